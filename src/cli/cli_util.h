/*
 * cli_util.h - helpers shared by the file tools (info, convert, quantize,
 * gen-model): argument parsing, error reporting, llama.cpp file types,
 * writing an output file safely, a parallel loop over rows, and a progress
 * bar.
 *
 * Outputs are written to "OUT.part" and renamed over OUT only once
 * complete, so a failed or interrupted run never leaves a half-written
 * model behind, and `kettle quantize m.gguf m.gguf Q8_0` does not clobber
 * the input it is still reading (the mapping keeps the old inode alive).
 */
#ifndef KT_CLI_UTIL_H
#define KT_CLI_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/dtype.h"
#include "kettle.h"

/* ---- arguments ---- */

/* True if argv[1..] contains "--help" or "-h". */
bool cli_wants_help(int argc, char **argv);

/* Matches option `name` at argv[*i], as "--name VALUE" or "--name=VALUE".
 * Returns 1 and sets *value (advancing *i past a separate value), 0 if
 * argv[*i] is not this option, -1 if the value is missing (message
 * printed). */
int cli_opt(int argc, char **argv, int *i, const char *name, const char **value);

/* Parses a whole decimal (or 0x hex) unsigned number; false if invalid. */
bool cli_parse_u64(const char *s, uint64_t *out);

/* Prints "kettle CMD: MESSAGE" on stderr for a usage error; returns 2. */
int cli_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prints "kettle CMD: err->msg" on stderr; returns 1. */
int cli_fail(const char *cmd, const kt_error *err);

/* ---- types ---- */

/* The element types the tools can write: F32, F16, BF16, Q8_0, Q4_0.
 * Returns the type or -1 for anything else. */
int cli_parse_out_type(const char *name);
/* "F32, F16, BF16, Q8_0, Q4_0" for messages. */
const char *cli_out_type_list(void);
/* llama.cpp's LLAMA_FTYPE for a file whose weights are mostly `t`. */
uint32_t cli_llama_ftype(kt_dtype t);

/* ---- output files ---- */

typedef struct cli_out {
    const char *path; /* final name */
    char tmp[4096];   /* where it is written first */
} cli_out;

/* Prepares the temporary name; fails if the path is too long. */
kt_status cli_out_init(cli_out *o, const char *path, kt_error *err);
/* Renames the finished temporary file over the final path. */
kt_status cli_out_commit(cli_out *o, kt_error *err);
/* Removes the temporary file (after a failure). */
void cli_out_discard(cli_out *o);

/* ---- parallel rows ---- */

/* Calls fn(ctx, ith, nth) on nth threads (the caller is thread 0) and waits
 * for all; nth is min(online CPUs, 16), or 1 when n_items is small. Falls
 * back to fewer threads if they cannot be created. */
typedef void (*cli_par_fn)(void *ctx, int ith, int nth);
void cli_parallel(int64_t n_items, cli_par_fn fn, void *ctx);

/* [lo, hi) of n items for thread ith of nth. */
void cli_split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi);

/* ---- progress ---- */

/* A progress bar on stderr, drawn only when stderr is a terminal. */
typedef struct cli_progress {
    uint64_t total, done;
    int last_pct;
    bool tty;
    double t0_ms;
} cli_progress;

void cli_progress_start(cli_progress *p, uint64_t total);
/* Adds `n` units and redraws if the percentage changed. */
void cli_progress_add(cli_progress *p, uint64_t n, const char *what);
/* Clears the bar; returns seconds since start. */
double cli_progress_end(cli_progress *p);

/* "12.3 MiB" into buf. */
const char *cli_human_bytes(uint64_t n, char *buf, size_t cap);

#endif
