/*
 * test_disk_cache.c - the prefix cache's disk tier (src/kv/disk_cache.h)
 * and the engine over it across restarts.
 *
 * Blocks carry a signature of (token, position, layer, K/V) in every row,
 * so a block read back can be checked value by value. Damaged files (a
 * truncated one, a flipped byte, another model's) must be skipped and
 * removed, never loaded; a write that fails (the file size limit standing
 * in for a full disk) must leave nothing behind; a kill -9 of a server
 * writing its cache must leave nothing a restart would load wrongly.
 * Sliding-window layers' rows travel only where a block still had them,
 * and a restarted Gemma engine resumes where they allow.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "kettle.h"
#include "kv/disk_cache.h"
#include "testutil.h"

#define BT 4
#define N_LAYER 2
#define KV_DIM 8

static const kv_pool_params LAYOUT = {.n_blocks = 16, .block_tokens = BT, .n_layer = N_LAYER, .kv_dim = KV_DIM,
                                       .type = KV_F32};

static float sig(int32_t token, int pos, int layer, int kind, int j) {
    return (float)token + 0.001f * (float)pos + 10.0f * (float)layer + 100.0f * (float)kind + 0.0001f * (float)j;
}

static void fill_block(kv_pool *p, int32_t id, const int32_t *ids) {
    for (int l = 0; l < N_LAYER; l++)
        for (int k = 0; k < 2; k++)
            for (int pos = 0; pos < BT; pos++) {
                float *row = kv_pool_row(p, id, l, (kv_kind)k, pos);
                for (int j = 0; j < KV_DIM; j++) row[j] = sig(ids[pos], pos, l, k, j);
            }
}

static void assert_block(kv_pool *p, int32_t id, const int32_t *ids) {
    for (int l = 0; l < N_LAYER; l++)
        for (int k = 0; k < 2; k++)
            for (int pos = 0; pos < BT; pos++) {
                const float *row = kv_pool_row(p, id, l, (kv_kind)k, pos);
                for (int j = 0; j < KV_DIM; j++)
                    if (row[j] != sig(ids[pos], pos, l, k, j)) fail_msg("layer %d kind %d pos %d differs", l, k, pos);
            }
}

/* A fresh directory for one test. */
static const char *fresh_dir(const char *name) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s", tu_tmp(name));
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    return dir;
}

static kv_disk *open_disk(const char *dir, size_t max_bytes, uint64_t fp) {
    kt_error err = {0};
    kv_disk *d = kv_disk_open(dir, max_bytes, fp, &LAYOUT, &err);
    if (!d) fail_msg("%s", err.msg);
    return d;
}

static kv_disk_stats stats(kv_disk *d) {
    kv_disk_stats s;
    kv_disk_get_stats(d, &s);
    return s;
}

typedef struct rig {
    kv_pool *pool;
    int32_t ids[4][BT];
    kv_disk_key key[4], parent[4];
} rig;

/* A pool and a chain of 4 blocks' ids and keys. */
static rig rig_new(void) {
    rig r;
    kt_error err = {0};
    r.pool = kv_pool_new(&LAYOUT, &err);
    assert_non_null(r.pool);
    kv_disk_key k = kv_disk_root();
    for (int b = 0; b < 4; b++) {
        for (int i = 0; i < BT; i++) r.ids[b][i] = 100 * b + i;
        r.parent[b] = k;
        r.key[b] = k = kv_disk_chain(k, r.ids[b], BT);
    }
    return r;
}

/* Writes block b of the chain through a pool block. */
static void put(rig *r, kv_disk *d, int b) {
    int32_t id;
    assert_int_equal(kv_pool_alloc(r->pool, &id, NULL), KT_OK);
    fill_block(r->pool, id, r->ids[b]);
    kv_disk_put(d, r->pool, id, r->key[b], r->parent[b], r->ids[b]);
    kv_pool_release(r->pool, id, NULL);
}

/* Reads block b back; true if it loaded (and then it is checked). */
static bool get(rig *r, kv_disk *d, int b) {
    int32_t id;
    assert_int_equal(kv_pool_alloc(r->pool, &id, NULL), KT_OK);
    bool ok = kv_disk_get(d, r->pool, id, r->key[b], r->parent[b], r->ids[b]);
    if (ok) assert_block(r->pool, id, r->ids[b]);
    kv_pool_release(r->pool, id, NULL);
    return ok;
}

/* The path of block b's file. */
static void block_path(const char *dir, uint64_t fp, kv_disk_key key, char *out, size_t cap) {
    snprintf(out, cap, "%s/%016llx/%016llx%016llx.kvb", dir, (unsigned long long)fp, (unsigned long long)key.hi,
             (unsigned long long)key.lo);
}

static void test_round_trip_and_restart(void **state) {
    (void)state;
    const char *dir = fresh_dir("disk-rt");
    rig r = rig_new();
    kv_disk *d = open_disk(dir, 1 << 20, 42);
    for (int b = 0; b < 3; b++) put(&r, d, b);
    kv_disk_flush(d);
    assert_int_equal(stats(d).writes, 3);
    assert_int_equal(stats(d).files, 3);
    assert_true(get(&r, d, 1));
    assert_false(kv_disk_has(d, r.key[3]));
    kv_disk_close(d);
    /* a restart finds them */
    d = open_disk(dir, 1 << 20, 42);
    assert_int_equal(stats(d).files, 3);
    for (int b = 0; b < 3; b++) assert_true(get(&r, d, b));
    assert_int_equal(stats(d).reads, 3);
    /* asked with other ids or another parent: not loaded, and the file
     * (which cannot be what the key says) is removed */
    int32_t other[BT] = {9, 9, 9, 9};
    int32_t id;
    assert_int_equal(kv_pool_alloc(r.pool, &id, NULL), KT_OK);
    assert_false(kv_disk_get(d, r.pool, id, r.key[2], r.parent[2], other));
    kv_pool_release(r.pool, id, NULL);
    assert_int_equal(stats(d).rejected, 1);
    assert_false(kv_disk_has(d, r.key[2]));
    kv_disk_close(d);
    /* another model's directory is another directory */
    d = open_disk(dir, 1 << 20, 43);
    assert_int_equal(stats(d).files, 0);
    assert_false(kv_disk_has(d, r.key[0]));
    kv_disk_close(d);
    kv_pool_free(r.pool);
}

/* Two processes sharing a directory (replicas behind a balancer): a
 * block one writes after the other opened is found by the other, and
 * counted in its index from then on. */
static void test_shared_dir(void **state) {
    (void)state;
    const char *dir = fresh_dir("disk-shared");
    rig r = rig_new();
    kv_disk *a = open_disk(dir, 1 << 20, 42), *b = open_disk(dir, 1 << 20, 42);
    assert_false(kv_disk_has(b, r.key[0]));
    put(&r, a, 0);
    kv_disk_flush(a);
    assert_int_equal(stats(b).files, 0);
    assert_true(kv_disk_has(b, r.key[0]));
    assert_true(get(&r, b, 0));
    assert_int_equal(stats(b).files, 1);
    assert_int_equal(stats(b).reads, 1);
    assert_false(kv_disk_has(b, r.key[1])); /* nobody wrote it */
    kv_disk_close(a);
    kv_disk_close(b);
    kv_pool_free(r.pool);
}

static void copy_file(const char *from, const char *to) {
    size_t n;
    char *data = tu_read_file(from, &n);
    assert_non_null(data);
    assert_int_equal(tu_write_file(to, data, n), 0);
    free(data);
}

/* Damaged and foreign files are skipped, removed and counted. */
static void test_bad_files_never_load(void **state) {
    (void)state;
    const char *dir = fresh_dir("disk-bad");
    rig r = rig_new();
    kv_disk *d = open_disk(dir, 1 << 20, 42);
    for (int b = 0; b < 4; b++) put(&r, d, b);
    kv_disk_close(d); /* waits for the writes */
    char path[1024], other[1024];
    /* block 0: truncated */
    block_path(dir, 42, r.key[0], path, sizeof path);
    assert_int_equal(truncate(path, 100), 0);
    /* block 1: one byte of its K/V flipped */
    block_path(dir, 42, r.key[1], path, sizeof path);
    size_t n;
    char *data = tu_read_file(path, &n);
    data[n / 2] ^= 0x10;
    assert_int_equal(tu_write_file(path, data, n), 0);
    free(data);
    /* block 2: copied from another model's directory (fingerprint 7) */
    d = open_disk(dir, 1 << 20, 7);
    kv_disk_close(d);
    block_path(dir, 42, r.key[2], path, sizeof path);
    block_path(dir, 7, r.key[2], other, sizeof other);
    copy_file(path, other);
    /* a temporary left by a killed writer (a pid that has exited), and
     * one of a live process sharing the directory (ours) */
    pid_t dead = fork();
    assert_true(dead >= 0);
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    snprintf(other, sizeof other, "%s/%016llx/.tmp-%d-5", dir, 42ull, (int)dead);
    assert_int_equal(tu_write_file(other, "partial", 7), 0);
    char live[600];
    snprintf(live, sizeof live, "%s/%016llx/.tmp-%d-6", dir, 42ull, (int)getpid());
    assert_int_equal(tu_write_file(live, "writing", 7), 0);

    d = open_disk(dir, 1 << 20, 42);
    assert_int_equal(stats(d).rejected, 1); /* the truncated one, at start */
    assert_true(access(other, F_OK) != 0);  /* the dead writer's temporary is gone */
    assert_true(access(live, F_OK) == 0);   /* the live one's is left alone */
    unlink(live);
    assert_false(get(&r, d, 0));
    assert_false(get(&r, d, 1)); /* checksum */
    assert_true(get(&r, d, 2));
    assert_true(get(&r, d, 3));
    assert_int_equal(stats(d).rejected, 2);
    block_path(dir, 42, r.key[1], path, sizeof path);
    assert_true(access(path, F_OK) != 0); /* removed */
    kv_disk_close(d);
    d = open_disk(dir, 1 << 20, 7);
    assert_false(get(&r, d, 2)); /* its fingerprint is 42's */
    assert_int_equal(stats(d).rejected, 1);
    kv_disk_close(d);
    kv_pool_free(r.pool);
}

/* The directory stays under its limit, the least recently used going. */
static void test_size_limit(void **state) {
    (void)state;
    const char *dir = fresh_dir("disk-limit");
    rig r = rig_new();
    kv_disk *d = open_disk(dir, 1 << 20, 42);
    put(&r, d, 0);
    kv_disk_flush(d);
    const uint64_t one = stats(d).bytes;
    kv_disk_close(d);
    d = open_disk(dir, 2 * one + one / 2, 42); /* room for two */
    put(&r, d, 1);
    kv_disk_flush(d);
    assert_true(get(&r, d, 0)); /* 0 is now newer than 1 */
    put(&r, d, 2);
    kv_disk_flush(d);
    assert_int_equal(stats(d).files, 2);
    assert_int_equal(stats(d).removed, 1);
    assert_true(stats(d).bytes <= 2 * one + one / 2);
    assert_true(kv_disk_has(d, r.key[0]));
    assert_false(kv_disk_has(d, r.key[1]));
    assert_true(kv_disk_has(d, r.key[2]));
    kv_disk_close(d);
    /* a smaller limit at start trims at once */
    d = open_disk(dir, one, 42);
    assert_int_equal(stats(d).files, 1);
    kv_disk_close(d);
    kv_pool_free(r.pool);
}

/* A write that fails (here: the process's file size limit, as a full disk
 * would) is counted and leaves no file, temporary or index entry. */
static void test_failed_write(void **state) {
    (void)state;
    const char *dir = fresh_dir("disk-full");
    rig r = rig_new();
    kv_disk *d = open_disk(dir, 1 << 20, 42);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, small = {.rlim_cur = 64, .rlim_max = RLIM_INFINITY};
    getrlimit(RLIMIT_FSIZE, &old);
    small.rlim_max = old.rlim_max;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    put(&r, d, 0);
    kv_disk_flush(d);
    setrlimit(RLIMIT_FSIZE, &old);
    assert_int_equal(stats(d).write_errors, 1);
    assert_int_equal(stats(d).files, 0);
    assert_false(kv_disk_has(d, r.key[0]));
    put(&r, d, 0); /* and it can be written later */
    kv_disk_flush(d);
    assert_true(get(&r, d, 0));
    kv_disk_close(d);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s/%016llx' | grep -c tmp) -eq 0", dir, 42ull);
    assert_int_equal(system(cmd), 0);
    kv_pool_free(r.pool);
}

/* A directory that cannot be made gets an error naming it. */
static void test_unusable_dir(void **state) {
    (void)state;
    const char *file = tu_tmp("disk-not-a-dir");
    assert_int_equal(tu_write_file(file, "x", 1), 0);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/sub", file);
    kt_error err = {0};
    assert_null(kv_disk_open(dir, 1 << 20, 42, &LAYOUT, &err));
    assert_int_equal(err.status, KT_ERR_IO);
    assert_non_null(strstr(err.msg, "--cache-dir"));
    assert_non_null(strstr(err.msg, "disk-not-a-dir"));
}

/* Sliding-window layers: a block still holding its window rows is written
 * with them and read back with them (into a window slot the reader then
 * releases); one that had given them back is written without (a shorter
 * file) and read back without, its full layers intact; a reader with no
 * slot to spare loads the full layers only; a file whose window flag was
 * changed does not load. */
static void test_window_rows(void **state) {
    (void)state;
    static const uint8_t windowed[N_LAYER] = {0, 1};
    kv_pool_params layout = LAYOUT;
    layout.window = 6, layout.windowed = windowed, layout.n_window_blocks = 2;
    const char *dir = fresh_dir("disk-window");
    kt_error err = {0};
    kv_pool *pool = kv_pool_new(&layout, &err);
    kv_disk *d = kv_disk_open(dir, 1 << 20, 7, &layout, &err);
    assert_non_null(pool);
    assert_non_null(d);
    rig r = rig_new();
    int32_t a, b;
    assert_int_equal(kv_pool_alloc(pool, &a, NULL), KT_OK);
    assert_int_equal(kv_pool_window_alloc(pool, a, &err), KT_OK);
    fill_block(pool, a, r.ids[0]);
    assert_int_equal(kv_pool_alloc(pool, &b, NULL), KT_OK); /* no window rows: fill the full layer only */
    for (int k = 0; k < 2; k++)
        for (int pos = 0; pos < BT; pos++)
            for (int j = 0; j < KV_DIM; j++) ((float *)kv_pool_row(pool, b, 0, (kv_kind)k, pos))[j] = sig(r.ids[1][pos], pos, 0, k, j);
    kv_disk_put(d, pool, a, r.key[0], r.parent[0], r.ids[0]);
    kv_disk_put(d, pool, b, r.key[1], r.parent[1], r.ids[1]);
    kv_disk_close(d);
    kv_pool_window_release(pool, a);
    kv_pool_release(pool, a, NULL), kv_pool_release(pool, b, NULL);
    assert_int_equal(kv_pool_n_window_used(pool), 0);

    d = kv_disk_open(dir, 1 << 20, 7, &layout, &err);
    assert_non_null(d);
    assert_int_equal(stats(d).files, 2);
    assert_int_equal(stats(d).bytes, 2 * (72 + 4 * BT + 8) + 3 * 2 * BT * KV_DIM * 4); /* 2 + 1 layers of rows */
    int32_t x;
    assert_int_equal(kv_pool_alloc(pool, &x, NULL), KT_OK);
    assert_true(kv_disk_get(d, pool, x, r.key[0], r.parent[0], r.ids[0]));
    assert_true(kv_pool_has_window(pool, x));
    assert_block(pool, x, r.ids[0]);
    kv_pool_window_release(pool, x);
    assert_true(kv_disk_get(d, pool, x, r.key[1], r.parent[1], r.ids[1]));
    assert_false(kv_pool_has_window(pool, x));
    for (int k = 0; k < 2; k++)
        for (int pos = 0; pos < BT; pos++)
            assert_true(((float *)kv_pool_row(pool, x, 0, (kv_kind)k, pos))[0] == sig(r.ids[1][pos], pos, 0, k, 0));
    /* both slots held: the file with window rows loads its full layer only */
    int32_t h1, h2;
    assert_int_equal(kv_pool_alloc(pool, &h1, NULL), KT_OK);
    assert_int_equal(kv_pool_alloc(pool, &h2, NULL), KT_OK);
    assert_int_equal(kv_pool_window_alloc(pool, h1, NULL), KT_OK);
    assert_int_equal(kv_pool_window_alloc(pool, h2, NULL), KT_OK);
    assert_true(kv_disk_get(d, pool, x, r.key[0], r.parent[0], r.ids[0]));
    assert_false(kv_pool_has_window(pool, x));
    assert_true(((float *)kv_pool_row(pool, x, 0, KV_V, 3))[5] == sig(r.ids[0][3], 3, 0, 1, 5));
    kv_disk_close(d);
    /* the window flag of block 0's file set to 0: its size no longer matches */
    char path[1024], cmd[1200];
    snprintf(cmd, sizeof cmd, "f=$(ls -S '%s'/*/* | head -1); printf '\\000' | dd of=\"$f\" bs=1 seek=64 conv=notrunc "
             "status=none && echo \"$f\"", dir);
    FILE *pp = popen(cmd, "r");
    assert_non_null(pp);
    assert_non_null(fgets(path, sizeof path, pp));
    pclose(pp);
    d = kv_disk_open(dir, 1 << 20, 7, &layout, &err);
    kv_pool_window_release(pool, h1), kv_pool_window_release(pool, h2);
    assert_false(kv_disk_get(d, pool, x, r.key[0], r.parent[0], r.ids[0]));
    assert_int_equal(stats(d).rejected, 1);
    kv_disk_close(d);
    kv_pool_release(pool, x, NULL), kv_pool_release(pool, h1, NULL), kv_pool_release(pool, h2, NULL);
    assert_int_equal(kv_pool_check(pool, &err), KT_OK);
    kv_pool_free(pool);
    kv_pool_free(r.pool);
}

/* ---- the engine over the disk tier ---- */

static kt_model *g_model;

static kt_engine *engine_with(const char *dir, bool cache) {
    kt_engine_params p = kt_engine_defaults();
    p.n_ctx = 256, p.n_parallel = 4, p.batch_tokens = 64, p.n_threads = 1;
    p.prefix_cache = cache, p.cache_dir = dir;
    kt_error err = {0};
    kt_engine *e = kt_engine_new(g_model, &p, &err);
    if (!e) fail_msg("%s", err.msg);
    return e;
}

static void prompt_of(int32_t *ids, int n, uint32_t seed) {
    ids[0] = 1;
    for (int i = 1; i < n; i++) ids[i] = 3 + (int32_t)((seed * 2654435761u + (uint32_t)i * 40503u) % 400u);
}

/* Greedy tokens and logprobs of ids; the usage in *u. */
static int run(kt_engine *e, const int32_t *ids, int n, int32_t *out, float *lp, kt_request_usage *u) {
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids, p.n_prompt = n, p.max_tokens = 16, p.ignore_eos = true, p.top_logprobs = 0;
    kt_request *r = NULL;
    kt_error err = {0};
    if (kt_engine_submit(e, &p, &r, &err) != KT_OK) fail_msg("%s", err.msg);
    kt_event ev;
    int k = 0;
    while (kt_request_wait(r, &ev, 60000) == 1)
        if (ev.token >= 0) lp[k] = ev.logprob.logprob, out[k++] = ev.token;
    if (u) *u = kt_request_get_usage(r);
    kt_request_free(r);
    return k;
}

/* A restarted engine reads a prompt's blocks back from disk and gives the
 * cold engine's tokens and logprob bits. */
static void test_engine_restart_hit(void **state) {
    (void)state;
    const char *dir = fresh_dir("disk-engine");
    int32_t ids[100], ref[16], got[16];
    float ref_lp[16], got_lp[16];
    prompt_of(ids, 100, 1);
    kt_engine *cold = engine_with(NULL, false);
    assert_int_equal(run(cold, ids, 100, ref, ref_lp, NULL), 16);
    kt_engine_free(cold);
    kt_engine *e = engine_with(dir, true);
    run(e, ids, 100, got, got_lp, NULL);
    kt_engine_free(e); /* writes everything queued */
    e = engine_with(dir, true);
    kt_request_usage u;
    assert_int_equal(run(e, ids, 100, got, got_lp, &u), 16);
    assert_int_equal(u.cached_tokens, 96);
    kt_engine_stats st;
    kt_engine_get_stats(e, &st);
    assert_int_equal(st.disk_cached_prompt_tokens, 96);
    assert_memory_equal(got, ref, sizeof ref);
    assert_memory_equal(got_lp, ref_lp, sizeof ref_lp);
    kt_engine_free(e);
}

/* The same for a model with sliding-window layers (the Gemma 3 golden,
 * window 64): the prompt's last window of blocks was written with its
 * window rows, so a restart resumes at the last whole block. */
static void test_engine_restart_hit_window(void **state) {
    (void)state;
    kt_error err = {0};
    kt_model *saved = g_model;
    g_model = kt_model_load(tu_shared("golden/arch/gemma3-F16.gguf"), &err);
    if (!g_model) fail_msg("%s", err.msg);
    const char *dir = fresh_dir("disk-engine-window");
    int32_t ids[150], ref[16], got[16];
    float ref_lp[16], got_lp[16];
    prompt_of(ids, 150, 2);
    ids[0] = kt_model_describe(g_model)->bos_id;
    kt_engine *cold = engine_with(NULL, false);
    assert_int_equal(run(cold, ids, 150, ref, ref_lp, NULL), 16);
    kt_engine_free(cold);
    kt_engine *e = engine_with(dir, true);
    run(e, ids, 150, got, got_lp, NULL);
    kt_engine_free(e);
    e = engine_with(dir, true);
    kt_request_usage u;
    assert_int_equal(run(e, ids, 150, got, got_lp, &u), 16);
    assert_int_equal(u.cached_tokens, 144);
    assert_memory_equal(got, ref, sizeof ref);
    assert_memory_equal(got_lp, ref_lp, sizeof ref_lp);
    kt_engine_free(e);
    kt_model_free(g_model);
    g_model = saved;
}

/* Children write the cache while they run and are killed with SIGKILL at
 * different moments; each restart loads only good blocks: its outputs are
 * the cold engine's, and no file is rejected (writes are atomic). */
static void test_kill_9_during_writes(void **state) {
    (void)state;
    const char *dir = fresh_dir("disk-kill");
    enum { N_PROMPTS = 6 };
    static int32_t ids[N_PROMPTS][120], ref[N_PROMPTS][16];
    static float ref_lp[N_PROMPTS][16];
    kt_engine *cold = engine_with(NULL, false);
    for (int i = 0; i < N_PROMPTS; i++) {
        prompt_of(ids[i], 120, (uint32_t)(10 + i));
        run(cold, ids[i], 120, ref[i], ref_lp[i], NULL);
    }
    kt_engine_free(cold);
    const int kill_after_ms[4] = {5, 30, 80, 200};
    for (int round = 0; round < 4; round++) {
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) { /* writes blocks until killed */
            kt_engine *e = engine_with(dir, true);
            for (int k = 0;; k++) {
                int32_t tmp[120], out[16];
                float lp[16];
                prompt_of(tmp, 120, (uint32_t)(1000 * round + k));
                memcpy(tmp, ids[k % N_PROMPTS], sizeof(int32_t) * 64); /* some prefixes repeat */
                run(e, tmp, 120, out, lp, NULL);
                run(e, ids[k % N_PROMPTS], 120, out, lp, NULL);
            }
        }
        struct timespec ts = {0, kill_after_ms[round] * 1000000L};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        kt_engine *e = engine_with(dir, true);
        for (int i = 0; i < N_PROMPTS; i++) {
            int32_t out[16];
            float lp[16];
            assert_int_equal(run(e, ids[i], 120, out, lp, NULL), 16);
            assert_memory_equal(out, ref[i], sizeof out);
            assert_memory_equal(lp, ref_lp[i], sizeof lp);
        }
        kt_engine_stats st;
        kt_engine_get_stats(e, &st);
        assert_int_equal(st.disk_rejected, 0);
        printf("kill -9 after %d ms: restart found %llu files, read %llu blocks back\n", kill_after_ms[round],
               (unsigned long long)st.disk_files, (unsigned long long)st.disk_reads);
        kt_engine_free(e);
    }
}

static int setup(void **state) {
    (void)state;
    kt_error err = {0};
    g_model = kt_model_load(tu_shared("models/stories260K.gguf"), &err);
    return g_model ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    kt_model_free(g_model);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_and_restart),
        cmocka_unit_test(test_shared_dir),
        cmocka_unit_test(test_bad_files_never_load),
        cmocka_unit_test(test_size_limit),
        cmocka_unit_test(test_failed_write),
        cmocka_unit_test(test_unusable_dir),
        cmocka_unit_test(test_window_rows),
        cmocka_unit_test(test_engine_restart_hit),
        cmocka_unit_test(test_engine_restart_hit_window),
        cmocka_unit_test(test_kill_9_during_writes),
    };
    return tu_result(cmocka_run_group_tests(tests, setup, teardown));
}
