/*
 * cmd_bench_grammar.c - `kettle bench grammar`: what structured output
 * costs, per schema, without a model.
 *
 * For every JSON Schema file under a folder (JSONSchemaBench's layout:
 * {"schema", "tests": [{"data", "valid"}]}, or a bare schema), at each
 * vocabulary given: the compile time (schema -> GBNF -> grammar -> the
 * start state), or the reason it is refused; then, along each valid test
 * instance (compact JSON, properties as the instance has them), the time
 * of the full token mask before every token, as generation would ask for
 * it. The instance is cut into tokens greedily (the longest token that is
 * a prefix of the rest: a tokenization a model could produce); an
 * instance the grammar does not take (another property order, whitespace
 * it does not allow) is followed as far as the grammar takes it.
 *
 * The vocabulary's class cache lives across schemas, as in `kettle serve`,
 * so the figures include first-time classes of each schema and what later
 * schemas share.
 */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "base/timing.h"
#include "cli/bench_serve.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "gguf/gguf.h"
#include "grammar/constraint.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/token_trie.h"
#include "text/vocab.h"

#define MAX_VOCABS 8
#define MAX_FILES 20000

typedef enum out_fmt { FMT_MD, FMT_CSV, FMT_JSON } out_fmt;

typedef struct bg_opts {
    const char *dir;
    const char *vocabs[MAX_VOCABS];
    int n_vocabs, max_instances;
    bool per_schema;
    out_fmt fmt;
} bg_opts;

/* One schema at one vocabulary. */
typedef struct bg_row {
    const char *file;
    bool compiled;
    char reason[sizeof(((kt_error *)0)->msg)];
    double compile_ms;
    int n_tokens, n_instances, n_complete;
    double mask_p50_us, mask_p99_us, mask_max_us;
} bg_row;

/* A vocabulary's figures over the folder. */
typedef struct bg_total {
    const char *vocab;
    int n_vocab, n_schemas, n_compiled;
    double trie_ms, compile_p50_ms, compile_p99_ms, compile_max_ms;
    long n_tokens;
    double mask_mean_us, mask_p50_us, mask_p99_us, mask_max_us;
    int n_instances, n_complete;
    uint64_t classes_computed, classes_found;
    size_t cache_bytes;
} bg_total;

static void usage(FILE *out) {
    fprintf(out,
            "usage: kettle bench grammar DIR [--vocab FILE]... [options]\n"
            "  DIR                  JSON Schema files (*.json), searched recursively, e.g. the\n"
            "                       data/ folder of JSONSchemaBench (github.com/guidance-ai/jsonschemabench)\n"
            "  --vocab FILE         a model or vocab-only GGUF whose tokens the masks cover\n"
            "                       (repeatable, up to %d; e.g. models/stories260K.gguf, or a pulled model)\n"
            "  --instances N        valid test instances followed per schema (default 4)\n"
            "  --per-schema         also list every schema: compile time or refusal, mask times\n"
            "  --md | --csv | --json  output format (default md)\n",
            MAX_VOCABS);
}

static int parse_opts(int argc, char **argv, bg_opts *o) {
    *o = (bg_opts){.max_instances = 4};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
        if (!strcmp(a, "--md")) o->fmt = FMT_MD;
        else if (!strcmp(a, "--csv")) o->fmt = FMT_CSV;
        else if (!strcmp(a, "--json")) o->fmt = FMT_JSON;
        else if (!strcmp(a, "--per-schema")) o->per_schema = true;
        else if ((r = cli_opt("bench grammar", argc, argv, &i, "--vocab", &v))) {
            if (r < 0) return 2;
            if (o->n_vocabs == MAX_VOCABS) return cli_usage_error("bench grammar", "at most %d --vocab", MAX_VOCABS);
            o->vocabs[o->n_vocabs++] = v;
        } else if ((r = cli_opt("bench grammar", argc, argv, &i, "--instances", &v))) {
            if (r < 0) return 2;
            if (!cli_parse_int(v, 0, 1000000, &o->max_instances))
                return cli_usage_error("bench grammar", "--instances wants a count, got '%s'", v);
        } else if (a[0] == '-') {
            return cli_usage_error("bench grammar", "unknown option '%s' (see --help)", a);
        } else if (o->dir) {
            return cli_usage_error("bench grammar", "one DIR only ('%s' and '%s')", o->dir, a);
        } else {
            o->dir = a;
        }
    }
    if (!o->dir) return cli_usage_error("bench grammar", "give the folder of schemas (see --help)");
    if (!o->n_vocabs) return cli_usage_error("bench grammar", "give at least one --vocab");
    return 0;
}

/* ---- the files ---- */

typedef struct file_list {
    char **path;
    int n;
} file_list;

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Every *.json under dir, recursively; false when out of memory or too many. */
static bool list_files(const char *dir, file_list *out) {
    DIR *d = opendir(dir);
    if (!d) return true; /* a file that is not a folder: skipped */
    bool ok = true;
    for (struct dirent *e; ok && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        char *p = malloc(len);
        if (!p) {
            ok = false;
            break;
        }
        snprintf(p, len, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
            ok = list_files(p, out);
            free(p);
        } else if (ends_with(p, ".json") && out->n < MAX_FILES) {
            char **np = realloc(out->path, sizeof *np * (size_t)(out->n + 1));
            if (!np) {
                free(p);
                ok = false;
                break;
            }
            out->path = np;
            out->path[out->n++] = p;
        } else {
            free(p);
        }
    }
    closedir(d);
    return ok;
}

/* ---- one schema ---- */

/* The longest token whose bytes start s[0..n), or -1. */
static int32_t longest_token(const kt_token_trie *t, const uint8_t *s, size_t n) {
    int32_t best = -1;
    uint32_t node = 0;
    for (size_t d = 0; d < n; d++) {
        /* find the child of node with byte s[d] */
        uint32_t i = node + 1, found = 0;
        while (i < t->end[node]) {
            if (t->byte[i] == s[d]) {
                found = i;
                break;
            }
            i = t->end[i];
        }
        if (!found) break;
        node = found;
        if (t->first[node] < t->first[node + 1]) best = t->sorted[t->first[node]];
    }
    return best;
}

typedef struct samples {
    double *v;
    long n, cap;
} samples;

static bool samples_add(samples *s, double x) {
    if (s->n == s->cap) {
        long cap = s->cap ? s->cap * 2 : 1024;
        double *nv = realloc(s->v, sizeof *nv * (size_t)cap);
        if (!nv) return false;
        s->v = nv, s->cap = cap;
    }
    s->v[s->n++] = x;
    return true;
}

/* Masks along one instance: appends each mask's time (us) to all and
 * mine; true when the grammar took the whole instance and could end. */
static bool follow_instance(const kt_grammar *g, const kt_token_trie *t, kt_gmask_cache *cache, int32_t eog,
                            const char *text, uint64_t *mask, samples *all, samples *mine, int *n_tokens) {
    kt_error err = {0};
    kt_constraint *c = kt_constraint_new(g, t, cache, &eog, 1, &err);
    if (!c) return false;
    const uint8_t *s = (const uint8_t *)text;
    size_t n = strlen(text), at = 0;
    bool complete = false;
    for (;;) {
        double t0 = kt_time_ms();
        kt_constraint_mask(c, mask);
        double us = (kt_time_ms() - t0) * 1000.0;
        samples_add(all, us), samples_add(mine, us);
        (*n_tokens)++;
        if (at == n) {
            complete = (mask[(uint32_t)eog >> 6] >> ((uint32_t)eog & 63)) & 1;
            break;
        }
        int32_t tok = longest_token(t, s + at, n - at);
        if (tok < 0 || !((mask[(uint32_t)tok >> 6] >> ((uint32_t)tok & 63)) & 1) || !kt_constraint_accept(c, tok))
            break;
        at += t->tok_len[tok];
    }
    kt_constraint_free(c);
    return complete;
}

/* The control id that stands for end of generation here: the vocabulary's
 * EOS, else any id not in the trie. */
static int32_t pick_eog(const kt_vocab *v, const kt_token_trie *t) {
    int32_t eos = kt_vocab_eos(v);
    if (eos >= 0 && !kt_token_trie_has(t, eos)) return eos;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (!kt_token_trie_has(t, i)) return i;
    return 0;
}

static void run_schema(const bg_opts *o, const char *path, const kt_vocab *v, const kt_token_trie *t,
                       kt_gmask_cache *cache, uint64_t *mask, samples *all, bg_row *row) {
    memset(row, 0, sizeof *row);
    row->file = path;
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    if (!doc) {
        snprintf(row->reason, sizeof row->reason, "not JSON: %s", jerr.text);
        return;
    }
    json_t *schema = json_object_get(doc, "schema");
    json_t *tests = json_object_get(doc, "tests");
    if (!schema) schema = doc;
    kt_error err = {0};
    double t0 = kt_time_ms();
    char *gbnf = kt_json_schema_to_gbnf(schema, &err);
    kt_grammar *g = gbnf ? kt_grammar_parse(gbnf, strlen(gbnf), NULL, &err) : NULL;
    const int32_t eog = pick_eog(v, t);
    kt_constraint *c = g ? kt_constraint_new(g, t, cache, &eog, 1, &err) : NULL;
    row->compile_ms = kt_time_ms() - t0;
    kt_constraint_free(c);
    if (!c) {
        snprintf(row->reason, sizeof row->reason, "%s", err.msg);
    } else {
        row->compiled = true;
        samples mine = {0};
        for (size_t i = 0; i < json_array_size(tests) && row->n_instances < o->max_instances; i++) {
            json_t *tc = json_array_get(tests, i);
            if (!json_is_true(json_object_get(tc, "valid"))) continue;
            char *text = json_dumps(json_object_get(tc, "data"), JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
            if (!text) continue;
            row->n_instances++;
            row->n_complete += follow_instance(g, t, cache, eog, text, mask, all, &mine, &row->n_tokens);
            free(text);
        }
        if (mine.n) {
            bs_sort(mine.v, (int)mine.n);
            row->mask_p50_us = bs_percentile(mine.v, (int)mine.n, 50);
            row->mask_p99_us = bs_percentile(mine.v, (int)mine.n, 99);
            row->mask_max_us = mine.v[mine.n - 1];
        }
        free(mine.v);
    }
    kt_grammar_free(g);
    free(gbnf);
    json_decref(doc);
}

/* ---- one vocabulary over the folder ---- */

static kt_vocab *open_vocab(const char *path, kt_error *err) {
    gguf_file *f = gguf_open(path, err);
    if (!f) return NULL;
    kt_vocab *v = kt_vocab_from_gguf(f, err);
    gguf_close(f);
    return v;
}

static bool run_vocab(const bg_opts *o, const file_list *files, const char *vocab_path, bg_row *rows, bg_total *tot,
                      kt_error *err) {
    memset(tot, 0, sizeof *tot);
    tot->vocab = vocab_path;
    kt_vocab *v = open_vocab(vocab_path, err);
    if (!v) return false;
    double t0 = kt_time_ms();
    kt_token_trie *t = kt_token_trie_from_vocab(v, err);
    tot->trie_ms = kt_time_ms() - t0;
    kt_gmask_cache *cache = t ? kt_gmask_cache_new(t, (size_t)512 << 20, err) : NULL;
    uint64_t *mask = t ? malloc(((size_t)t->n_vocab + 63) / 64 * 8) : NULL;
    samples all = {0}, compile = {0};
    bool ok = cache && mask;
    for (int i = 0; ok && i < files->n; i++) {
        run_schema(o, files->path[i], v, t, cache, mask, &all, &rows[i]);
        tot->n_schemas++;
        if (!rows[i].compiled) continue;
        tot->n_compiled++;
        samples_add(&compile, rows[i].compile_ms);
        tot->n_instances += rows[i].n_instances, tot->n_complete += rows[i].n_complete;
    }
    if (ok) {
        tot->n_vocab = t->n_vocab;
        tot->n_tokens = all.n;
        double sum = 0;
        for (long i = 0; i < all.n; i++) sum += all.v[i];
        if (all.n) {
            bs_sort(all.v, (int)all.n);
            tot->mask_mean_us = sum / (double)all.n;
            tot->mask_p50_us = bs_percentile(all.v, (int)all.n, 50);
            tot->mask_p99_us = bs_percentile(all.v, (int)all.n, 99);
            tot->mask_max_us = all.v[all.n - 1];
        }
        if (compile.n) {
            bs_sort(compile.v, (int)compile.n);
            tot->compile_p50_ms = bs_percentile(compile.v, (int)compile.n, 50);
            tot->compile_p99_ms = bs_percentile(compile.v, (int)compile.n, 99);
            tot->compile_max_ms = compile.v[compile.n - 1];
        }
        kt_gmask_cache_counts(cache, &tot->classes_computed, &tot->classes_found, &tot->cache_bytes);
    } else if (!err->msg[0]) {
        kt_error_set(err, KT_ERR_NOMEM, "out of memory");
    }
    free(all.v), free(compile.v), free(mask);
    kt_gmask_cache_free(cache);
    kt_token_trie_free(t);
    kt_vocab_free(v);
    return ok;
}

/* ---- reports ---- */

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static void print_md(const bg_opts *o, const file_list *files, bg_row *const *rows, const bg_total *tot) {
    printf("| vocabulary | tokens | trie ms | schemas | compiled | compile p50 / p99 / max ms | masks | mask mean us | p50 | "
           "p99 | max | instances taken whole | classes computed / found |\n");
    printf("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---|\n");
    for (int k = 0; k < o->n_vocabs; k++) {
        const bg_total *t = &tot[k];
        printf("| %s | %d | %.1f | %d | %d | %.3f / %.3f / %.3f | %ld | %.1f | %.1f | %.1f | %.1f | %d / %d | %llu / %llu "
               "|\n",
               base_name(t->vocab), t->n_vocab, t->trie_ms, t->n_schemas, t->n_compiled, t->compile_p50_ms,
               t->compile_p99_ms, t->compile_max_ms, t->n_tokens, t->mask_mean_us, t->mask_p50_us, t->mask_p99_us,
               t->mask_max_us, t->n_complete, t->n_instances, (unsigned long long)t->classes_computed,
               (unsigned long long)t->classes_found);
    }
    if (!o->per_schema) return;
    for (int k = 0; k < o->n_vocabs; k++) {
        printf("\n%s\n\n| schema | compile ms | tokens | mask p50 us | p99 | max | refused because |\n", base_name(tot[k].vocab));
        printf("|---|---:|---:|---:|---:|---:|---|\n");
        for (int i = 0; i < files->n; i++) {
            const bg_row *r = &rows[k][i];
            printf("| %s | %.3f | %d | %.1f | %.1f | %.1f | %s |\n", r->file, r->compile_ms, r->n_tokens, r->mask_p50_us,
                   r->mask_p99_us, r->mask_max_us, r->compiled ? "" : r->reason);
        }
    }
}

static void print_csv(const bg_opts *o, const file_list *files, bg_row *const *rows, const bg_total *tot) {
    (void)tot;
    printf("vocab,schema,compiled,compile_ms,tokens,instances,complete,mask_p50_us,mask_p99_us,mask_max_us,reason\n");
    for (int k = 0; k < o->n_vocabs; k++)
        for (int i = 0; i < files->n; i++) {
            const bg_row *r = &rows[k][i];
            printf("%s,%s,%d,%.4f,%d,%d,%d,%.2f,%.2f,%.2f,\"", base_name(o->vocabs[k]), r->file, r->compiled,
                   r->compile_ms, r->n_tokens, r->n_instances, r->n_complete, r->mask_p50_us, r->mask_p99_us,
                   r->mask_max_us);
            for (const char *c = r->reason; *c; c++) printf(*c == '"' ? "\"\"" : "%c", *c);
            printf("\"\n");
        }
}

static void print_json(const bg_opts *o, const file_list *files, bg_row *const *rows, const bg_total *tot) {
    json_t *out = json_array();
    for (int k = 0; k < o->n_vocabs; k++) {
        const bg_total *t = &tot[k];
        json_t *schemas = json_array();
        for (int i = 0; i < files->n && o->per_schema; i++) {
            const bg_row *r = &rows[k][i];
            json_array_append_new(schemas, json_pack("{s:s, s:b, s:f, s:i, s:f, s:f, s:f, s:s}", "schema", r->file,
                                                     "compiled", r->compiled, "compile_ms", r->compile_ms, "tokens",
                                                     r->n_tokens, "mask_p50_us", r->mask_p50_us, "mask_p99_us",
                                                     r->mask_p99_us, "mask_max_us", r->mask_max_us, "reason", r->reason));
        }
        json_array_append_new(
            out, json_pack("{s:s, s:i, s:f, s:i, s:i, s:f, s:f, s:f, s:I, s:f, s:f, s:f, s:f, s:i, s:i, s:I, s:I, s:o}",
                           "vocab", t->vocab, "n_vocab", t->n_vocab, "trie_ms", t->trie_ms, "schemas", t->n_schemas,
                           "compiled", t->n_compiled, "compile_p50_ms", t->compile_p50_ms, "compile_p99_ms",
                           t->compile_p99_ms, "compile_max_ms", t->compile_max_ms, "masks", (json_int_t)t->n_tokens,
                           "mask_mean_us", t->mask_mean_us, "mask_p50_us", t->mask_p50_us, "mask_p99_us",
                           t->mask_p99_us, "mask_max_us", t->mask_max_us, "instances", t->n_instances,
                           "instances_complete", t->n_complete, "classes_computed", (json_int_t)t->classes_computed,
                           "classes_found", (json_int_t)t->classes_found, "schemas_detail", schemas));
    }
    char *s = json_dumps(out, JSON_INDENT(2));
    if (s) printf("%s\n", s);
    free(s);
    json_decref(out);
}

int cmd_bench_grammar(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) return usage(stdout), 0;
    bg_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    file_list files = {0};
    if (!list_files(o.dir, &files)) return fprintf(stderr, "kettle bench grammar: out of memory listing %s\n", o.dir), 1;
    if (!files.n) return cli_usage_error("bench grammar", "no *.json file under '%s'", o.dir);
    qsort(files.path, (size_t)files.n, sizeof *files.path, cmp_str);
    bg_row *rows[MAX_VOCABS] = {0};
    bg_total tot[MAX_VOCABS];
    rc = 0;
    for (int k = 0; k < o.n_vocabs && !rc; k++) {
        kt_error err = {0};
        rows[k] = calloc((size_t)files.n, sizeof *rows[k]);
        if (!rows[k] || !run_vocab(&o, &files, o.vocabs[k], rows[k], &tot[k], &err)) {
            if (!rows[k]) kt_error_set(&err, KT_ERR_NOMEM, "out of memory");
            rc = cli_fail("bench grammar", &err);
        }
        fprintf(stderr, "kettle bench grammar: %s done\n", o.vocabs[k]);
    }
    if (!rc) {
        if (o.fmt == FMT_MD) print_md(&o, &files, rows, tot);
        else if (o.fmt == FMT_CSV) print_csv(&o, &files, rows, tot);
        else print_json(&o, &files, rows, tot);
    }
    for (int k = 0; k < o.n_vocabs; k++) free(rows[k]);
    for (int i = 0; i < files.n; i++) free(files.path[i]);
    free(files.path);
    return rc;
}
