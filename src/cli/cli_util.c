/*
 * cli_util.c - helpers shared by the file tools; see cli_util.h.
 */
#include "cli/cli_util.h"

#include <errno.h>
#include <stdio.h>
#include <time.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

int cli_take_opt(const char *cmd, int argc, char **argv, int *i, const cli_int_opt *ints, size_t n_ints,
                 const cli_str_opt *strs, size_t n_strs) {
    const char *v = NULL;
    int r;
    for (size_t k = 0; k < n_ints; k++)
        if ((r = cli_opt(cmd, argc, argv, i, ints[k].name, &v))) {
            if (r < 0) return 2;
            return cli_parse_int(v, ints[k].lo, ints[k].hi, ints[k].dst)
                       ? 1
                       : cli_usage_error(cmd, "invalid value '%s' for %s (%ld..%ld)", v, ints[k].name, ints[k].lo,
                                         ints[k].hi);
        }
    for (size_t k = 0; k < n_strs; k++)
        if ((r = cli_opt(cmd, argc, argv, i, strs[k].name, strs[k].dst))) return r < 0 ? 2 : 1;
    return 0;
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

/* ---- generation options ---- */

/* A seed from the system's entropy; the clock and pid where there is none. */
static uint64_t random_seed(void) {
    uint64_t s = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    bool ok = f && fread(&s, sizeof s, 1, f) == 1;
    if (f) fclose(f);
    if (!ok) s = (uint64_t)time(NULL) * 6364136223846793005ull ^ (uint64_t)getpid();
    return s >> 1; /* --seed takes 0 .. LONG_MAX: the printed seed can be given back */
}

void cli_gen_defaults(cli_gen_opts *g) {
    *g = (cli_gen_opts){.n_predict = 128, .sp = kt_sampler_defaults(), .load = KT_LOAD_REPACK};
    g->sp.seed = random_seed();
}

void cli_warn_ctx(const char *cmd, const kt_model *m, int n_ctx) {
    const int train = kt_model_describe(m)->n_ctx_train;
    if (n_ctx > train)
        fprintf(stderr, "kettle %s: warning: -c %d is beyond the %d positions the model was trained on; its output past "
                "them may degrade\n", cmd, n_ctx, train);
}

const char *cli_gen_usage(void) {
    return "  -m, --model FILE      GGUF model, or OWNER/REPO[:QUANT] pulled with kettle pull\n"
           "      --load MODE       repack (default: read into huge pages, Q4_0 rewritten\n"
           "                        for the kernels; fastest, RAM = file size), copy (the\n"
           "                        same without the rewrite), mmap (zero-copy: least RAM,\n"
           "                        fastest start) or populate (mmap, every page at load)\n"
           "  -n, --n-predict N     tokens to generate (default 128; -1: until end or full)\n"
           "  -c, --ctx-size N      context length (default: the model's, at most 4096)\n"
           "  -t, --threads N       threads (default: all CPUs)\n"
           "      --temp T          temperature (default 0.8; 0 = greedy)\n"
           "      --top-k K         (default 40; 0 = off)\n"
           "      --top-p P         (default 0.95; 1 = off)\n"
           "      --min-p P         (default 0.05; 0 = off)\n"
           "      --repeat-penalty R    (default 1 = off)\n"
           "      --frequency-penalty F (default 0)\n"
           "      --presence-penalty F  (default 0)\n"
           "      --repeat-last-n N     penalty window (default 64)\n"
           "      --seed S          random seed (default: a fresh one, printed with the stats)\n";
}

bool cli_parse_load_mode(const char *s, kt_load_mode *out) {
    static const char *const NAMES[] = {"mmap", "populate", "copy", "repack"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, NAMES[i])) {
            *out = (kt_load_mode)i;
            return true;
        }
    return false;
}

static bool parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_int(const char *s, long lo, long hi, int *out) {
    long v;
    if (lo < INT_MIN || hi > INT_MAX || !parse_long(s, lo, hi, &v)) return false;
    *out = (int)v;
    return true;
}

bool cli_parse_int_list(const char *s, long lo, long hi, int *v, int cap, int *n) {
    *n = 0;
    while (*s) {
        char *end;
        errno = 0;
        long x = strtol(s, &end, 10);
        if (errno || end == s || x < lo || x > hi || *n == cap) return false;
        v[(*n)++] = (int)x;
        if (*end == ',') end++;
        else if (*end) return false;
        s = end;
    }
    return *n > 0;
}

static bool parse_float(const char *s, float lo, float hi, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

bool cli_parse_float(const char *s, float lo, float hi, float *out) {
    return parse_float(s, lo, hi, out);
}

/* An integer option: its name, bounds and where it goes. */
typedef struct int_opt {
    const char *name, *alias;
    long lo, hi;
    int *dst;
} int_opt;

typedef struct float_opt {
    const char *name;
    float lo, hi;
    float *dst;
} float_opt;

int cli_gen_opt(const char *cmd, int argc, char **argv, int *i, cli_gen_opts *g) {
    const char *a = argv[*i];
    int_opt ints[] = {{"-n", "--n-predict", -1, 1 << 24, &g->n_predict},
                      {"-c", "--ctx-size", 0, 1 << 24, &g->n_ctx},
                      {"-t", "--threads", 1, 1024, &g->n_threads},
                      {"--top-k", NULL, 0, 1 << 24, &g->sp.top_k},
                      {"--repeat-last-n", NULL, 0, 1 << 24, &g->sp.penalty_last_n}};
    float_opt floats[] = {{"--temp", 0, 100, &g->sp.temperature},
                          {"--top-p", 0, 1, &g->sp.top_p},
                          {"--min-p", 0, 1, &g->sp.min_p},
                          {"--repeat-penalty", 0, 100, &g->sp.repeat_penalty},
                          {"--frequency-penalty", -100, 100, &g->sp.frequency_penalty},
                          {"--presence-penalty", -100, 100, &g->sp.presence_penalty}};
    bool is_model = !strcmp(a, "-m") || !strcmp(a, "--model"), is_seed = !strcmp(a, "--seed");
    bool is_load = !strcmp(a, "--load");
    int_opt *io = NULL;
    float_opt *fo = NULL;
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++)
        if (!strcmp(a, ints[k].name) || (ints[k].alias && !strcmp(a, ints[k].alias))) io = &ints[k];
    for (size_t k = 0; k < sizeof floats / sizeof floats[0]; k++)
        if (!strcmp(a, floats[k].name)) fo = &floats[k];
    if (!is_model && !is_seed && !is_load && !io && !fo) return 0;
    if (*i + 1 >= argc) return cli_usage_error(cmd, "option %s needs a value", a);
    const char *v = argv[++*i];
    long n = 0;
    bool ok = true;
    if (is_model) g->model = v;
    else if (is_load) ok = cli_parse_load_mode(v, &g->load);
    else if (is_seed) ok = parse_long(v, 0, __LONG_MAX__, &n), g->sp.seed = (uint64_t)n, g->seed_given = true;
    else if (io) ok = parse_long(v, io->lo, io->hi, &n), *io->dst = (int)n;
    else ok = parse_float(v, fo->lo, fo->hi, fo->dst);
    return ok ? 1 : cli_usage_error(cmd, "invalid value '%s' for %s", v, a);
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

/* ---- loading ---- */

/* Small files load in a blink: a bar would only flash. */
#define CLI_LOAD_BAR_BYTES ((uint64_t)64 << 20)

typedef struct load_bar {
    cli_progress p;
    const char *stage; /* the stage the bar is drawing; NULL: none yet */
} load_bar;

/* kt_progress_fn: a bar per stage, labelled with it. */
static void on_load_progress(void *user, const char *stage, uint64_t done, uint64_t total) {
    load_bar *b = user;
    if (b->stage != stage) { /* the library passes each stage's one literal */
        if (b->stage) cli_progress_end(&b->p);
        cli_progress_start(&b->p, total);
        b->stage = stage;
    }
    if (done > b->p.done) cli_progress_add(&b->p, done - b->p.done, stage);
}

kt_model *cli_load_model(const char *path, kt_load_mode mode, kt_error *err) {
    struct stat st;
    bool big = stat(path, &st) == 0 && (uint64_t)st.st_size >= CLI_LOAD_BAR_BYTES && isatty(STDERR_FILENO);
    load_bar bar = {0};
    kt_model *m = kt_model_load_progress(path, mode, big ? on_load_progress : NULL, &bar, err);
    if (bar.stage) cli_progress_end(&bar.p);
    return m;
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

char *cli_load_template(const char *arg, kt_error *err) {
    size_t len;
    const char *builtin = kt_chat_builtin_template(arg);
    char *text = builtin ? strdup(builtin) : cli_read_file(arg, &len);
    if (!text)
        snprintf(err->msg, sizeof err->msg, "chat template '%s' is neither a built-in nor a readable file (%s)", arg,
                 strerror(errno));
    return text;
}

/* ---- a growing text buffer ---- */

size_t cli_text_append(char *data, size_t size, size_t n, void *user) {
    cli_text *b = user;
    const size_t add = size * n;
    if (b->max && b->len + add > b->max) return 0;
    char *q = realloc(b->p, b->len + add + 1);
    if (!q) return 0;
    memcpy(q + b->len, data, add);
    b->p = q, b->len += add, q[b->len] = 0;
    return add;
}
