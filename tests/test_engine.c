/*
 * test_engine.c - the engine's step loop: the same tokens as a plain
 * session, batch invariance (16 requests at once, seen to share steps,
 * give each one's tokens alone, bit for bit, logprobs included), chunked
 * prefill, n > 1 choices sharing the prompt's blocks (greedy, and sampled
 * against each choice's seed alone), admission of --parallel full-context
 * requests, stop strings across token boundaries, priorities,
 * cancellation at each stage freeing KV blocks and reservations, and
 * clear errors. Tests that need a request at a given stage hold the
 * engine (kt_engine_hold) and grant it steps, so none depends on timing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "gguf/gguf.h"
#include "kettle.h"
#include "testutil.h"

#define WAIT_MS 60000 /* a hung engine fails the test instead of hanging it */
#define MAX_OUT 256

static kt_model *g_model; /* stories260K, F32 weights */

/* Under ThreadSanitizer (the CI's third build, which looks for races) the
 * Q4_0 twins of the batch-invariance and cache tests are skipped, said
 * so: they run the same threads over other kernels, 60 of the TSan run's
 * 90 s; the Release and ASan builds run them. tu_skip, not cmocka's bare
 * skip(): the program then exits 77 and ctest shows it as skipped, not
 * as passed. */
#if defined(__SANITIZE_THREAD__)
#define SKIP_UNDER_TSAN() tu_skip("the Q4_0 twin under ThreadSanitizer: the Release and ASan builds run it")
#else
#define SKIP_UNDER_TSAN() ((void)0)
#endif
static kt_model *g_tok;   /* the model requests are tokenized for */

static int setup(void **state) {
    (void)state;
    kt_error err = {0};
    g_model = kt_model_load(tu_shared("models/stories260K.gguf"), &err);
    if (!g_model) fprintf(stderr, "%s\n", err.msg);
    return g_model ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    kt_model_free(g_model);
    return 0;
}

static bool g_no_cache; /* engines made by engine_on have no prefix cache */

static kt_engine *engine_on(kt_model *m, int n_parallel, int batch_tokens, kt_kv_type kv, float stretch) {
    kt_engine_params p = kt_engine_defaults();
    p.prefix_cache = !g_no_cache;
    p.n_ctx = 256;
    p.n_parallel = n_parallel;
    p.batch_tokens = batch_tokens;
    p.kv_type = kv;
    p.n_threads = 2;
    p.max_itl_stretch = stretch;
    kt_error err = {0};
    kt_engine *e = kt_engine_new(m, &p, &err);
    if (!e) fprintf(stderr, "%s\n", err.msg);
    assert_non_null(e);
    return e;
}

static kt_engine *engine(int n_parallel, int batch_tokens, kt_kv_type kv, float stretch) {
    return engine_on(g_model, n_parallel, batch_tokens, kv, stretch);
}

/* Text to tokens with BOS. */
static int tokenize(const char *text, int32_t *ids, int cap) {
    kt_error err = {0};
    int n = kt_tokenize(g_tok ? g_tok : g_model, text, strlen(text), ids, cap, true, &err);
    assert_true(n > 0 && n <= cap);
    return n;
}

/* What one choice produced. */
typedef struct output {
    int32_t tokens[MAX_OUT];
    float logprobs[MAX_OUT];
    int n;
    char text[4096];
    kt_finish finish;
} output;

static kt_request *submit_with(kt_engine *e, const char *prompt, int max_tokens, int n_choices,
                               float temperature, uint64_t seed) {
    int32_t ids[256];
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids;
    p.n_prompt = tokenize(prompt, ids, 256);
    p.max_tokens = max_tokens;
    p.n_choices = n_choices;
    p.top_logprobs = 2;
    p.sampling.temperature = temperature;
    p.sampling.seed = seed;
    kt_request *r = NULL;
    kt_error err = {0};
    if (kt_engine_submit(e, &p, &r, &err) != KT_OK) fail_msg("%s", err.msg);
    return r;
}

static kt_request *submit(kt_engine *e, const char *prompt, int max_tokens, int n_choices) {
    return submit_with(e, prompt, max_tokens, n_choices, 0.0f, 0);
}

/* A request that runs until cancelled: ignore_eos, and max_tokens (0) up
 * to the context's end. */
static kt_request *submit_long(kt_engine *e, const int32_t *ids, int n, int n_choices) {
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids, p.n_prompt = n, p.n_choices = n_choices, p.ignore_eos = true;
    kt_request *r = NULL;
    kt_error err = {0};
    if (kt_engine_submit(e, &p, &r, &err) != KT_OK) fail_msg("%s", err.msg);
    return r;
}

static kt_engine_stats stats_of(kt_engine *e) {
    kt_engine_stats st;
    kt_engine_get_stats(e, &st);
    return st;
}

/* Reads every event of r into out[choice] until it finishes. */
static void drain(kt_request *r, output *out) {
    kt_event ev;
    int rc;
    while ((rc = kt_request_wait(r, &ev, WAIT_MS)) == 1) {
        output *o = &out[ev.choice];
        if (ev.token >= 0) {
            assert_true(o->n < MAX_OUT);
            assert_true(ev.has_logprob);
            assert_int_equal(ev.logprob.token, ev.token);
            o->logprobs[o->n] = ev.logprob.logprob;
            o->tokens[o->n++] = ev.token;
        }
        assert_true(strlen(o->text) + ev.text_len < sizeof o->text);
        strcat(o->text, ev.text);
        if (ev.finish != KT_FINISH_NONE) {
            assert_int_equal(o->finish, KT_FINISH_NONE);
            o->finish = ev.finish;
        }
    }
    assert_int_equal(rc, -1); /* finished, not timed out */
}

static void run_alone(kt_engine *e, const char *prompt, int max_tokens, output *out) {
    memset(out, 0, sizeof *out);
    kt_request *r = submit(e, prompt, max_tokens, 1);
    drain(r, out);
    kt_request_free(r);
}

/* Greedy tokens from a plain kt_session, the reference. */
static int session_greedy(const char *prompt, int max_tokens, int32_t *out) {
    int32_t ids[256];
    int n = tokenize(prompt, ids, 256);
    kt_error err = {0};
    kt_session *s = kt_session_new(g_model, &(kt_session_params){.n_ctx = 256, .n_threads = 2}, &err);
    assert_non_null(s);
    int nv = kt_model_describe(g_model)->n_vocab;
    float *logits = tu_xmalloc(sizeof(float) * (size_t)nv);
    assert_int_equal(kt_session_eval(s, ids, n, logits, false, &err), KT_OK);
    int k = 0;
    while (k < max_tokens) {
        int32_t best = 0;
        for (int i = 1; i < nv; i++) best = logits[i] > logits[best] ? i : best;
        if (kt_token_is_eog(g_model, best)) break;
        out[k++] = best;
        if (k == max_tokens) break;
        assert_int_equal(kt_session_eval(s, &best, 1, logits, false, &err), KT_OK);
    }
    free(logits);
    kt_session_free(s);
    return k;
}

static const char *PROMPTS[16] = {
    "Once upon a time", "Lily had a red ball", "The cat sat on the mat", "Tom was sad because",
    "One day, a little bird", "The sun was hot and", "Mom said to Ben", "There was a big tree",
    "The dog ran to the park", "Sue liked to paint", "A boy found a box", "The fish swam fast",
    "It was a rainy day", "Max and Mia played", "The king had a crown", "At night the stars",
};

/* With F32 KV the engine's paged attention does the session's arithmetic
 * exactly, so greedy tokens match a plain session's. */
static void test_engine_matches_session(void **state) {
    (void)state;
    kt_engine *e = engine(4, 64, KT_KV_F32, 0.0f);
    for (int i = 0; i < 3; i++) {
        int32_t ref[64];
        int n_ref = session_greedy(PROMPTS[i], 40, ref);
        output o;
        run_alone(e, PROMPTS[i], 40, &o);
        assert_int_equal(o.n, n_ref);
        assert_memory_equal(o.tokens, ref, sizeof(int32_t) * (size_t)n_ref);
        assert_true(o.finish == KT_FINISH_LENGTH || o.finish == KT_FINISH_STOP);
        assert_true(strlen(o.text) > 0);
    }
    kt_engine_free(e);
}

/* 16 concurrent greedy requests give each request's tokens and logprobs
 * alone, bit for bit (F16 KV, chunked prefill on), each n_gen tokens. */
static void check_batch_invariance_16(kt_model *m, int n_gen) {
    kt_engine *e = engine_on(m, 16, 48, KT_KV_F16, 1.8f);
    static output alone[16], together[16];
    for (int i = 0; i < 16; i++) run_alone(e, PROMPTS[i], n_gen, &alone[i]);
    kt_request *r[16];
    memset(together, 0, sizeof together);
    /* all 16 wait before the first step, so they run together */
    kt_engine_hold(e, true);
    for (int i = 0; i < 16; i++) r[i] = submit(e, PROMPTS[i], n_gen, 1);
    kt_engine_hold(e, false);
    for (int i = 0; i < 16; i++) drain(r[i], &together[i]);
    int distinct = 0;
    for (int i = 0; i < 16; i++) {
        assert_true(alone[i].n > 0);
        assert_int_equal(together[i].n, alone[i].n);
        assert_memory_equal(together[i].tokens, alone[i].tokens, sizeof(int32_t) * (size_t)alone[i].n);
        assert_memory_equal(together[i].logprobs, alone[i].logprobs, sizeof(float) * (size_t)alone[i].n);
        assert_string_equal(together[i].text, alone[i].text);
        distinct += i > 0 && memcmp(alone[i].tokens, alone[0].tokens, sizeof(int32_t) * 4) != 0;
        kt_request_free(r[i]);
    }
    assert_true(distinct >= 8); /* the requests really are different */
    kt_engine_stats st;
    kt_engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_true(st.ttft.n >= 32 && st.itl.n > 0);
    /* and they really ran together: steps decoded all 16 at once */
    assert_int_equal(st.max_step_seqs, 16);
    assert_true(st.steps_multi_seq >= (uint64_t)(n_gen * 5 / 6)); /* 40 of 48 */
    kt_engine_free(e);
}

static void test_batch_invariance_16(void **state) {
    (void)state;
    check_batch_invariance_16(g_model, 48);
}

/* The same with Q4_0 weights: activations are quantized per token row,
 * and the GEMM tiles tokens, yet nothing leaks between rows. Under
 * AddressSanitizer 24 tokens a request instead of 48 (the same 16-row
 * steps, fewer of them; the F32 case above keeps 48), said on stdout. */
static void test_batch_invariance_16_q4_0(void **state) {
    (void)state;
    SKIP_UNDER_TSAN();
    kt_error err = {0};
    kt_model *m = kt_model_load(tu_shared("models/test-tiny-Q4_0.gguf"), &err);
    assert_non_null(m);
    g_tok = m;
    if (TU_SANITIZED) printf("  (ASan build: 24 tokens a request, not 48)\n");
    check_batch_invariance_16(m, TU_SANITIZED ? 24 : 48);
    g_tok = NULL;
    kt_model_free(m);
}

/* Q8_0 KV: runs, frees its blocks, and its first token's distribution is
 * close to F32 KV's (the prompt's K/V rounded to 8 bits). A model whose
 * head size is not a multiple of 32 cannot use it and says so. */
static void test_q8_0_kv(void **state) {
    (void)state;
    kt_error err = {0};
    kt_model *m = kt_model_load(tu_shared("models/test-tiny-Q8_0.gguf"), &err);
    assert_non_null(m);
    g_tok = m;
    kt_engine *f32 = engine_on(m, 4, 64, KT_KV_F32, 0.0f), *q8 = engine_on(m, 4, 64, KT_KV_Q8_0, 0.0f);
    int same_first = 0;
    for (int i = 0; i < 4; i++) {
        output a, b;
        run_alone(f32, PROMPTS[i], 8, &a);
        run_alone(q8, PROMPTS[i], 8, &b);
        assert_true(b.n > 0 && b.finish != KT_FINISH_ERROR);
        if (a.tokens[0] != b.tokens[0]) continue;
        same_first++;
        assert_true(fabsf(a.logprobs[0] - b.logprobs[0]) < 0.05f);
    }
    assert_true(same_first >= 3);
    kt_engine_stats st;
    kt_engine_get_stats(q8, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    kt_engine_free(f32);
    kt_engine_free(q8);
    g_tok = NULL;
    kt_model_free(m);
    /* stories260K: head size 8 */
    kt_engine_params p = kt_engine_defaults();
    p.kv_type = KT_KV_Q8_0;
    p.n_ctx = 64;
    assert_null(kt_engine_new(g_model, &p, &err));
    assert_non_null(strstr(err.msg, "multiple of 32"));
}

/* A prompt read in chunks of 8 tokens gives the tokens of one read whole. */
static void test_chunked_prefill_invariance(void **state) {
    (void)state;
    const char *long_prompt =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "sun with her friends. One day, she found a big red ball in the park";
    kt_engine *whole = engine(2, 200, KT_KV_F16, 0.0f), *chunked = engine(2, 10, KT_KV_F16, 0.0f);
    output a, b;
    run_alone(whole, long_prompt, 30, &a);
    run_alone(chunked, long_prompt, 30, &b);
    assert_true(a.n > 0);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.tokens, b.tokens, sizeof(int32_t) * (size_t)a.n);
    assert_memory_equal(a.logprobs, b.logprobs, sizeof(float) * (size_t)a.n);
    kt_engine_free(whole);
    kt_engine_free(chunked);
}

/* n = 3 greedy choices share the prompt and each equals n = 1. */
static void test_choices_share_prompt(void **state) {
    (void)state;
    kt_engine *e = engine(4, 64, KT_KV_F16, 0.0f);
    output one, three[3];
    run_alone(e, PROMPTS[0], 30, &one);
    memset(three, 0, sizeof three);
    kt_request *r = submit(e, PROMPTS[0], 30, 3);
    drain(r, three);
    kt_request_free(r);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(three[i].n, one.n);
        assert_memory_equal(three[i].tokens, one.tokens, sizeof(int32_t) * (size_t)one.n);
        assert_string_equal(three[i].text, one.text);
    }
    kt_engine_stats st;
    kt_engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    kt_engine_free(e);
}

/* n = 4 sampled choices (temperature 1): choice i equals a request of one
 * choice with seed + i, token for token. The prompt ends inside a KV
 * block, so the choices share that block and each must write into a copy
 * of it (copy-on-write): without the copies they would read each other's
 * K/V and drift apart from their single-choice twins. */
static void test_choices_sampled(void **state) {
    (void)state;
    kt_engine *e = engine(4, 64, KT_KV_F16, 0.0f);
    int32_t ids[256];
    assert_true(tokenize(PROMPTS[2], ids, 256) % 16 != 0);
    const uint64_t seed = 1234;
    static output alone[4], four[4];
    memset(alone, 0, sizeof alone), memset(four, 0, sizeof four);
    for (int i = 0; i < 4; i++) {
        kt_request *r = submit_with(e, PROMPTS[2], 40, 1, 1.0f, seed + (uint64_t)i);
        drain(r, &alone[i]);
        kt_request_free(r);
    }
    kt_request *r = submit_with(e, PROMPTS[2], 40, 4, 1.0f, seed);
    drain(r, four);
    kt_request_free(r);
    int differ = 0;
    for (int i = 0; i < 4; i++) {
        assert_true(alone[i].n > 0);
        assert_int_equal(four[i].n, alone[i].n);
        assert_memory_equal(four[i].tokens, alone[i].tokens, sizeof(int32_t) * (size_t)alone[i].n);
        assert_memory_equal(four[i].logprobs, alone[i].logprobs, sizeof(float) * (size_t)alone[i].n);
        assert_string_equal(four[i].text, alone[i].text);
        differ += i > 0 && strcmp(alone[i].text, alone[0].text) != 0;
    }
    assert_true(differ >= 2); /* sampling really did choose differently */
    assert_int_equal(stats_of(e).kv_blocks_used, 0);
    kt_engine_free(e);
}

/* The default KV pool holds n_parallel full contexts, and that many
 * single-choice requests of a full context (max_tokens unset) run at once:
 * one choice needs no copy-on-write block. */
static void test_parallel_full_context(void **state) {
    (void)state;
    kt_engine *e = engine(4, 64, KT_KV_F16, 0.0f);
    int32_t ids[20];
    for (int i = 0; i < 20; i++) ids[i] = 1 + i;
    kt_engine_hold(e, true);
    kt_request *r[4];
    for (int i = 0; i < 4; i++) r[i] = submit_long(e, ids, 20, 1);
    kt_engine_run_steps(e, 1);
    kt_engine_stats st = stats_of(e);
    assert_int_equal(st.queue_depth, 0);
    assert_int_equal(st.requests_running, 4);
    assert_int_equal(st.running, 4);
    assert_int_equal(st.kv_blocks_reserved, st.kv_blocks_total); /* 4 x 256 / 16 */
    assert_int_equal(st.kv_blocks_total, 4 * 256 / 16);
    for (int i = 0; i < 4; i++) kt_request_free(r[i]);
    kt_engine_run_steps(e, 1);
    st = stats_of(e);
    assert_int_equal(st.requests_running, 0);
    assert_int_equal(st.kv_blocks_reserved, 0);
    assert_int_equal(st.kv_blocks_used, 0);
    kt_engine_hold(e, false);
    kt_engine_free(e);
}

/* Stop strings cut the text before them, even when they span tokens, and
 * the choice ends with "stop"; no part of the stop string is output. */
static void test_stop_strings(void **state) {
    (void)state;
    kt_engine *e = engine(4, 64, KT_KV_F16, 0.0f);
    output full;
    run_alone(e, PROMPTS[0], 60, &full);
    size_t len = strlen(full.text);
    assert_true(len > 20);
    /* a stop string from the middle of the text, 5 bytes straddling tokens */
    char stop[8];
    size_t at = len / 2;
    memcpy(stop, full.text + at, 5);
    stop[5] = 0;
    size_t first = (size_t)(strstr(full.text, stop) - full.text);
    int32_t ids[256];
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids;
    p.n_prompt = tokenize(PROMPTS[0], ids, 256);
    p.max_tokens = 60;
    const char *stops[2] = {"zzzzqqq", stop};
    p.stop = stops;
    p.n_stop = 2;
    kt_request *r = NULL;
    kt_error err = {0};
    assert_int_equal(kt_engine_submit(e, &p, &r, &err), KT_OK);
    output o;
    memset(&o, 0, sizeof o);
    p.top_logprobs = -1;
    kt_event ev;
    int rc;
    while ((rc = kt_request_wait(r, &ev, WAIT_MS)) == 1) {
        strcat(o.text, ev.text);
        if (ev.finish) o.finish = ev.finish;
    }
    assert_int_equal(rc, -1);
    assert_int_equal(o.finish, KT_FINISH_STOP);
    assert_int_equal(strlen(o.text), first);
    assert_memory_equal(o.text, full.text, first);
    kt_request_free(r);
    kt_engine_free(e);
}

/* Events until the request has finished: how many choices ended
 * cancelled. */
static int drain_cancelled(kt_request *r) {
    kt_event ev;
    int rc, cancelled = 0;
    while ((rc = kt_request_poll(r, &ev)) == 1) cancelled += ev.finish == KT_FINISH_CANCELLED;
    assert_int_equal(rc, -1); /* finished: the step that reaped it has run */
    return cancelled;
}

/* The engine is back to empty: no request, sequence, block or reservation. */
static void assert_empty(kt_engine *e) {
    kt_engine_stats st = stats_of(e);
    assert_int_equal(st.queue_depth, 0);
    assert_int_equal(st.requests_running, 0);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.kv_blocks_reserved, 0);
}

/* Cancels r; the next step must end all its n choices as cancelled and
 * leave the engine empty. Frees r. */
static void cancel_to_empty(kt_engine *e, kt_request *r, int n) {
    kt_request_cancel(r);
    kt_engine_run_steps(e, 1);
    assert_int_equal(drain_cancelled(r), n);
    assert_empty(e);
    kt_request_free(r);
}

/* Cancelling at each stage (queued, prefilling, decoding, and a request
 * freed unread) ends it with "cancelled" in the next step and gives back
 * its blocks and its reservation. One sequence at a time and 16-token
 * steps, so a second request queues and a 100-token prompt takes 7 steps. */
static void test_cancel_stages(void **state) {
    (void)state;
    kt_engine_params prm = kt_engine_defaults();
    prm.n_ctx = 256, prm.n_parallel = 2, prm.batch_tokens = 16, prm.n_threads = 2;
    kt_error err = {0};
    kt_engine *e = kt_engine_new(g_model, &prm, &err);
    assert_non_null(e);
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = 1 + (i * 7) % 500;
    kt_engine_hold(e, true);

    /* prefilling, n = 2: the shared prompt and the choices' reservation */
    kt_request *a = submit_long(e, ids, 100, 2);
    kt_request *q = submit_long(e, ids, 10, 1); /* queued: two sequences are running */
    kt_engine_run_steps(e, 2);
    kt_engine_stats st = stats_of(e);
    assert_int_equal(st.requests_running, 1);
    assert_int_equal(st.queue_depth, 1);
    assert_int_equal(st.prompt_tokens, 32);
    assert_true(st.kv_blocks_reserved > 0 && st.kv_blocks_used == 2);
    assert_int_equal(st.generated_tokens, 0);

    /* queued */
    kt_request_cancel(q);
    kt_engine_run_steps(e, 1);
    assert_int_equal(drain_cancelled(q), 1);
    assert_int_equal(stats_of(e).queue_depth, 0);
    assert_int_equal(stats_of(e).requests_running, 1);
    kt_request_free(q);

    /* prefilling */
    assert_int_equal(stats_of(e).generated_tokens, 0);
    cancel_to_empty(e, a, 2);

    /* decoding */
    a = submit_long(e, ids, 10, 2);
    kt_engine_run_steps(e, 3);
    assert_true(stats_of(e).generated_tokens >= 4);
    assert_int_equal(stats_of(e).requests_running, 1);
    cancel_to_empty(e, a, 2);

    /* freed without reading, while prefilling: the engine lets go by itself */
    a = submit_long(e, ids, 100, 1);
    kt_engine_run_steps(e, 1);
    assert_int_equal(stats_of(e).requests_running, 1);
    kt_request_free(a);
    kt_engine_run_steps(e, 1);
    assert_empty(e);

    kt_engine_hold(e, false);
    kt_engine_free(e);
}

/* With one sequence at a time, the waiting request of higher priority
 * starts first; a full queue says busy. */
static void test_priority_and_busy(void **state) {
    (void)state;
    kt_engine_params prm = kt_engine_defaults();
    prm.n_ctx = 256, prm.n_parallel = 1, prm.batch_tokens = 64, prm.queue_max = 2, prm.n_threads = 2;
    kt_error err = {0};
    kt_engine *e = kt_engine_new(g_model, &prm, &err);
    assert_non_null(e);
    int32_t ids[64];
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids;
    p.n_prompt = tokenize(PROMPTS[3], ids, 64);
    p.max_tokens = 120;
    p.ignore_eos = true;
    p.top_logprobs = 0;
    kt_request *running = NULL, *low = NULL, *high = NULL, *extra = NULL;
    kt_engine_hold(e, true); /* low and high both wait before either can start */
    assert_int_equal(kt_engine_submit(e, &p, &running, &err), KT_OK);
    kt_engine_run_steps(e, 2);
    assert_int_equal(stats_of(e).requests_running, 1); /* it is running */
    p.max_tokens = 5;
    p.priority = 0;
    assert_int_equal(kt_engine_submit(e, &p, &low, &err), KT_OK);
    p.priority = 5;
    assert_int_equal(kt_engine_submit(e, &p, &high, &err), KT_OK);
    assert_int_equal(kt_engine_submit(e, &p, &extra, &err), KT_ERR_BUSY);
    assert_null(extra);
    assert_non_null(strstr(err.msg, "busy"));
    kt_engine_hold(e, false);
    output o[2];
    memset(o, 0, sizeof o);
    drain(high, &o[0]);
    drain(low, &o[1]);
    /* high went first though it came later */
    kt_request_usage ul = kt_request_get_usage(low), uh = kt_request_get_usage(high);
    assert_true(uh.done_ns > 0 && ul.first_token_ns > 0);
    assert_true(ul.first_token_ns > uh.done_ns);
    kt_request_free(high);
    kt_request_free(low);
    kt_request_free(running);
    kt_engine_free(e);
}

/* Bad requests get errors that say what is wrong, with the numbers. */
static void test_errors(void **state) {
    (void)state;
    kt_engine *e = engine(2, 64, KT_KV_F16, 0.0f);
    int32_t *ids = tu_xmalloc(sizeof(int32_t) * 300);
    for (int i = 0; i < 300; i++) ids[i] = 1 + i % 100;
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids;
    p.n_prompt = 300;
    kt_request *r = NULL;
    kt_error err = {0};
    assert_int_equal(kt_engine_submit(e, &p, &r, &err), KT_ERR_CONTEXT);
    assert_non_null(strstr(err.msg, "300"));
    assert_non_null(strstr(err.msg, "256"));
    /* max_tokens past the room left is cut to it: the reply ends at the
     * context's end, "length" */
    p.n_prompt = 100;
    p.max_tokens = 200;
    p.ignore_eos = true, p.top_logprobs = 0;
    assert_int_equal(kt_engine_submit(e, &p, &r, &err), KT_OK);
    output cut = {0};
    drain(r, &cut);
    assert_int_equal(cut.n, 156);
    assert_int_equal(cut.finish, KT_FINISH_LENGTH);
    kt_request_free(r), r = NULL;
    p.ignore_eos = false;
    p.max_tokens = 10;
    ids[5] = 99999;
    assert_int_equal(kt_engine_submit(e, &p, &r, &err), KT_ERR_ARG);
    assert_non_null(strstr(err.msg, "99999"));
    ids[5] = 1;
    p.n_choices = 0;
    assert_int_equal(kt_engine_submit(e, &p, &r, &err), KT_ERR_ARG);
    p.n_choices = 1;
    const char *empty[1] = {""};
    p.stop = empty, p.n_stop = 1;
    assert_int_equal(kt_engine_submit(e, &p, &r, &err), KT_ERR_ARG);
    assert_null(r);
    free(ids);
    kt_engine_free(e);
}

/* strict_max_tokens: a max_tokens past the room left is refused, naming
 * the numbers, as a context error on the max_tokens field; one that fits
 * runs. A small pool cuts max_tokens to what it holds by default. */
static void test_strict_max_tokens(void **state) {
    (void)state;
    kt_engine_params ep = kt_engine_defaults();
    ep.n_ctx = 256, ep.n_parallel = 2, ep.batch_tokens = 64, ep.n_threads = 2, ep.strict_max_tokens = true;
    kt_error err = {0};
    kt_engine *e = kt_engine_new(g_model, &ep, &err);
    assert_non_null(e);
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = 1 + i % 50;
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids, p.n_prompt = 100, p.max_tokens = 200, p.top_logprobs = 0;
    kt_request *r = NULL;
    kt_gen_field field = KT_FIELD_NONE;
    assert_int_equal(kt_engine_submit_ex(e, &p, &r, &err, &field), KT_ERR_CONTEXT);
    assert_int_equal(field, KT_FIELD_MAX_TOKENS);
    assert_non_null(strstr(err.msg, "max_tokens 200"));
    assert_non_null(strstr(err.msg, "156"));
    assert_null(r);
    p.max_tokens = 156;
    assert_int_equal(kt_engine_submit(e, &p, &r, &err), KT_OK);
    output o = {0};
    drain(r, &o);
    kt_request_free(r);
    const size_t block_bytes = stats_of(e).kv_block_bytes;
    kt_engine_free(e);
    /* a pool of 4 blocks (64 positions) under a 256 context: max_tokens is
     * cut to what the pool holds, 64 - 10 */
    ep.strict_max_tokens = false, ep.prefix_cache = false, ep.n_parallel = 1;
    ep.kv_bytes = 4 * block_bytes;
    assert_non_null(e = kt_engine_new(g_model, &ep, &err));
    assert_int_equal(stats_of(e).kv_blocks_total, 4);
    p.n_prompt = 10, p.max_tokens = 200, p.ignore_eos = true;
    assert_int_equal(kt_engine_submit(e, &p, &r, &err), KT_OK);
    output small = {0};
    drain(r, &small);
    assert_int_equal(small.n, 54);
    assert_int_equal(small.finish, KT_FINISH_LENGTH);
    kt_request_free(r);
    kt_engine_free(e);
}

/* Shutting down with requests in flight ends them as cancelled; clients
 * can still read and free them. */
static void test_shutdown_in_flight(void **state) {
    (void)state;
    kt_engine *e = engine(2, 64, KT_KV_F16, 0.0f);
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kt_engine_hold(e, true);
    kt_request *r = submit_long(e, ids, 8, 1), *queued = submit_long(e, ids, 8, 2);
    kt_engine_run_steps(e, 3); /* r decodes; queued waits (n_parallel 2) */
    assert_true(stats_of(e).generated_tokens >= 2);
    assert_int_equal(stats_of(e).queue_depth, 1);
    kt_engine_free(e);
    kt_event ev;
    int rc, cancelled = 0, tokens = 0;
    while ((rc = kt_request_poll(r, &ev)) == 1) cancelled += ev.finish == KT_FINISH_CANCELLED, tokens += ev.token >= 0;
    assert_int_equal(rc, -1);
    assert_int_equal(cancelled, 1);
    assert_true(tokens >= 2);
    assert_int_equal(drain_cancelled(queued), 2);
    kt_request_free(r);
    kt_request_free(queued);
}

/* ---- the prefix cache ---- */

/* Token ids of a story-like prompt of about n tokens (the same for the
 * same seed), so requests can share prefixes of known lengths. */
static int story_ids(int32_t *ids, int n, uint32_t seed) {
    ids[0] = kt_model_describe(g_tok ? g_tok : g_model)->bos_id;
    for (int i = 1; i < n; i++) ids[i] = 3 + (int32_t)((seed * 2654435761u + (uint32_t)i * 40503u) % 400u);
    return n;
}

typedef struct run_opts {
    int max_tokens, n_choices;
    float temperature;
} run_opts;

/* Runs ids to completion; returns the usage (cached_tokens). */
static kt_request_usage run_ids(kt_engine *e, const int32_t *ids, int n, run_opts o, output *out) {
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids, p.n_prompt = n, p.max_tokens = o.max_tokens, p.n_choices = o.n_choices;
    p.top_logprobs = 2, p.ignore_eos = true;
    p.sampling.temperature = o.temperature, p.sampling.seed = 99;
    kt_request *r = NULL;
    kt_error err = {0};
    if (kt_engine_submit(e, &p, &r, &err) != KT_OK) fail_msg("%s", err.msg);
    memset(out, 0, sizeof *out * (size_t)o.n_choices);
    drain(r, out);
    kt_request_usage u = kt_request_get_usage(r);
    kt_request_free(r);
    return u;
}

static void assert_same_output(const output *a, const output *b) {
    assert_true(a->n > 0);
    assert_int_equal(a->n, b->n);
    assert_memory_equal(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n);
    assert_memory_equal(a->logprobs, b->logprobs, sizeof(float) * (size_t)a->n);
    assert_string_equal(a->text, b->text);
}

/* A prompt served from the cache gives the cold engine's tokens and
 * logprob bits: greedy and sampled with n = 3 (from `first`: 1, sampled
 * only), whole and chunked prefill. */
static void check_cache_exact(kt_model *m, int first) {
    g_tok = m;
    g_no_cache = true;
    kt_engine *cold = engine_on(m, 4, 64, KT_KV_F16, 0.0f);
    g_no_cache = false;
    kt_engine *warm = engine_on(m, 4, 64, KT_KV_F16, 0.0f), *chunked = engine_on(m, 4, 12, KT_KV_F16, 0.0f);
    int32_t ids[120];
    int n = story_ids(ids, 100, 1);
    const run_opts opts[2] = {{24, 1, 0.0f}, {24, 3, 1.0f}};
    for (int k = first; k < 2; k++) {
        static output ref[3], out[3];
        kt_request_usage u = run_ids(cold, ids, n, opts[k], ref);
        assert_int_equal(u.cached_tokens, 0);
        kt_engine *engines[2] = {warm, chunked};
        for (int w = 0; w < 2; w++) {
            run_ids(engines[w], ids, n, opts[k], out); /* fills the cache (the second round hits too) */
            u = run_ids(engines[w], ids, n, opts[k], out);
            /* 6 whole blocks and 3 positions of the first run's tail block
             * (copied before the 100th token, prefilled, is written) */
            assert_int_equal(u.cached_tokens, 99);
            for (int i = 0; i < opts[k].n_choices; i++) assert_same_output(&ref[i], &out[i]);
        }
    }
    kt_engine_stats st = stats_of(warm);
    assert_true(st.cached_prompt_tokens >= (uint64_t)((first ? 1 : 3) * 99)); /* each round hits; the second also the first's */
    assert_true(st.kv_blocks_cached > 0);
    assert_int_equal(st.kv_blocks_used, 0);
    kt_engine_free(cold), kt_engine_free(warm), kt_engine_free(chunked);
    g_tok = NULL;
}

static void test_cache_exact(void **state) {
    (void)state;
    check_cache_exact(g_model, 0);
}

static void test_cache_exact_q4_0(void **state) {
    (void)state;
    SKIP_UNDER_TSAN();
    kt_error err = {0};
    kt_model *m = kt_model_load(tu_shared("models/test-tiny-Q4_0.gguf"), &err);
    assert_non_null(m);
    /* under AddressSanitizer the sampled n = 3 round only: the greedy one
     * repeats its model paths (the F32 case above runs both) */
    if (TU_SANITIZED) printf("  (ASan build: the sampled n = 3 round only)\n");
    check_cache_exact(m, TU_SANITIZED ? 1 : 0);
    kt_model_free(m);
}

/* Turn 2 sends turn 1's prompt, its reply (the sampled ids) and more: it
 * hits the KV of the prompt and of the generated tokens, and its output
 * equals a cold engine's. */
static void test_cache_next_turn(void **state) {
    (void)state;
    g_no_cache = true;
    kt_engine *cold = engine(2, 64, KT_KV_F16, 0.0f);
    g_no_cache = false;
    kt_engine *e = engine(2, 64, KT_KV_F16, 0.0f);
    int32_t ids[200];
    int n = story_ids(ids, 40, 2);
    static output o1[1], o2[1], ref[1];
    run_ids(e, ids, n, (run_opts){30, 1, 0.0f}, o1);
    assert_int_equal(o1->n, 30);
    memcpy(ids + n, o1->tokens, sizeof(int32_t) * 30);
    int n2 = n + 30 + story_ids(ids + n + 30, 20, 3);
    kt_request_usage u = run_ids(e, ids, n2, (run_opts){16, 1, 0.0f}, o2);
    /* turn 1 computed 40 + 29 positions: 4 whole blocks of 16 and 5
     * positions of its tail block */
    assert_int_equal(u.cached_tokens, 69);
    run_ids(cold, ids, n2, (run_opts){16, 1, 0.0f}, ref);
    assert_same_output(ref, o2);
    kt_engine_free(cold), kt_engine_free(e);
}

/* The pool against the memory available (mem_limit standing in for the
 * machine's): a default pool larger than it is cut to it and still
 * serves (the stats say what it would have taken), a --kv-mb above it
 * and a single context larger than it are refused naming the flag. */
static void test_kv_fits_memory(void **state) {
    (void)state;
    kt_engine *e = engine(4, 64, KT_KV_DEFAULT, 0.0f);
    const kt_engine_stats full = stats_of(e);
    kt_engine_free(e);
    kt_engine_params p = kt_engine_defaults(); /* engine()'s, with a memory limit */
    p.n_ctx = 256, p.n_parallel = 4, p.batch_tokens = 64, p.n_threads = 2;
    kt_error err = {0};
    assert_int_equal(full.kv_wanted_bytes, 0);
    p.mem_limit = full.kv_pool_bytes / 2; /* half of 4 contexts: 2 fit */
    e = kt_engine_new(g_model, &p, &err);
    if (!e) fail_msg("%s", err.msg);
    const kt_engine_stats cut = stats_of(e);
    assert_int_equal(cut.kv_wanted_bytes, full.kv_pool_bytes);
    assert_true(cut.kv_pool_bytes <= p.mem_limit && cut.kv_blocks_total == full.kv_blocks_total / 2);
    output o;
    run_alone(e, PROMPTS[0], 20, &o);
    assert_int_equal(o.n, 20);
    kt_engine_free(e);
    p.kv_bytes = p.mem_limit + 1;
    assert_null(kt_engine_new(g_model, &p, &err));
    assert_int_equal(err.status, KT_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "--kv-mb"));
    p.kv_bytes = 0, p.mem_limit = full.kv_pool_bytes / 8; /* half a context */
    assert_null(kt_engine_new(g_model, &p, &err));
    assert_non_null(strstr(err.msg, "lower --ctx"));
}

/* Greedy tokens of ids from a plain kt_session of model m (one block of
 * the whole context: every layer keeps every position), EOS ignored. */
static void session_greedy_ids(kt_model *m, const int32_t *ids, int n, int max_tokens, int32_t *out) {
    kt_error err = {0};
    kt_session *s = kt_session_new(m, &(kt_session_params){.n_ctx = 512, .n_threads = 2, .kv_type = KT_KV_F32}, &err);
    assert_non_null(s);
    int nv = kt_model_describe(m)->n_vocab;
    float *logits = tu_xmalloc(sizeof(float) * (size_t)nv);
    assert_int_equal(kt_session_eval(s, ids, n, logits, false, &err), KT_OK);
    for (int k = 0; k < max_tokens; k++) {
        int32_t best = 0;
        for (int i = 1; i < nv; i++) best = logits[i] > logits[best] ? i : best;
        out[k] = best;
        if (k + 1 < max_tokens) assert_int_equal(kt_session_eval(s, &best, 1, logits, false, &err), KT_OK);
    }
    free(logits);
    kt_session_free(s);
}

/* Sliding-window layers in the paged pool (golden Gemma 2 and Gemma 3
 * files, window 64, prompts and replies of several windows): the window
 * layers keep fewer block slots than the pool has blocks; a request gives
 * the session's tokens (which keeps every position) exactly, with chunked
 * prefill across windows; and (with `turns`) the next turn resumes from
 * the cache where the finished turn's window rows are still there, and
 * after other requests have taken those slots back resumes only as far
 * as the window rows allow and still gives a cold engine's tokens. */
static void check_window_layers(const char *path, bool turns) {
    kt_error err = {0};
    kt_model *m = kt_model_load(tu_shared(path), &err);
    if (!m) fail_msg("%s", err.msg);
    kt_model *saved_tok = g_tok;
    g_tok = m; /* story_ids' BOS */
    kt_engine_params p = kt_engine_defaults();
    p.n_ctx = 320, p.n_parallel = 1, p.batch_tokens = 16, p.kv_type = KT_KV_F32, p.n_threads = 2;
    kt_engine *e = kt_engine_new(m, &p, &err), *cold = NULL;
    p.prefix_cache = false;
    cold = kt_engine_new(m, &p, &err);
    assert_non_null(e);
    assert_non_null(cold);
    kt_engine_stats st = stats_of(e);
    /* 320 positions: 20 blocks; window slots: 2 spans of
     * ceil((64 + 16) / 16) + 3 = 8, fewer than the 18 blocks of the
     * first request, which so must give slots back as it goes */
    assert_int_equal(st.kv_blocks_total, 20);
    assert_int_equal(st.kv_window_slots_total, 16);
    assert_true(st.kv_pool_bytes < st.kv_block_bytes * (size_t)st.kv_blocks_total);

    int32_t ids[320], ref[180];
    int n = story_ids(ids, 100, 5);
    static output o1[1], o2[1], o3[1], cold_out[1];
    run_ids(e, ids, n, (run_opts){180, 1, 0.0f}, o1);
    session_greedy_ids(m, ids, n, 180, ref);
    assert_int_equal(o1->n, 180);
    assert_memory_equal(o1->tokens, ref, sizeof(int32_t) * 180);
    assert_int_equal(stats_of(e).kv_window_slots_used, 0); /* finished: its slots are idle or free */
    if (turns) {
        memcpy(ids + n, o1->tokens, sizeof(int32_t) * 180);
        int n2 = n + 180 + story_ids(ids + n + 180, 12, 6);
        kt_request_usage u = run_ids(e, ids, n2, (run_opts){16, 1, 0.0f}, o2);
        assert_int_equal(u.cached_tokens, n + 179); /* every computed position: the window rows were there */
        run_ids(cold, ids, n2, (run_opts){16, 1, 0.0f}, cold_out);
        assert_same_output(cold_out, o2);
        /* two other prompts (cached as they go, 20 blocks) churn through all 16 slots */
        for (int i = 0; i < 2; i++) {
            int32_t other[160];
            static output x[1];
            run_ids(e, other, story_ids(other, 150, 20 + (uint32_t)i), (run_opts){2, 1, 0.0f}, x);
        }
        u = run_ids(e, ids, n2, (run_opts){16, 1, 0.0f}, o3);
        print_message("%s: next turn after churn resumes at %d of %d positions\n", path, u.cached_tokens, n2);
        assert_true(u.cached_tokens < n + 179); /* here 1: the BOS, inside a block another prompt left */
        assert_same_output(cold_out, o3);
    }
    g_tok = saved_tok;
    kt_engine_free(cold), kt_engine_free(e);
    kt_model_free(m);
}

static void test_window_layers(void **state) {
    (void)state;
    check_window_layers("golden/arch/gemma3-F16.gguf", true);
    check_window_layers("golden/arch/gemma2-F16.gguf", false); /* its soft-caps through the paged pool */
    check_window_layers("golden/arch/gpt-oss-F16.gguf", true); /* alternating 64-token windows, sinks, YaRN */
}

/* Four requests that share a 96-token prefix, admitted in one step: the
 * first computes it, the others wait for it and take it from the cache
 * (not four computations of the same KV), and all four give a cold
 * engine's output. */
static void test_cache_shared_prefix_once(void **state) {
    (void)state;
    g_no_cache = true;
    kt_engine *cold = engine(4, 64, KT_KV_F16, 0.0f);
    g_no_cache = false;
    kt_engine *e = engine(4, 64, KT_KV_F16, 1.8f);
    static int32_t ids[4][120];
    static output ref[4], out[4];
    kt_request *r[4];
    kt_engine_hold(e, true);
    for (int i = 0; i < 4; i++) {
        story_ids(ids[i], 96, 5);
        story_ids(ids[i] + 96, 8, (uint32_t)(50 + i));
        kt_gen_params p = kt_gen_defaults();
        p.prompt = ids[i], p.n_prompt = 104, p.max_tokens = 12, p.top_logprobs = 2, p.ignore_eos = true;
        kt_error err = {0};
        if (kt_engine_submit(e, &p, &r[i], &err) != KT_OK) fail_msg("%s", err.msg);
    }
    kt_engine_hold(e, false);
    memset(out, 0, sizeof out);
    for (int i = 0; i < 4; i++) {
        drain(r[i], &out[i]);
        kt_request_usage u = kt_request_get_usage(r[i]);
        assert_int_equal(u.cached_tokens, i == 0 ? 0 : 96);
        kt_request_free(r[i]);
        run_ids(cold, ids[i], 104, (run_opts){12, 1, 0.0f}, &ref[i]);
        assert_same_output(&ref[i], &out[i]);
    }
    kt_engine_stats st = stats_of(e);
    assert_int_equal(st.prompt_tokens, 104 + 3 * 8);
    assert_int_equal(st.cached_prompt_tokens, 3 * 96);
    kt_engine_free(cold), kt_engine_free(e);
}

/* Under a steady stream of shorter prompts a long one is still prefilled:
 * least prompt left first alone would serve the shorter ones for as long
 * as they come; passed over 8 steps, the long one goes first. Three
 * sequences, 32-token steps, no ITL stretch: two 60-token prompts at a
 * time take every step's budget, and 20 of them wait, which alone would
 * hold the 200-token prompt back ~38 steps. With the rule its first token
 * comes after 8 steps passed over and 7 of its own. */
static void test_long_prompt_not_starved(void **state) {
    (void)state;
    enum { N_SHORT = 20 };
    kt_engine *e = engine(3, 32, KT_KV_F16, 0.0f);
    static int32_t long_ids[200], short_ids[N_SHORT][60];
    story_ids(long_ids, 200, 1);
    kt_engine_hold(e, true);
    kt_gen_params p = kt_gen_defaults();
    p.prompt = long_ids, p.n_prompt = 200, p.max_tokens = 1;
    kt_request *lr = NULL, *sr[N_SHORT];
    kt_error err = {0};
    if (kt_engine_submit(e, &p, &lr, &err) != KT_OK) fail_msg("%s", err.msg);
    for (int i = 0; i < N_SHORT; i++) {
        p.prompt = short_ids[i], p.n_prompt = story_ids(short_ids[i], 60, 100 + (uint32_t)i);
        if (kt_engine_submit(e, &p, &sr[i], &err) != KT_OK) fail_msg("%s", err.msg);
    }
    int step = 0;
    kt_event ev;
    for (bool first = false; !first && step < 60; step++) {
        kt_engine_run_steps(e, 1);
        while (!first && kt_request_poll(lr, &ev) == 1) first = ev.token >= 0;
    }
    uint64_t done = stats_of(e).requests_finished[KT_FINISH_LENGTH]; /* the long one's too */
    print_message("the long prompt's first token after %d steps, %llu requests done\n", step,
                  (unsigned long long)done);
    assert_true(step <= 20);
    assert_true(done < N_SHORT / 2); /* the stream of short ones was still going */
    kt_engine_hold(e, false);
    kt_request_free(lr);
    for (int i = 0; i < N_SHORT; i++) kt_request_free(sr[i]);
    kt_engine_free(e);
}

/* ---- scheduling prefill beside decoding streams (engine.c's rule) ----
 * The engine's costs are fixed (kt_engine_fix_costs): a decode step 10 ms,
 * a prefill token 1 ms, stretch 2, so a step's prefill allowance is 10 ms
 * = 10 tokens, and with a 100 ms stall a remainder of up to 110 tokens
 * goes in whole. 64-token steps; two streams decode throughout. */
#define SCHED_DECODE_MS 10.0
#define SCHED_TOKEN_MS 1.0
#define SCHED_ALLOWANCE_TOKENS 10 /* (2 - 1) x 10 ms / 1 ms */
#define SCHED_STALL_MS 100.0f

typedef struct sched {
    kt_engine *e;
    kt_request *streams[2];
    int32_t prefix[100], stream_ids[2][8];
    uint64_t prompt_tokens;
} sched;

static kt_request *submit_prompt(kt_engine *e, const int32_t *ids, int n, int max_tokens) {
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids, p.n_prompt = n, p.max_tokens = max_tokens, p.ignore_eos = true;
    kt_request *r = NULL;
    kt_error err = {0};
    if (kt_engine_submit(e, &p, &r, &err) != KT_OK) fail_msg("%s", err.msg);
    return r;
}

/* An engine whose cache holds the 100-token prefix, held, with two
 * streams decoding. */
static void sched_start(sched *s, int n_parallel) {
    kt_engine_params p = kt_engine_defaults();
    p.n_ctx = 256, p.n_parallel = n_parallel, p.batch_tokens = 64, p.n_threads = 2;
    p.max_itl_stretch = 2.0f, p.max_stall_ms = SCHED_STALL_MS;
    kt_error err = {0};
    s->e = kt_engine_new(g_model, &p, &err);
    if (!s->e) fail_msg("%s", err.msg);
    kt_engine_fix_costs(s->e, SCHED_DECODE_MS, SCHED_TOKEN_MS, SCHED_TOKEN_MS);
    static output o[1];
    run_ids(s->e, s->prefix, story_ids(s->prefix, 100, 11), (run_opts){2, 1, 0.0f}, o);
    kt_engine_hold(s->e, true);
    for (int i = 0; i < 2; i++)
        s->streams[i] = submit_long(s->e, s->stream_ids[i], story_ids(s->stream_ids[i], 8, 20 + (uint32_t)i), 1);
    kt_engine_run_steps(s->e, 2); /* their prompts (short: whole) and a first decode step */
    s->prompt_tokens = stats_of(s->e).prompt_tokens;
}

/* The streams' tokens so far. */
static int streams_tokens(sched *s) {
    int n = 0;
    for (int i = 0; i < 2; i++) n += kt_request_get_usage(s->streams[i]).completion_tokens;
    return n;
}

/* One step; returns its prefill tokens and checks the bounds: the step's
 * prefill costs at most the allowance and the stall, and each stream got
 * its token. */
static int sched_step(sched *s) {
    const int before = streams_tokens(s);
    kt_engine_run_steps(s->e, 1);
    const uint64_t now = stats_of(s->e).prompt_tokens;
    const int n = (int)(now - s->prompt_tokens);
    s->prompt_tokens = now;
    assert_true(n <= SCHED_ALLOWANCE_TOKENS + (int)SCHED_STALL_MS);
    assert_int_equal(streams_tokens(s), before + 2);
    return n;
}

static void sched_end(sched *s) {
    kt_engine_hold(s->e, false);
    for (int i = 0; i < 2; i++) kt_request_free(s->streams[i]);
    kt_engine_free(s->e);
}

/* A request's first token, if one came (its events are read). */
static bool first_token_came(kt_request *r) {
    kt_event ev;
    bool got = false;
    while (kt_request_poll(r, &ev) == 1) got = got || ev.token >= 0;
    return got;
}

/* An agent's next turn: the 100-token prefix cached (the first run's
 * reply token's KV too), 60 tokens to prefill. Beside the streams it goes
 * in whole, in the step that admits it, and its first token comes from
 * that step (by the stretch alone: 6 steps). */
static void test_cached_turn_whole(void **state) {
    (void)state;
    static sched s;
    sched_start(&s, 3);
    static int32_t turn[160];
    memcpy(turn, s.prefix, sizeof s.prefix);
    story_ids(turn + 100, 60, 12);
    kt_request *r = submit_prompt(s.e, turn, 160, 4);
    assert_int_equal(sched_step(&s), 60);
    assert_true(first_token_came(r));
    assert_int_equal(kt_request_get_usage(r).cached_tokens, 100);
    kt_request_free(r);
    sched_end(&s);
}

/* A whole prompt is costed at what large steps cost a token, chunks at
 * what chunks do: with one-token chunks at 2 ms and large steps at 1 ms a
 * token, the 60-token next turn (120 ms as chunks, past the 110 ms the
 * stall leaves) goes in whole at 60 ms. */
static void test_whole_costed_as_large_steps(void **state) {
    (void)state;
    static sched s;
    sched_start(&s, 3);
    kt_engine_fix_costs(s.e, SCHED_DECODE_MS, 2.0 * SCHED_TOKEN_MS, SCHED_TOKEN_MS);
    static int32_t turn[160];
    memcpy(turn, s.prefix, sizeof s.prefix);
    story_ids(turn + 100, 60, 15);
    kt_request *r = submit_prompt(s.e, turn, 160, 4);
    kt_engine_run_steps(s.e, 1);
    assert_int_equal(stats_of(s.e).prompt_tokens - s.prompt_tokens, 60);
    assert_true(first_token_came(r));
    kt_request_free(r);
    sched_end(&s);
}

/* A long cold prompt beside the streams is read in chunks of the stretch
 * while its remainder costs more than the stall allows (199 - 9 x 10 =
 * 109 <= 110; its BOS is cached), then the rest whole: 62 + 47 tokens
 * (the step's room). */
static void test_long_prompt_chunked(void **state) {
    (void)state;
    static sched s;
    sched_start(&s, 3);
    static int32_t cold[200];
    story_ids(cold, 200, 13);
    kt_request *r = submit_prompt(s.e, cold, 200, 4);
    for (int i = 0; i < 9; i++) {
        assert_int_equal(sched_step(&s), SCHED_ALLOWANCE_TOKENS);
        assert_false(first_token_came(r));
    }
    assert_int_equal(sched_step(&s), 62);
    assert_false(first_token_came(r));
    assert_int_equal(kt_request_get_usage(r).cached_tokens, 1);
    assert_int_equal(sched_step(&s), 47);
    assert_true(first_token_came(r));
    kt_request_free(r);
    sched_end(&s);
}

/* Three next turns at once (60 tokens each to prefill): one goes in
 * whole each step (two would cost 120 ms, past the 110 the stretch and
 * the stall allow), so their first tokens come at steps 1, 2 and 3 (by
 * the stretch alone, 6, 12 and 18), the streams getting a token every
 * step. */
static void test_cached_turns_whole_in_turn(void **state) {
    (void)state;
    static sched s;
    sched_start(&s, 5);
    static int32_t turn[3][160];
    kt_request *r[3];
    for (int i = 0; i < 3; i++) {
        memcpy(turn[i], s.prefix, sizeof s.prefix);
        story_ids(turn[i] + 100, 60, 30 + (uint32_t)i);
        r[i] = submit_prompt(s.e, turn[i], 160, 64);
    }
    int first_step[3] = {0, 0, 0}, n_done = 0;
    for (int step = 1; step <= 30 && n_done < 3; step++) {
        sched_step(&s);
        for (int i = 0; i < 3; i++)
            if (!first_step[i] && first_token_came(r[i])) first_step[i] = step, n_done++;
    }
    print_message("next turns' first tokens at steps %d, %d, %d\n", first_step[0], first_step[1], first_step[2]);
    assert_int_equal(first_step[0], 1);
    assert_int_equal(first_step[1], 2);
    assert_int_equal(first_step[2], 3);
    for (int i = 0; i < 3; i++) kt_request_free(r[i]);
    sched_end(&s);
}

/* Next turns keep coming, one whole every step, while a long cold prompt
 * waits: passed over 8 steps, it goes
 * first and gets its chunk every step, so its first
 * token comes (200 tokens at >= 4 a step, most at 8) while the turns go
 * on being served. */
static void test_long_prompt_not_starved_by_turns(void **state) {
    (void)state;
    static sched s;
    sched_start(&s, 4);
    static int32_t cold[200], turn[40][140];
    story_ids(cold, 200, 14);
    kt_request *lr = submit_prompt(s.e, cold, 200, 1), *tr = NULL;
    int n_turns = 0, step = 0;
    bool long_first = false;
    for (step = 1; step <= 80 && !long_first; step++) {
        if (!tr && n_turns < 40) {
            memcpy(turn[n_turns], s.prefix, sizeof s.prefix);
            story_ids(turn[n_turns] + 100, 40, 40 + (uint32_t)n_turns);
            tr = submit_prompt(s.e, turn[n_turns++], 140, 1);
        }
        sched_step(&s);
        long_first = first_token_came(lr);
        if (tr && first_token_came(tr)) kt_request_free(tr), tr = NULL; /* the next one comes */
    }
    print_message("the long prompt's first token after %d steps, beside %d next turns\n", step - 1, n_turns);
    assert_true(long_first && step - 1 <= 50);
    assert_true(n_turns >= 5);
    kt_request_free(tr);
    kt_request_free(lr);
    sched_end(&s);
}

/* Waiting requests of one priority: one whose prompt the cache holds goes
 * before one that arrived earlier with nothing cached, but never more than
 * 4 times in a row (no starvation). One sequence at a time. */
static void test_cache_hits_first(void **state) {
    (void)state;
    kt_engine_params prm = kt_engine_defaults();
    prm.n_ctx = 256, prm.n_parallel = 1, prm.batch_tokens = 64, prm.n_threads = 2;
    kt_error err = {0};
    kt_engine *e = kt_engine_new(g_model, &prm, &err);
    assert_non_null(e);
    static int32_t warm[120], cold[120], hit[6][120];
    story_ids(warm, 100, 7);
    static output o[8];
    run_ids(e, warm, 100, (run_opts){4, 1, 0.0f}, o); /* the cache holds 96 of its tokens */
    kt_engine_hold(e, true);
    int32_t first[8];
    story_ids(first, 8, 9);
    kt_request *running = submit_long(e, first, 8, 1);
    kt_engine_run_steps(e, 1); /* running holds the only sequence */
    story_ids(cold, 100, 8);
    kt_gen_params p = kt_gen_defaults();
    p.max_tokens = 2, p.ignore_eos = true, p.top_logprobs = 0; /* drain() reads logprobs */
    p.prompt = cold, p.n_prompt = 100;
    kt_request *a = NULL, *h[6];
    assert_int_equal(kt_engine_submit(e, &p, &a, &err), KT_OK);
    for (int i = 0; i < 6; i++) {
        memcpy(hit[i], warm, sizeof(int32_t) * 96);
        story_ids(hit[i] + 96, 8, (uint32_t)(30 + i));
        p.prompt = hit[i], p.n_prompt = 104;
        assert_int_equal(kt_engine_submit(e, &p, &h[i], &err), KT_OK);
    }
    kt_request_free(running); /* frees the sequence: the queue moves */
    kt_engine_hold(e, false);
    memset(o, 0, sizeof o);
    drain(a, &o[0]);
    for (int i = 0; i < 6; i++) drain(h[i], &o[1 + i]);
    uint64_t ta = kt_request_get_usage(a).first_token_ns, th[6];
    for (int i = 0; i < 6; i++) th[i] = kt_request_get_usage(h[i]).first_token_ns;
    for (int i = 0; i < 4; i++) assert_true(th[i] < ta); /* four hits go first */
    assert_true(ta < th[4] && ta < th[5]);                 /* then the one passed over */
    kt_request_free(a);
    for (int i = 0; i < 6; i++) kt_request_free(h[i]);
    kt_engine_free(e);
}

/* 12 concurrent requests in 3 groups sharing long prefixes (and each its
 * own tail), twice over, with a pool too small to keep everything: every
 * output equals a cold engine's (no request is ever served another's KV),
 * the cache gives back idle blocks under pressure, and all blocks come
 * back. */
static void test_cache_concurrent(void **state) {
    (void)state;
    g_no_cache = true;
    kt_engine *cold = engine(4, 64, KT_KV_F16, 0.0f);
    g_no_cache = false;
    kt_engine_params prm = kt_engine_defaults();
    prm.n_ctx = 256, prm.n_parallel = 8, prm.batch_tokens = 48, prm.n_threads = 2;
    kt_error err = {0};
    kt_engine *e = kt_engine_new(g_model, &prm, &err);
    assert_non_null(e);
    /* 40 blocks: 3 or 4 requests' worst case at once, and no room to keep
     * every prefix, so idle cached blocks must be taken back */
    prm.kv_bytes = 40 * stats_of(e).kv_block_bytes;
    kt_engine_free(e);
    e = kt_engine_new(g_model, &prm, &err);
    assert_non_null(e);
    assert_int_equal(stats_of(e).kv_blocks_total, 40);
    enum { N = 12 };
    static int32_t ids[N][160];
    static output ref[N], out[N];
    int n[N];
    for (int i = 0; i < N; i++) {
        int shared = story_ids(ids[i], 80 + 16 * (i % 3), (uint32_t)(10 + i % 3));
        n[i] = shared + story_ids(ids[i] + shared, 20 + i, (uint32_t)(100 + i)) ;
        run_ids(cold, ids[i], n[i], (run_opts){20, 1, 0.0f}, &ref[i]);
    }
    for (int round = 0; round < 2; round++) {
        kt_request *r[N];
        memset(out, 0, sizeof out);
        for (int i = 0; i < N; i++) {
            kt_gen_params p = kt_gen_defaults();
            p.prompt = ids[i], p.n_prompt = n[i], p.max_tokens = 20, p.top_logprobs = 2, p.ignore_eos = true;
            if (kt_engine_submit(e, &p, &r[i], &err) != KT_OK) fail_msg("%s", err.msg);
        }
        for (int i = 0; i < N; i++) {
            drain(r[i], &out[i]);
            kt_request_free(r[i]);
            assert_same_output(&ref[i], &out[i]);
        }
    }
    kt_engine_stats st = stats_of(e);
    printf("concurrent: %llu prompt tokens from the cache, %llu prefilled, %llu blocks evicted\n",
           (unsigned long long)st.cached_prompt_tokens, (unsigned long long)st.prompt_tokens,
           (unsigned long long)st.cache_evicted_blocks);
    assert_true(st.cached_prompt_tokens >= 64); /* hits, though not all can */
    assert_true(st.cache_evicted_blocks > 0);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.kv_blocks_reserved, 0);
    kt_engine_free(cold), kt_engine_free(e);
}

/* KT_ENGINE_BENCH=MODEL ./test_engine: aggregate decode tokens/s with
 * 1..16 concurrent greedy streams (not a test; figures for
 * docs/PERFORMANCE.md). The window is from the moment every stream has its
 * first token to the moment the first one ends: all decode together. */
/* ---- lazy grammars (tool calls under tool_choice auto) ---- */

/* Greedy from "Once upon a time" with trigger `trig` and its grammar. */
static void run_triggered_ex(kt_engine *e, const char *trig, const char *gbnf, int max_segments, const char *think_open,
                             const char *think_close, bool in_thinking, output *out) {
    int32_t ids[64];
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids;
    p.n_prompt = tokenize("Once upon a time", ids, 64);
    p.max_tokens = 60;
    p.top_logprobs = 0;
    const char *triggers[1] = {trig}, *grammars[1] = {gbnf};
    p.triggers = triggers, p.trigger_grammars = grammars, p.n_triggers = 1, p.max_segments = max_segments;
    p.think_open = think_open, p.think_close = think_close, p.in_thinking = in_thinking;
    kt_request *r = NULL;
    kt_error err = {0};
    if (kt_engine_submit(e, &p, &r, &err) != KT_OK) fail_msg("%s", err.msg);
    memset(out, 0, sizeof *out);
    drain(r, out);
    kt_request_free(r);
}

static void run_triggered(kt_engine *e, const char *trig, const char *gbnf, int max_segments, output *out) {
    run_triggered_ex(e, trig, gbnf, max_segments, NULL, NULL, false, out);
}

/* Text is free until the trigger appears; then the trigger's grammar
 * holds, taking the bytes of the triggering token past the trigger, and
 * the reply ends when the grammar does (max_segments 1) or watches again
 * (0). A trigger whose token runs into text the grammar refuses does not
 * start it: the output is the free one. */
static void test_lazy_grammar(void **state) {
    (void)state;
    kt_engine *e = engine(2, 64, KT_KV_F32, 0);
    output free_out, out;
    run_alone(e, "Once upon a time", 60, &free_out);
    /* a trigger that ends inside a token: the first two letters of the
     * first word of 4+ letters after the first few */
    const char *t = free_out.text + 10, *w = NULL;
    for (; *t; t++) {
        if (t[0] == ' ' && strspn(t + 1, "abcdefghijklmnopqrstuvwxyz") >= 4) {
            w = t + 1;
            break;
        }
    }
    assert_non_null(w);
    char trig[3] = {w[0], w[1], 0};
    const char *first = strstr(free_out.text, trig);
    size_t before = (size_t)(first - free_out.text);
    run_triggered(e, trig, "root ::= [a-z]{0,12} \"!\"", 1, &out);
    if (strncmp(out.text, free_out.text, before + 2))
        fail_msg("free text before the trigger changed:\n%s\n%s", out.text, free_out.text);
    const char *after = out.text + before + 2;
    assert_int_equal(strspn(after, "abcdefghijklmnopqrstuvwxyz") + 1, strlen(after));
    assert_int_equal(after[strlen(after) - 1], '!');
    assert_int_equal(out.finish, KT_FINISH_STOP);
    /* the grammar refuses what follows the trigger in its token: no start */
    run_triggered(e, trig, "root ::= \"!\"", 1, &out);
    assert_string_equal(out.text, free_out.text);
    /* no limit: back to free text after each segment, triggered again */
    run_triggered(e, trig, "root ::= [a-z]{0,12} \"!\"", 0, &out);
    assert_true(strncmp(out.text, free_out.text, before + 2) == 0);
    assert_non_null(strchr(out.text, '!'));
    assert_int_equal(out.finish, KT_FINISH_LENGTH);
    /* inside thinking a trigger is not watched: opened by the reply's first
     * bytes, or by the prompt, and never closed */
    char open[4] = {free_out.text[0], free_out.text[1], free_out.text[2], 0};
    if (!strstr(open, trig)) {
        run_triggered_ex(e, trig, "root ::= [a-z]{0,12} \"!\"", 1, open, "@@never@@", false, &out);
        assert_string_equal(out.text, free_out.text);
    }
    run_triggered_ex(e, trig, "root ::= [a-z]{0,12} \"!\"", 1, "@@open@@", "@@never@@", true, &out);
    assert_string_equal(out.text, free_out.text);
    /* closed before the trigger: watched again */
    char close[3] = {free_out.text[before - 2], free_out.text[before - 1], 0};
    run_triggered_ex(e, trig, "root ::= [a-z]{0,12} \"!\"", 1, "@@open@@", close, true, &out);
    if (strstr(free_out.text, close) == free_out.text + before - 2) assert_int_equal(out.text[strlen(out.text) - 1], '!');
    /* a trigger grammar that does not parse is refused at submit */
    int32_t ids[8];
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids, p.n_prompt = tokenize("Once", ids, 8);
    const char *triggers[1] = {"x"}, *grammars[1] = {"root ::= ("};
    p.triggers = triggers, p.trigger_grammars = grammars, p.n_triggers = 1;
    kt_request *r = NULL;
    kt_error err = {0};
    kt_gen_field field = KT_FIELD_NONE;
    assert_int_equal(kt_engine_submit_ex(e, &p, &r, &err, &field), KT_ERR_ARG);
    assert_int_equal(field, KT_FIELD_GRAMMAR);
    assert_non_null(strstr(err.msg, "trigger"));
    kt_engine_free(e);
}

static int bench(const char *path, int n_threads) {
    kt_error err = {0};
    kt_model *m = kt_model_load_ex(path, KT_LOAD_COPY, &err);
    if (!m) return fprintf(stderr, "%s\n", err.msg), 1;
    kt_engine_params p = kt_engine_defaults();
    p.n_ctx = 512, p.n_parallel = 16, p.n_threads = n_threads;
    p.max_itl_stretch = 0.0f; /* every prompt in at once: a clean decode window */
    kt_engine *e = kt_engine_new(m, &p, &err);
    if (!e) return fprintf(stderr, "%s\n", err.msg), 1;
    int32_t prompt[32];
    int nv = kt_model_describe(m)->n_vocab;
    double single = 0.0;
    printf("| streams | decode t/s (aggregate) | per stream | vs 1 stream |\n|---|---|---|---|\n");
    for (int streams = 1; streams <= 16; streams *= 2) {
        kt_request *r[16];
        for (int i = 0; i < streams; i++) {
            for (int k = 0; k < 32; k++) prompt[k] = 1 + (i * 131 + k * 17) % (nv - 1);
            kt_gen_params g = kt_gen_defaults();
            g.prompt = prompt, g.n_prompt = 32, g.max_tokens = 64, g.ignore_eos = true;
            if (kt_engine_submit(e, &g, &r[i], &err) != KT_OK) return fprintf(stderr, "%s\n", err.msg), 1;
        }
        static uint64_t t[16][64];
        int n[16] = {0};
        for (int i = 0; i < streams; i++) {
            kt_event ev;
            while (kt_request_wait(r[i], &ev, -1) == 1)
                if (ev.token >= 0 && n[i] < 64) t[i][n[i]++] = ev.t_ns;
            kt_request_free(r[i]);
        }
        uint64_t start = 0, end = UINT64_MAX;
        for (int i = 0; i < streams; i++) {
            start = t[i][0] > start ? t[i][0] : start;
            end = t[i][n[i] - 1] < end ? t[i][n[i] - 1] : end;
        }
        long tokens = 0;
        for (int i = 0; i < streams; i++)
            for (int k = 0; k < n[i]; k++) tokens += t[i][k] > start && t[i][k] <= end;
        double tps = end > start ? tokens / ((end - start) / 1e9) : 0.0;
        if (streams == 1) single = tps;
        printf("| %d | %.1f | %.1f | %.2fx |\n", streams, tps, tps / streams, single > 0 ? tps / single : 0.0);
        fflush(stdout);
    }
    kt_engine_free(e);
    kt_model_free(m);
    return 0;
}


/* ---- embeddings ---- */

#define EMBD 64 /* stories260K's n_embd */

/* The pooled vector of ids (one request, waited for). */
static void embed_ids(kt_engine *e, const int32_t *ids, int n, kt_pooling pooling, float *out, int *cached) {
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids, p.n_prompt = n, p.embed = pooling;
    kt_request *r = NULL;
    kt_error err = {0};
    if (kt_engine_submit(e, &p, &r, &err) != KT_OK) fail_msg("%s", err.msg);
    output o = {0};
    drain(r, &o);
    assert_int_equal(o.finish, KT_FINISH_STOP);
    assert_int_equal(o.n, 0); /* nothing generated */
    int n_embd = 0;
    const float *v = kt_request_embedding(r, &n_embd);
    assert_non_null(v);
    assert_int_equal(n_embd, EMBD);
    memcpy(out, v, sizeof(float) * EMBD);
    if (cached) *cached = kt_request_get_usage(r).cached_tokens;
    kt_request_free(r);
}

static float max_diff(const float *a, const float *b, int n) {
    float d = 0;
    for (int i = 0; i < n; i++) d = fmaxf(d, fabsf(a[i] - b[i]));
    return d;
}

/* The last hidden state is what the classifier reads: output.weight times
 * the last token's embedding gives llama.cpp's logits for that position. */
static void test_embed_is_classifier_input(void **state) {
    (void)state;
    kt_engine *e = engine(4, 64, KT_KV_F32, 1.8f);
    const int32_t ids[] = {1, 403, 407, 261, 378}; /* golden/stories260K.once.json's prompt */
    float last[EMBD];
    embed_ids(e, ids, 5, KT_POOL_LAST, last, NULL);
    kt_error err = {0};
    gguf_file *f = gguf_open(tu_shared("models/stories260K.gguf"), &err);
    assert_non_null(f);
    const gguf_tensor *w = gguf_tensor_find(f, "output.weight");
    assert_true(w && w->type == KT_F32 && w->dims[0] == EMBD && w->dims[1] == 512);
    size_t size = 0;
    float *golden = (float *)tu_read_file(tu_shared("golden/stories260K.once.logits.f32"), &size);
    assert_true(golden && size >= 5 * 512 * sizeof(float));
    float worst = 0;
    for (int v = 0; v < 512; v++) {
        double logit = 0;
        for (int i = 0; i < EMBD; i++) logit += (double)((const float *)w->data)[(size_t)v * EMBD + i] * last[i];
        worst = fmaxf(worst, fabsf((float)logit - golden[4 * 512 + v]));
    }
    if (worst > 1e-4f) fail_msg("logits from the embedding differ from llama.cpp's by %g", worst);
    free(golden);
    gguf_close(f);
    kt_engine_free(e);
}

/* Causal attention: token k's hidden state is the last-token embedding of
 * the prompt cut after k. So CLS is LAST of the first token, and MEAN is
 * the mean of LAST over every prefix; chunked prefill (a 90-token prompt,
 * 32-token steps) and a prompt the prefix cache already holds change no
 * bit of it. */
static void test_embed_pooling(void **state) {
    (void)state;
    kt_engine *e = engine(4, 32, KT_KV_F32, 1.8f);
    int32_t ids[128];
    int n = tokenize("Once upon a time there was a little girl named Lily. She loved to play outside in the sun with "
                     "her red ball and her friend Tom, who had a dog called Max.", ids, 128);
    assert_true(n > 32 && n < 128);
    float mean[EMBD], cls[EMBD], last[EMBD], v[EMBD], sum[EMBD] = {0};
    int cached = -1;
    embed_ids(e, ids, n, KT_POOL_MEAN, mean, &cached);
    assert_int_equal(cached, 0);
    embed_ids(e, ids, n, KT_POOL_CLS, cls, NULL);
    embed_ids(e, ids, 1, KT_POOL_LAST, v, NULL);
    assert_true(max_diff(cls, v, EMBD) == 0);
    for (int k = 1; k <= n; k++) {
        embed_ids(e, ids, k, KT_POOL_LAST, v, NULL);
        for (int i = 0; i < EMBD; i++) sum[i] += v[i];
        if (k == n) memcpy(last, v, sizeof v);
    }
    for (int i = 0; i < EMBD; i++) sum[i] /= (float)n;
    if (max_diff(mean, sum, EMBD) > 1e-5f) fail_msg("mean pooling differs from the prefixes' mean by %g", max_diff(mean, sum, EMBD));
    /* a generation has put the prompt in the prefix cache: the embedding still computes every token, the same bits */
    output o;
    run_alone(e, "Once upon a time there was a little girl named Lily.", 4, &o);
    embed_ids(e, ids, n, KT_POOL_MEAN, v, &cached);
    assert_int_equal(cached, 0);
    assert_true(max_diff(mean, v, EMBD) == 0);
    embed_ids(e, ids, n, KT_POOL_LAST, v, NULL);
    assert_true(max_diff(last, v, EMBD) == 0);
    kt_engine_free(e);
}

/* Beside generations, an embedding is the same; the engine's limits. */
static void test_embed_batch_and_limits(void **state) {
    (void)state;
    kt_engine *e = engine(4, 64, KT_KV_F32, 1.8f);
    int32_t ids[256];
    int n = tokenize("Tom had a big red ball.", ids, 256);
    float alone[EMBD], busy[EMBD];
    embed_ids(e, ids, n, KT_POOL_MEAN, alone, NULL);
    kt_request *g1 = submit(e, "Once upon a time", 40, 1), *g2 = submit(e, "The cat sat", 40, 1);
    embed_ids(e, ids, n, KT_POOL_MEAN, busy, NULL);
    output o[2] = {0};
    drain(g1, &o[0]), drain(g2, &o[1]);
    kt_request_free(g1), kt_request_free(g2);
    assert_true(max_diff(alone, busy, EMBD) == 0);
    /* the whole context may be embedded; more is refused, and so are choices */
    for (int i = 0; i < 256; i++) ids[i] = 300;
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids, p.n_prompt = 256, p.embed = KT_POOL_MEAN;
    kt_request *r = NULL;
    kt_error err = {0};
    assert_int_equal(kt_engine_submit(e, &p, &r, &err), KT_OK);
    output full = {0};
    drain(r, &full);
    assert_int_equal(full.finish, KT_FINISH_STOP);
    kt_request_free(r);
    p.n_prompt = 257;
    assert_int_equal(kt_engine_submit(e, &p, &r, &err), KT_ERR_CONTEXT);
    assert_non_null(strstr(err.msg, "257 tokens"));
    p.n_prompt = 4, p.n_choices = 2;
    assert_int_equal(kt_engine_submit(e, &p, &r, &err), KT_ERR_ARG);
    kt_engine_free(e);
}

int main(void) {
    const char *bench_model = getenv("KT_ENGINE_BENCH");
    if (bench_model) {
        const char *t = getenv("KT_THREADS");
        return bench(bench_model, t ? atoi(t) : 2);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_matches_session),
        cmocka_unit_test(test_batch_invariance_16),
        cmocka_unit_test(test_batch_invariance_16_q4_0),
        cmocka_unit_test(test_chunked_prefill_invariance),
        cmocka_unit_test(test_q8_0_kv),
        cmocka_unit_test(test_choices_share_prompt),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_choices_sampled),
        cmocka_unit_test(test_parallel_full_context),
        cmocka_unit_test(test_cancel_stages),
        cmocka_unit_test(test_priority_and_busy),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_strict_max_tokens),
        cmocka_unit_test(test_shutdown_in_flight),
        cmocka_unit_test(test_cache_exact),
        cmocka_unit_test(test_cache_exact_q4_0),
        cmocka_unit_test(test_cache_next_turn),
        cmocka_unit_test(test_cache_concurrent),
        cmocka_unit_test(test_cache_shared_prefix_once),
        cmocka_unit_test(test_cache_hits_first),
        cmocka_unit_test(test_long_prompt_not_starved),
        cmocka_unit_test(test_cached_turn_whole),
        cmocka_unit_test(test_long_prompt_chunked),
        cmocka_unit_test(test_whole_costed_as_large_steps),
        cmocka_unit_test(test_cached_turns_whole_in_turn),
        cmocka_unit_test(test_long_prompt_not_starved_by_turns),
        cmocka_unit_test(test_lazy_grammar),
        cmocka_unit_test(test_window_layers),
        cmocka_unit_test(test_kv_fits_memory),
        cmocka_unit_test(test_embed_is_classifier_input),
        cmocka_unit_test(test_embed_pooling),
        cmocka_unit_test(test_embed_batch_and_limits),
    };
    return tu_result(cmocka_run_group_tests(tests, setup, teardown));
}
