/*
 * testutil.h - helpers shared by the tests: paths to the shared test data
 * (KETTLE_TESTDATA, default ../shared) and to the
 * kettle binary, reading whole files, running a command and capturing its
 * output.
 */
#ifndef KT_TESTUTIL_H
#define KT_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>

#include "base/dtype.h"
#include "kettle.h"

/* 1 in a build under AddressSanitizer. Such a build looks for memory
 * errors, not for wrong answers, and runs ~7x slower: tests that repeat
 * the same paths over many seeds or cases run fewer repetitions there
 * (saying so where they do), so the CI's suite stays within its time. */
#if defined(__SANITIZE_ADDRESS__)
#define TU_SANITIZED 1
#else
#define TU_SANITIZED 0
#endif

/* The shared test data folder (CMake's KETTLE_TESTDATA, default ../shared
 * beside the repository). When it is missing, fails the running test with
 * a message naming KETTLE_TESTDATA and how to set it, so a test reports the
 * cause once instead of a "no such file" for each file it opens. */
const char *tu_shared_dir(void);
/* "<shared>/<rel>" in a static buffer (overwritten by the next call);
 * checks the folder as tu_shared_dir does. */
const char *tu_shared(const char *rel);
/* "<build>/tmp/<name>" in a static buffer (overwritten by the next call). */
const char *tu_tmp(const char *name);
/* Reads a whole file (NUL-terminated); NULL if it cannot. Caller frees. */
char *tu_read_file(const char *path, size_t *size);
/* Writes bytes to a file; 0 on success. */
int tu_write_file(const char *path, const void *data, size_t size);
/* Runs `sh -c cmd`, capturing stdout (and stderr separately if err_out is
 * not NULL). Returns the exit status (or -1). Caller frees the strings. */
int tu_run(const char *cmd, char **out, char **err_out);

/* Runs cmd (tu_run) and checks that it exits want_rc with msg1, and msg2
 * unless NULL, on stderr; prints the command and its stderr first when
 * not, so a failure shows what the program said. */
void tu_expect_run(const char *cmd, int want_rc, const char *msg1, const char *msg2);

/* Runs `bin gen-model ARGS -o tu_tmp(file)` (args: --shape, --type,
 * --vocab ...) and loads what it wrote; the test fails if either fails. */
kt_model *tu_gen_model(const char *bin, const char *file, const char *args);

/* x[i] = std * normal, from a seeded generator: the same numbers on every
 * run. */
void tu_fill_normal(float *x, size_t n, float std, uint64_t seed);
/* A random n_out x n_in weight matrix of `type` (caller frees), made by
 * quantizing normal floats (std 0.1, from the seed); lopsided > 0 adds it
 * to one element of each row, so blocks get a minimum far from 0. */
void *tu_make_weights(kt_dtype type, int n_in, int n_out, uint64_t seed, float lopsided);
/* The test's own clock (CLOCK_MONOTONIC) in ms: to time a kettle command
 * from outside, independently of kettle's clock. */
double tu_now_ms(void);
/* malloc that fails the test instead of returning NULL. */
void *tu_xmalloc(size_t n);

/* llama.cpp's golden files (golden/, golden/arch/): a JSON array of ids
 * (caller frees), and one teacher-forced position's logits against its
 * golden entry: the lse within 10 tol, the argmax where the golden's
 * top-1 / top-2 gap exceeds 2 tol; returns the max |diff| over the
 * golden's top entries (p: the position, for the messages). */
int32_t *tu_json_ids(json_t *arr, int *n);
int tu_argmax(const float *x, int n);
double tu_golden_check_position(const float *logits, int n_vocab, json_t *pos, double tol, int p);

/* The batched engine (engine/engine.h): a request's greedy-or-seeded
 * output (tokens and their logprob bits), submitted with ignore_eos and
 * top_logprobs 0; drained until it finishes (failing on an error event),
 * freed, its usage returned; two outputs compared bit for bit. */
typedef struct tu_eng_out {
    int32_t tokens[64];
    float logprobs[64];
    int n;
} tu_eng_out;
struct kt_engine;
struct kt_request *tu_eng_submit(struct kt_engine *e, const int32_t *ids, int n, int max_tokens, int n_choices);
struct kt_request_usage tu_eng_drain(struct kt_request *r, tu_eng_out *out, int n_choices);
void tu_assert_same_out(const tu_eng_out *a, const tu_eng_out *b, const char *what);

/* Skips the running test visibly: prints which test and why, and makes
 * tu_result turn a run with no failure into ctest's skip code, so ctest
 * shows the program as skipped instead of passed. */
#define tu_skip(...) do { tu_note_skip(__func__, __VA_ARGS__); skip(); } while (0)
void tu_note_skip(const char *test, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* What main returns: cmocka's failure count, or TU_SKIP_CODE when nothing
 * failed but a test was skipped. */
#define TU_SKIP_CODE 77
int tu_result(int failed);

#endif
