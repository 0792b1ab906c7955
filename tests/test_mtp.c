/*
 * test_mtp.c - Qwen 3.5's multi-token-prediction (MTP) block: loaded from
 * `kettle gen-model --shape qwen3.5-tiny` (which writes it, as the real
 * files carry it) and left out with --no-mtp without changing the trunk;
 * its logits against llama.cpp's draft-mtp path on the same file.
 *
 * The reference (tests/data/mtp/qwen35-tiny-F32.json) is the output of
 * tools/mtp_ref/mtp_dump.cpp (llama.cpp de3ff81 as a library; how it is
 * built and what it runs is at its top) on `kettle gen-model --shape
 * qwen3.5-tiny --type F32 --vocab <shared>/models/test-tiny-F16.gguf`,
 * which is deterministic: the test writes the same file again. It holds,
 * per MTP row, the top 8 logits, 64 probe logits at fixed ids and the
 * log-sum-exp: the prompt's rows (row p from x_p and the target's h_{p-1})
 * and three draft rows chained on the MTP's own hidden state.
 *
 * Tolerance 1e-4 on every logit: both sides are F32 end to end (weights,
 * activations, KV), so they differ only by summation order, as the trunk's
 * F32 goldens do (held to 5e-5 .. 1e-4 in test_golden); the MTP block adds
 * one decoder block and a 512-wide eh_proj to that path.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/model_internal.h"
#include "engine/mtp_engine.h"
#include "model/mtp.h"
#include "testutil.h"

enum { N_PROMPT_R = 16 };
#define TOL_BLOCK 1e-5 /* MTP_PRINT=1: print every row's difference, fail none */

static kt_model *g_mtp, *g_plain;

static kt_model *make_model(const char *name, const char *extra) {
    char args[4096];
    snprintf(args, sizeof args, "--shape qwen3.5-tiny --type %s --vocab %s %s", strstr(name, "Q4_0") ? "Q4_0" : "F32",
             tu_shared("models/test-tiny-F16.gguf"), extra);
    return tu_gen_model(KT_BIN, name, args);
}

static int setup(void **state) {
    (void)state;
    g_mtp = make_model("mtp-qwen35-tiny-F32.gguf", "");
    g_plain = make_model("mtp-qwen35-tiny-nomtp-F32.gguf", "--no-mtp");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    kt_model_free(g_mtp), kt_model_free(g_plain);
    return 0;
}

/* The block is bound (a full-attention layer after the trunk, its KV layer
 * after the trunk's), the trunk is the same 8 layers with or without it,
 * and gives the same logits. */
static void test_load(void **state) {
    (void)state;
    const llm_config *c = &g_mtp->llm->cfg, *p = &g_plain->llm->cfg;
    assert_int_equal(c->n_layer, 8);
    assert_int_equal(p->n_layer, 8);
    assert_int_equal(c->n_nextn, 1);
    assert_int_equal(c->n_mtp, 1);
    assert_int_equal(p->n_nextn, 0);
    assert_int_equal(p->n_mtp, 0);
    const llm_layer *l = &g_mtp->llm->layers[c->n_layer];
    assert_false(l->recurrent);
    assert_true(l->attn_gated);
    assert_int_equal(l->kv_layer, c->n_kv_layer);
    assert_int_equal(g_mtp->llm->mtp.eh_proj.n_in, 2 * c->n_embd);
    assert_ptr_equal(g_mtp->llm->mtp.head.data, g_mtp->llm->output.data); /* no shared_head_head: the output */
    assert_ptr_not_equal(g_mtp->llm->mtp.head_norm.data, g_mtp->llm->output_norm.data); /* its own shared_head_norm */
    kt_session *a = kt_session_new(g_mtp, &(kt_session_params){.n_ctx = 64, .n_threads = 1}, NULL);
    kt_session *b = kt_session_new(g_plain, &(kt_session_params){.n_ctx = 64, .n_threads = 1}, NULL);
    assert_non_null(a), assert_non_null(b);
    const int32_t ids[5] = {1, 400, 9000, 17, 31000};
    const int nv = c->n_vocab;
    float *la = tu_xmalloc(sizeof(float) * (size_t)nv * 5), *lb = tu_xmalloc(sizeof(float) * (size_t)nv * 5);
    assert_int_equal(kt_session_eval(a, ids, 5, la, true, NULL), KT_OK);
    assert_int_equal(kt_session_eval(b, ids, 5, lb, true, NULL), KT_OK);
    assert_memory_equal(la, lb, sizeof(float) * (size_t)nv * 5);
    free(la), free(lb);
    kt_session_free(a), kt_session_free(b);
}

/* A trunk cut by --layers keeps its MTP block after the layers written. */
static void test_load_cut_trunk(void **state) {
    (void)state;
    kt_model *m = make_model("mtp-qwen35-tiny-7l.gguf", "--layers 7");
    assert_int_equal(m->llm->cfg.n_layer, 7);
    assert_int_equal(m->llm->cfg.n_mtp, 1);
    kt_model_free(m);
}

static double check_row(const float *l, int n_vocab, json_t *row, const char *what, int i, double tol) {
    json_t *top = json_object_get(row, "top"), *probe = json_object_get(row, "probe");
    double md = 0, mx = -INFINITY, s = 0;
    for (size_t k = 0; k < json_array_size(top); k++) {
        json_t *e = json_array_get(top, k);
        const int id = (int)json_integer_value(json_array_get(e, 0));
        const double d = fabs(l[id] - json_real_value(json_array_get(e, 1)));
        md = d > md ? d : md;
    }
    for (size_t k = 0; k < json_array_size(probe); k++) {
        const double d = fabs(l[(long)k * n_vocab / (long)json_array_size(probe)] - json_real_value(json_array_get(probe, k)));
        md = d > md ? d : md;
    }
    for (int v = 0; v < n_vocab; v++) mx = l[v] > mx ? l[v] : mx;
    for (int v = 0; v < n_vocab; v++) s += exp(l[v] - mx);
    const double dl = fabs(mx + log(s) - json_real_value(json_object_get(row, "lse")));
    md = dl > md ? dl : md;
    if (getenv("MTP_PRINT")) printf("%s %d %.3g\n", what, i, md);
    if (md > tol && !getenv("MTP_PRINT"))
        fail_msg("%s row %d: max |logit diff| %.3g against llama.cpp's (tolerance %g)", what, i, md, tol);
    return md;
}

/* The MTP block's logits against llama.cpp's: the prompt's rows (one
 * batch over the hidden states, shifted by one position) and a chain of
 * draft rows, each fed the previous row's own hidden state. own_h: on
 * kettle's trunk's hidden states (end to end), else on llama.cpp's (the
 * block alone). Returns the largest difference; the trunk's own logits'
 * to *trunk_diff. */
static double check_mtp(bool own_h, double tol, double *trunk_diff) {
    char path[4096];
    snprintf(path, sizeof path, "%s/mtp/qwen35-tiny-F32.json", KT_TEST_DATA);
    json_error_t jerr;
    json_t *ref = json_load_file(path, 0, &jerr);
    if (!ref) fail_msg("%s: %s", path, jerr.text);
    int n;
    int32_t *ids = tu_json_ids(json_object_get(ref, "prompt_ids"), &n);
    const llm_model *m = g_mtp->llm;
    const int E = m->cfg.n_embd, nv = m->cfg.n_vocab;
    assert_int_equal(nv, (int)json_integer_value(json_object_get(ref, "n_vocab")));
    kt_error err = {0};
    kv_pool_params kp = llm_kv_params(m, 1, 64, KV_F32);
    llm_mtp_kv_params(m, &kp);
    kv_pool *kv = kv_pool_new(&kp, &err);
    kv_seq *seq = kv ? kv_seq_new(kv, &err) : NULL;
    llm_work *w = llm_work_new(m, 64, &err);
    kt_pool *pool = kt_pool_new(1, &err);
    if (!seq || !w || !pool) fail_msg("%s", err.msg);
    int pos[64];
    kv_seq *seqs[64];
    bool all[64];
    for (int i = 0; i < 64; i++) pos[i] = i, seqs[i] = seq, all[i] = true;
    /* the target over the prompt: every token's hidden state (after the output norm) and logits */
    float *h = tu_xmalloc(sizeof(float) * (size_t)(n + 1) * E), *tl = tu_xmalloc(sizeof(float) * (size_t)nv * n);
    memset(h, 0, sizeof(float) * E); /* row 0: h_{-1} = 0 */
    assert_int_equal(kv_seq_append(seq, n, &err), KT_OK);
    llm_batch tb = {.n_tokens = n, .tokens = ids, .pos = pos, .seq = seqs, .logits = all, .hidden = all,
                    .hidden_out = h + E};
    llm_forward(m, w, pool, &tb, tl);
    const int next = tu_argmax(tl + (size_t)(n - 1) * nv, nv);
    assert_int_equal(next, (int)json_integer_value(json_object_get(ref, "target_next")));
    json_t *trows = json_object_get(ref, "target_rows"), *th = json_object_get(ref, "target_h");
    *trunk_diff = 0;
    for (int p = 0; p < n; p++) {
        *trunk_diff = fmax(*trunk_diff, check_row(tl + (size_t)p * nv, nv, json_array_get(trows, (size_t)p), "target",
                                                  p, INFINITY));
        for (int j = 0; !own_h && j < E; j++)
            h[(size_t)(p + 1) * E + j] = (float)json_real_value(json_array_get(json_array_get(th, (size_t)p), (size_t)j));
    }
    /* the MTP over the prompt: row p from x_p and h_{p-1} */
    float *ml = tu_xmalloc(sizeof(float) * (size_t)nv * n), *ho = tu_xmalloc(sizeof(float) * (size_t)n * E);
    llm_batch mb = {.n_tokens = n, .tokens = ids, .pos = pos, .seq = seqs};
    if (llm_mtp_forward(m, w, pool, &mb, h, ml, ho, &err) != KT_OK) fail_msg("%s", err.msg);
    json_t *rows = json_object_get(ref, "rows");
    assert_int_equal((int)json_array_size(rows), n);
    double md = 0;
    for (int p = 0; p < n; p++)
        md = fmax(md, check_row(ml + (size_t)p * nv, nv, json_array_get(rows, (size_t)p), "prompt", p, tol));
    /* draft: the target's next token at n with h_{n-1}, then chained on the MTP's own h */
    json_t *chain = json_object_get(ref, "chain");
    float *hrow = tu_xmalloc(sizeof(float) * E);
    memcpy(hrow, h + (size_t)n * E, sizeof(float) * E);
    int32_t tok = next;
    for (size_t s = 0; s < json_array_size(chain); s++) {
        assert_int_equal(kv_seq_append(seq, 1, &err), KT_OK);
        llm_batch db = {.n_tokens = 1, .tokens = &tok, .pos = &pos[n + s], .seq = seqs};
        if (llm_mtp_forward(m, w, pool, &db, hrow, ml, ho, &err) != KT_OK) fail_msg("%s", err.msg);
        json_t *row = json_array_get(chain, s);
        assert_int_equal(tok, (int)json_integer_value(json_object_get(row, "token")));
        md = fmax(md, check_row(ml, nv, row, "draft", (int)s, tol));
        memcpy(hrow, ho, sizeof(float) * E);
        tok = tu_argmax(ml, nv);
    }
    print_message("MTP vs llama.cpp on %s hidden states: %d prompt rows, %zu draft rows, max |logit diff| %.3g "
                  "(tolerance %g; the trunks' logits differ by %.3g)\n", own_h ? "kettle's" : "llama.cpp's", n,
                  json_array_size(chain), md, tol, *trunk_diff);
    free(hrow), free(ml), free(ho), free(h), free(tl), free(ids);
    kt_pool_free(pool), llm_work_free(w), kv_seq_free(seq), kv_pool_free(kv);
    json_decref(ref);
    return md;
}

/* The block alone, on llama.cpp's hidden states: only summation orders differ
 * (measured 3e-7 on logits of about 1: float rounding; 1e-5 leaves 30x). */
static void test_mtp_block_vs_llama(void **state) {
    (void)state;
    double trunk;
    check_mtp(false, TOL_BLOCK, &trunk);
}

/* End to end, on kettle's own hidden states: the MTP's logits differ from
 * llama.cpp's no more than the trunk's own logits do (on this random file
 * the trunks' differ by ~1e-3: the recurrent layers' F32 arithmetic in
 * another order), with a margin of 2. */
static void test_mtp_end_to_end_vs_llama(void **state) {
    (void)state;
    double trunk;
    const double md = check_mtp(true, INFINITY, &trunk);
    assert_true(md <= 2 * trunk);
}

/* The K and V rows the engine and sessions write for every prompt and
 * verified token (llm_mtp_kv) are the bits the whole block
 * (llm_mtp_forward) writes: two sequences of one pool, the same tokens and
 * hidden rows, one through each. */
static void test_mtp_kv_rows_same_bits(void **state) {
    (void)state;
    const llm_model *m = g_mtp->llm;
    const int E = m->cfg.n_embd, n = 40, layer = m->cfg.n_kv_layer;
    kt_error err = {0};
    kv_pool_params kp = llm_kv_params(m, 2, 64, KV_F32);
    kp.n_state_slots = 2;
    llm_mtp_kv_params(m, &kp);
    kv_pool *kv = kv_pool_new(&kp, &err);
    kv_seq *sa = kv ? kv_seq_new(kv, &err) : NULL, *sb = kv ? kv_seq_new(kv, &err) : NULL;
    llm_work *w = llm_work_new(m, 64, &err);
    kt_pool *pool = kt_pool_new(2, &err);
    if (!sa || !sb || !w || !pool) fail_msg("%s", err.msg);
    int32_t ids[40];
    int pos[40];
    kv_seq *qa[40], *qb[40];
    float *h = tu_xmalloc(sizeof(float) * (size_t)n * E);
    for (int i = 0; i < n; i++) ids[i] = 1 + (i * 7919) % 31000, pos[i] = i, qa[i] = sa, qb[i] = sb;
    for (size_t i = 0; i < (size_t)n * E; i++) h[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    assert_int_equal(kv_seq_append(sa, n, &err), KT_OK);
    assert_int_equal(kv_seq_append(sb, n, &err), KT_OK);
    llm_batch ba = {.n_tokens = n, .tokens = ids, .pos = pos, .seq = qa}, bb = ba;
    bb.seq = qb;
    if (llm_mtp_forward(m, w, pool, &ba, h, NULL, NULL, &err) != KT_OK) fail_msg("%s", err.msg);
    if (llm_mtp_kv(m, w, pool, &bb, h, &err) != KT_OK) fail_msg("%s", err.msg);
    const size_t row = kv_pool_row_bytes(kv);
    int nonzero = 0;
    for (int p = 0; p < n; p++)
        for (int kind = 0; kind < 2; kind++) {
            const float *a = kv_seq_row(sa, layer, (kv_kind)kind, p), *b = kv_seq_row(sb, layer, (kv_kind)kind, p);
            assert_memory_equal(a, b, row);
            nonzero += a[0] != 0.0f;
        }
    assert_true(nonzero > n); /* rows were written, not two untouched planes */
    free(h);
    kt_pool_free(pool), llm_work_free(w), kv_seq_free(sa), kv_seq_free(sb), kv_pool_free(kv);
}

/* The engine's guesses for several sequences at once (one pass of the
 * block per depth for all of them) are each sequence's guesses alone,
 * and leave every sequence as long as it was. */
static void test_mtp_guesses_batched(void **state) {
    (void)state;
    const llm_model *m = g_mtp->llm;
    const int E = m->cfg.n_embd, n = 24;
    kt_error err = {0};
    kv_pool_params kp = llm_kv_params(m, 8, 64, KV_F32);
    kp.n_state_slots = 3;
    llm_mtp_kv_params(m, &kp);
    kv_pool *kv = kv_pool_new(&kp, &err);
    kv_seq *sq[3] = {0};
    for (int i = 0; kv && i < 3; i++) sq[i] = kv_seq_new(kv, &err);
    llm_work *w = llm_work_new(m, 64, &err);
    kt_pool *pool = kt_pool_new(2, &err);
    eng_mtp mt;
    if (!sq[2] || !w || !pool || eng_mtp_init(&mt, m, 3, 64, &err) != KT_OK) fail_msg("%s", err.msg);
    float *h = tu_xmalloc(sizeof(float) * (size_t)n * E);
    for (int s = 0; s < 3; s++) { /* three prompts, their MTP rows on made-up hidden states */
        int32_t ids[24];
        int pos[24];
        kv_seq *qs[24];
        for (int i = 0; i < n; i++) ids[i] = 1 + (i * 7919 + s * 104729) % 31000, pos[i] = i, qs[i] = sq[s];
        for (size_t i = 0; i < (size_t)n * E; i++) h[i] = (float)((i * 2654435761u + (size_t)s) % 2001) / 1000.0f - 1.0f;
        assert_int_equal(kv_seq_append(sq[s], n, &err), KT_OK);
        llm_batch b = {.n_tokens = n, .tokens = ids, .pos = pos, .seq = qs};
        if (llm_mtp_kv(m, w, pool, &b, h, &err) != KT_OK) fail_msg("%s", err.msg);
        memcpy(mt.h + (size_t)sq[s]->state_slot * E, h + (size_t)(n - 1) * E, sizeof(float) * E);
        mt.h_pos[sq[s]->state_slot] = n - 1;
    }
    const int k[3] = {4, 2, 3};
    int32_t alone[3][4], together[3][4];
    for (int s = 0; s < 3; s++) {
        eng_mtp_job j = {.seq = sq[s], .pending = 500 + s, .k = k[s], .out = alone[s]};
        if (eng_mtp_propose(&mt, w, pool, &j, 1, &err) != KT_OK) fail_msg("%s", err.msg);
        assert_int_equal(j.got, k[s]);
        assert_int_equal(sq[s]->len, n);
    }
    eng_mtp_job jobs[3];
    for (int s = 0; s < 3; s++) jobs[s] = (eng_mtp_job){.seq = sq[s], .pending = 500 + s, .k = k[s], .out = together[s]};
    if (eng_mtp_propose(&mt, w, pool, jobs, 3, &err) != KT_OK) fail_msg("%s", err.msg);
    for (int s = 0; s < 3; s++) {
        assert_int_equal(jobs[s].got, k[s]);
        assert_int_equal(sq[s]->len, n);
        assert_memory_equal(alone[s], together[s], sizeof(int32_t) * (size_t)k[s]);
    }
    assert_int_equal(mt.guesses_blind, 0);
    assert_false(alone[0][0] == alone[1][0] && alone[1][0] == alone[2][0] && alone[0][1] == alone[1][1]); /* not one answer */
    free(h);
    eng_mtp_free(&mt);
    kt_pool_free(pool), llm_work_free(w);
    for (int s = 0; s < 3; s++) kv_seq_free(sq[s]);
    kv_pool_free(kv);
}

/* Repacked at load (the CLI's default), the MTP block's matrices are
 * rewritten with the trunk's (eh_proj its own, the head the output's, whose
 * type the MTP's copy follows) and it guesses what the mapped file does. */
static void test_mtp_repacked(void **state) {
    (void)state;
    kt_model_free(make_model("mtp-qwen35-tiny-Q4_0.gguf", "")); /* written */
    char path[4096];
    snprintf(path, sizeof path, "%s", tu_tmp("mtp-qwen35-tiny-Q4_0.gguf"));
    kt_error err = {0};
    kt_model *mm = kt_model_load_ex(path, KT_LOAD_MMAP, &err), *rp = kt_model_load_ex(path, KT_LOAD_REPACK, &err);
    if (!mm || !rp) fail_msg("%s", err.msg);
    const llm_model *r = rp->llm;
    assert_int_not_equal(r->mtp.eh_proj.type, mm->llm->mtp.eh_proj.type); /* Q4_0 -> Q4_0x8 */
    assert_int_equal(r->mtp.head.type, r->output.type);
    assert_int_equal(r->mtp.embed_tokens.type, r->tok_embd.type);
    int32_t ids[N_PROMPT_R];
    for (int i = 0; i < N_PROMPT_R; i++) ids[i] = 1 + (i * 577) % 31000;
    int32_t g[2][4];
    kt_model *ms[2] = {mm, rp};
    for (int k = 0; k < 2; k++) {
        kt_session *s = kt_session_new(ms[k], &(kt_session_params){.n_ctx = 64, .n_threads = 2, .mtp = true}, &err);
        if (!s) fail_msg("%s", err.msg);
        assert_int_equal(kt_session_eval(s, ids, N_PROMPT_R, NULL, false, NULL), KT_OK);
        assert_int_equal(kt_session_mtp_draft(s, 4242, 4, g[k], NULL), 4);
        kt_session_free(s);
    }
    assert_memory_equal(g[0], g[1], sizeof g[0]);
    kt_model_free(mm), kt_model_free(rp);
}

/* ---- the proposer ---- */

enum { N_PROMPT = 12, N_GEN = 40, N_MAX = N_GEN + 8 };

static void prompt_ids(int32_t *ids) {
    ids[0] = 1;
    for (int i = 1; i < N_PROMPT; i++) ids[i] = 100 + (i * 977) % 31000;
}

static kt_sampler *sampler(float temp) {
    kt_sampler_params sp = kt_sampler_defaults();
    sp.temperature = temp, sp.seed = 42;
    kt_sampler *smp = kt_sampler_new(&sp, 32000, NULL);
    assert_non_null(smp);
    return smp;
}

/* Plain decoding: the prompt, then n tokens one pass each, into out
 * (the first sampled after the prompt, then the rest); the session holds
 * the prompt and all but the last token. */
static kt_session *plain(kt_model *m, float temp, bool mtp, int n, int32_t *out) {
    kt_session *s = kt_session_new(m, &(kt_session_params){.n_ctx = 128, .n_threads = 2, .mtp = mtp}, NULL);
    assert_non_null(s);
    int32_t ids[N_PROMPT];
    prompt_ids(ids);
    float *l = tu_xmalloc(sizeof(float) * 32000);
    kt_sampler *smp = sampler(temp);
    assert_int_equal(kt_session_eval(s, ids, N_PROMPT, l, false, NULL), KT_OK);
    for (int i = 0; i < n; i++) {
        out[i] = kt_sampler_sample(smp, l);
        kt_sampler_accept(smp, out[i]);
        if (i + 1 < n) assert_int_equal(kt_session_eval(s, &out[i], 1, l, false, NULL), KT_OK);
    }
    kt_sampler_free(smp);
    free(l);
    return s;
}

typedef struct script { /* a proposer that knows the answer: the first `good` right, then wrong ones */
    const int32_t *ref;
    int calls;
} script;

static int scripted(void *ctx, const int32_t *tokens, int n, int k, int32_t *out) {
    (void)tokens;
    script *sc = ctx;
    const int good = sc->calls++ % 4; /* 0, 1, 2, 3 right, then wrong */
    for (int i = 0; i < k; i++) {
        const int at = n - N_PROMPT + i; /* the index in ref of the token after tokens[n - 1 + i] */
        out[i] = i < good && at < N_MAX ? sc->ref[at] : 7 + i;
    }
    return k;
}

/* Speculative decoding through kt_spec_step until N_GEN tokens or more
 * (*n_out; the session holds the prompt and all but the last). */
static kt_session *speculate(kt_model *m, float temp, const kt_spec_params *p, int32_t *out, int *n_out,
                             kt_spec_stats *stats) {
    kt_session *s = kt_session_new(m, &(kt_session_params){.n_ctx = 128, .n_threads = 2, .mtp = true}, NULL);
    assert_non_null(s);
    kt_error err = {0};
    kt_spec *sp = kt_spec_new(m, p, &err);
    if (!sp) fail_msg("%s", err.msg);
    int32_t ctx[N_PROMPT + N_MAX + 40], step[40];
    prompt_ids(ctx);
    float *l = tu_xmalloc(sizeof(float) * 32000);
    kt_sampler *smp = sampler(temp);
    assert_int_equal(kt_session_eval(s, ctx, N_PROMPT, l, false, NULL), KT_OK);
    int n = N_PROMPT, got = 0;
    out[got++] = ctx[n++] = kt_sampler_sample(smp, l);
    kt_sampler_accept(smp, out[0]);
    while (got < N_GEN) {
        const int r = kt_spec_step(sp, s, smp, ctx, n, step, &err);
        if (r < 0) fail_msg("%s", err.msg);
        for (int i = 0; i < r; i++) out[got++] = ctx[n++] = step[i];
    }
    *n_out = got;
    *stats = kt_spec_get_stats(sp);
    kt_spec_free(sp);
    kt_sampler_free(smp);
    free(l);
    return s;
}

/* The two sessions hold the same state: the next pass's logits are the
 * same bits, and the MTP block guesses the same from them. */
static void same_state(kt_session *a, kt_session *b, int32_t pending) {
    float *la = tu_xmalloc(sizeof(float) * 32000), *lb = tu_xmalloc(sizeof(float) * 32000);
    int32_t ga[3], gb[3];
    assert_int_equal(kt_session_n_past(a), kt_session_n_past(b));
    assert_int_equal(kt_session_mtp_draft(a, pending, 3, ga, NULL), 3);
    assert_int_equal(kt_session_mtp_draft(b, pending, 3, gb, NULL), 3);
    assert_memory_equal(ga, gb, sizeof ga);
    assert_int_equal(kt_session_eval(a, &pending, 1, la, false, NULL), KT_OK);
    assert_int_equal(kt_session_eval(b, &pending, 1, lb, false, NULL), KT_OK);
    assert_memory_equal(la, lb, sizeof(float) * 32000);
    free(la), free(lb);
}

/* --spec mtp is plain decoding, token for token, at temperature 0 and
 * with seeded sampling, on F32 and Q4_0 weights and a mixture of experts,
 * k = 1 and chained k = 4 (fixed: every step verifies, nearly every
 * proposal of these random weights is rejected and rolled back); the
 * session's recurrent state and MTP rows end as plain decoding's. */
static void test_spec_mtp_exact(void **state) {
    (void)state;
    kt_model *q4 = make_model("mtp-qwen35-tiny-Q4_0.gguf", "");
    char args[4096];
    snprintf(args, sizeof args, "--shape qwen3.5moe-tiny --type F32 --vocab %s", tu_shared("models/test-tiny-F16.gguf"));
    kt_model *moe = tu_gen_model(KT_BIN, "mtp-qwen35moe-tiny-F32.gguf", args);
    kt_model *models[] = {g_mtp, q4, moe};
    for (int mi = 0; mi < 3; mi++)
        for (int ti = 0; ti < 2; ti++)
            for (int ki = 0; ki < 2; ki++) {
                const float temp = ti ? 0.9f : 0.0f;
                int32_t want[N_MAX], got[N_MAX];
                int n;
                kt_spec_stats st;
                kt_spec_params p = {.k_max = ki ? 4 : 1, .fixed_k = true, .mtp = true};
                kt_session *b = speculate(models[mi], temp, &p, got, &n, &st);
                kt_session *a = plain(models[mi], temp, true, n, want);
                assert_memory_equal(want, got, sizeof(int32_t) * (size_t)n);
                assert_true(st.proposed > 0);
                same_state(a, b, want[n - 1]);
                kt_session_free(a), kt_session_free(b);
            }
    kt_model_free(q4), kt_model_free(moe);
}

/* MTP with prompt lookup beside it: where the context repeats (this
 * random model's greedy output does), the lookup's runs are taken and
 * kept; the tokens are still plain decoding's. k is fixed: an adapting k
 * follows the measured cost of a pass, which a sanitized build's timing
 * pushes to 0 (no proposal at all), so the check would depend on speed. */
static void test_spec_mtp_with_lookup(void **state) {
    (void)state;
    int32_t want[N_MAX], got[N_MAX];
    int n;
    kt_spec_stats st;
    kt_spec_params p = {.k_max = 4, .fixed_k = true, .mtp = true};
    kt_session *b = speculate(g_mtp, 0.0f, &p, got, &n, &st);
    kt_session *a = plain(g_mtp, 0.0f, true, n, want);
    assert_memory_equal(want, got, sizeof(int32_t) * (size_t)n);
    print_message("MTP + lookup: %llu passes, %llu proposed (%llu by lookup), %llu kept (%llu by lookup)\n",
                  (unsigned long long)st.steps, (unsigned long long)st.proposed, (unsigned long long)st.lookup_proposed,
                  (unsigned long long)st.accepted, (unsigned long long)st.lookup_accepted);
    assert_true(st.lookup_accepted > 0);
    same_state(a, b, want[n - 1]);
    kt_session_free(a), kt_session_free(b);
}

/* A hybrid model's rollback after partial acceptance: a proposer that is
 * right for 0..3 tokens then wrong; the tokens are plain decoding's and
 * the state (recurrent, KV, the MTP's rows and hidden state) ends as
 * plain decoding's, bit for bit. */
static void test_spec_hybrid_partial(void **state) {
    (void)state;
    for (int ti = 0; ti < 2; ti++) {
        const float temp = ti ? 0.9f : 0.0f;
        int32_t want[N_MAX], got[N_MAX], ref[N_MAX];
        int n;
        kt_session_free(plain(g_mtp, temp, false, N_MAX, ref)); /* what the proposer knows */
        script sc = {ref, 0};
        kt_spec_stats st;
        kt_spec_params p = {.k_max = 5, .fixed_k = true, .propose = scripted, .propose_ctx = &sc};
        kt_session *b = speculate(g_mtp, temp, &p, got, &n, &st);
        kt_session *a = plain(g_mtp, temp, true, n, want);
        assert_memory_equal(want, got, sizeof(int32_t) * (size_t)n);
        print_message("scripted proposals at temperature %.1f: %llu passes, %llu proposed, %llu kept\n", temp,
                      (unsigned long long)st.steps, (unsigned long long)st.proposed, (unsigned long long)st.accepted);
        assert_true(st.accepted > 0 && st.accepted < st.proposed);
        same_state(a, b, want[n - 1]);
        kt_session_free(a), kt_session_free(b);
    }
}

/* --spec mtp on a model without the block is refused, naming it. */
static void test_spec_mtp_refused(void **state) {
    (void)state;
    kt_error err = {0};
    assert_false(kt_model_has_mtp(g_plain));
    assert_null(kt_spec_new(g_plain, &(kt_spec_params){.mtp = true}, &err));
    assert_non_null(strstr(err.msg, "multi-token-prediction"));
    assert_null(kt_session_new(g_plain, &(kt_session_params){.n_ctx = 64, .mtp = true}, &err));
    assert_non_null(strstr(err.msg, "multi-token-prediction"));
}

/* ---- the engine ---- */

static kt_engine *engine_of(kt_model *m, kt_spec_kind spec) {
    kt_engine_params p = kt_engine_defaults();
    p.n_ctx = 256, p.n_parallel = 4, p.batch_tokens = 24, p.n_threads = 2, p.kv_type = KT_KV_F32;
    p.spec = spec, p.spec_k_max = 3, p.spec_fixed_k = true; /* every step verifies: rejections and rollbacks */
    kt_error err = {0};
    kt_engine *e = kt_engine_new(m, &p, &err);
    if (!e) fail_msg("%s", err.msg);
    return e;
}

/* Four requests at once (prompts of 40 tokens in chunks of the 24-token
 * step budget, beside each other's decoding), greedy, seeded at 0.9 with
 * two choices, greedy under a grammar: the engine with --spec mtp gives
 * plain decoding's tokens and logprob bits. */
static void run_engine(kt_engine *e, tu_eng_out out[4][2]) {
    kt_request *rq[4];
    static const char grammar[] = "root ::= [a-z ]+"; /* the fourth: under a grammar (proposals cut where it refuses) */
    for (int i = 0; i < 4; i++) {
        int32_t ids[40];
        ids[0] = 1;
        for (int j = 1; j < 40; j++) ids[j] = 50 + (j * 131 + i * 7919) % 31000;
        kt_gen_params p = kt_gen_defaults();
        p.prompt = ids, p.n_prompt = 40, p.max_tokens = 24, p.ignore_eos = true, p.top_logprobs = 0;
        p.n_choices = i == 2 ? 2 : 1;
        p.sampling.temperature = i == 0 || i == 3 ? 0.0f : 0.9f, p.sampling.seed = 99 + (uint64_t)i;
        if (i == 3) p.grammar = grammar, p.grammar_len = strlen(grammar);
        kt_error err = {0};
        if (kt_engine_submit(e, &p, &rq[i], &err) != KT_OK) fail_msg("%s", err.msg);
    }
    for (int i = 0; i < 4; i++) tu_eng_drain(rq[i], out[i], i == 2 ? 2 : 1);
}

/* On F32 weights mapped and on Q4_0 repacked at load (the CLI's way). */
static void test_engine_mtp_exact(void **state) {
    (void)state;
    kt_model_free(make_model("mtp-qwen35-tiny-Q4_0.gguf", "")); /* written */
    char path[4096];
    snprintf(path, sizeof path, "%s", tu_tmp("mtp-qwen35-tiny-Q4_0.gguf"));
    kt_model *q4 = kt_model_load_ex(path, KT_LOAD_REPACK, NULL);
    assert_non_null(q4);
    kt_model *models[2] = {g_mtp, q4};
    for (int mi = 0; mi < 2; mi++) {
        tu_eng_out plain_out[4][2], mtp_out[4][2];
        kt_engine *e = engine_of(models[mi], KT_SPEC_OFF);
        run_engine(e, plain_out);
        kt_engine_free(e);
        e = engine_of(models[mi], KT_SPEC_MTP);
        run_engine(e, mtp_out);
        kt_engine_stats st;
        kt_engine_get_stats(e, &st);
        kt_engine_free(e);
        for (int i = 0; i < 4; i++)
            for (int c = 0; c < (i == 2 ? 2 : 1); c++) {
                if (i < 3) assert_int_equal(plain_out[i][c].n, 24);
                assert_true(plain_out[i][c].n > 0);
                tu_assert_same_out(&plain_out[i][c], &mtp_out[i][c], "engine --spec mtp");
            }
        print_message("engine --spec mtp (%s): %llu passes verified %llu proposals, %llu kept (%llu of %llu by lookup)\n",
                      mi ? "Q4_0 repacked" : "F32", (unsigned long long)st.spec_passes,
                      (unsigned long long)st.spec_proposed, (unsigned long long)st.spec_accepted,
                      (unsigned long long)st.spec_lookup_accepted, (unsigned long long)st.spec_lookup_proposed);
        assert_true(st.spec_proposed > 0);
        assert_true(st.spec_lookup_proposed <= st.spec_proposed && st.spec_lookup_accepted <= st.spec_accepted);
        /* every MTP row had the target's hidden state before it but each prompt's first (position 0),
         * every guess too (the second choice forks from the first's end) */
        assert_int_equal(st.mtp_rows_blind, 4);
        assert_int_equal(st.mtp_guesses_blind, 0);
    }
    kt_model_free(q4);
    kt_error err = {0};
    kt_engine_params p = kt_engine_defaults();
    p.spec = KT_SPEC_MTP;
    assert_null(kt_engine_new(g_plain, &p, &err));
    assert_non_null(strstr(err.msg, "multi-token-prediction"));
}

/* A kt_session with the MTP block makes no MTP rows for
 * an image's rows, as the engine makes none for a request with images:
 * the block's K rows at the image's positions stay as the fresh pool had
 * them (zeros), the text's after it are written; the target's logits are
 * a session's without the block, bit for bit, before, at and after the
 * image. */
static void test_session_mtp_image(void **state) {
    (void)state;
    kt_error err = {0};
    kt_session *a = kt_session_new(g_mtp, &(kt_session_params){.n_ctx = 64, .n_threads = 2, .mtp = true}, &err);
    kt_session *b = kt_session_new(g_mtp, &(kt_session_params){.n_ctx = 64, .n_threads = 2}, &err);
    assert_non_null(a), assert_non_null(b);
    const int n_vocab = kt_model_describe(g_mtp)->n_vocab, n_embd = kt_model_describe(g_mtp)->n_embd;
    float *la = tu_xmalloc(sizeof(float) * (size_t)n_vocab), *lb = tu_xmalloc(sizeof(float) * (size_t)n_vocab);
    float *embd = tu_xmalloc(sizeof(float) * 4 * (size_t)n_embd);
    for (int k = 0; k < 4 * n_embd; k++) embd[k] = 0.01f * (float)(k % 89) - 0.4f;
    int32_t text[8];
    for (int j = 0; j < 8; j++) text[j] = 70 + 13 * j;
    kt_session *s[2] = {a, b};
    float *l[2] = {la, lb};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(kt_session_eval(s[i], text, 8, l[i], false, &err), KT_OK);
        if (i) assert_memory_equal(la, lb, sizeof(float) * (size_t)n_vocab);
    }
    for (int i = 0; i < 2; i++) assert_int_equal(kt_session_eval_image(s[i], embd, 2, 2, l[i], &err), KT_OK);
    assert_memory_equal(la, lb, sizeof(float) * (size_t)n_vocab);
    for (int i = 0; i < 2; i++) assert_int_equal(kt_session_eval(s[i], text, 8, l[i], false, &err), KT_OK);
    assert_memory_equal(la, lb, sizeof(float) * (size_t)n_vocab);
    const int mtp_layer = g_mtp->llm->cfg.n_kv_layer; /* the block's KV layer, after the trunk's */
    const size_t row_bytes = kv_pool_row_bytes(a->kv);
    int zero_rows[3] = {0}; /* text before, the image, text after */
    for (int pos = 0; pos < 20; pos++) {
        const unsigned char *r = kv_seq_row(a->seq, mtp_layer, KV_K, pos);
        bool zero = true;
        for (size_t k = 0; k < row_bytes && zero; k++) zero = r[k] == 0;
        zero_rows[pos < 8 ? 0 : pos < 12 ? 1 : 2] += zero;
    }
    print_message("MTP K rows left zero: %d of 8 text, %d of 4 image, %d of 8 text after\n", zero_rows[0],
                  zero_rows[1], zero_rows[2]);
    assert_int_equal(zero_rows[0], 0);
    assert_int_equal(zero_rows[1], 4);
    assert_int_equal(zero_rows[2], 0);
    free(la), free(lb), free(embd);
    kt_session_free(a), kt_session_free(b);
}

/* The engine makes the block's rows only where a guess may read them
 * (engine/mtp_engine.h). On these random weights its guesses are never
 * kept, so once the policy has measured that (or stopped guessing), the
 * prompts that come after make no rows: the last of five requests one
 * after another skips its prompt's rows, and every request's tokens and
 * logprob bits are plain decoding's. A request with an image (the
 * caller's embeddings) makes none at all: the block takes no guesses for
 * one. */
static void test_engine_mtp_rows(void **state) {
    (void)state;
    enum { N_REQ = 5, N_GEN = 48 };
    static tu_eng_out plain_out[N_REQ], mtp_out[N_REQ];
    for (int spec = 0; spec < 2; spec++) {
        kt_engine_params p = kt_engine_defaults();
        p.n_ctx = 256, p.n_parallel = 1, p.batch_tokens = 64, p.n_threads = 2, p.kv_type = KT_KV_F32;
        p.spec = spec ? KT_SPEC_MTP : KT_SPEC_OFF, p.spec_k_max = 3; /* the policy's k, not fixed */
        kt_error err = {0};
        kt_engine *e = kt_engine_new(g_mtp, &p, &err);
        if (!e) fail_msg("%s", err.msg);
        kt_engine_stats before = {0}, st;
        for (int i = 0; i < N_REQ; i++) {
            int32_t ids[40];
            ids[0] = 1;
            for (int j = 1; j < 40; j++) ids[j] = 50 + (j * 977 + i * 7919) % 31000; /* no prefix shared */
            if (i == N_REQ - 1) kt_engine_get_stats(e, &before);
            tu_eng_drain(tu_eng_submit(e, ids, 40, N_GEN, 1), spec ? &mtp_out[i] : &plain_out[i], 1);
        }
        kt_engine_get_stats(e, &st);
        if (spec) {
            for (int i = 0; i < N_REQ; i++) tu_assert_same_out(&plain_out[i], &mtp_out[i], "engine --spec mtp, policy's k");
            print_message("MTP rows: %llu made, %llu skipped (the last request's prompt: %llu skipped); %llu proposed, "
                          "%llu kept\n", (unsigned long long)st.mtp_rows, (unsigned long long)st.mtp_rows_skipped,
                          (unsigned long long)(st.mtp_rows_skipped - before.mtp_rows_skipped),
                          (unsigned long long)st.spec_proposed, (unsigned long long)st.spec_accepted);
            /* its prompt's 39 tokens but the last (which wants logits) */
            assert_int_equal(st.mtp_rows_skipped - before.mtp_rows_skipped, 39);
            assert_int_equal(st.spec_accepted - st.spec_lookup_accepted, 0);
            /* an image: its request makes no row */
            const int n_embd = kt_model_describe(g_mtp)->n_embd;
            float *embd = tu_xmalloc(sizeof(float) * 4 * (size_t)n_embd);
            for (int k = 0; k < 4 * n_embd; k++) embd[k] = 0.01f * (float)(k % 97) - 0.4f;
            int32_t ids[24];
            for (int j = 0; j < 24; j++) ids[j] = 60 + j;
            kt_prompt_image im = {.at = 8, .grid_x = 2, .grid_y = 2, .hash = 12345, .embd = embd};
            kt_gen_params g = kt_gen_defaults();
            g.prompt = ids, g.n_prompt = 24, g.max_tokens = 8, g.ignore_eos = true, g.top_logprobs = 0;
            g.images = &im, g.n_images = 1;
            kt_request *r = NULL;
            if (kt_engine_submit(e, &g, &r, &err)) fail_msg("%s", err.msg);
            static tu_eng_out img_out;
            tu_eng_drain(r, &img_out, 1);
            kt_engine_get_stats(e, &before);
            assert_int_equal(before.mtp_rows, st.mtp_rows);
            assert_true(before.mtp_rows_skipped >= st.mtp_rows_skipped + 24 + 7);
            free(embd);
        } else {
            assert_int_equal(st.mtp_rows + st.mtp_rows_skipped, 0);
        }
        kt_engine_free(e);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load),
        cmocka_unit_test(test_load_cut_trunk),
        cmocka_unit_test(test_mtp_block_vs_llama),
        cmocka_unit_test(test_mtp_end_to_end_vs_llama),
        cmocka_unit_test(test_mtp_kv_rows_same_bits),
        cmocka_unit_test(test_mtp_guesses_batched),
        cmocka_unit_test(test_mtp_repacked),
        cmocka_unit_test(test_spec_mtp_exact),
        cmocka_unit_test(test_spec_mtp_with_lookup),
        cmocka_unit_test(test_spec_hybrid_partial),
        cmocka_unit_test(test_spec_mtp_refused),
        cmocka_unit_test(test_engine_mtp_exact),
        cmocka_unit_test(test_engine_mtp_rows),
        cmocka_unit_test(test_session_mtp_image),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
