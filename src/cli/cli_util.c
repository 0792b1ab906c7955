/*
 * cli_util.c - helpers shared by the file tools; see cli_util.h.
 */
#include "cli/cli_util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/timing.h"
#include "ops/pool.h"

/* ---- arguments ---- */

bool cli_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
    return false;
}

int cli_opt(const char *cmd, int argc, char **argv, int *i, const char *name,
            const char **value) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return 0;
    if (a[n] == '=') {
        *value = a + n + 1;
        return 1;
    }
    if (a[n] != '\0') return 0;
    if (*i + 1 >= argc) {
        cli_usage_error(cmd, "option %s needs a value", name);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

bool cli_parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-' || *s == '+' || *s == ' ') return false;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end) return false;
    *out = (uint64_t)v;
    return true;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kettle %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see 'kettle %s --help')\n", cmd);
    va_end(ap);
    return 2;
}

int cli_fail(const char *cmd, const kt_error *err) {
    fprintf(stderr, "kettle %s: %s\n", cmd, err->msg[0] ? err->msg : "failed");
    return 1;
}

char *cli_read_file(const char *path, size_t *len) {
    bool is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n < 2) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    int failed = !buf || ferror(f);
    if (!is_stdin) fclose(f);
    if (failed) {
        free(buf);
        if (!errno) errno = EIO;
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* ---- types ---- */

static const kt_dtype OUT_TYPES[] = {KT_F32, KT_F16, KT_BF16, KT_Q8_0, KT_Q4_0};

int cli_parse_out_type(const char *name) {
    int t = kt_dtype_parse(name);
    for (size_t i = 0; i < sizeof OUT_TYPES / sizeof OUT_TYPES[0]; i++)
        if (t == (int)OUT_TYPES[i]) return t;
    return -1;
}

const char *cli_out_type_list(void) {
    return "F32, F16, BF16, Q8_0, Q4_0";
}

uint32_t cli_llama_ftype(kt_dtype t) {
    switch (t) {
    case KT_F16: return 1;   /* LLAMA_FTYPE_MOSTLY_F16 */
    case KT_Q4_0: return 2;  /* LLAMA_FTYPE_MOSTLY_Q4_0 */
    case KT_Q8_0: return 7;  /* LLAMA_FTYPE_MOSTLY_Q8_0 */
    case KT_BF16: return 32; /* LLAMA_FTYPE_MOSTLY_BF16 */
    default: return 0;       /* LLAMA_FTYPE_ALL_F32 */
    }
}

/* ---- parallel rows ---- */

static int par_threads(int64_t n_items) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > CLI_MAX_THREADS) n = CLI_MAX_THREADS;
    if (n_items < 64) n = 1;
    return (int)n;
}

void cli_parallel(int64_t n_items, cli_par_fn fn, void *ctx) {
    /* A pool per call: the tools call this once per tensor, so thread
     * start-up is noise next to the work. Without threads, run inline. */
    kt_pool *pool = kt_pool_new(par_threads(n_items), NULL);
    kt_pool_run(pool, fn, ctx);
    kt_pool_free(pool);
}

/* ---- progress ---- */

void cli_progress_start(cli_progress *p, uint64_t total) {
    p->total = total ? total : 1;
    p->done = 0;
    p->last_pct = -1;
    p->tty = isatty(STDERR_FILENO) == 1;
    p->t0_ms = kt_time_ms();
}

void cli_progress_add(cli_progress *p, uint64_t n, const char *what) {
    p->done += n;
    if (!p->tty) return;
    int pct = (int)(p->done * 100 / p->total);
    if (pct > 100) pct = 100;
    if (pct == p->last_pct) return;
    p->last_pct = pct;
    char bar[31];
    int fill = pct * 30 / 100;
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = 0;
    fprintf(stderr, "\r\033[K[%s] %3d%%  %.40s", bar, pct, what ? what : "");
    fflush(stderr);
}

double cli_progress_end(cli_progress *p) {
    if (p->tty && p->last_pct >= 0) fprintf(stderr, "\r\033[K");
    return (kt_time_ms() - p->t0_ms) / 1e3;
}

const char *cli_human_bytes(uint64_t n, char *buf, size_t cap) {
    static const char *UNITS[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, cap, "%llu B", (unsigned long long)n);
    else snprintf(buf, cap, "%.1f %s", v, UNITS[u]);
    return buf;
}
