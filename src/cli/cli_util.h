/*
 * cli_util.h - helpers shared by the file tools (info, convert, quantize,
 * gen-model): argument parsing, error reporting, llama.cpp file types, a
 * parallel loop over rows, and a progress bar.
 *
 * (Outputs need no helper: the GGUF writer writes a temporary file and
 * renames it into place, so a failed run leaves nothing half-written and
 * `kettle quantize m.gguf m.gguf Q8_0` does not clobber its mapped input.)
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
 * argv[*i] is not this option, -1 if the value is missing (usage message
 * printed, naming command `cmd`). */
int cli_opt(const char *cmd, int argc, char **argv, int *i, const char *name,
            const char **value);

/* Option tables for cli_take_opt: an integer option with its range, a
 * string option. */
typedef struct cli_int_opt {
    const char *name;
    long lo, hi;
    int *dst;
} cli_int_opt;
typedef struct cli_str_opt {
    const char *name;
    const char **dst;
} cli_str_opt;
/* Whether argv[*i] is one of ints or strs (either table may be empty):
 * 1 taken (the value into its dst, an integer checked against its range),
 * 0 none of them, 2 a usage error (reported, naming `cmd`). */
int cli_take_opt(const char *cmd, int argc, char **argv, int *i, const cli_int_opt *ints, size_t n_ints,
                 const cli_str_opt *strs, size_t n_strs);

/* Parses a whole decimal (or 0x hex) unsigned number; false if invalid. */
bool cli_parse_u64(const char *s, uint64_t *out);
/* A decimal integer in [lo, hi] (within int's range), the whole string. */
bool cli_parse_int(const char *s, long lo, long hi, int *out);
/* A comma-separated list of integers in [lo, hi], at most cap of them,
 * into v[0..*n); false (at least one needed) if invalid. */
bool cli_parse_int_list(const char *s, long lo, long hi, int *v, int cap, int *n);
/* A chat template given as a built-in name (chatml, llama3, ...) or a
 * file path, as malloc'd text; NULL with err->msg saying why. */
char *cli_load_template(const char *arg, kt_error *err);
/* A decimal number in [lo, hi], the whole string. */
bool cli_parse_float(const char *s, float lo, float hi, float *out);

/* Prints "kettle CMD: MESSAGE" on stderr for a usage error; returns 2. */
int cli_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prints "kettle CMD: err->msg" on stderr; returns 1. */
int cli_fail(const char *cmd, const kt_error *err);

/* Reads a whole file ("-": standard input) into a NUL-terminated malloc'ed
 * buffer; *len excludes the NUL. NULL with errno set on failure. */
char *cli_read_file(const char *path, size_t *len);

/* ---- generation options (run, chat) ---- */

typedef struct cli_gen_opts {
    const char *model;
    int n_predict, n_ctx, n_threads;
    kt_load_mode load;
    kt_sampler_params sp;
    bool seed_given; /* --seed; else cli_gen_defaults drew one (printed, so a run can be repeated) */
} cli_gen_opts;

/* Parses "mmap", "populate" or "copy"; false otherwise. */
bool cli_parse_load_mode(const char *s, kt_load_mode *out);

/* n_predict 128, the model's context (at most 4096), all CPUs, and
 * kt_sampler_defaults() with a seed drawn from the system's entropy (so
 * two runs at a temperature above 0 differ, as users expect; --seed
 * repeats one). */
void cli_gen_defaults(cli_gen_opts *g);
/* If argv[*i] is a generation option (-m, -n, -c, -t or a sampling option)
 * takes it and its value (advancing *i) and returns 1; returns 0 if it is
 * not one, 2 after reporting a usage error. */
int cli_gen_opt(const char *cmd, int argc, char **argv, int *i, cli_gen_opts *g);
/* Warns on stderr when an asked context (-c, 0: the default) is beyond
 * the positions the model was trained on. */
void cli_warn_ctx(const char *cmd, const kt_model *m, int n_ctx);
/* The usage lines of those options. */
const char *cli_gen_usage(void);

/* ---- types ---- */

/* The element types the tools can write: F32, F16, BF16, Q8_0, Q4_0.
 * Returns the type or -1 for anything else. */
int cli_parse_out_type(const char *name);
/* "F32, F16, BF16, Q8_0, Q4_0" for messages. */
const char *cli_out_type_list(void);
/* llama.cpp's LLAMA_FTYPE for a file whose weights are mostly `t`. */
uint32_t cli_llama_ftype(kt_dtype t);

/* ---- parallel rows ---- */

#define CLI_MAX_THREADS 16

/* Calls fn(ctx, ith, nth) on nth threads (the caller is thread 0) and waits
 * for all; nth is min(online CPUs, CLI_MAX_THREADS), or 1 when n_items is small. Falls
 * back to fewer threads if they cannot be created. */
typedef void (*cli_par_fn)(void *ctx, int ith, int nth);
void cli_parallel(int64_t n_items, cli_par_fn fn, void *ctx);


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

/* ---- a growing text buffer (libcurl write callbacks) ---- */

typedef struct cli_text {
    char *p;    /* NUL-terminated; NULL until something came */
    size_t len;
    size_t max; /* more than this is refused (the transfer fails); 0: no limit */
} cli_text;

/* A CURLOPT_WRITEFUNCTION for a cli_text (user): appends; 0 when out of
 * memory or over max, which ends the transfer. */
size_t cli_text_append(char *data, size_t size, size_t n, void *user);

/* kt_model_load_ex with a progress bar on stderr (a terminal only) for
 * files of 64 MiB or more: reading, then repacking. */
kt_model *cli_load_model(const char *path, kt_load_mode mode, kt_error *err);

/* "12.3 MiB" into buf. */
const char *cli_human_bytes(uint64_t n, char *buf, size_t cap);

#endif
