/*
 * model_store.c - the folder of pulled models: where it is, names in it,
 * choosing a file by QUANT, listing and removing; see model_store.h.
 */
#include "cli/model_store.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "cli/cli_util.h"

/* ---- names ---- */

/* A Hub owner or repo name: letters, digits, '.', '_', '-', never a path
 * step ("." or ".."), so a name cannot climb out of the store. */
static bool valid_name(const char *s, size_t n) {
    if (n == 0 || n >= sizeof ((ms_ref *)0)->owner) return false;
    if ((n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("._-", s[i])) return false;
    return true;
}

static bool ends_with_ci(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcasecmp(s + n - m, suffix);
}

bool ms_parse_ref(const char *s, ms_ref *ref, kt_error *err) {
    *ref = (ms_ref){0};
    const char *slash = strchr(s, '/'), *colon = slash ? strchr(slash, ':') : NULL;
    const char *repo_end = colon ? colon : s + strlen(s);
    if (!slash || !valid_name(s, (size_t)(slash - s)) || !valid_name(slash + 1, (size_t)(repo_end - slash - 1))) {
        kt_error_set(err, KT_ERR_ARG,
                     "'%s' is not a model name: expected OWNER/REPO[:QUANT] (e.g. "
                     "bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M) or an https:// URL", s);
        return false;
    }
    if (colon && (!colon[1] || strlen(colon + 1) >= sizeof ref->quant || strchr(colon + 1, '/'))) {
        kt_error_set(err, KT_ERR_ARG, "'%s': the QUANT after ':' must be a non-empty part of a file name", s);
        return false;
    }
    memcpy(ref->owner, s, (size_t)(slash - s));
    memcpy(ref->repo, slash + 1, (size_t)(repo_end - slash - 1));
    if (colon) snprintf(ref->quant, sizeof ref->quant, "%s", colon + 1);
    return true;
}

bool ms_looks_like_ref(const char *s) {
    ms_ref r;
    /* "dir/model.gguf" is a path, however missing; "owner/repo:x.gguf" a name */
    return ms_parse_ref(s, &r, NULL) && (r.quant[0] || !ends_with_ci(s, ".gguf"));
}

/* ---- folders ---- */

bool ms_root(char *buf, size_t cap, kt_error *err) {
    const char *env = getenv("KETTLE_MODELS"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (env && *env) n = snprintf(buf, cap, "%s", env);
    else if (xdg && *xdg == '/') n = snprintf(buf, cap, "%s/kettle/models", xdg);
    else if (home && *home) n = snprintf(buf, cap, "%s/.cache/kettle/models", home);
    else {
        kt_error_set(err, KT_ERR_ARG, "no folder for models: set KETTLE_MODELS (or HOME)");
        return false;
    }
    if (n < 0 || (size_t)n >= cap) {
        kt_error_set(err, KT_ERR_ARG, "the model folder's path is too long");
        return false;
    }
    return true;
}

bool ms_repo_dir(const ms_ref *ref, char *buf, size_t cap, kt_error *err) {
    char root[MS_PATH_MAX];
    if (!ms_root(root, sizeof root, err)) return false;
    int n = snprintf(buf, cap, "%s/%s/%s", root, ref->owner, ref->repo);
    if (n < 0 || (size_t)n >= cap) {
        kt_error_set(err, KT_ERR_ARG, "the model folder's path is too long");
        return false;
    }
    return true;
}

kt_status ms_mkdirs(const char *dir, kt_error *err) {
    char p[MS_PATH_MAX];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return kt_error_set(err, KT_ERR_ARG, "path too long: %s", dir);
    for (char *s = p + 1;; s++) {
        bool end = *s == 0;
        if (*s != '/' && !end) continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return kt_error_set(err, KT_ERR_IO, "cannot create the folder %s: %s", p, strerror(errno));
        if (end) break;
        *s = '/';
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return kt_error_set(err, KT_ERR_IO, "%s is not a folder", dir);
    return KT_OK;
}

/* ---- choosing a file ---- */

static bool is_word_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* Where `needle` occurs in `hay` case-insensitively: 0 nowhere, 1 inside a
 * word, 2 as a whole word. */
static int match_kind(const char *hay, const char *needle) {
    size_t n = strlen(needle), h = strlen(hay);
    int best = 0;
    for (size_t i = 0; n && i + n <= h; i++) {
        if (strncasecmp(hay + i, needle, n)) continue;
        bool whole = (i == 0 || !is_word_char(hay[i - 1])) && (i + n == h || !is_word_char(hay[i + n]));
        best = whole ? 2 : (best > 1 ? best : 1);
    }
    return best;
}

/* Vision projectors sit beside models in many repos; they are chosen only
 * when asked for by name. */
static bool is_projector(const char *name) { return strncasecmp(name, "mmproj", 6) == 0; }

/* The "-of-" of a split file's "-NNNNN-of-MMMMM"; NULL if not split. */
static const char *split_of(const char *name) {
    const char *of = NULL;
    for (const char *p = strstr(name, "-of-"); p; p = strstr(p + 1, "-of-")) of = p;
    if (!of || of - name < 6 || of[-6] != '-') return NULL;
    for (int i = 1; i <= 5; i++)
        if (!isdigit((unsigned char)of[-i]) || !isdigit((unsigned char)of[4 + i - 1])) return NULL;
    return of;
}

bool ms_is_split(const char *name) { return split_of(name) != NULL; }

/* A later shard of a split file: only the first one stands for the set. */
static bool is_later_shard(const char *name) {
    const char *of = split_of(name);
    return of && strncmp(of - 5, "00001", 5) != 0;
}

/* Counts candidates matching `quant` with kind `kind`; *last = the last one. */
static int count_matches(const ms_candidate *c, int n, const char *quant, int kind, bool projectors, int *last) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (is_later_shard(c[i].name) || (is_projector(c[i].name) && !projectors)) continue;
        if (match_kind(c[i].name, quant) >= kind) k++, *last = i;
    }
    return k;
}

static int pick_by_quant(const ms_candidate *c, int n, const char *quant, const char *what, kt_error *err) {
    bool projectors = match_kind(quant, "mmproj") > 0;
    int last = -1, whole = count_matches(c, n, quant, 2, projectors, &last);
    if (whole == 1) return last;
    int any = whole ? whole : count_matches(c, n, quant, 1, projectors, &last);
    if (any == 1) return last;
    if (any == 0) kt_error_set(err, KT_ERR_ARG, "no GGUF file of %s matches '%s'; the files are:", what, quant);
    else kt_error_set(err, KT_ERR_ARG, "'%s' matches %d GGUF files of %s: name one more precisely (its whole file name "
                      "works); the files are:", quant, any, what);
    return -1;
}

static int pick_default(const ms_candidate *c, int n, bool prefer_smallest, const char *what, kt_error *err) {
    /* "" at kind 0 matches every name: this counts the model files */
    int last = -1, models = count_matches(c, n, "", 0, false, &last);
    if (models == 1) return last;
    if (models > 1 && count_matches(c, n, "Q4_K_M", 2, false, &last) == 1) return last;
    int smallest = -1;
    bool sizes = prefer_smallest && models > 1;
    for (int i = 0; sizes && i < n; i++) {
        if (is_later_shard(c[i].name) || is_projector(c[i].name)) continue;
        if (!c[i].size) sizes = false;
        else if (smallest < 0 || c[i].size < c[smallest].size) smallest = i;
    }
    if (sizes) return smallest;
    if (models) kt_error_set(err, KT_ERR_ARG, "%s has %d GGUF files: name one as %s:QUANT; the files are:", what, models, what);
    else kt_error_set(err, KT_ERR_ARG, "%s has no GGUF model file (only projectors); the files are:", what);
    return -1;
}

int ms_pick(const ms_candidate *c, int n, const char *quant, bool prefer_smallest, const char *what, kt_error *err) {
    if (n == 0) {
        kt_error_set(err, KT_ERR_ARG, "%s has no GGUF file", what);
        return -1;
    }
    return quant && *quant ? pick_by_quant(c, n, quant, what, err) : pick_default(c, n, prefer_smallest, what, err);
}

void ms_print_candidates(FILE *out, const ms_candidate *c, int n) {
    for (int i = 0; i < n; i++) {
        if (is_later_shard(c[i].name)) continue;
        char hb[32];
        fprintf(out, "  %s", c[i].name);
        if (c[i].size) fprintf(out, "  (%s)", cli_human_bytes(c[i].size, hb, sizeof hb));
        fprintf(out, "\n");
    }
}

/* A quantization's name: Q4_K_M, IQ4_XS, Q8_0, F16, BF16, ... */
static bool is_quant_word(const char *w, size_t n) {
    static const char *const FLOATS[] = {"F16", "F32", "BF16", "FP16", "FP32"};
    for (size_t k = 0; k < sizeof FLOATS / sizeof FLOATS[0]; k++)
        if (n == strlen(FLOATS[k]) && !strncasecmp(w, FLOATS[k], n)) return true;
    size_t i = (n > 0 && toupper((unsigned char)w[0]) == 'I') ? 1 : 0;
    return n >= i + 2 && toupper((unsigned char)w[i]) == 'Q' && isdigit((unsigned char)w[i + 1]);
}

const char *ms_quant_of(const char *name, char *buf, size_t cap) {
    buf[0] = 0;
    for (const char *w = name; *w;) {
        size_t n = strcspn(w, "-.");
        if (is_quant_word(w, n) && n < cap) {
            for (size_t i = 0; i < n; i++) buf[i] = (char)toupper((unsigned char)w[i]);
            buf[n] = 0; /* the last one wins: "Qwen2-Q4_0-Q8_0" is not expected, "m.Q8_0.gguf" is */
        }
        w += n + (w[n] != 0);
    }
    return buf;
}

/* ---- files in the store ---- */

static bool file_size(const char *path, uint64_t *size) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return false;
    *size = (uint64_t)st.st_size;
    return true;
}

kt_status ms_write_meta(const char *model_path, const ms_meta *m, kt_error *err) {
    char path[MS_PATH_MAX + 16], tmp[MS_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s.meta.json", model_path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:I}", "repo", m->repo, "source", m->source, "sha256", m->sha256,
                          "commit", m->commit, "size", (json_int_t)m->size);
    if (!j) return kt_error_set(err, KT_ERR_NOMEM, "out of memory writing %s", path);
    int rc = json_dump_file(j, tmp, JSON_INDENT(2));
    json_decref(j);
    if (rc != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return kt_error_set(err, KT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    }
    return KT_OK;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const ms_candidate *)a)->name, ((const ms_candidate *)b)->name);
}

void ms_names_free(ms_candidate *files, int n) {
    for (int i = 0; files && i < n; i++) free((char *)files[i].name);
    free(files);
}

/* The model name a folder entry stands for: "x.gguf" as is, "x.gguf.part"
 * (when partials are wanted) as "x.gguf"; NULL for anything else. */
static char *entry_model_name(const char *entry, bool with_partial, bool *partial) {
    size_t n = strlen(entry);
    *partial = with_partial && n > 10 && !strcmp(entry + n - 10, ".gguf.part");
    if (entry[0] == '.' || (!ends_with_ci(entry, ".gguf") && !*partial)) return NULL;
    return strndup(entry, *partial ? n - 5 : n);
}

static bool has_name(const ms_candidate *c, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(c[i].name, name)) return true;
    return false;
}

kt_status ms_repo_files(const char *dir, bool with_partial, ms_candidate **files, int *n, kt_error *err) {
    *files = NULL, *n = 0;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT || errno == ENOTDIR ? KT_OK
                                                       : kt_error_set(err, KT_ERR_IO, "cannot read %s: %s", dir, strerror(errno));
    int cap = 0;
    kt_status st = KT_OK;
    for (struct dirent *e; st == KT_OK && (e = readdir(d));) {
        bool partial;
        char *name = entry_model_name(e->d_name, with_partial, &partial), path[MS_PATH_MAX];
        uint64_t size = 0;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (!name || has_name(*files, *n, name) || !file_size(path, &size)) {
            free(name);
            continue;
        }
        if (*n == cap) {
            ms_candidate *grown = realloc(*files, (size_t)(cap = cap ? 2 * cap : 8) * sizeof **files);
            if (!grown) {
                free(name);
                st = kt_error_set(err, KT_ERR_NOMEM, "out of memory listing %s", dir);
                break;
            }
            *files = grown;
        }
        (*files)[(*n)++] = (ms_candidate){.name = name, .size = partial ? 0 : size};
    }
    closedir(d);
    if (st != KT_OK) ms_names_free(*files, *n), *files = NULL, *n = 0;
    else if (*n > 1) qsort(*files, (size_t)*n, sizeof **files, by_name);
    return st;
}

static void print_ref(char *buf, size_t cap, const ms_ref *ref) {
    snprintf(buf, cap, "%s/%s%s%s", ref->owner, ref->repo, ref->quant[0] ? ":" : "", ref->quant);
}

/* The error for a name with no complete file: a download to resume, or none. */
static kt_status not_pulled(const ms_ref *ref, const char *dir, kt_error *err) {
    char name[400], root[MS_PATH_MAX] = "";
    print_ref(name, sizeof name, ref);
    ms_candidate *all;
    int n_all, at = -1;
    kt_error ignored;
    if (ms_repo_files(dir, true, &all, &n_all, &ignored) == KT_OK && n_all > 0)
        at = ms_pick(all, n_all, ref->quant, false, name, &ignored);
    ms_names_free(all, n_all);
    if (at >= 0)
        return kt_error_set(err, KT_ERR_ARG, "%s has not finished downloading: run 'kettle pull %s' to resume it", name, name);
    ms_root(root, sizeof root, NULL);
    return kt_error_set(err, KT_ERR_ARG, "'%s' is neither a file nor a pulled model (in %s): run 'kettle pull %s' first",
                        name, root, name);
}

kt_status ms_find(const ms_ref *ref, char *path, size_t cap, kt_error *err) {
    char dir[MS_PATH_MAX], what[300];
    if (!ms_repo_dir(ref, dir, sizeof dir, err)) return KT_ERR_ARG;
    ms_candidate *files;
    int n;
    kt_status st = ms_repo_files(dir, false, &files, &n, err);
    if (st != KT_OK) return st;
    if (n == 0) return not_pulled(ref, dir, err);
    snprintf(what, sizeof what, "%s/%s", ref->owner, ref->repo);
    int at = ms_pick(files, n, ref->quant, false, what, err);
    if (at < 0 && ref->quant[0] && count_matches(files, n, ref->quant, 1, true, &(int){0}) == 0)
        st = not_pulled(ref, dir, err);
    else if (at < 0) st = KT_ERR_ARG;
    else if (snprintf(path, cap, "%s/%s", dir, files[at].name) >= (int)cap)
        st = kt_error_set(err, KT_ERR_ARG, "the model's path is too long");
    ms_names_free(files, n);
    return st;
}

kt_status ms_resolve(const char *arg, char *path, size_t cap, kt_error *err) {
    struct stat st;
    ms_ref ref;
    if (stat(arg, &st) == 0 || !ms_looks_like_ref(arg) || !ms_parse_ref(arg, &ref, err)) {
        if (snprintf(path, cap, "%s", arg) >= (int)cap) return kt_error_set(err, KT_ERR_ARG, "path too long: %s", arg);
        return KT_OK;
    }
    return ms_find(&ref, path, cap, err);
}

/* Lists a repo's files after a failed choice, so the user can pick one. */
static void print_repo_choices(const char *arg) {
    ms_ref ref;
    char dir[MS_PATH_MAX];
    ms_candidate *files;
    int n;
    if (!ms_parse_ref(arg, &ref, NULL) || !ms_repo_dir(&ref, dir, sizeof dir, NULL) ||
        ms_repo_files(dir, false, &files, &n, NULL) != KT_OK)
        return;
    ms_print_candidates(stderr, files, n);
    ms_names_free(files, n);
}

int ms_resolve_opt(const char *cmd, const char **model, char *buf, size_t cap) {
    if (!*model) return 0;
    kt_error err = {0};
    if (ms_resolve(*model, buf, cap, &err) != KT_OK) {
        cli_fail(cmd, &err);
        size_t len = strlen(err.msg);
        if (len && err.msg[len - 1] == ':') print_repo_choices(*model);
        return 1;
    }
    *model = buf;
    return 0;
}

/* ---- listing ---- */

typedef struct entry_list {
    ms_entry *v;
    int n, cap;
} entry_list;

static int by_entry(const void *a, const void *b) {
    const ms_entry *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : strcmp(x->file, y->file);
}

static kt_status add_repo_entries(entry_list *l, const char *root, const char *owner, const char *repo, kt_error *err) {
    char dir[MS_PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s/%s", root, owner, repo);
    ms_candidate *files;
    int n;
    kt_status st = ms_repo_files(dir, true, &files, &n, err);
    for (int i = 0; st == KT_OK && i < n; i++) {
        if (l->n == l->cap) {
            ms_entry *grown = realloc(l->v, (size_t)(l->cap = l->cap ? 2 * l->cap : 16) * sizeof *l->v);
            if (!grown) {
                st = kt_error_set(err, KT_ERR_NOMEM, "out of memory listing the models");
                break;
            }
            l->v = grown;
        }
        ms_entry *e = &l->v[l->n++];
        *e = (ms_entry){.size = files[i].size};
        snprintf(e->name, sizeof e->name, "%s/%s", owner, repo);
        snprintf(e->file, sizeof e->file, "%s", files[i].name);
        snprintf(e->path, sizeof e->path, "%s/%s", dir, files[i].name);
        e->partial = !file_size(e->path, &e->size);
        if (e->partial) { /* the listing had only its .part */
            snprintf(e->path, sizeof e->path, "%s/%s.part", dir, files[i].name);
            file_size(e->path, &e->size);
        }
    }
    ms_names_free(files, n);
    return st;
}

/* The sub-folders of dir (names, malloc'd) through a callback. */
static kt_status each_subdir(const char *dir, kt_status (*fn)(void *, const char *, kt_error *), void *ctx,
                             kt_error *err) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? KT_OK : kt_error_set(err, KT_ERR_IO, "cannot read %s: %s", dir, strerror(errno));
    kt_status st = KT_OK;
    for (struct dirent *e; st == KT_OK && (e = readdir(d));) {
        char path[MS_PATH_MAX];
        struct stat s;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (e->d_name[0] == '.' || stat(path, &s) != 0 || !S_ISDIR(s.st_mode)) continue;
        st = fn(ctx, e->d_name, err);
    }
    closedir(d);
    return st;
}

typedef struct list_walk {
    entry_list *l;
    const char *root, *owner;
} list_walk;

static kt_status walk_repo(void *ctx, const char *repo, kt_error *err) {
    list_walk *w = ctx;
    return add_repo_entries(w->l, w->root, w->owner, repo, err);
}

static kt_status walk_owner(void *ctx, const char *owner, kt_error *err) {
    list_walk *w = ctx;
    char dir[MS_PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", w->root, owner);
    list_walk inner = {w->l, w->root, owner};
    return each_subdir(dir, walk_repo, &inner, err);
}

kt_status ms_list(ms_entry **entries, int *n, kt_error *err) {
    char root[MS_PATH_MAX];
    *entries = NULL, *n = 0;
    if (!ms_root(root, sizeof root, err)) return KT_ERR_ARG;
    entry_list l = {0};
    list_walk w = {&l, root, NULL};
    kt_status st = each_subdir(root, walk_owner, &w, err);
    if (st != KT_OK) {
        free(l.v);
        return st;
    }
    if (l.n > 1) qsort(l.v, (size_t)l.n, sizeof *l.v, by_entry);
    *entries = l.v, *n = l.n;
    return KT_OK;
}

/* ---- removing ---- */

static kt_status unlink_if_there(const char *dir, const char *file, const char *suffix, bool *removed, kt_error *err) {
    char path[MS_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s%s", dir, file, suffix);
    if (unlink(path) == 0) *removed = true;
    else if (errno != ENOENT) return kt_error_set(err, KT_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
    return KT_OK;
}

kt_status ms_remove(const char *dir, const char *file, kt_error *err) {
    bool removed = false;
    static const char *const SUFFIXES[] = {"", ".part", ".meta.json"};
    for (size_t k = 0; k < sizeof SUFFIXES / sizeof SUFFIXES[0]; k++) {
        kt_status st = unlink_if_there(dir, file, SUFFIXES[k], &removed, err);
        if (st != KT_OK) return st;
    }
    if (!removed) return kt_error_set(err, KT_ERR_ARG, "%s/%s is not there", dir, file);
    /* The repo and owner folders go when empty (rmdir refuses otherwise). */
    char parent[MS_PATH_MAX];
    snprintf(parent, sizeof parent, "%s", dir);
    if (rmdir(parent) == 0) {
        char *slash = strrchr(parent, '/');
        if (slash) *slash = 0, rmdir(parent);
    }
    return KT_OK;
}
