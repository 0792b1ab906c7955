/*
 * testutil.c - see testutil.h.
 */
#include "testutil.h"

#include "engine/engine.h"

#include "base/rng.h"
#include "ops/quant.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *tu_shared_dir(void) {
    static bool present; /* checked until found once; the folder does not go away mid-run */
    /* access(), not stat(): test_fault makes stat fail on purpose */
    if (!present && access(KT_SHARED_DIR "/models", R_OK | X_OK) != 0)
        fail_msg("the shared test data is not at %s (KETTLE_TESTDATA, default ../shared beside the "
                 "repository): point KETTLE_TESTDATA at the folder holding models/, vocab/ and golden/ "
                 "and configure again (cmake -S . -B build -DKETTLE_TESTDATA=DIR)", KT_SHARED_DIR);
    present = true;
    return KT_SHARED_DIR;
}

const char *tu_shared(const char *rel) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", tu_shared_dir(), rel);
    return buf;
}

double tu_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

const char *tu_tmp(const char *name) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", KT_TMP_DIR, name);
    return buf;
}

char *tu_read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return NULL; }
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) { fclose(f); return NULL; }
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
    fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    if (size) *size = (size_t)n;
    return buf;
}

int tu_write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, size, f);
    return (fclose(f) == 0 && w == size) ? 0 : -1;
}

int tu_run(const char *cmd, char **out, char **err_out) {
    char errpath[4096], full[8192];
    snprintf(errpath, sizeof errpath, "%s/stderr.%d.txt", KT_TMP_DIR, (int)getpid());
    snprintf(full, sizeof full, "%s 2>%s", cmd, errpath);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
    }
    int st = pclose(p);
    if (buf) buf[len] = 0;
    if (out) *out = buf; else free(buf);
    if (err_out) *err_out = tu_read_file(errpath, NULL);
    unlink(errpath);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void tu_expect_run(const char *cmd, int want_rc, const char *msg1, const char *msg2) {
    char *out = NULL, *err = NULL;
    int rc = tu_run(cmd, &out, &err);
    const char *e = err ? err : "";
    if (rc != want_rc || !strstr(e, msg1) || (msg2 && !strstr(e, msg2))) fprintf(stderr, "%s\n-> %d\n%s\n", cmd, rc, e);
    assert_int_equal(rc, want_rc);
    assert_non_null(strstr(e, msg1));
    if (msg2) assert_non_null(strstr(e, msg2));
    free(out), free(err);
}

kt_model *tu_gen_model(const char *bin, const char *file, const char *args) {
    char cmd[8192], path[4096];
    snprintf(path, sizeof path, "%s", tu_tmp(file));
    snprintf(cmd, sizeof cmd, "%s gen-model %s -o '%s'", bin, args, path);
    tu_expect_run(cmd, 0, "wrote", NULL);
    kt_error err = {0};
    kt_model *m = kt_model_load(path, &err);
    if (!m) fail_msg("%s: %s", path, err.msg);
    return m;
}

void tu_fill_normal(float *x, size_t n, float std, uint64_t seed) {
    kt_rng r;
    kt_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = kt_rng_normal(&r) * std;
}

static int g_skipped;

void tu_note_skip(const char *test, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("SKIPPED %s: ", test);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    g_skipped++;
}

int tu_result(int failed) {
    if (failed) return failed;
    if (g_skipped) printf("%d test(s) skipped (see the SKIPPED lines): reporting a skip to ctest\n", g_skipped);
    return g_skipped ? TU_SKIP_CODE : 0;
}

void *tu_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

void *tu_make_weights(kt_dtype type, int n_in, int n_out, uint64_t seed, float lopsided) {
    size_t rb = kt_dtype_row_bytes(type, n_in);
    char *w = tu_xmalloc(rb * (size_t)n_out);
    float *row = tu_xmalloc(sizeof(float) * (size_t)n_in);
    for (int r = 0; r < n_out; r++) {
        tu_fill_normal(row, (size_t)n_in, 0.1f, seed * 1000003u + (uint64_t)r);
        row[r % n_in] += lopsided;
        kt_quantize_row(type, row, w + rb * (size_t)r, n_in);
    }
    free(row);
    return w;
}

int32_t *tu_json_ids(json_t *arr, int *n) {
    *n = (int)json_array_size(arr);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(*n + 1));
    assert_non_null(ids);
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return ids;
}

static double log_sum_exp(const float *x, int n) {
    double mx = x[0], s = 0;
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) s += exp(x[i] - mx);
    return mx + log(s);
}

int tu_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

double tu_golden_check_position(const float *logits, int n_vocab, json_t *pos, double tol, int p) {
    json_t *top = json_object_get(pos, "top");
    double maxdiff = 0;
    for (size_t j = 0; j < json_array_size(top); j++) {
        json_t *e = json_array_get(top, j);
        int id = (int)json_integer_value(json_array_get(e, 0));
        double want = json_real_value(json_array_get(e, 1));
        double d = fabs(logits[id] - want);
        if (d > maxdiff) maxdiff = d;
    }
    double lse = log_sum_exp(logits, n_vocab);
    double want_lse = json_real_value(json_object_get(pos, "lse"));
    if (fabs(lse - want_lse) > tol * 10) {
        fprintf(stderr, "position %d: lse %f, golden %f\n", p, lse, want_lse);
        fail();
    }
    double gap = json_real_value(json_array_get(json_array_get(top, 0), 1)) -
                 json_real_value(json_array_get(json_array_get(top, 1), 1));
    int want_top = (int)json_integer_value(json_array_get(json_array_get(top, 0), 0));
    if (gap > 2 * tol && tu_argmax(logits, n_vocab) != want_top) {
        int got = tu_argmax(logits, n_vocab);
        fprintf(stderr, "position %d: argmax %d (logit %f), golden %d (logit %f here, gap %f)\n", p, got,
                logits[got], want_top, logits[want_top], gap);
        fail();
    }
    return maxdiff;
}

kt_request *tu_eng_submit(kt_engine *e, const int32_t *ids, int n, int max_tokens, int n_choices) {
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids, p.n_prompt = n, p.max_tokens = max_tokens, p.n_choices = n_choices;
    p.top_logprobs = 0, p.ignore_eos = true;
    kt_request *r = NULL;
    kt_error err = {0};
    if (kt_engine_submit(e, &p, &r, &err) != KT_OK) fail_msg("%s", err.msg);
    return r;
}

kt_request_usage tu_eng_drain(kt_request *r, tu_eng_out *out, int n_choices) {
    memset(out, 0, sizeof *out * (size_t)n_choices);
    kt_event ev;
    int rc;
    while ((rc = kt_request_wait(r, &ev, 60000)) == 1) {
        if (ev.finish == KT_FINISH_ERROR) fail_msg("engine error: %s", ev.error);
        if (ev.token < 0) continue;
        tu_eng_out *o = &out[ev.choice];
        assert_true(o->n < 64);
        o->logprobs[o->n] = ev.logprob.logprob;
        o->tokens[o->n++] = ev.token;
    }
    assert_int_equal(rc, -1);
    kt_request_usage u = kt_request_get_usage(r);
    kt_request_free(r);
    return u;
}

void tu_assert_same_out(const tu_eng_out *a, const tu_eng_out *b, const char *what) {
    if (a->n != b->n || memcmp(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n) ||
        memcmp(a->logprobs, b->logprobs, sizeof(float) * (size_t)a->n))
        fail_msg("%s: tokens or logprob bits differ from the request alone", what);
}
