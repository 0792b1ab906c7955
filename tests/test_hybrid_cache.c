/*
 * test_hybrid_cache.c - the prefix cache on a hybrid model (Qwen 3.5's
 * Gated DeltaNet + attention, the qwen3.5-tiny shape of `kettle
 * gen-model`, F32 and Q4_0 weights) through the engine: a warm cache
 * gives a cold engine's tokens and logprob bits for an agent's next turn,
 * a prompt that shares a long prefix, requests that arrive together, and
 * after the snapshots have been evicted, after a restart from the disk
 * tier; the snapshots stay within their budget. Speculation rolls the
 * recurrent state back exactly.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "testutil.h"

typedef tu_eng_out out;

static kt_model *g_f32, *g_q4;

static kt_model *make_model(const char *type) {
    char name[64], args[4096];
    snprintf(name, sizeof name, "hybrid-cache-%s.gguf", type);
    snprintf(args, sizeof args, "--shape qwen3.5-tiny --type %s --vocab %s", type, tu_shared("models/test-tiny-F16.gguf"));
    return tu_gen_model(KT_BIN, name, args);
}

static int setup(void **state) {
    (void)state;
    g_f32 = make_model("F32");
    g_q4 = make_model("Q4_0");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    kt_model_free(g_f32), kt_model_free(g_q4);
    return 0;
}

static kt_engine *engine_dir(kt_model *m, bool cache, int n_ctx, int batch_tokens, size_t state_bytes,
                             const char *dir) {
    kt_engine_params p = kt_engine_defaults();
    p.n_ctx = n_ctx, p.n_parallel = 4, p.batch_tokens = batch_tokens, p.n_threads = 2, p.kv_type = KT_KV_F32;
    p.prefix_cache = cache, p.state_cache_bytes = state_bytes, p.cache_dir = dir;
    kt_error err = {0};
    kt_engine *e = kt_engine_new(m, &p, &err);
    if (!e) fail_msg("%s", err.msg);
    return e;
}

static kt_engine *engine_of(kt_model *m, bool cache, int n_ctx, int batch_tokens, size_t state_bytes) {
    return engine_dir(m, cache, n_ctx, batch_tokens, state_bytes, NULL);
}

static kt_request *submit(kt_engine *e, const int32_t *ids, int n, int max_tokens, float temperature) {
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids, p.n_prompt = n, p.max_tokens = max_tokens, p.ignore_eos = true, p.top_logprobs = 0;
    p.sampling.temperature = temperature, p.sampling.seed = 1234;
    kt_request *r = NULL;
    kt_error err = {0};
    if (kt_engine_submit(e, &p, &r, &err) != KT_OK) fail_msg("%s", err.msg);
    return r;
}

/* Every token of r (one choice) into o: testutil's engine drain. */
static kt_request_usage drain(kt_request *r, out *o) {
    return tu_eng_drain(r, o, 1);
}

static kt_request_usage run(kt_engine *e, const int32_t *ids, int n, int max_tokens, float temperature, out *o) {
    return drain(submit(e, ids, n, max_tokens, temperature), o);
}

static void assert_same(const out *a, const out *b, const char *what) {
    if (a->n != b->n || memcmp(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n) ||
        memcmp(a->logprobs, b->logprobs, sizeof(float) * (size_t)a->n))
        fail_msg("%s: tokens or logprob bits differ from the cold engine's", what);
}

/* Token ids of the tiny vocabulary, from a seed. */
static void ids_of(int32_t *ids, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = 3 + (int32_t)((seed >> 33) % 250);
    }
}

static kt_engine_stats stats(kt_engine *e) {
    kt_engine_stats s;
    kt_engine_get_stats(e, &s);
    return s;
}

/* An agent's next turn (turn 1's prompt, its reply, a tool result) on a
 * warm cache: served from the snapshot at the end of turn 1's generation
 * (its last sampled token was never fed: prompt + reply - 1 positions),
 * with the cold engine's tokens and logprob bits, greedy and sampled,
 * whole and in chunks of 24 tokens a step. */
static void check_next_turn(kt_model *m) {
    kt_engine *cold = engine_of(m, false, 1024, 256, 0), *warm = engine_of(m, true, 1024, 256, 0);
    kt_engine *chunked = engine_of(m, true, 1024, 24, 0);
    const float temps[2] = {0.0f, 1.0f};
    for (int k = 0; k < 2; k++) {
        int32_t ids[400];
        ids_of(ids, 150, 10 + (uint64_t)k);
        static out o1, o2, ref;
        kt_engine *engines[2] = {warm, chunked};
        for (int w = 0; w < 2; w++) {
            run(engines[w], ids, 150, 30, temps[k], &o1);
            assert_int_equal(o1.n, 30);
            memcpy(ids + 150, o1.tokens, sizeof(int32_t) * 30);
            ids_of(ids + 180, 40, 99 + (uint64_t)k);
            kt_request_usage u = run(engines[w], ids, 220, 20, temps[k], &o2);
            assert_int_equal(u.cached_tokens, 179);
            run(cold, ids, 220, 20, temps[k], &ref);
            assert_same(&ref, &o2, temps[k] > 0 ? "the next turn, sampled" : "the next turn, greedy");
        }
    }
    kt_engine_stats s = stats(warm);
    assert_true(s.state_snapshot_hits >= 2);
    assert_true(s.state_snapshots > 0 && s.state_snapshots <= s.state_snapshots_max);
    assert_true(s.state_snapshot_bytes > 0);
    kt_engine_free(cold), kt_engine_free(warm), kt_engine_free(chunked);
}

static void test_next_turn_f32(void **state) {
    (void)state;
    check_next_turn(g_f32);
}

/* Under a sanitizer (memory errors, not wrong answers; ~10x slower) the
 * Q4_0 repetitions of the F32 cases' paths run in the optimized build
 * only, said on stdout (testutil.h's TU_SANITIZED). */
static void test_next_turn_q4_0(void **state) {
    (void)state;
    if (TU_SANITIZED) {
        printf("  sanitized build: the Q4_0 next turn runs in the optimized build only\n");
        return;
    }
    check_next_turn(g_q4);
}

/* A prompt sharing the first 600 positions of an earlier 700-position
 * one resumes from the snapshot its long prefill took at 512 (the
 * interval a budget of 8 snapshots gives a 1024 context), and another
 * identical one from its prompt's last block boundary (688). */
static void test_long_prefill_interval(void **state) {
    (void)state;
    kt_engine *cold = engine_of(g_f32, false, 1024, 256, 0), *warm = engine_of(g_f32, true, 1024, 256, 1);
    assert_int_equal(stats(warm).state_interval, 512);
    static int32_t a[700], b[700];
    ids_of(a, 700, 5);
    memcpy(b, a, sizeof(int32_t) * 600);
    ids_of(b + 600, 100, 6);
    static out o, ref;
    assert_int_equal(run(warm, a, 700, 4, 0.0f, &o).cached_tokens, 0);
    kt_request_usage u = run(warm, b, 700, 16, 0.0f, &o);
    assert_int_equal(u.cached_tokens, 512);
    run(cold, b, 700, 16, 0.0f, &ref);
    assert_same(&ref, &o, "a prompt sharing 600 positions");
    ids_of(b + 690, 10, 7);
    memcpy(b, a, sizeof(int32_t) * 690);
    u = run(warm, b, 700, 16, 0.0f, &o);
    assert_int_equal(u.cached_tokens, 688);
    run(cold, b, 700, 16, 0.0f, &ref);
    assert_same(&ref, &o, "a prompt sharing 690 positions");
    kt_engine_free(cold), kt_engine_free(warm);
}

/* Three requests sharing a 300-position prefix arrive together: the
 * later two wait for the first to compute it, which takes a snapshot at
 * the shared boundary for them, and all three give the cold engine's
 * bits. */
static void test_together(void **state) {
    (void)state;
    kt_engine *cold = engine_of(g_q4, false, 1024, 256, 0), *warm = engine_of(g_q4, true, 1024, 64, 0);
    static int32_t ids[3][400];
    for (int i = 0; i < 3; i++) {
        ids_of(ids[i], 300, 21);
        ids_of(ids[i] + 300, 60, 30 + (uint64_t)i);
    }
    kt_engine_hold(warm, true);
    kt_request *r[3];
    for (int i = 0; i < 3; i++) r[i] = submit(warm, ids[i], 360, 12, 0.0f);
    kt_engine_hold(warm, false);
    static out o[3], ref;
    int cached = 0;
    for (int i = 0; i < 3; i++) cached += drain(r[i], &o[i]).cached_tokens;
    for (int i = 0; i < 3; i++) {
        run(cold, ids[i], 360, 12, 0.0f, &ref);
        assert_same(&ref, &o[i], "a request beside two sharing its prefix");
    }
    assert_int_equal(cached, 2 * 288); /* the shared 300, in whole blocks */
    kt_engine_free(cold), kt_engine_free(warm);
}

/* With room for 8 snapshots, 12 conversations of 2 turns: the snapshots
 * of the first ones are evicted (least recently used first), their next
 * turns are computed again and still equal the cold engine's, the last
 * ones' next turns hit, and at no point are more than 8 snapshots held. */
static void test_after_eviction(void **state) {
    (void)state;
    kt_engine *cold = engine_of(g_f32, false, 1024, 256, 0), *warm = engine_of(g_f32, true, 1024, 256, 1);
    static int32_t ids[12][200];
    static out o, ref;
    for (int i = 0; i < 12; i++) {
        ids_of(ids[i], 100, 50 + (uint64_t)i);
        run(warm, ids[i], 100, 10, 0.0f, &o);
        memcpy(ids[i] + 100, o.tokens, sizeof(int32_t) * 10);
        ids_of(ids[i] + 110, 20, 80 + (uint64_t)i);
        kt_engine_stats s = stats(warm);
        assert_true(s.state_snapshots <= 8);
        assert_int_equal(s.state_snapshots_max, 8);
    }
    assert_true(stats(warm).state_snapshots_evicted > 0);
    kt_request_usage first = run(warm, ids[0], 130, 10, 0.0f, &o);
    run(cold, ids[0], 130, 10, 0.0f, &ref);
    assert_same(&ref, &o, "a next turn whose snapshot was evicted");
    kt_request_usage last = run(warm, ids[11], 130, 10, 0.0f, &o);
    run(cold, ids[11], 130, 10, 0.0f, &ref);
    assert_same(&ref, &o, "the last conversation's next turn");
    assert_true(first.cached_tokens < 100);
    assert_int_equal(last.cached_tokens, 109);
    kt_engine_free(cold), kt_engine_free(warm);
}

/* The disk tier keeps the snapshots of whole blocks: after a restart
 * with the same --cache-dir, the next turn resumes from the prompt's
 * last block boundary (read back from disk, blocks and state) with the
 * cold engine's bits; a state file with a flipped byte is rejected and
 * removed, and the turn is computed again, still exact. */
static void test_restart(void **state) {
    (void)state;
    char dir[2048], cmd[8300];
    snprintf(dir, sizeof dir, "%s", tu_tmp("hybrid-cache-dir"));
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    kt_engine *cold = engine_of(g_f32, false, 1024, 256, 0), *e = engine_dir(g_f32, true, 1024, 256, 0, dir);
    static int32_t ids[300];
    static out o, ref;
    ids_of(ids, 150, 77);
    run(e, ids, 150, 30, 0.0f, &o);
    memcpy(ids + 150, o.tokens, sizeof(int32_t) * 30);
    ids_of(ids + 180, 40, 78);
    kt_engine_free(e); /* the writes finish */
    run(cold, ids, 220, 16, 0.0f, &ref);
    e = engine_dir(g_f32, true, 1024, 256, 0, dir);
    kt_request_usage u = run(e, ids, 220, 16, 0.0f, &o);
    assert_int_equal(u.cached_tokens, 144);
    assert_same(&ref, &o, "the next turn after a restart");
    kt_engine_stats s = stats(e);
    assert_int_equal(s.disk_cached_prompt_tokens, 144);
    kt_engine_free(e);
    /* flip a byte of every state file */
    snprintf(cmd, sizeof cmd,
             "for f in '%s'/*/*.kvs; do printf '\\377' | dd of=\"$f\" bs=1 seek=100 conv=notrunc 2>/dev/null || exit 1; "
             "done; ls '%s'/*/*.kvs >/dev/null", dir, dir);
    assert_int_equal(system(cmd), 0);
    e = engine_dir(g_f32, true, 1024, 256, 0, dir);
    u = run(e, ids, 220, 16, 0.0f, &o);
    assert_int_equal(u.cached_tokens, 0);
    assert_same(&ref, &o, "the next turn after its state file was damaged");
    s = stats(e);
    assert_true(s.disk_rejected >= 1);
    kt_engine_free(e), kt_engine_free(cold);
}

/* ---- speculation: the recurrent state rolled back ---- */

typedef struct oracle {
    int32_t seq[600];
    int len;
    long spoiled;
} oracle;

/* The plain run's next k tokens, spoiled at a depth that varies with
 * the position (k: all right). */
static int oracle_propose(void *ctx, const int32_t *tokens, int n, int k, int32_t *out) {
    oracle *o = ctx;
    if (n >= o->len || memcmp(o->seq, tokens, sizeof *tokens * (size_t)n) != 0) {
        out[0] = tokens[n - 1];
        return 1;
    }
    const int got = o->len - n < k ? o->len - n : k;
    memcpy(out, o->seq + n, sizeof *out * (size_t)got);
    const int right = (int)(((unsigned)n * 2654435761u) >> 13) % (got + 1);
    if (right < got) out[right] = 3 + (out[right] + 1) % 250, o->spoiled++;
    return got;
}

/* Speculation on a hybrid model, greedy and sampled, F32 and Q4_0: the
 * proposals are plain decoding's own tokens spoiled at every depth, so
 * passes keep all, some or none of them, and every rejection rolls the
 * recurrent state back (restore, replay the kept tokens): the tokens and
 * logprob bits are plain decoding's, and the prefix cache's snapshots
 * taken after such steps give the next turn the cold bits. */
static void check_spec(kt_model *m) {
    static oracle o;
    const float temps[2] = {0.0f, 0.8f};
    for (int k = 0; k < 2; k++) {
        kt_engine *plain = engine_of(m, false, 1024, 256, 0);
        int32_t ids[400];
        ids_of(ids, 100, 300 + (uint64_t)k);
        static out ref, got;
        run(plain, ids, 100, 60, temps[k], &ref);
        memcpy(o.seq, ids, sizeof(int32_t) * 100);
        memcpy(o.seq + 100, ref.tokens, sizeof(int32_t) * (size_t)ref.n);
        o.len = 100 + ref.n, o.spoiled = 0;
        kt_engine_params p = kt_engine_defaults();
        p.n_ctx = 1024, p.n_parallel = 4, p.batch_tokens = 256, p.n_threads = 2, p.kv_type = KT_KV_F32;
        p.spec = KT_SPEC_NGRAM, p.spec_k_max = 6, p.spec_fixed_k = true, p.spec_propose = oracle_propose;
        p.spec_propose_ctx = &o;
        kt_error err = {0};
        kt_engine *spec = kt_engine_new(m, &p, &err);
        if (!spec) fail_msg("%s", err.msg);
        run(spec, ids, 100, 60, temps[k], &got);
        assert_same(&ref, &got, temps[k] > 0 ? "speculation, sampled" : "speculation, greedy");
        kt_engine_stats st = stats(spec);
        printf("  speculation at temperature %.1f: %llu proposed, %llu kept in %llu passes (%ld spoiled)\n",
               temps[k], (unsigned long long)st.spec_proposed, (unsigned long long)st.spec_accepted,
               (unsigned long long)st.spec_passes, o.spoiled);
        assert_true(st.spec_accepted > 0 && st.spec_accepted < st.spec_proposed && o.spoiled > 0);
        /* the next turn from the generation's snapshot */
        memcpy(ids + 100, got.tokens, sizeof(int32_t) * 60);
        ids_of(ids + 160, 20, 400 + (uint64_t)k);
        static out next, next_ref;
        kt_request_usage u = run(spec, ids, 180, 12, temps[k], &next);
        assert_int_equal(u.cached_tokens, 159);
        run(plain, ids, 180, 12, temps[k], &next_ref);
        assert_same(&next_ref, &next, "the next turn after speculation");
        kt_engine_free(spec), kt_engine_free(plain);
    }
}

static void test_spec_f32(void **state) {
    (void)state;
    check_spec(g_f32);
}

static void test_spec_q4_0(void **state) {
    (void)state;
    if (TU_SANITIZED) {
        printf("  sanitized build: Q4_0 speculation runs in the optimized build only\n");
        return;
    }
    check_spec(g_q4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_next_turn_f32),
        cmocka_unit_test(test_next_turn_q4_0),
        cmocka_unit_test(test_long_prefill_interval),
        cmocka_unit_test(test_together),
        cmocka_unit_test(test_after_eviction),
        cmocka_unit_test(test_restart),
        cmocka_unit_test(test_spec_f32),
        cmocka_unit_test(test_spec_q4_0),
    };
    return tu_result(cmocka_run_group_tests(tests, setup, teardown));
}
