/*
 * test_fault.c - fault injection (-DKT_FAULT=ON; docs/ARCHITECTURE.md,
 * "Fault injection"): every allocation and I/O call on the paths below
 * fails in turn, and each failure must end in an error value with a
 * message, or be absorbed with the same result as without it, and leave
 * a clean state: nothing leaked (LeakSanitizer after every run), no
 * crash or sanitizer report, no file half-written.
 *
 * A scenario runs once unarmed to count its calls N (twice: the counts
 * must agree, lane by lane, or a point would not name the same call in
 * every run), then for points i = 1..N: the i-th counted call fails
 * (fault.h), the scenario runs to its end and checks its own outcome
 * against the unarmed run's, the files it wrote are checked, and the
 * leak checker runs. A failure names the point and the call that failed.
 *
 * Scenarios: model load (two files, every load mode, then a short eval),
 * session save and restore (the file must stay the old one or become a
 * whole new one), the disk cache (blocks written, read back, a corrupt
 * file refused; every file left must check), the disk tier under a
 * restarted engine, and the server's request path in process, as gen.c
 * drives it: the body parsed, translated and validated, the prompt
 * rendered and tokenized, the request run on the engine step by step,
 * the answer or the stream built (docs/ARCHITECTURE.md lists the
 * requests).
 *
 * ctest runs every point of the small scenarios and a fixed stride of the
 * server path (the stride printed); KT_FAULT_ALL=1 runs every point.
 * Triage: KT_FAULT_ONLY=NAME (scenarios whose name holds NAME),
 * KT_FAULT_POINT=i (one point), KT_FAULT_FROM=i (points from i),
 * KT_FAULT_KEEP_GOING=1 (report each failure and go on),
 * KT_FAULT_VERBOSE=1 (every point and its call), KT_FAULT_TRACE=1 (every
 * counted call), KT_FAULT_PROFILE=1 (each request's calls, time and
 * unarmed answer).
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <sanitizer/common_interface_defs.h>
#include <sanitizer/lsan_interface.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/json_safe.h"
#include "engine/engine.h"
#include "fault/fault.h"
#include "kettle.h"
#include "kv/disk_cache.h"
#include "server/http_internal.h"
#include "server/openai.h"
#include "server/results.h"
#include "server/sampled.h"
#include "testutil.h"

/* ---- the sweep ---- */

static const char *cur_scenario = "";
static long cur_point; /* 0: the unarmed run */

/* KT_FAULT_KEEP_GOING=1 (triage): a failed check is printed and the
 * sweep goes on at the next point; the leak checks of the scenario stop
 * at its first failure (what that run left behind would be reported again
 * at every later point), and the test fails at the end. */
static bool keep_going;
static jmp_buf next_point;
static long n_failed;
static bool leaks_off;

static bool in_points; /* next_point is set */

static void check_failed(const char *msg) {
    if (!keep_going || !in_points) fail_msg("%s, point %ld (%s): %s", cur_scenario, cur_point, fault_fired_where(), msg);
    fprintf(stderr, "FAILED %s, point %ld (%s): %s\n", cur_scenario, cur_point, fault_fired_where(), msg);
    n_failed++, leaks_off = true;
    longjmp(next_point, 1);
}

/* Fails the test naming the scenario, the point and the call that failed. */
#define FCHECK(cond, ...)                                                                                             \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            char m_[2048];                                                                                             \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                                                      \
            check_failed(m_);                                                                                          \
        }                                                                                                              \
    } while (0)

/* A crash, a sanitizer report or a hang names the point too. */
static void on_death(void) {
    fprintf(stderr, "test_fault: died in %s at point %ld: %s\n", cur_scenario, cur_point, fault_fired_where());
}

static void on_alarm(int sig) {
    (void)sig;
    fprintf(stderr, "test_fault: %s hangs at point %ld: %s\n", cur_scenario, cur_point, fault_fired_where());
    _exit(1);
}

static long env_long(const char *name, long dflt) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : dflt;
}

/* What a run of a scenario ended in. */
typedef enum outcome {
    RUN_SAME = 1,  /* completed, with the unarmed run's result */
    RUN_ERROR,     /* an error value with a message (checked by the scenario) */
    RUN_ABSORBED,  /* completed, a failure absorbed on the way (a cache miss, a dropped write) */
} outcome;

typedef struct scenario {
    const char *name;
    outcome (*run)(void *ctx);
    void (*after)(void *ctx); /* checks (and resets) files between runs; may be NULL */
    void *ctx;
    long max_runs;            /* ctest's budget of armed runs: a stride past it */
} scenario;

typedef struct totals {
    long points, runs, by_outcome[4], by_class[FAULT_N_CLASSES];
} totals;
static totals grand;

static void leak_check(void) {
    if (leaks_off) return;
    FCHECK(__lsan_do_recoverable_leak_check() == 0, "memory leaked (LeakSanitizer's report above)");
}

static void sweep(const scenario *sc) {
    const char *only = getenv("KT_FAULT_ONLY");
    if (only && *only && !strstr(sc->name, only)) return;
    cur_scenario = sc->name, cur_point = 0;
    const bool verbose = env_long("KT_FAULT_VERBOSE", 0) != 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double start = (double)ts.tv_sec + ts.tv_nsec / 1e9;
    alarm(120);
    fault_start(0, 0);
    outcome o = sc->run(sc->ctx);
    long n = fault_stop();
    long by_class[FAULT_N_CLASSES], by_lane[FAULT_MAX_LANES];
    for (int c = 0; c < FAULT_N_CLASSES; c++) by_class[c] = fault_count_class(c);
    for (int l = 0; l < FAULT_MAX_LANES; l++) by_lane[l] = fault_count_lane(l);
    FCHECK(o == RUN_SAME, "the unarmed run did not complete (%d)", (int)o);
    if (sc->after) sc->after(sc->ctx);
    fault_start(0, 0);
    o = sc->run(sc->ctx);
    long n2 = fault_stop();
    char diff[256] = "";
    int len = 0;
    for (int c = 0; c < FAULT_N_CLASSES && len < 200; c++)
        if (fault_count_class(c) != by_class[c])
            len += snprintf(diff + len, sizeof diff - (size_t)len, " %s %ld -> %ld", fault_class_name(c), by_class[c],
                            fault_count_class(c));
    for (int l = 0; l < FAULT_MAX_LANES && len < 200; l++)
        if (fault_count_lane(l) != by_lane[l])
            len += snprintf(diff + len, sizeof diff - (size_t)len, " lane %d %ld -> %ld", l, by_lane[l], fault_count_lane(l));
    FCHECK(o == RUN_SAME && n2 == n && !len, "a second unarmed run made %ld calls, the first %ld (%s): not repeatable", n2,
           n, diff);
    if (sc->after) sc->after(sc->ctx);
    leak_check();
    long stride = 1, only_point = env_long("KT_FAULT_POINT", 0), from = env_long("KT_FAULT_FROM", 1);
    if (!env_long("KT_FAULT_ALL", 0) && sc->max_runs > 0 && n > sc->max_runs) stride = (n + sc->max_runs - 1) / sc->max_runs;
    long counts[4] = {0}, runs = 0;
    in_points = true;
    for (volatile long i = only_point ? only_point : from; i <= (only_point ? only_point : n); i += stride) {
        cur_point = i;
        static volatile bool recovering;
        recovering = false;
        if (setjmp(next_point)) {
            fault_stop();
            if (!recovering && sc->after) recovering = true, sc->after(sc->ctx);
            continue;
        }
        alarm(60);
        /* point i: the lanes' calls one after another */
        int lane = 0;
        long k = i;
        while (lane < FAULT_MAX_LANES - 1 && k > by_lane[lane]) k -= by_lane[lane++];
        fault_start(lane, k);
        o = sc->run(sc->ctx);
        fault_stop();
        FCHECK(fault_fired(), "the armed call was not reached");
        FCHECK(o >= RUN_SAME && o <= RUN_ABSORBED, "bad outcome %d", (int)o);
        if (verbose) printf("  %s %ld: %s -> %s\n", sc->name, i, fault_fired_where(),
                            o == RUN_SAME ? "same" : o == RUN_ERROR ? "error" : "absorbed");
        if (sc->after) sc->after(sc->ctx);
        leak_check();
        counts[o]++, runs++;
        if (stride > 1 && i + stride > n && i != n) i = n - stride; /* the last point too */
    }
    in_points = false;
    alarm(0);
    cur_point = 0;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    printf("%-22s %6ld points (", sc->name, n);
    for (int c = 0, first = 1; c < FAULT_N_CLASSES; c++)
        if (by_class[c]) printf("%s%s %ld", first ? "" : ", ", fault_class_name(c), by_class[c]), first = 0;
    printf("); %ld run%s (stride %ld): %ld error, %ld absorbed, %ld same; %.1f s\n", runs, runs == 1 ? "" : "s",
           stride, counts[RUN_ERROR], counts[RUN_ABSORBED], counts[RUN_SAME],
           (double)ts.tv_sec + ts.tv_nsec / 1e9 - start);
    fflush(stdout);
    grand.points += n, grand.runs += runs;
    for (int k = 0; k < 4; k++) grand.by_outcome[k] += counts[k];
    for (int c = 0; c < FAULT_N_CLASSES; c++) grand.by_class[c] += by_class[c];
}

/* An error value: a status and a message a user can act on. */
static outcome expect_error(const kt_error *err, const char *what) {
    FCHECK(err->status != KT_OK, "%s failed without a status", what);
    FCHECK(err->msg[0] != 0, "%s failed without a message", what);
    return RUN_ERROR;
}

/* Logits against the unarmed run's: RUN_SAME bit for bit; RUN_ABSORBED
 * within 1e-4 (a kernel that could not have its scratch memory fell back
 * to the scalar reference, ops.c and matmul.c: the same arithmetic in
 * another order); anything further is a failed check. */
static outcome logits_match(const float *got, const float *want, int n, const char *what) {
    if (!memcmp(got, want, sizeof(float) * (size_t)n)) return RUN_SAME;
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]) / (fabs((double)want[i]) > 1 ? fabs((double)want[i]) : 1);
        worst = d > worst || d != d ? d : worst;
    }
    FCHECK(worst <= 1e-4, "%s gives other logits (relative difference %g)", what, worst);
    return RUN_ABSORBED;
}

/* The test's own memory, not an injection point. */
static void *own_alloc(size_t n) {
    const bool was = fault_pause();
    void *p = malloc(n);
    fault_resume(was);
    FCHECK(p != NULL, "test: out of memory");
    return p;
}

static char *own_strdup(const char *s) {
    char *d = own_alloc(strlen(s) + 1);
    return strcpy(d, s);
}

static bool same_bytes(const void *a, size_t na, const void *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na) == 0);
}

/* ---- model load ---- */

#define EVAL_TOKENS 5

typedef struct load_ctx {
    const char *rel;
    kt_load_mode mode;
    bool progress;
    bool have_base;
    kt_model_desc desc;
    char *template_text;
    int n_vocab;
    float *logits; /* the last token's after EVAL_TOKENS */
} load_ctx;

static void on_progress(void *user, const char *stage, uint64_t done, uint64_t total) {
    (void)user, (void)stage, (void)done, (void)total;
}

/* The model, then a session and a short eval: a model that loads must
 * give the unarmed run's logits bit for bit. */
static outcome run_load(void *arg) {
    load_ctx *x = arg;
    kt_error err = {0};
    kt_model *m = x->progress ? kt_model_load_progress(tu_shared(x->rel), x->mode, on_progress, NULL, &err)
                              : kt_model_load_ex(tu_shared(x->rel), x->mode, &err);
    if (!m) return expect_error(&err, "kt_model_load");
    const kt_model_desc *d = kt_model_describe(m);
    const char *tt = kt_model_chat_template(m);
    outcome o = RUN_SAME;
    kt_session *s = kt_session_new(m, &(kt_session_params){.n_ctx = 32, .n_threads = 1}, &err);
    if (!s) {
        o = expect_error(&err, "kt_session_new");
    } else {
        int32_t toks[EVAL_TOKENS];
        for (int i = 0; i < EVAL_TOKENS; i++) toks[i] = 1 + (i * 37) % (d->n_vocab - 1);
        float *l = own_alloc(sizeof(float) * (size_t)d->n_vocab);
        if (kt_session_eval(s, toks, EVAL_TOKENS, l, false, &err) != KT_OK) o = expect_error(&err, "kt_session_eval");
        if (o == RUN_SAME && !x->have_base) {
            x->have_base = true, x->desc = *d, x->n_vocab = d->n_vocab, x->logits = l, l = NULL;
            x->template_text = tt ? own_strdup(tt) : NULL;
        } else if (o == RUN_SAME) {
            FCHECK(d->n_vocab == x->desc.n_vocab && d->n_layer == x->desc.n_layer && d->n_repacked == x->desc.n_repacked &&
                       d->weight_bytes == x->desc.weight_bytes && d->bos_id == x->desc.bos_id && d->eos_id == x->desc.eos_id,
                   "the model loaded with another description");
            FCHECK((!tt && !x->template_text) || (tt && x->template_text && !strcmp(tt, x->template_text)),
                   "the model loaded with another chat template");
            o = logits_match(l, x->logits, d->n_vocab, "the model loaded");
        }
        free(l);
        kt_session_free(s);
    }
    kt_model_free(m);
    return o;
}

static void load_ctx_free(load_ctx *x) {
    free(x->logits), free(x->template_text);
}

static void test_model_load(void **state) {
    (void)state;
    static const struct { const char *rel; kt_load_mode mode; bool progress; const char *name; } CASES[] = {
        {"models/stories260K.gguf", KT_LOAD_MMAP, false, "load stories mmap"},
        {"models/stories260K.gguf", KT_LOAD_MMAP_POPULATE, false, "load stories populate"},
        {"models/stories260K.gguf", KT_LOAD_COPY, false, "load stories copy"},
        {"models/stories260K.gguf", KT_LOAD_REPACK, true, "load stories repack"},
        {"models/test-tiny-Q4_0.gguf", KT_LOAD_MMAP, false, "load tiny-Q4_0 mmap"},
        {"models/test-tiny-Q4_0.gguf", KT_LOAD_REPACK, true, "load tiny-Q4_0 repack"},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        load_ctx x = {.rel = CASES[i].rel, .mode = CASES[i].mode, .progress = CASES[i].progress};
        scenario sc = {CASES[i].name, run_load, NULL, &x, 0};
        sweep(&sc);
        load_ctx_free(&x);
    }
}

/* ---- session save and restore ---- */

#define SESS_OLD 8  /* positions in the file before the save */
#define SESS_NEW 20 /* positions the save writes */

typedef struct sess_ctx {
    kt_model *m;
    int n_vocab;
    int32_t toks[SESS_NEW + 1];
    char path[600], dir[512];
    uint8_t *old_file, *new_file;
    size_t old_size, new_size;
    float *next_old, *next_new; /* logits of toks[SESS_NEW] after restoring the old / new file */
    bool have_base;
} sess_ctx;

/* The logits of the token after a restored session, or NULL (an error). */
static float *eval_next(sess_ctx *x, kt_session *s, int n, kt_error *err) {
    float *l = own_alloc(sizeof(float) * (size_t)x->n_vocab);
    if (kt_session_eval(s, &x->toks[n], 1, l, false, err) != KT_OK) return free(l), NULL;
    return l;
}

static outcome run_session(void *arg) {
    sess_ctx *x = arg;
    kt_error err = {0};
    kt_session *s = kt_session_new(x->m, &(kt_session_params){.n_ctx = 64, .n_threads = 2}, &err);
    if (!s) return expect_error(&err, "kt_session_new");
    outcome o = RUN_SAME;
    bool saved = false;
    if (kt_session_eval(s, x->toks, SESS_NEW, NULL, false, &err) != KT_OK) o = expect_error(&err, "kt_session_eval");
    else if (kt_session_save(s, x->path, x->toks, SESS_NEW, "the new note", &err) != KT_OK) o = expect_error(&err, "kt_session_save");
    else saved = true;
    kt_session_free(s);
    /* restore whatever the file is now: the new version, or the old one when the save failed */
    if (!(s = kt_session_new(x->m, &(kt_session_params){.n_ctx = 64, .n_threads = 2}, &err)))
        return expect_error(&err, "kt_session_new");
    int32_t *tokens = NULL;
    char *note = NULL;
    int n = -1;
    memset(&err, 0, sizeof err);
    if (kt_session_load(s, x->path, &tokens, &n, &note, &err) != KT_OK) {
        o = expect_error(&err, "kt_session_load");
        FCHECK(kt_session_n_past(s) == 0 && !tokens && !note, "a failed restore left the session holding %d positions",
               kt_session_n_past(s));
    } else {
        const int want = saved || o == RUN_SAME ? SESS_NEW : -1;
        FCHECK(n == SESS_NEW || (n == SESS_OLD && !saved), "restored %d positions", n);
        FCHECK(want < 0 || n == want, "the save succeeded but %d positions were restored", n);
        FCHECK(!memcmp(tokens, x->toks, sizeof(int32_t) * (size_t)n), "restored other tokens");
        FCHECK(!strcmp(note, n == SESS_NEW ? "the new note" : "the old note"), "restored the note '%s'", note);
        FCHECK(kt_session_n_past(s) == n, "the session holds %d positions after restoring %d", kt_session_n_past(s), n);
        float *l = eval_next(x, s, n, &err);
        if (!l) {
            o = expect_error(&err, "kt_session_eval after restore");
        } else if (!x->have_base) {
            x->next_new = l, l = NULL;
        } else {
            outcome m = logits_match(l, n == SESS_NEW ? x->next_new : x->next_old, x->n_vocab, "the restored session");
            if (o == RUN_SAME) o = m;
        }
        free(l);
    }
    free(tokens), free(note);
    kt_session_free(s);
    x->have_base = true;
    return o;
}

/* No temporary left beside the file. */
static void no_temporaries(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    FCHECK(d != NULL, "cannot list %s", dir);
    struct dirent *de;
    while ((de = readdir(d)))
        FCHECK(!strstr(de->d_name, ".tmp-") || (prefix && strncmp(de->d_name, prefix, strlen(prefix))),
               "a temporary was left: %s/%s", dir, de->d_name);
    closedir(d);
}

/* The file is the old version or a whole new one, never anything else;
 * then the old one is put back for the next run. The new one may differ
 * from the unarmed run's in the KV's last bits (logits_match), so what
 * is not the old file must restore: all its positions, tokens and note. */
static void after_session(void *arg) {
    sess_ctx *x = arg;
    size_t size = 0;
    uint8_t *now = (uint8_t *)tu_read_file(x->path, &size);
    FCHECK(now != NULL, "the session file is gone");
    if (!same_bytes(now, size, x->old_file, x->old_size) && !same_bytes(now, size, x->new_file, x->new_size)) {
        kt_error err = {0};
        kt_session *s = kt_session_new(x->m, &(kt_session_params){.n_ctx = 64, .n_threads = 1}, &err);
        assert_non_null(s);
        int32_t *tokens = NULL;
        char *note = NULL;
        int n = 0;
        kt_status st = kt_session_load(s, x->path, &tokens, &n, &note, &err);
        kt_session_free(s);
        FCHECK(st == KT_OK && n == SESS_NEW && !memcmp(tokens, x->toks, sizeof(int32_t) * SESS_NEW) &&
                   !strcmp(note, "the new note"),
               "the session file is neither the old version nor a whole new one (%zu bytes: %s)", size, err.msg);
        free(tokens), free(note);
    }
    free(now);
    no_temporaries(x->dir, NULL);
    assert_int_equal(tu_write_file(x->path, x->old_file, x->old_size), 0);
}

static void test_session_files(void **state) {
    (void)state;
    sess_ctx x = {0};
    kt_error err = {0};
    x.m = kt_model_load(tu_shared("models/stories260K.gguf"), &err);
    assert_non_null(x.m);
    x.n_vocab = kt_model_describe(x.m)->n_vocab;
    for (int i = 0; i <= SESS_NEW; i++) x.toks[i] = 1 + (i * 53) % (x.n_vocab - 1);
    snprintf(x.dir, sizeof x.dir, "%s", tu_tmp("fault-session"));
    mkdir(x.dir, 0755);
    snprintf(x.path, sizeof x.path, "%s/chat.session", x.dir);
    /* the new version and the old one, written unarmed */
    kt_session *s = kt_session_new(x.m, &(kt_session_params){.n_ctx = 64, .n_threads = 1}, &err);
    assert_non_null(s);
    assert_int_equal(kt_session_eval(s, x.toks, SESS_NEW, NULL, false, &err), KT_OK);
    assert_int_equal(kt_session_save(s, x.path, x.toks, SESS_NEW, "the new note", &err), KT_OK);
    x.new_file = (uint8_t *)tu_read_file(x.path, &x.new_size);
    assert_int_equal(kt_session_save(s, x.path, x.toks, SESS_OLD, "the old note", &err), KT_OK);
    x.old_file = (uint8_t *)tu_read_file(x.path, &x.old_size);
    assert_non_null(x.new_file);
    assert_non_null(x.old_file);
    kt_session_truncate(s, SESS_OLD);
    assert_non_null(x.next_old = eval_next(&x, s, SESS_OLD, &err));
    kt_session_free(s);
    scenario sc = {"session save+restore", run_session, after_session, &x, 0};
    sweep(&sc);
    free(x.old_file), free(x.new_file), free(x.next_old), free(x.next_new);
    kt_model_free(x.m);
}

/* ---- the disk tier ---- */

#define BT 4
#define N_LAYER 2
#define KV_DIM 8
#define N_CHAIN 4

static const kv_pool_params LAYOUT = {.n_blocks = 16, .block_tokens = BT, .n_layer = N_LAYER, .kv_dim = KV_DIM,
                                       .type = KV_F32};

typedef struct disk_ctx {
    char dir[512], sub[600];
    uint64_t fp;
    kv_pool *pool;
    int32_t ids[N_CHAIN][BT];
    kv_disk_key key[N_CHAIN], parent[N_CHAIN];
    uint8_t *corrupt; /* the file of block 3 the test puts there: right size, a flipped byte */
    size_t corrupt_size;
} disk_ctx;

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

static bool block_is(kv_pool *p, int32_t id, const int32_t *ids) {
    for (int l = 0; l < N_LAYER; l++)
        for (int k = 0; k < 2; k++)
            for (int pos = 0; pos < BT; pos++) {
                const float *row = kv_pool_row(p, id, l, (kv_kind)k, pos);
                for (int j = 0; j < KV_DIM; j++)
                    if (row[j] != sig(ids[pos], pos, l, k, j)) return false;
            }
    return true;
}

static void disk_put(disk_ctx *x, kv_disk *d, int b) {
    int32_t id;
    assert_int_equal(kv_pool_alloc(x->pool, &id, NULL), KT_OK);
    fill_block(x->pool, id, x->ids[b]);
    kv_disk_put(d, x->pool, id, x->key[b], x->parent[b], x->ids[b]);
    kv_pool_release(x->pool, id, NULL);
}

/* Block b read back: true if it loaded, and then it must be the block. */
static bool disk_get(disk_ctx *x, kv_disk *d, int b) {
    int32_t id;
    assert_int_equal(kv_pool_alloc(x->pool, &id, NULL), KT_OK);
    memset(kv_pool_row(x->pool, id, 0, KV_K, 0), 0, 4); /* not the block by accident */
    bool ok = kv_disk_get(d, x->pool, id, x->key[b], x->parent[b], x->ids[b]);
    FCHECK(!ok || block_is(x->pool, id, x->ids[b]), "block %d read back with other values", b);
    kv_pool_release(x->pool, id, NULL);
    return ok;
}

static void block_path(const disk_ctx *x, int b, char *out, size_t cap) {
    snprintf(out, cap, "%s/%016llx%016llx.kvb", x->sub, (unsigned long long)x->key[b].hi,
             (unsigned long long)x->key[b].lo);
}

/* Blocks 0 and 1 on disk from an earlier run, block 3's file corrupt, and
 * a temporary a killed writer left. */
static void disk_seed(disk_ctx *x) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", x->dir);
    assert_int_equal(system(cmd), 0);
    kt_error err = {0};
    kv_disk *d = kv_disk_open(x->dir, 1 << 20, x->fp, &LAYOUT, &err);
    if (!d) fail_msg("%s", err.msg);
    disk_put(x, d, 0), disk_put(x, d, 1);
    kv_disk_close(d);
    char path[700];
    block_path(x, 3, path, sizeof path);
    assert_int_equal(tu_write_file(path, x->corrupt, x->corrupt_size), 0);
    snprintf(path, sizeof path, "%s/.tmp-999999999-7", x->sub);
    assert_int_equal(tu_write_file(path, "half a block", 12), 0);
}

static outcome run_disk(void *arg) {
    disk_ctx *x = arg;
    kt_error err = {0};
    kv_disk *d = kv_disk_open(x->dir, 1 << 20, x->fp, &LAYOUT, &err);
    if (!d) return expect_error(&err, "kv_disk_open");
    disk_put(x, d, 1); /* already there: nothing */
    disk_put(x, d, 2);
    kv_disk_flush(d);
    bool all = true;
    for (int b = 0; b < 3; b++) all = disk_get(x, d, b) && all;
    FCHECK(!disk_get(x, d, 3), "the corrupt block 3 was loaded");
    disk_put(x, d, 3); /* the corrupt file was removed: written anew */
    kv_disk_flush(d);
    all = disk_get(x, d, 3) && all;
    kv_disk_close(d);
    /* whatever was dropped is a miss: the cache is optional, and no call fails for it */
    return all ? RUN_SAME : RUN_ABSORBED;
}

/* Every file left is a whole block file that checks (block 3's may still
 * be the corrupt one the seed put there), nothing else is left; then the
 * seed state is put back. */
static void after_disk(void *arg) {
    disk_ctx *x = arg;
    /* blocks 0 and 1 were whole before the run, and nothing may take them away: not a failed read
     * (which says nothing of the file), not a failed write of another block */
    for (int b = 0; b < 2; b++) {
        char path[700];
        block_path(x, b, path, sizeof path);
        FCHECK(access(path, F_OK) == 0, "block %d's file, whole before the run, is gone", b);
    }
    DIR *dir = opendir(x->sub);
    FCHECK(dir != NULL, "the cache directory %s is gone", x->sub);
    struct dirent *de;
    while ((de = readdir(dir))) {
        if (de->d_name[0] == '.' && (!de->d_name[1] || !strcmp(de->d_name, "..")))
            continue;
        int b = -1;
        for (int i = 0; i < N_CHAIN; i++) {
            char p[700];
            block_path(x, i, p, sizeof p);
            if (!strcmp(strrchr(p, '/') + 1, de->d_name)) b = i;
        }
        /* the dead writer's temporary is removed only by an open that got that far */
        if (!strcmp(de->d_name, ".tmp-999999999-7")) continue;
        FCHECK(b >= 0, "an unexpected file was left: %s", de->d_name);
        char path[700];
        block_path(x, b, path, sizeof path);
        size_t n = 0;
        uint8_t *bytes = (uint8_t *)tu_read_file(path, &n);
        FCHECK(bytes != NULL, "cannot read %s", path);
        const size_t file_bytes = 72 + 4 * BT + (size_t)N_LAYER * 2 * BT * KV_DIM * 4 + 8;
        kv_disk_expect e = {.fingerprint = x->fp, .block_tokens = BT, .n_layer = N_LAYER, .row_bytes = KV_DIM * 4,
                            .kv_type = KV_F32, .file_bytes = file_bytes, .file_bytes_nowin = file_bytes,
                            .key = x->key[b], .parent = x->parent[b], .ids = x->ids[b]};
        bool windows;
        FCHECK(kv_disk_check_block(bytes, n, &e, &windows) || (b == 3 && same_bytes(bytes, n, x->corrupt, x->corrupt_size)),
               "block %d's file does not check", b);
        free(bytes);
    }
    closedir(dir);
    disk_seed(x);
}

static void test_disk_tier(void **state) {
    (void)state;
    disk_ctx x = {.fp = 0x6661756c74ull};
    kt_error err = {0};
    x.pool = kv_pool_new(&LAYOUT, &err);
    assert_non_null(x.pool);
    kv_disk_key k = kv_disk_root();
    for (int b = 0; b < N_CHAIN; b++) {
        for (int i = 0; i < BT; i++) x.ids[b][i] = 100 * b + i;
        x.parent[b] = k;
        x.key[b] = k = kv_disk_chain(k, x.ids[b], BT);
    }
    snprintf(x.dir, sizeof x.dir, "%s", tu_tmp("fault-disk"));
    snprintf(x.sub, sizeof x.sub, "%s/%016llx", x.dir, (unsigned long long)x.fp);
    /* block 3's file as the writer makes it, then one byte of its KV flipped */
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", x.dir);
    assert_int_equal(system(cmd), 0);
    kv_disk *d = kv_disk_open(x.dir, 1 << 20, x.fp, &LAYOUT, &err);
    assert_non_null(d);
    disk_put(&x, d, 3);
    kv_disk_close(d);
    char path[700];
    block_path(&x, 3, path, sizeof path);
    x.corrupt = (uint8_t *)tu_read_file(path, &x.corrupt_size);
    assert_non_null(x.corrupt);
    x.corrupt[x.corrupt_size / 2] ^= 0x40;
    disk_seed(&x);
    scenario sc = {"disk cache", run_disk, after_disk, &x, 0};
    sweep(&sc);
    free(x.corrupt);
    kv_pool_free(x.pool);
}

/* ---- the disk tier under the engine ---- */

#define ED_PROMPT 40 /* two whole blocks of 16 and a part: the parts stay in memory */

typedef struct engdisk_ctx {
    kt_model *m;
    char dir[512];
    int32_t prompt_a[ED_PROMPT], prompt_b[ED_PROMPT];
    int32_t base_a[8], base_b[8];
    int n_base_a, n_base_b;
    uint64_t base_reads; /* blocks read from disk, unarmed */
    int n_new;           /* files the unarmed run added (request B's blocks) */
    bool have_base;
    /* the files a first engine left (seeded unarmed): names and bytes */
    int n_seed;
    char seed_name[16][700];
    uint8_t *seed_bytes[16];
    size_t seed_size[16];
} engdisk_ctx;

/* A greedy request run step by step; its tokens in out (at most 8), or
 * -1 with the engine's error (an error event or a refused submit). */
static int engine_generate(kt_engine *e, const int32_t *prompt, int32_t *out, kt_error *err) {
    kt_gen_params p = kt_gen_defaults();
    p.prompt = prompt, p.n_prompt = ED_PROMPT, p.max_tokens = 6;
    kt_request *r;
    if (kt_engine_submit(e, &p, &r, err) != KT_OK) return -1;
    int n = 0, rc = 0;
    kt_event ev;
    bool failed = false;
    while (rc >= 0) {
        kt_engine_run_steps(e, 1);
        while ((rc = kt_request_poll(r, &ev)) == 1) {
            if (ev.token >= 0 && n < 8) out[n++] = ev.token;
            if (ev.finish == KT_FINISH_ERROR) {
                failed = true;
                kt_error_set(err, KT_ERR_NOMEM, "%s", ev.error[0] ? ev.error : "the engine failed");
            }
            FCHECK(ev.finish != KT_FINISH_CANCELLED, "a request nobody cancelled ended cancelled");
        }
    }
    kt_request_free(r);
    return failed ? -1 : n;
}

static kt_engine *disk_engine(engdisk_ctx *x, kt_error *err) {
    kt_engine_params p = kt_engine_defaults();
    p.n_ctx = 128, p.n_parallel = 1, p.n_threads = 1, p.batch_tokens = 32, p.mem_limit = (size_t)64 << 20;
    p.cache_dir = x->dir, p.cache_disk_bytes = (size_t)1 << 30;
    kt_engine *e = kt_engine_new(x->m, &p, err);
    if (e) kt_engine_hold(e, true);
    return e;
}

/* A restarted engine: request A's blocks come from the files (reads),
 * request B's are written (the writer thread, a lane of its own). */
static outcome run_engine_disk(void *arg) {
    engdisk_ctx *x = arg;
    kt_error err = {0};
    kt_engine *e = disk_engine(x, &err);
    if (!e) return expect_error(&err, "kt_engine_new with a cache directory");
    int32_t a[8], b[8];
    outcome o = RUN_SAME;
    int na = engine_generate(e, x->prompt_a, a, &err);
    if (na < 0) o = expect_error(&err, "request A");
    int nb = na < 0 ? -1 : engine_generate(e, x->prompt_b, b, &err);
    if (na >= 0 && nb < 0) o = expect_error(&err, "request B");
    kt_engine_stats st;
    kt_engine_get_stats(e, &st);
    kt_engine_free(e); /* finishes the writes */
    if (o != RUN_SAME) return o;
    if (!x->have_base) {
        memcpy(x->base_a, a, sizeof a), memcpy(x->base_b, b, sizeof b);
        x->n_base_a = na, x->n_base_b = nb, x->have_base = true;
        x->base_reads = st.disk_reads;
        FCHECK(st.disk_reads >= 2, "request A read %llu blocks from disk", (unsigned long long)st.disk_reads);
        return RUN_SAME;
    }
    /* a block that could not be read is computed again: the same tokens (batch invariance) */
    FCHECK(na == x->n_base_a && !memcmp(a, x->base_a, sizeof(int32_t) * (size_t)na), "request A gave other tokens");
    FCHECK(nb == x->n_base_b && !memcmp(b, x->base_b, sizeof(int32_t) * (size_t)nb), "request B gave other tokens");
    return st.disk_reads == x->base_reads ? RUN_SAME : RUN_ABSORBED;
}

/* Calls fn for every file under dir's fingerprint folders. */
static void each_cache_file(const char *dir, void (*fn)(void *ctx, const char *path, const char *name), void *ctx) {
    DIR *top = opendir(dir);
    FCHECK(top != NULL, "the cache directory %s is gone", dir);
    struct dirent *de;
    while ((de = readdir(top))) {
        if (de->d_name[0] == '.') continue;
        char sub[700];
        snprintf(sub, sizeof sub, "%s/%.60s", dir, de->d_name);
        DIR *d = opendir(sub);
        if (!d) continue;
        struct dirent *f;
        while ((f = readdir(d))) {
            if (!strcmp(f->d_name, ".") || !strcmp(f->d_name, "..")) continue;
            char path[800];
            snprintf(path, sizeof path, "%s/%.60s", sub, f->d_name);
            fn(ctx, path, f->d_name);
        }
        closedir(d);
    }
    closedir(top);
}

static int seed_index(const engdisk_ctx *x, const char *path) {
    for (int i = 0; i < x->n_seed; i++)
        if (!strcmp(x->seed_name[i], path)) return i;
    return -1;
}

static void add_seed(void *ctx, const char *path, const char *name) {
    engdisk_ctx *x = ctx;
    FCHECK(strncmp(name, ".tmp-", 5) != 0, "a clean run left a temporary %s", path);
    FCHECK(x->n_seed < 16, "more files than expected");
    snprintf(x->seed_name[x->n_seed], sizeof x->seed_name[0], "%s", path);
    x->seed_bytes[x->n_seed] = (uint8_t *)tu_read_file(path, &x->seed_size[x->n_seed]);
    assert_non_null(x->seed_bytes[x->n_seed]);
    x->n_seed++;
}

/* Each file: one the first engine left, unchanged, or a whole block file
 * (its size, and its checksum over everything before it); no temporary. */
static void check_cache_file(void *ctx, const char *path, const char *name) {
    engdisk_ctx *x = ctx;
    FCHECK(strncmp(name, ".tmp-", 5) != 0, "a temporary was left: %s", path);
    size_t n = 0;
    uint8_t *bytes = (uint8_t *)tu_read_file(path, &n);
    FCHECK(bytes != NULL, "cannot read %s", path);
    const int i = seed_index(x, path);
    if (i >= 0) {
        FCHECK(same_bytes(bytes, n, x->seed_bytes[i], x->seed_size[i]), "%s changed", path);
    } else {
        uint64_t sum;
        FCHECK(n == x->seed_size[0] && n > 8, "%s has %zu bytes, a block file %zu", path, n, x->seed_size[0]);
        memcpy(&sum, bytes + n - 8, 8);
        FCHECK(sum == XXH3_64bits(bytes, n - 8), "%s does not check", path);
        FCHECK(unlink(path) == 0, "cannot remove %s", path); /* the seed state for the next run */
        x->n_new++;
    }
    free(bytes);
}

static void after_engine_disk(void *arg) {
    engdisk_ctx *x = arg;
    for (int i = 0; i < x->n_seed; i++)
        FCHECK(access(x->seed_name[i], F_OK) == 0, "%s, whole before the run, is gone", x->seed_name[i]);
    x->n_new = 0;
    each_cache_file(x->dir, check_cache_file, x);
    FCHECK(cur_point > 0 || x->n_new >= 2, "the unarmed run wrote %d block files for request B", x->n_new);
}

static void test_engine_disk(void **state) {
    (void)state;
    engdisk_ctx x = {0};
    kt_error err = {0};
    x.m = kt_model_load(tu_shared("models/stories260K.gguf"), &err);
    assert_non_null(x.m);
    const int nv = kt_model_describe(x.m)->n_vocab;
    for (int i = 0; i < ED_PROMPT; i++)
        x.prompt_a[i] = 1 + (i * 131) % (nv - 1), x.prompt_b[i] = 1 + (i * 197 + 5) % (nv - 1);
    snprintf(x.dir, sizeof x.dir, "%s", tu_tmp("fault-engine-disk"));
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", x.dir);
    assert_int_equal(system(cmd), 0);
    /* the first engine: request A's blocks on disk */
    kt_engine *e = disk_engine(&x, &err);
    assert_non_null(e);
    int32_t out[8];
    assert_true(engine_generate(e, x.prompt_a, out, &err) > 0);
    kt_engine_free(e);
    each_cache_file(x.dir, add_seed, &x);
    assert_true(x.n_seed >= 2);
    scenario sc = {"engine disk tier", run_engine_disk, after_engine_disk, &x, 0};
    sweep(&sc);
    for (int i = 0; i < x.n_seed; i++) free(x.seed_bytes[i]);
    kt_model_free(x.m);
}

/* ---- the server's request path ---- */

typedef struct req_case {
    srv_kind kind;
    const srv_dialect *dialect; /* NULL: OpenAI's chat or completions */
    const char *body;
} req_case;

#define TOOLS_JSON                                                                                                     \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","         \
    "\"properties\":{\"city\":{\"type\":\"string\",\"enum\":[\"Paris\",\"Oslo\"]}},\"required\":[\"city\"],"        \
    "\"additionalProperties\":false}}}]"

static const req_case REQS[] = {
    /* two choices, logprobs, a stop string */
    {SRV_CHAT, NULL,
     "{\"messages\":[{\"role\":\"system\",\"content\":\"Tell a story.\"},{\"role\":\"user\",\"content\":"
     "\"Once upon a time\"}],\"max_tokens\":12,\"n\":2,\"temperature\":0.7,\"seed\":5,\"logprobs\":true,"
     "\"top_logprobs\":2,\"stop\":[\"zzz\"]}"},
    /* a stream with usage */
    {SRV_CHAT, NULL,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"Lily had a red ball\"}],\"max_tokens\":10,"
     "\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}"},
    /* a completion with logprobs and a logit bias */
    {SRV_COMPLETION, NULL,
     "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0,\"logprobs\":2,"
     "\"logit_bias\":{\"13\":-100}}"},
    /* tool calls under a grammar, streamed */
    {SRV_CHAT, NULL,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],\"tools\":" TOOLS_JSON
     ",\"tool_choice\":\"required\",\"max_tokens\":72,\"temperature\":0,\"stream\":true}"},
    /* request 1's question again, whole: the result cache answers */
    {SRV_CHAT, NULL,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"Lily had a red ball\"}],\"max_tokens\":10,"
     "\"temperature\":0}"},
    /* a JSON schema */
    {SRV_CHAT, NULL,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"A cat\"}],\"max_tokens\":30,\"temperature\":0,"
     "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"c\",\"schema\":{\"type\":"
     "\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"]}}}}"},
    /* a tool loop's next turn: the call (arguments as a JSON string) and its result, in text parts */
    {SRV_CHAT, NULL,
     "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Weather in \"},{\"type\":"
     "\"text\",\"text\":\"Paris?\"}]},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\","
     "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
     "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"Sunny\"}],\"tools\":" TOOLS_JSON
     ",\"max_tokens\":8,\"temperature\":0}"},
    /* OpenAI's Responses API, streamed */
    {SRV_CHAT, &SRV_DIALECT_RESPONSES,
     "{\"input\":\"Lily had a red ball\",\"instructions\":\"Tell a story.\",\"max_output_tokens\":8,"
     "\"temperature\":0,\"stream\":true}"},
    /* Anthropic's Messages API, streamed, and a tool call */
    {SRV_CHAT, &SRV_DIALECT_MESSAGES,
     "{\"model\":\"stories\",\"max_tokens\":72,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":"
     "\"Weather in Oslo?\"}],\"tools\":[{\"name\":\"get_weather\",\"input_schema\":{\"type\":\"object\","
     "\"properties\":{\"city\":{\"type\":\"string\",\"enum\":[\"Paris\",\"Oslo\"]}},\"required\":[\"city\"]}}],"
     "\"tool_choice\":{\"type\":\"any\"},\"temperature\":0}"},
    /* Anthropic's Messages API, whole */
    {SRV_CHAT, &SRV_DIALECT_MESSAGES,
     "{\"model\":\"stories\",\"max_tokens\":8,\"system\":\"Tell a story.\",\"messages\":[{\"role\":\"user\","
     "\"content\":\"A dog\"}],\"temperature\":0}"},
};
#define N_REQS (sizeof REQS / sizeof REQS[0])
/* the last turn quotes request 4's reply, whose sampled ids the memory holds */
#define TURN2_FMT                                                                                                      \
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Lily had a red ball\"},{\"role\":\"assistant\",\"content\":%s},"  \
    "{\"role\":\"user\",\"content\":\"And then?\"}],\"max_tokens\":6,\"temperature\":0}"

typedef struct srv_ctx {
    kt_model *m;
    const char *template_text;
    bool have_base;
    char *base[N_REQS + 1]; /* each request's answer in the unarmed run */
    char *turn2_body;
} srv_ctx;

static kt_gen_params gen_params_of(const srv_gen_req *g, const int32_t *ids, int n) {
    /* what gen.c's gen_params makes, without the connection's hooks */
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids, p.n_prompt = n;
    p.max_tokens = g->max_tokens, p.n_choices = g->n_choices, p.sampling = g->sampling;
    p.stop = g->stop, p.n_stop = g->n_stop, p.top_logprobs = g->top_logprobs;
    p.logit_bias = g->logit_bias, p.n_logit_bias = g->n_logit_bias, p.priority = g->priority;
    p.ignore_eos = g->ignore_eos;
    p.grammar = g->grammar, p.grammar_len = g->grammar ? strlen(g->grammar) : 0;
    const kt_tool_grammar *tg = &g->tools_grammar;
    if (tg->n_triggers) {
        p.grammar = tg->grammar, p.grammar_len = tg->grammar ? strlen(tg->grammar) : 0;
        p.triggers = (const char *const *)tg->triggers, p.trigger_grammars = (const char *const *)tg->trigger_grammars;
        p.n_triggers = tg->n_triggers, p.max_segments = tg->max_calls;
        if (g->format && g->reasoning_split) {
            p.think_open = kt_tool_format_think_open(g->format);
            p.think_close = kt_tool_format_think_close(g->format);
            p.in_thinking = g->think == KT_THINK_OPEN;
        }
    }
    p.special_text = srv_gen_special_text(g);
    return p;
}

/* An answer as the client gets it: the status and the body (the error
 * object, the whole answer, or the stream's bytes). A stream that ran out
 * of memory is status 599 here: its whole events, then OOM_END (gen.c
 * sends the dialect's static ending there); `engine_error`: a choice
 * ended in KT_FINISH_ERROR, which a stream shows as an error event. */
typedef struct answer {
    int status;
    bool engine_error;
    srv_buf out;
} answer;

#define OOM_END "[out of memory]"

/* One request's state, as gen.c's srv_conn holds it. */
typedef struct req_run {
    const srv_dialect *d;
    json_t *dialect_body;
    srv_xlate *xlate;
    srv_gen_req g;
    srv_reply rp;
    bool include_usage;
    answer *a;
} req_run;

static bool emit(req_run *q, json_t *chunk) {
    if (!q->d) return srv_buf_sse(&q->a->out, chunk);
    return chunk && q->d->stream_chunk(q->xlate, chunk, &q->a->out);
}

static bool sse_error(req_run *q, const char *msg) {
    if (q->d) return q->d->stream_error(q->xlate, msg, &q->a->out);
    srv_error e;
    srv_fail(&e, 500, "server_error", NULL, NULL, "%s", msg[0] ? msg : "the engine failed");
    char *j = srv_error_json(&e);
    bool ok = j && srv_buf_append(&q->a->out, "data: ", 6) && srv_buf_append(&q->a->out, j, strlen(j)) &&
              srv_buf_append(&q->a->out, "\n\n", 2);
    free(j);
    return ok;
}

/* gen.c's stream_event: the event's chunks, then its finish (and error). */
static bool stream_event(req_run *q, const kt_event *ev) {
    json_t *chunks;
    if (!srv_chunk_event(&q->rp, ev, q->include_usage, &chunks)) return false;
    size_t i;
    json_t *j;
    bool ok = true;
    json_array_foreach(chunks, i, j) ok = ok && emit(q, json_incref(j));
    json_decref(chunks);
    if (!ok) return false;
    if (ev->finish == KT_FINISH_NONE) return true;
    if (!emit(q, srv_chunk_finish(&q->rp, ev->choice, ev->finish, q->include_usage))) return false;
    return ev->finish != KT_FINISH_ERROR || sse_error(q, ev->error);
}

/* One event as gen.c's drain takes it: the stream's bytes of an event
 * that failed are taken back. */
static bool take_event(req_run *q, const kt_event *ev) {
    if (ev->finish == KT_FINISH_ERROR) q->a->engine_error = true;
    const size_t mark = q->a->out.len;
    bool ok = q->g.stream ? srv_reply_track(&q->rp, ev) && stream_event(q, ev) : srv_reply_add(&q->rp, ev);
    if (!ok) q->a->out.len = mark;
    return ok;
}

static void test_copy(srv_buf *b, const char *s) {
    const bool was = fault_pause(); /* the test's own copy: gen.c hands the text to libmicrohttpd */
    b->len = 0;
    FCHECK(srv_buf_append(b, s, strlen(s)), "test: out of memory");
    fault_resume(was);
}

/* One request through the path gen.c takes: parse, translate, validate,
 * render and tokenize, the result cache, submit, the events (the engine
 * stepped one step at a time, each step's events drained), the answer,
 * the stream's end, or the error in the endpoint's shape. */
static void serve_one(srv_ctx *x, kt_engine *e, srv_sampled *sampled, srv_results *results, const req_case *rc,
                      const char *body_text, answer *a) {
    req_run q = {.d = rc->dialect, .a = a};
    srv_error er = {0};
    srv_conn c = {0};
    c.body.data = (char *)body_text, c.body.len = strlen(body_text);
    bool have_gen = false, have_reply = false;
    int32_t *ids = NULL;
    kt_request *req = NULL;
    srv_result res = {0};
    a->status = 200;
    json_t *body = srv_parse_body(&c, &er);
    if (!body) goto error;
    if (q.d) {
        q.dialect_body = body;
        if (!(body = q.d->to_chat(q.dialect_body, NULL, &er))) goto error;
    }
    if (!srv_parse_gen(body, rc->kind, &(srv_model_info){.n_vocab = kt_model_describe(x->m)->n_vocab}, 42, &q.g, &er))
        goto error;
    have_gen = true;
    q.include_usage = q.g.include_usage;
    int n = srv_prompt_tokens(x->m, x->template_text, sampled, &q.g, NULL, &ids, &er);
    if (n < 0) goto error;
    const bool cacheable = srv_result_cacheable(&q.g);
    srv_result_key key = {0};
    bool hit = false;
    if (cacheable) key = srv_result_key_of(&q.g, ids, n), hit = srv_results_get(results, key, &res);
    if (!hit) {
        kt_gen_params p = gen_params_of(&q.g, ids, n);
        kt_error err = {0};
        kt_gen_field field = KT_FIELD_NONE;
        if (kt_engine_submit_ex(e, &p, &req, &err, &field) != KT_OK) {
            srv_submit_error(&err, field, q.g.kind, &er);
            goto error;
        }
    }
    const char *id = q.d == &SRV_DIALECT_RESPONSES ? "resp_fault" : q.d ? "msg_fault"
                     : rc->kind == SRV_CHAT ? "chatcmpl-fault" : "cmpl-fault";
    have_reply = true; /* gen.c frees the reply whatever its init did */
    bool ok = srv_reply_init(&q.rp, &q.g, x->m, "stories", id, 1700000000);
    if (ok && q.g.stream && q.g.kind == SRV_CHAT) {
        ok = !q.d || (q.xlate = q.d->stream_new(q.dialect_body, &q.rp, &q.g, n));
        for (int i = 0; ok && i < q.g.n_choices; i++) ok = emit(&q, srv_chunk_role(&q.rp, i, q.include_usage));
    }
    if (!ok) {
        srv_fail(&er, 500, "server_error", NULL, NULL, "out of memory");
        goto error;
    }
    kt_request_usage u = {0};
    if (hit) { /* gen.c's answer_from_results */
        u = res.usage;
        u.cached_tokens = u.prompt_tokens;
        for (int i = 0; ok && i < res.n_choices; i++) {
            kt_event ev = {.choice = i, .token = -1, .text = res.text[i], .text_len = res.len[i],
                           .finish = res.finish[i], .stop_string = res.stop_string[i]};
            ok = take_event(&q, &ev);
        }
    } else {
        kt_event ev;
        for (int r = 0; ok && r >= 0;) {
            kt_engine_run_steps(e, 1);
            while (ok && (r = kt_request_poll(req, &ev)) == 1) ok = take_event(&q, &ev);
        }
        if (ok) {
            srv_reply_remember(&q.rp, sampled);
            u = kt_request_get_usage(req);
            if (cacheable) srv_results_put(results, key, &q.rp, &u);
        }
    }
    if (q.g.stream) {
        const size_t mark = a->out.len;
        if (ok && q.d) ok = q.d->stream_end(q.xlate, &u, &a->out);
        else if (ok)
            ok = (!q.include_usage || srv_buf_sse(&a->out, srv_chunk_usage(&q.rp, &u))) &&
                 srv_buf_append(&a->out, "data: [DONE]\n\n", 14);
        if (!ok) { /* the whole events first, then the static ending */
            a->out.len = mark;
            const bool was = fault_pause();
            srv_buf_append(&a->out, OOM_END, strlen(OOM_END));
            fault_resume(was);
            a->status = 599;
        }
        goto done;
    }
    if (!ok) {
        srv_fail(&er, 500, "server_error", NULL, NULL, "out of memory");
        goto error;
    }
    const int bad = srv_reply_error_choice(&q.rp);
    if (bad >= 0) {
        srv_fail(&er, 500, "server_error", NULL, NULL, "%s", q.rp.choices[bad].error[0] ? q.rp.choices[bad].error : "the engine failed");
        goto error;
    }
    json_t *done = srv_reply_json(&q.rp, &u), *j = done;
    if (done && q.d) j = q.d->from_chat(q.dialect_body, done, &q.rp, &q.g), json_decref(done);
    char *text = j ? kt_json_dumps(j, JSON_COMPACT) : NULL; /* srv_respond_json */
    json_decref(j);
    if (!text) {
        srv_fail(&er, 500, "server_error", NULL, NULL, "out of memory");
        goto error;
    }
    test_copy(&a->out, text);
    free(text);
    goto done;
error:
    FCHECK(er.status >= 400 && er.msg[0], "an error without a status or message (%d '%s')", er.status, er.msg);
    a->status = er.status;
    char *ej = q.d ? q.d->error_json(&er) : srv_error_json(&er);
    a->out.len = 0;
    if (ej) test_copy(&a->out, ej); /* else gen.c answers MHD_NO: the connection closes */
    free(ej);
done:
    if (req) kt_request_cancel(req), kt_request_free(req);
    if (have_reply) srv_reply_free(&q.rp);
    srv_result_clear(&res);
    if (have_gen) srv_gen_req_free(&q.g);
    if (q.xlate) q.d->stream_free(q.xlate);
    free(ids);
    json_decref(body);
    json_decref(q.dialect_body);
}

/* How many prompt tokens the prefix cache served depends on what earlier
 * requests left there, which a failure may have changed: not compared. */
static void mask_cached(char *s) {
    /* OpenAI's, and Anthropic's (whose input_tokens are the rest) */
    static const char *const KEYS[] = {"\"cached_tokens\":", "\"cache_read_input_tokens\":", "\"input_tokens\":"};
    for (size_t k = 0; k < sizeof KEYS / sizeof KEYS[0]; k++)
        for (char *p = s; (p = strstr(p, KEYS[k]));) {
            p += strlen(KEYS[k]);
            char *q = p;
            while (*q >= '0' && *q <= '9') q++;
            if (q > p) *p = '0', memmove(p + 1, q, strlen(q) + 1); /* still JSON */
        }
}

/* Two JSON values alike but for reals within 1e-4 (logprobs computed
 * after a kernel's scalar fallback, logits_match). */
static bool json_close(json_t *a, json_t *b) {
    if (json_is_real(a) && json_is_real(b)) {
        double x = json_real_value(a), y = json_real_value(b);
        return fabs(x - y) <= 1e-4 * (fabs(y) > 1 ? fabs(y) : 1);
    }
    if (json_typeof(a) != json_typeof(b)) return false;
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b)) return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!json_close(json_array_get(a, i), json_array_get(b, i))) return false;
        return true;
    }
    if (json_is_object(a)) {
        if (json_object_size(a) != json_object_size(b)) return false;
        const char *k;
        json_t *v;
        json_object_foreach(a, k, v) if (!json_close(v, json_object_get(b, k))) return false;
        return true;
    }
    return json_equal(a, b);
}

/* A whole answer or a stream's events, each JSON (or [DONE]) close to
 * the unarmed run's: parsed with the test's own memory. */
static bool answer_close(const char *got, const char *want) {
    const bool was = fault_pause();
    bool ok = true;
    const bool stream = !strncmp(want, "data: ", 6);
    while (ok && *want) {
        const char *ge = stream ? strstr(got, "\n\n") : got + strlen(got);
        const char *we = stream ? strstr(want, "\n\n") : want + strlen(want);
        if (!ge || !we) {
            ok = !ge && !we && !strcmp(got, want);
            break;
        }
        const size_t skip = stream ? 6 : 0;
        json_t *a = json_loadb(got + skip, (size_t)(ge - got) - skip, 0, NULL);
        json_t *b = json_loadb(want + skip, (size_t)(we - want) - skip, 0, NULL);
        ok = (a && b) ? json_close(a, b) : (ge - got == we - want && !memcmp(got, want, (size_t)(ge - got)));
        json_decref(a), json_decref(b);
        got = stream ? ge + 2 : ge, want = stream ? we + 2 : we;
    }
    ok = ok && !*got;
    fault_resume(was);
    return ok;
}

/* An answer must be the unarmed run's, an error, or (a stream) the
 * unarmed stream's first whole events and then the error ending. */
static outcome judge(const answer *a, const char *base, int i) {
    const size_t blen = strlen(base);
    if (a->engine_error) { /* a stream's error event, after what was sent before */
        FCHECK(a->out.data && strstr(a->out.data, "error"), "request %d: the engine failed and the stream does not say so", i);
        return RUN_ERROR;
    }
    if (a->status == 200) {
        if (same_bytes(a->out.data, a->out.len, base, blen)) return RUN_SAME;
        size_t k = 0;
        while (k < a->out.len && k < blen && a->out.data[k] == base[k]) k++;
        FCHECK(answer_close(a->out.data, base), "request %d answered otherwise from byte %zu:\n%.300s\nnot\n%.300s", i,
               k, a->out.data + k, base + k);
        return RUN_ABSORBED;
    }
    if (a->status == 599) {
        size_t kept = a->out.len - strlen(OOM_END);
        FCHECK(kept <= blen && (kept == 0 || !memcmp(a->out.data, base, kept)) &&
                   (kept == 0 || (kept >= 2 && !memcmp(a->out.data + kept - 2, "\n\n", 2))),
               "request %d's stream broke off inside an event or with other bytes", i);
        return RUN_ERROR;
    }
    return RUN_ERROR;
}

static outcome run_server(void *arg) {
    srv_ctx *x = arg;
    kt_error err = {0};
    kt_engine_params p = kt_engine_defaults();
    p.n_ctx = 1024, p.n_parallel = 2, p.n_threads = 1, p.batch_tokens = 32, p.kv_bytes = 0;
    p.mem_limit = (size_t)64 << 20;
    kt_engine *e = kt_engine_new(x->m, &p, &err);
    if (!e) return expect_error(&err, "kt_engine_new");
    kt_engine_hold(e, true); /* steps only when granted: the engine and this thread never run at once */
    srv_sampled *sampled = srv_sampled_new(4096);
    srv_results *results = srv_results_new(8);
    outcome o = RUN_SAME;
    for (size_t i = 0; i <= N_REQS; i++) {
        answer a = {0};
        const bool turn2 = i == N_REQS;
        if (!sampled || !results) {
            o = RUN_ERROR; /* the server refuses to start without them (cmd_serve.c) */
            break;
        }
        struct timespec q0, q1;
        clock_gettime(CLOCK_MONOTONIC, &q0);
        long c0 = fault_count();
        static const req_case TURN2 = {SRV_CHAT, NULL, NULL};
        serve_one(x, e, sampled, results, turn2 ? &TURN2 : &REQS[i], turn2 ? x->turn2_body : REQS[i].body, &a);
        clock_gettime(CLOCK_MONOTONIC, &q1);
        if (getenv("KT_FAULT_PROFILE")) fprintf(stderr, "request %zu: %ld calls, %.1f ms\n", i, fault_count() - c0, (q1.tv_sec - q0.tv_sec) * 1e3 + (q1.tv_nsec - q0.tv_nsec) / 1e6);
        const bool was = fault_pause(); /* NUL-terminated (for strstr and messages) by the test */
        FCHECK(srv_buf_append(&a.out, "", 1), "test: out of memory");
        fault_resume(was);
        a.out.len--;
        mask_cached(a.out.data), a.out.len = strlen(a.out.data);
        if (!x->have_base) {
            FCHECK(a.status == 200, "request %zu failed unarmed: %s", i, a.out.data);
            x->base[i] = own_strdup(a.out.data);
            if (getenv("KT_FAULT_PROFILE")) fprintf(stderr, "answer %zu: %s\n", i, a.out.data);
        } else {
            outcome r = judge(&a, x->base[i], (int)i);
            if (r == RUN_ERROR || (r == RUN_ABSORBED && o == RUN_SAME)) o = r;
        }
        srv_buf_free(&a.out);
    }
    srv_results_free(results);
    srv_sampled_free(sampled);
    kt_engine_free(e);
    if (!x->have_base) x->have_base = true;
    return o;
}

static void test_server_path(void **state) {
    (void)state;
    srv_ctx x = {0};
    kt_error err = {0};
    x.m = kt_model_load(tu_shared("models/stories260K.gguf"), &err);
    assert_non_null(x.m);
    x.template_text = kt_chat_builtin_template("chatml");
    assert_non_null(x.template_text);
    /* a first unarmed run gives the reply the second turn quotes: request
     * 4's (request 1's prompt, not streamed), whose ids the sampled-ids
     * memory holds by the time the second turn comes */
    x.turn2_body = strdup("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2}");
    assert_non_null(x.turn2_body);
    assert_int_equal(run_server(&x), RUN_SAME);
    json_t *j = json_loads(x.base[4], 0, NULL);
    assert_non_null(j);
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    char *quoted = json_dumps(json_object_get(msg, "content"), JSON_ENCODE_ANY);
    assert_non_null(quoted);
    free(x.turn2_body);
    size_t len = strlen(TURN2_FMT) + strlen(quoted);
    x.turn2_body = malloc(len);
    assert_non_null(x.turn2_body);
    snprintf(x.turn2_body, len, TURN2_FMT, quoted);
    free(quoted);
    json_decref(j);
    for (size_t i = 0; i <= N_REQS; i++) free(x.base[i]), x.base[i] = NULL;
    x.have_base = false;
    scenario sc = {"server request path", run_server, NULL, &x, 300};
    sweep(&sc);
    for (size_t i = 0; i <= N_REQS; i++) free(x.base[i]);
    free(x.turn2_body);
    kt_model_free(x.m);
}

/* A crash is the sanitizer's to report (with the death callback naming
 * the point), not cmocka's signal handler's. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "allow_user_segv_handler=0:print_stacktrace=1";
}

const char *__ubsan_default_options(void);
const char *__ubsan_default_options(void) {
    return "print_stacktrace=1";
}

int main(void) {
    fault_init_jansson();
    __sanitizer_set_death_callback(on_death);
    signal(SIGALRM, on_alarm);
    setvbuf(stdout, NULL, _IOLBF, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_session_files),
        cmocka_unit_test(test_disk_tier),
        cmocka_unit_test(test_engine_disk),
        cmocka_unit_test(test_model_load),
        cmocka_unit_test(test_server_path),
    };
    keep_going = env_long("KT_FAULT_KEEP_GOING", 0) != 0;
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (n_failed) printf("%ld checks failed\n", n_failed), failed += (int)n_failed;
    printf("all scenarios: %ld points (", grand.points);
    for (int c = 0, first = 1; c < FAULT_N_CLASSES; c++)
        if (grand.by_class[c]) printf("%s%s %ld", first ? "" : ", ", fault_class_name(c), grand.by_class[c]), first = 0;
    printf("), %ld runs: %ld error, %ld absorbed, %ld same\n", grand.runs, grand.by_outcome[RUN_ERROR],
           grand.by_outcome[RUN_ABSORBED], grand.by_outcome[RUN_SAME]);
    return tu_result(failed);
}
