/*
 * cmd_pull.c - `kettle pull`, `kettle ls` and `kettle rm`: models from the
 * Hugging Face Hub (or a URL) into the model store, and the store listed
 * and pruned. See model_store.h for the store, hub_client.h for the HTTP.
 *
 * A pull is all or nothing: the file is complete under its name only after
 * its size and sha256 (when the repository publishes one) were checked, so
 * `-m OWNER/REPO:QUANT` never finds half a model. A transfer that stops
 * leaves FILE.part for the next pull to resume; a wrong checksum deletes
 * it, since resuming a corrupt prefix could never succeed.
 */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/timing.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/hub_client.h"
#include "cli/model_store.h"

/* What one pull fetches, and where it goes. */
typedef struct pull_job {
    const char *name;       /* as the user gave it, for messages */
    char repo[260];         /* OWNER/REPO, for the metadata */
    char dir[MS_PATH_MAX];  /* STORE/OWNER/REPO */
    char file[256];         /* FILE.gguf */
    char *url;              /* malloc'd */
    uint64_t size;          /* from the listing, 0: unknown */
    char sha256[65];        /* from the listing, "" unknown */
    bool hub;               /* the Hub's resolve URL: a sha256 ETag is trusted */
} pull_job;

static void pull_usage(FILE *out) {
    fprintf(out,
            "usage: kettle pull OWNER/REPO[:QUANT] | URL ...\n\n"
            "Downloads a GGUF model from the Hugging Face Hub into the model store, so\n"
            "'-m OWNER/REPO:QUANT' finds it in every command (run, chat, serve, bench, ...).\n"
            "QUANT picks the file whose name contains it (case-insensitive), e.g. Q4_K_M or\n"
            "the whole file name; without it the Q4_K_M file, else the smallest one. A URL\n"
            "(https://.../FILE.gguf) is downloaded as it is. A stopped download resumes\n"
            "where it left off the next time; the file's sha256 is checked when the\n"
            "repository publishes it. The path of the file goes to stdout.\n\n"
            "environment:\n"
            "  KETTLE_MODELS       the store (default $XDG_CACHE_HOME/kettle/models,\n"
            "                      else ~/.cache/kettle/models)\n"
            "  HF_TOKEN            a token for gated or private repositories\n"
            "  KETTLE_HF_ENDPOINT  the Hub (default https://huggingface.co)\n"
            "  KETTLE_PULL_STALL_S give up after this many seconds without a byte (default 30)\n");
}

/* ---- choosing the file ---- */

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* A file name fit for the store: no folder steps, no hidden names, no
 * control characters. */
static bool safe_file_name(const char *s) {
    if (!*s || *s == '.' || strlen(s) >= sizeof ((pull_job *)0)->file) return false;
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == '/' || *s == '\\' || *s == 0x7f) return false;
    return true;
}

/* Why no quant was named, for the line saying which file was taken. */
static const char *default_reason(const hub_file *files, int n, int at) {
    char q[64];
    int models = 0;
    for (int i = 0; i < n; i++) models += strncasecmp(base_name(files[i].path), "mmproj", 6) != 0;
    if (models <= 1) return "the only GGUF file";
    return !strcmp(ms_quant_of(base_name(files[at].path), q, sizeof q), "Q4_K_M") ? "Q4_K_M, the default"
                                                                                   : "the smallest, as none is Q4_K_M";
}

static kt_status refuse_split(const char *name, const char *file, kt_error *err) {
    return kt_error_set(err, KT_ERR_UNSUPPORTED, "%s is split into several files (%s, ...); kettle cannot pull split "
                        "GGUFs yet: choose a quant that is one file, or download the parts and merge them with "
                        "'llama-gguf-split --merge'", name, file);
}

/* Lists OWNER/REPO on the Hub and picks the file REF names into job. */
static kt_status plan_hub_pull(const ms_ref *ref, pull_job *job, kt_error *err) {
    hub_file *files;
    int n;
    kt_status st = hub_list_ggufs(ref->owner, ref->repo, &files, &n, err);
    if (st != KT_OK) return st;
    snprintf(job->repo, sizeof job->repo, "%s/%s", ref->owner, ref->repo);
    ms_candidate *c = calloc((size_t)(n ? n : 1), sizeof *c);
    if (!c) return hub_files_free(files, n), kt_error_set(err, KT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) c[i] = (ms_candidate){base_name(files[i].path), files[i].size};
    int at = ms_pick(c, n, ref->quant, true, job->repo, err);
    if (at < 0) {
        fprintf(stderr, "kettle pull: %s\n", err->msg);
        ms_print_candidates(stderr, c, n);
        st = KT_ERR_ARG;
        err->msg[0] = 0; /* said already, with the list */
    } else if (ms_is_split(c[at].name)) {
        st = refuse_split(job->name, c[at].name, err);
    } else if (!safe_file_name(c[at].name)) {
        st = kt_error_set(err, KT_ERR_FORMAT, "the repository's file name '%s' is not one kettle will write", c[at].name);
    } else {
        snprintf(job->file, sizeof job->file, "%s", c[at].name);
        job->size = files[at].size;
        memcpy(job->sha256, files[at].sha256, sizeof job->sha256);
        job->url = hub_resolve_url(ref->owner, ref->repo, files[at].path);
        job->hub = true;
        if (!job->url) st = kt_error_set(err, KT_ERR_NOMEM, "out of memory");
        else if (!ref->quant[0]) fprintf(stderr, "kettle pull: %s: taking %s (%s)\n", job->repo, job->file,
                                         default_reason(files, n, at));
    }
    free(c);
    hub_files_free(files, n);
    return st;
}

/* "host:port" made a folder name. */
static void host_folder(const char *url, char *out, size_t cap) {
    const char *h = strstr(url, "://") + 3;
    size_t n = strcspn(h, "/?#");
    if (memchr(h, '@', n)) { /* user:password@host: the credentials stay out of the path */
        const char *at = memchr(h, '@', n);
        n -= (size_t)(at + 1 - h), h = at + 1;
    }
    snprintf(out, cap, "%.*s", (int)n, h);
    for (char *p = out; *p; p++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-", *p)) *p = '_';
    if (!out[0] || !strcmp(out, ".") || !strcmp(out, "..")) snprintf(out, cap, "host");
}

/* A plain URL: its last path step is the file; the Hub's own resolve URLs
 * keep their OWNER/REPO. */
static kt_status plan_url_pull(const char *url, pull_job *job, kt_error *err) {
    char path[2048], owner[128] = "", repo[128] = "";
    const char *p = strstr(url, "://") + 3;
    p += strcspn(p, "/");
    snprintf(path, sizeof path, "%.*s", (int)strcspn(p, "?#"), p);
    char *file = curl_easy_unescape(NULL, base_name(path), 0, NULL);
    if (!file) return kt_error_set(err, KT_ERR_NOMEM, "out of memory");
    kt_status st = KT_OK;
    size_t n = strlen(file);
    if (n < 6 || strcasecmp(file + n - 5, ".gguf") || !safe_file_name(file))
        st = kt_error_set(err, KT_ERR_ARG, "the URL '%s' does not name a .gguf file", url);
    else if (ms_is_split(file))
        st = refuse_split(url, file, err);
    const char *ep = hub_endpoint();
    size_t epn = strlen(ep);
    ms_ref ref;
    char ref_text[300];
    int end = 0; /* set only when the whole "/OWNER/REPO/resolve/" matched */
    job->hub = !strncmp(url, ep, epn) && url[epn] == '/' &&
               sscanf(url + epn, "/%127[^/]/%127[^/]/resolve/%n", owner, repo, &end) == 2 && end > 0;
    snprintf(ref_text, sizeof ref_text, "%s/%s", owner, repo);
    if (job->hub && !ms_parse_ref(ref_text, &ref, NULL)) job->hub = false;
    if (!job->hub) {
        snprintf(owner, sizeof owner, "%s", MS_URL_OWNER);
        host_folder(url, repo, sizeof repo);
    }
    snprintf(job->repo, sizeof job->repo, "%s/%s", owner, repo);
    snprintf(job->file, sizeof job->file, "%s", file);
    curl_free(file);
    job->url = strdup(url);
    if (st == KT_OK && !job->url) st = kt_error_set(err, KT_ERR_NOMEM, "out of memory");
    return st;
}

static kt_status plan_pull(const char *arg, pull_job *job, kt_error *err) {
    char root[MS_PATH_MAX];
    kt_status st;
    if (!strncmp(arg, "https://", 8) || !strncmp(arg, "http://", 7)) {
        st = plan_url_pull(arg, job, err);
    } else {
        ms_ref ref;
        if (!ms_parse_ref(arg, &ref, err)) return KT_ERR_ARG;
        st = plan_hub_pull(&ref, job, err);
    }
    if (st == KT_OK && !ms_root(root, sizeof root, err)) st = KT_ERR_ARG;
    if (st == KT_OK && snprintf(job->dir, sizeof job->dir, "%s/%s", root, job->repo) >= (int)sizeof job->dir)
        st = kt_error_set(err, KT_ERR_ARG, "the model folder's path is too long");
    return st;
}

/* ---- fetching and checking ---- */

/* The size and checksum the file must have: the listing's, else the
 * server's headers. */
static void expected(const pull_job *job, const hub_fetch *f, uint64_t *size, const char **sha) {
    *size = job->size ? job->size : f->server_size;
    *sha = job->sha256[0] ? job->sha256 : f->server_sha256[0] ? f->server_sha256 : NULL;
}

/* Size and sha256 against what was published; a mismatch deletes the part. */
static kt_status verify(const pull_job *job, const hub_fetch *f, kt_error *err) {
    uint64_t size;
    const char *sha;
    expected(job, f, &size, &sha);
    if (size && f->size != size) {
        unlink(f->part_path);
        return kt_error_set(err, KT_ERR_FORMAT, "%s: got %llu bytes, the repository says %llu; the download was "
                            "deleted: run 'kettle pull %s' again to retry", job->file, (unsigned long long)f->size,
                            (unsigned long long)size, job->name);
    }
    if (sha && strcmp(sha, f->sha256)) {
        unlink(f->part_path);
        return kt_error_set(err, KT_ERR_FORMAT, "%s: checksum mismatch: sha256 %s, the repository says %s; the "
                            "download was deleted: run 'kettle pull %s' again to retry (if it fails again, the "
                            "server's file differs from the repository's metadata)", job->file, f->sha256, sha,
                            job->name);
    }
    return KT_OK;
}

static kt_status sync_dir(const char *dir, kt_error *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return kt_error_set(err, KT_ERR_IO, "cannot open %s: %s", dir, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    return rc == 0 ? KT_OK : kt_error_set(err, KT_ERR_IO, "cannot sync %s: %s", dir, strerror(errno));
}

/* The checked part becomes the model, then its metadata is written. */
static kt_status install(const pull_job *job, const hub_fetch *f, const char *path, kt_error *err) {
    if (rename(f->part_path, path) != 0)
        return kt_error_set(err, KT_ERR_IO, "cannot rename %s to %s: %s", f->part_path, path, strerror(errno));
    kt_status st = sync_dir(job->dir, err);
    ms_meta m = {.size = f->size};
    snprintf(m.repo, sizeof m.repo, "%s", job->repo);
    snprintf(m.source, sizeof m.source, "%s", job->url);
    snprintf(m.sha256, sizeof m.sha256, "%s", f->sha256);
    snprintf(m.commit, sizeof m.commit, "%s", f->commit);
    return st == KT_OK ? ms_write_meta(path, &m, err) : st;
}

static void say_fetching(const pull_job *job, uint64_t have) {
    char a[32], b[32];
    if (have) fprintf(stderr, "kettle pull: resuming %s at %s\n", job->file, cli_human_bytes(have, a, sizeof a));
    else fprintf(stderr, "kettle pull: downloading %s%s%s%s\n", job->file, job->size ? " (" : "",
                 job->size ? cli_human_bytes(job->size, b, sizeof b) : "", job->size ? ")" : "");
}

static void say_done(const pull_job *job, const hub_fetch *f, const char *path, double secs) {
    char a[32];
    uint64_t size;
    const char *sha;
    expected(job, f, &size, &sha);
    const char *checked = sha ? "sha256 verified"
                          : size ? "no checksum published: only its size was checked"
                                 : "no checksum or size published: nothing could be checked";
    fprintf(stderr, "kettle pull: saved %s (%s, %s%s; %.1f s)\n", path, cli_human_bytes(f->size, a, sizeof a), checked,
            f->restarted ? "; the server ignored the resume request, so it was downloaded whole" : "", secs);
}

static kt_status fetch(const pull_job *job, const char *path, kt_error *err) {
    char part[MS_PATH_MAX + 320];
    struct stat st;
    snprintf(part, sizeof part, "%s.part", path);
    hub_fetch f = {.url = job->url, .part_path = part, .expect_size = job->size,
                   .trust_etag = job->hub};
    say_fetching(job, stat(part, &st) == 0 ? (uint64_t)st.st_size : 0);
    double t0 = kt_time_ms();
    kt_status rc = hub_download(&f, err);
    if (rc == KT_OK) rc = verify(job, &f, err);
    if (rc == KT_OK) rc = install(job, &f, path, err);
    if (rc == KT_OK) say_done(job, &f, path, (kt_time_ms() - t0) / 1e3);
    return rc;
}

static int pull_one(const char *arg) {
    pull_job job = {.name = arg};
    kt_error err = {0};
    char path[MS_PATH_MAX + 300];
    struct stat st;
    kt_status rc = plan_pull(arg, &job, &err);
    if (rc == KT_OK && snprintf(path, sizeof path, "%s/%s", job.dir, job.file) >= (int)sizeof path)
        rc = kt_error_set(&err, KT_ERR_ARG, "the model's path is too long");
    bool have = rc == KT_OK && stat(path, &st) == 0 && (!job.size || (uint64_t)st.st_size == job.size);
    if (have) fprintf(stderr, "kettle pull: %s is already pulled ('kettle rm %s:%s' removes it)\n", job.file,
                      job.repo, job.file);
    else if (rc == KT_OK && (rc = ms_mkdirs(job.dir, &err)) == KT_OK) rc = fetch(&job, path, &err);
    free(job.url);
    if (rc != KT_OK) return err.msg[0] ? cli_fail("pull", &err) : 1;
    printf("%s\n", path);
    return 0;
}

int cmd_pull(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) return pull_usage(stdout), 0;
    if (argc < 2) return cli_usage_error("pull", "name a model: OWNER/REPO[:QUANT] or a URL");
    for (int i = 1; i < argc; i++)
        if (argv[i][0] == '-') return cli_usage_error("pull", "unknown option '%s'", argv[i]);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) return fprintf(stderr, "kettle pull: curl_global_init failed\n"), 1;
    int rc = 0;
    for (int i = 1; i < argc && !rc; i++) rc = pull_one(argv[i]);
    curl_global_cleanup();
    return rc;
}

/* ---- ls ---- */

/* The name -m takes for an entry: OWNER/REPO:QUANT when QUANT picks this
 * very file among the repo's, else OWNER/REPO:FILE. */
static void entry_ref(const ms_entry *e, const ms_entry *all, int n, char *out, size_t cap) {
    char q[64];
    ms_candidate c[256];
    int k = 0, self = -1;
    for (int i = 0; i < n && k < 256; i++)
        if (!strcmp(all[i].name, e->name) && !all[i].partial) {
            if (&all[i] == e) self = k;
            c[k++] = (ms_candidate){all[i].file, all[i].size};
        }
    ms_quant_of(e->file, q, sizeof q);
    bool unique = q[0] && self >= 0 && ms_pick(c, k, q, false, e->name, NULL) == self;
    snprintf(out, cap, "%s:%s", e->name, unique ? q : e->file);
}

static void ls_usage(FILE *out) {
    fprintf(out, "usage: kettle ls\n\nLists the models 'kettle pull' downloaded: the name '-m' takes, the file, its\n"
                 "size and path; a download that stopped shows as partial ('kettle pull' resumes it).\n"
                 "The store is $KETTLE_MODELS, else $XDG_CACHE_HOME/kettle/models, else\n"
                 "~/.cache/kettle/models.\n");
}

int cmd_ls(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) return ls_usage(stdout), 0;
    if (argc > 1) return cli_usage_error("ls", "unexpected argument '%s'", argv[1]);
    kt_error err = {0};
    ms_entry *e;
    int n;
    char root[MS_PATH_MAX];
    if (!ms_root(root, sizeof root, &err) || ms_list(&e, &n, &err) != KT_OK) return cli_fail("ls", &err);
    if (n == 0) fprintf(stderr, "kettle ls: no models in %s yet ('kettle pull OWNER/REPO:QUANT' gets one)\n", root);
    else printf("%-48s %-40s %16s  %s\n", "NAME", "FILE", "SIZE", "PATH");
    for (int i = 0; i < n; i++) {
        char ref[600], size[40], hb[32];
        entry_ref(&e[i], e, n, ref, sizeof ref);
        snprintf(size, sizeof size, "%s%s", e[i].partial ? "partial " : "", cli_human_bytes(e[i].size, hb, sizeof hb));
        printf("%-48s %-40s %16s  %s\n", ref, e[i].file, size, e[i].path);
    }
    free(e);
    return fflush(stdout) == 0 ? 0 : 1;
}

/* ---- rm ---- */

static void rm_usage(FILE *out) {
    fprintf(out, "usage: kettle rm OWNER/REPO[:QUANT] ...\n\nDeletes a pulled model (or a stopped download of one) "
                 "and its metadata from the\nstore; QUANT picks the file as for 'kettle pull'. 'kettle ls' lists "
                 "the names.\n");
}

static int rm_one(const char *arg) {
    kt_error err = {0};
    ms_ref ref;
    char dir[MS_PATH_MAX], what[300], hb[32];
    ms_candidate *files = NULL;
    int n = 0, rc = 1;
    if (!ms_parse_ref(arg, &ref, &err) || !ms_repo_dir(&ref, dir, sizeof dir, &err) ||
        ms_repo_files(dir, true, &files, &n, &err) != KT_OK)
        return cli_fail("rm", &err);
    snprintf(what, sizeof what, "%s/%s", ref.owner, ref.repo);
    int at = n ? ms_pick(files, n, ref.quant, false, what, &err) : -1;
    if (!n) kt_error_set(&err, KT_ERR_ARG, "%s is not in the model store ('kettle ls' lists what is)", what);
    if (at < 0) {
        cli_fail("rm", &err);
        ms_print_candidates(stderr, files, n);
    } else if (ms_remove(dir, files[at].name, &err) != KT_OK) {
        cli_fail("rm", &err);
    } else {
        fprintf(stderr, "kettle rm: removed %s/%s%s%s%s\n", what, files[at].name, files[at].size ? " (" : "",
                files[at].size ? cli_human_bytes(files[at].size, hb, sizeof hb) : "", files[at].size ? ")" : "");
        rc = 0;
    }
    ms_names_free(files, n);
    return rc;
}

int cmd_rm(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) return rm_usage(stdout), 0;
    if (argc < 2) return cli_usage_error("rm", "name a model: OWNER/REPO[:QUANT] (see 'kettle ls')");
    int rc = 0;
    for (int i = 1; i < argc; i++) rc |= rm_one(argv[i]);
    return rc;
}
