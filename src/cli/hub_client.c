/*
 * hub_client.c - the Hub's file list and resumable downloads with libcurl;
 * see hub_client.h.
 *
 * A download appends to FILE.part. When bytes are already there it hashes
 * them first, then asks for the rest with "Range: bytes=N-": a 206 whose
 * Content-Range starts at N continues the part, a 200 means the server
 * ignored the range, so the part is emptied and the whole file taken; a 416
 * whose total is N means the part was already whole. The part is locked
 * (flock) so two pulls of one file cannot interleave their bytes. Headers of
 * every response on the redirect chain are read: the Hub puts the file's
 * sha256 and size (X-Linked-Etag, X-Linked-Size) and the commit on its 302,
 * not on the CDN's answer.
 */
#include "cli/hub_client.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <nettle/sha2.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/error.h"
#include "base/timing.h"
#include "cli/cli_util.h"

#define MAX_LISTING (64u << 20) /* a repo's JSON listing; far above any real one */

const char *hub_endpoint(void) {
    static char buf[1024];
    const char *e = getenv("KETTLE_HF_ENDPOINT");
    snprintf(buf, sizeof buf, "%s", e && *e ? e : "https://huggingface.co");
    for (size_t n = strlen(buf); n && buf[n - 1] == '/'; n--) buf[n - 1] = 0;
    return buf;
}

/* Seconds without a byte before a transfer is given up:
 * $KETTLE_PULL_STALL_S, else 30. */
static long stall_seconds(void) {
    const char *s = getenv("KETTLE_PULL_STALL_S");
    long v = s ? strtol(s, NULL, 10) : 0;
    return v > 0 && v < 3600 ? v : 30;
}

/* ---- requests ---- */

typedef struct request {
    CURL *h;
    struct curl_slist *headers;
    char curl_err[CURL_ERROR_SIZE];
} request;

/* The Bearer header, for URLs on the Hub only. */
static bool add_auth(request *r, const char *url) {
    const char *token = getenv("HF_TOKEN"), *ep = hub_endpoint();
    if (!token || !*token || strncmp(url, ep, strlen(ep)) != 0) return true;
    size_t cap = strlen(token) + 32;
    char *line = malloc(cap);
    if (!line) return false;
    snprintf(line, cap, "Authorization: Bearer %s", token);
    struct curl_slist *l = curl_slist_append(r->headers, line);
    free(line);
    if (l) r->headers = l;
    return l != NULL;
}

static bool request_init(request *r, const char *url) {
    *r = (request){.h = curl_easy_init()};
    if (!r->h || !add_auth(r, url)) return false;
    curl_easy_setopt(r->h, CURLOPT_URL, url);
    curl_easy_setopt(r->h, CURLOPT_HTTPHEADER, r->headers);
    curl_easy_setopt(r->h, CURLOPT_USERAGENT, "kettle");
    curl_easy_setopt(r->h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(r->h, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(r->h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(r->h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(r->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(r->h, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(r->h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(r->h, CURLOPT_LOW_SPEED_TIME, stall_seconds());
    curl_easy_setopt(r->h, CURLOPT_FAILONERROR, 1L); /* an error page never lands in the file */
    curl_easy_setopt(r->h, CURLOPT_ERRORBUFFER, r->curl_err);
    return true;
}

static void request_free(request *r) {
    if (r->h) curl_easy_cleanup(r->h);
    curl_slist_free_all(r->headers);
    *r = (request){0};
}

static long response_code(const request *r) {
    long code = 0;
    curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &code);
    return code;
}

/* What went wrong with a request, in words a user can act on. */
static kt_status transfer_error(const request *r, CURLcode rc, const char *what, kt_error *err) {
    long code = response_code(r);
    if (rc == CURLE_HTTP_RETURNED_ERROR && (code == 401 || code == 403))
        return kt_error_set(err, KT_ERR_IO, "%s: HTTP %ld: the repository is gated or private; set HF_TOKEN to a token "
                            "that has access (https://huggingface.co/settings/tokens), after accepting its terms on "
                            "its page if it asks", what, code);
    if (rc == CURLE_HTTP_RETURNED_ERROR)
        return kt_error_set(err, KT_ERR_IO, "%s: HTTP %ld%s", what, code,
                            code == 404 ? " (not found: check the name)" : "");
    if (rc == CURLE_OPERATION_TIMEDOUT)
        return kt_error_set(err, KT_ERR_IO, "%s: timed out, nothing received for %ld s (%s)", what, stall_seconds(),
                            r->curl_err[0] ? r->curl_err : curl_easy_strerror(rc));
    return kt_error_set(err, KT_ERR_IO, "%s: %s", what, r->curl_err[0] ? r->curl_err : curl_easy_strerror(rc));
}

/* ---- the listing ---- */

/* GET url as JSON. On an HTTP error *code has the status. */
static json_t *get_json(const char *url, long *code, kt_error *err) {
    request r;
    cli_text b = {.max = MAX_LISTING};
    json_t *doc = NULL;
    *code = 0;
    if (!request_init(&r, url)) {
        kt_error_set(err, KT_ERR_NOMEM, "out of memory");
    } else {
        curl_easy_setopt(r.h, CURLOPT_WRITEFUNCTION, cli_text_append);
        curl_easy_setopt(r.h, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(r.h, CURLOPT_TIMEOUT, 120L);
        CURLcode rc = curl_easy_perform(r.h);
        *code = response_code(&r);
        json_error_t je;
        if (rc != CURLE_OK) transfer_error(&r, rc, url, err);
        else if (!b.p || !(doc = json_loads(b.p, 0, &je)))
            kt_error_set(err, KT_ERR_FORMAT, "%s: the answer is not JSON (%s)", url, b.p ? je.text : "empty");
    }
    request_free(&r);
    free(b.p);
    return doc;
}

static bool is_gguf(const char *path) {
    size_t n = path ? strlen(path) : 0;
    return n > 5 && !strcasecmp(path + n - 5, ".gguf");
}

static bool is_sha256_hex(const char *s, size_t n) {
    if (n != 64) return false;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i])) return false;
    return true;
}

static bool add_file(hub_file **files, int *n, int *cap, const char *path, uint64_t size, const char *sha) {
    if (*n == *cap) {
        hub_file *grown = realloc(*files, (size_t)(*cap = *cap ? 2 * *cap : 16) * sizeof **files);
        if (!grown) return false;
        *files = grown;
    }
    hub_file *f = &(*files)[*n];
    *f = (hub_file){.path = strdup(path), .size = size};
    if (!f->path) return false;
    if (sha && is_sha256_hex(sha, strlen(sha)))
        for (int i = 0; i < 64; i++) f->sha256[i] = (char)tolower((unsigned char)sha[i]);
    (*n)++;
    return true;
}

/* The tree API: [{"type":"file","path":..,"size":..,"lfs":{"oid":..,"size":..}}]. */
static kt_status files_from_tree(json_t *doc, hub_file **files, int *n, kt_error *err) {
    int cap = 0;
    size_t i;
    json_t *e;
    json_array_foreach(doc, i, e) {
        const char *type = json_string_value(json_object_get(e, "type"));
        const char *path = json_string_value(json_object_get(e, "path"));
        json_t *lfs = json_object_get(e, "lfs");
        json_t *size = json_object_get(lfs, "size") ? json_object_get(lfs, "size") : json_object_get(e, "size");
        if (!type || strcmp(type, "file") || !is_gguf(path)) continue;
        json_int_t sz = json_is_integer(size) ? json_integer_value(size) : 0;
        if (!add_file(files, n, &cap, path, sz > 0 ? (uint64_t)sz : 0, json_string_value(json_object_get(lfs, "oid"))))
            return kt_error_set(err, KT_ERR_NOMEM, "out of memory reading the file list");
    }
    return KT_OK;
}

/* The model API: {"siblings":[{"rfilename":..}]}. */
static kt_status files_from_siblings(json_t *doc, hub_file **files, int *n, kt_error *err) {
    int cap = 0;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(doc, "siblings"), i, e) {
        const char *path = json_string_value(json_object_get(e, "rfilename"));
        if (is_gguf(path) && !add_file(files, n, &cap, path, 0, NULL))
            return kt_error_set(err, KT_ERR_NOMEM, "out of memory reading the file list");
    }
    return KT_OK;
}

void hub_files_free(hub_file *files, int n) {
    for (int i = 0; files && i < n; i++) free(files[i].path);
    free(files);
}

kt_status hub_list_ggufs(const char *owner, const char *repo, hub_file **files, int *n, kt_error *err) {
    char url[2048];
    long code;
    *files = NULL, *n = 0;
    snprintf(url, sizeof url, "%s/api/models/%s/%s/tree/main?recursive=true", hub_endpoint(), owner, repo);
    json_t *doc = get_json(url, &code, err);
    kt_status st = KT_OK;
    if (json_is_array(doc)) {
        st = files_from_tree(doc, files, n, err);
    } else if (code != 401 && code != 403) { /* an older Hub, or a mirror without the tree API */
        kt_error first = *err;
        json_decref(doc);
        snprintf(url, sizeof url, "%s/api/models/%s/%s", hub_endpoint(), owner, repo);
        doc = get_json(url, &code, err);
        if (json_is_object(doc)) st = files_from_siblings(doc, files, n, err);
        else st = code == 404 ? kt_error_set(err, KT_ERR_ARG, "no repository %s/%s on %s (check the name)", owner, repo,
                                             hub_endpoint())
                              : (*err = first, first.status ? first.status : KT_ERR_FORMAT);
    } else {
        st = err ? err->status : KT_ERR_IO;
    }
    json_decref(doc);
    if (st != KT_OK) hub_files_free(*files, *n), *files = NULL, *n = 0;
    return st;
}

char *hub_resolve_url(const char *owner, const char *repo, const char *path) {
    size_t cap = strlen(hub_endpoint()) + strlen(owner) + strlen(repo) + 3 * strlen(path) + 32;
    char *url = malloc(cap);
    if (!url) return NULL;
    size_t n = (size_t)snprintf(url, cap, "%s/%s/%s/resolve/main", hub_endpoint(), owner, repo);
    for (const char *s = path; *s;) {
        size_t k = strcspn(s, "/");
        char *esc = curl_easy_escape(NULL, s, (int)k);
        if (!esc) return free(url), NULL;
        n += (size_t)snprintf(url + n, cap - n, "/%s", esc);
        curl_free(esc);
        s += k + (s[k] == '/');
    }
    return url;
}

/* ---- the download ---- */

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

typedef struct fetch_state {
    hub_fetch *f;
    int fd;
    uint64_t offset;       /* where this request's bytes start in the part */
    struct sha256_ctx sha;
    long status;           /* of the response being read */
    int64_t range_start;   /* its Content-Range start, -1 when none */
    uint64_t range_total;
    uint64_t content_length; /* 0: not given */
    bool body_started;
    char etag[65];
    char fail[256];        /* why the write callback stopped the transfer */
    cli_progress bar;
    bool bar_on;
    uint64_t bar_seen;
} fetch_state;

/* A header value: after "Name:", blanks and quotes (and a weak "W/") off. */
static bool header_value(const char *line, size_t len, const char *name, char *out, size_t cap) {
    size_t n = strlen(name);
    if (len <= n || strncasecmp(line, name, n) || line[n] != ':') return false;
    const char *v = line + n + 1, *end = line + len;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    if (end - v >= 2 && v[0] == 'W' && v[1] == '/') v += 2;
    while (end > v && strchr(" \t\r\n\"", end[-1])) end--;
    if (v < end && *v == '"') v++;
    size_t k = (size_t)(end - v) < cap - 1 ? (size_t)(end - v) : cap - 1;
    memcpy(out, v, k);
    out[k] = 0;
    return true;
}

static void lower_sha(char *dst, const char *src) {
    for (int i = 0; i < 64; i++) dst[i] = (char)tolower((unsigned char)src[i]);
    dst[64] = 0;
}

static size_t on_header(char *line, size_t size, size_t n, void *user) {
    fetch_state *s = user;
    size_t len = size * n;
    char v[256];
    if (len > 5 && !strncmp(line, "HTTP/", 5)) { /* a new response on the redirect chain */
        const char *sp = memchr(line, ' ', len);
        s->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        s->range_start = -1, s->range_total = 0, s->content_length = 0, s->etag[0] = 0;
    } else if (header_value(line, len, "X-Linked-Etag", v, sizeof v) && is_sha256_hex(v, strlen(v))) {
        lower_sha(s->f->server_sha256, v);
    } else if (header_value(line, len, "ETag", v, sizeof v) && is_sha256_hex(v, strlen(v))) {
        lower_sha(s->etag, v);
    } else if (header_value(line, len, "X-Linked-Size", v, sizeof v)) {
        s->f->server_size = strtoull(v, NULL, 10);
    } else if (header_value(line, len, "X-Repo-Commit", s->f->commit, sizeof s->f->commit)) {
        /* kept as it came (a git id; cut at the buffer if longer) */
    } else if (header_value(line, len, "Content-Length", v, sizeof v)) {
        s->content_length = strtoull(v, NULL, 10);
    } else if (header_value(line, len, "Content-Range", v, sizeof v)) {
        unsigned long long a = 0, b = 0, t = 0;
        if (sscanf(v, "bytes %llu-%llu/%llu", &a, &b, &t) == 3) s->range_start = (int64_t)a, s->range_total = t;
        else if (sscanf(v, "bytes */%llu", &t) == 1) s->range_total = t;
    }
    return len;
}

static bool write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w, n -= (size_t)w;
    }
    return true;
}

/* Empties the part: the server is sending the whole file. */
static bool start_over(fetch_state *s) {
    if (ftruncate(s->fd, 0) != 0 || lseek(s->fd, 0, SEEK_SET) != 0) return false;
    sha256_init(&s->sha);
    s->offset = 0, s->f->size = 0, s->f->resumed_from = 0, s->f->restarted = true;
    return true;
}

/* The first body byte: does this response continue the part? */
static bool check_body_start(fetch_state *s) {
    s->body_started = true;
    if (s->status == 206 && s->range_start != (int64_t)s->offset) {
        snprintf(s->fail, sizeof s->fail, "the server answered the range request from byte %llu at byte %lld",
                 (unsigned long long)s->offset, (long long)s->range_start);
        return false;
    }
    if (s->status != 206 && s->offset > 0 && !start_over(s)) {
        snprintf(s->fail, sizeof s->fail, "cannot empty %s: %s", s->f->part_path, strerror(errno));
        return false;
    }
    if (s->status == 206) s->f->resumed_from = s->offset;
    /* no X-Linked-Size: the whole file's length is the server's word on its size */
    if (!s->f->server_size && s->range_total) s->f->server_size = s->range_total;
    if (!s->f->server_size && s->status == 200 && s->content_length) s->f->server_size = s->content_length;
    if (s->f->trust_etag && !s->f->server_sha256[0] && s->etag[0]) memcpy(s->f->server_sha256, s->etag, 65);
    return true;
}

static size_t on_body(char *data, size_t size, size_t n, void *user) {
    fetch_state *s = user;
    size_t len = size * n;
    if (!s->body_started && !check_body_start(s)) return 0;
    uint64_t limit = s->f->expect_size ? s->f->expect_size : s->f->server_size;
    if (limit && s->f->size + len > limit) {
        snprintf(s->fail, sizeof s->fail, "the server sent more than the file's %llu bytes", (unsigned long long)limit);
        return 0;
    }
    if (!write_all(s->fd, data, len)) {
        snprintf(s->fail, sizeof s->fail, "writing %s failed: %s", s->f->part_path, strerror(errno));
        return 0;
    }
    sha256_update(&s->sha, len, (const uint8_t *)data);
    s->f->size += len;
    return len;
}

/* "1.2 GiB / 4.1 GiB  35.0 MiB/s" beside the bar. */
static void draw_progress(fetch_state *s, uint64_t total, uint64_t now) {
    if (!s->bar_on) {
        if (!total) return;
        cli_progress_start(&s->bar, total);
        s->bar.done = s->f->size;
        s->bar_on = true, s->bar_seen = now;
    }
    uint64_t delta = now > s->bar_seen ? now - s->bar_seen : 0;
    s->bar_seen = now > s->bar_seen ? now : s->bar_seen;
    if (!s->bar.tty || (int)((s->bar.done + delta) * 100 / s->bar.total) == s->bar.last_pct) {
        s->bar.done += delta;
        return;
    }
    char what[96], a[32], b[32], r[32] = "";
    double secs = (kt_time_ms() - s->bar.t0_ms) / 1e3;
    if (secs > 0.1) { /* a rate over less time is noise */
        cli_human_bytes((uint64_t)((double)(s->f->size - s->f->resumed_from) / secs), r, sizeof r - 2);
        strcat(r, "/s");
    }
    snprintf(what, sizeof what, "%s / %s  %s", cli_human_bytes(s->f->size, a, sizeof a),
             cli_human_bytes(s->bar.total, b, sizeof b), r);
    cli_progress_add(&s->bar, delta, what);
}

static int on_progress(void *user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ult, curl_off_t ulnow) {
    (void)ult, (void)ulnow;
    fetch_state *s = user;
    if (g_interrupted) return 1;
    if (s->body_started) {
        uint64_t total = s->f->expect_size ? s->f->expect_size
                         : dltotal > 0     ? s->offset + (uint64_t)dltotal : s->f->server_size;
        draw_progress(s, total, (uint64_t)dlnow);
    }
    return 0;
}

/* Hashes what the part already holds, so a resumed file is checked whole. */
static kt_status hash_existing(fetch_state *s, uint64_t n, kt_error *err) {
    enum { CHUNK = 1 << 20 };
    char *buf = malloc(CHUNK);
    if (!buf) return kt_error_set(err, KT_ERR_NOMEM, "out of memory");
    uint64_t done = 0;
    while (done < n) {
        ssize_t r = pread(s->fd, buf, n - done < CHUNK ? (size_t)(n - done) : CHUNK, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(buf);
            return kt_error_set(err, KT_ERR_IO, "cannot read %s: %s", s->f->part_path, r ? strerror(errno) : "short");
        }
        sha256_update(&s->sha, (size_t)r, (const uint8_t *)buf);
        done += (uint64_t)r;
    }
    free(buf);
    return lseek(s->fd, (off_t)n, SEEK_SET) == (off_t)n ? KT_OK
                                                        : kt_error_set(err, KT_ERR_IO, "cannot seek in %s", s->f->part_path);
}

/* Opens and locks the part; *have = the bytes a resume can keep. */
static kt_status open_part(fetch_state *s, kt_error *err) {
    hub_fetch *f = s->f;
    s->fd = open(f->part_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (s->fd < 0) return kt_error_set(err, KT_ERR_IO, "cannot open %s: %s", f->part_path, strerror(errno));
    if (flock(s->fd, LOCK_EX | LOCK_NB) != 0)
        return kt_error_set(err, KT_ERR_BUSY, "another 'kettle pull' is downloading %s now", f->part_path);
    struct stat st;
    if (fstat(s->fd, &st) != 0) return kt_error_set(err, KT_ERR_IO, "cannot stat %s: %s", f->part_path, strerror(errno));
    uint64_t have = (uint64_t)st.st_size;
    if (f->expect_size && have > f->expect_size) { /* not a prefix of this file */
        if (ftruncate(s->fd, 0) != 0) return kt_error_set(err, KT_ERR_IO, "cannot empty %s", f->part_path);
        have = 0;
    }
    sha256_init(&s->sha);
    kt_status rc = have ? hash_existing(s, have, err) : KT_OK;
    s->offset = have, f->size = have;
    return rc;
}

static kt_status check_space(const hub_fetch *f, kt_error *err) {
    struct statvfs vfs;
    if (!f->expect_size || f->expect_size <= f->size || statvfs(f->part_path, &vfs) != 0) return KT_OK;
    uint64_t need = f->expect_size - f->size, free_bytes = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    char a[32], b[32];
    if (need > free_bytes)
        return kt_error_set(err, KT_ERR_IO, "not enough disk space for %s: %s more needed, %s free (set KETTLE_MODELS "
                            "to a folder on a bigger disk)", f->part_path, cli_human_bytes(need, a, sizeof a),
                            cli_human_bytes(free_bytes, b, sizeof b));
    return KT_OK;
}

/* One GET from s->offset. */
static CURLcode perform(fetch_state *s, request *r) {
    char range[64];
    s->body_started = false, s->fail[0] = 0, s->status = 0;
    curl_easy_setopt(r->h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(r->h, CURLOPT_HEADERDATA, s);
    curl_easy_setopt(r->h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(r->h, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(r->h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(r->h, CURLOPT_XFERINFODATA, s);
    curl_easy_setopt(r->h, CURLOPT_NOPROGRESS, 0L);
    snprintf(range, sizeof range, "%llu-", (unsigned long long)s->offset);
    curl_easy_setopt(r->h, CURLOPT_RANGE, s->offset ? range : NULL);
    return curl_easy_perform(r->h);
}

/* The message for a transfer that stopped with the part kept. */
static kt_status stopped(fetch_state *s, const char *why, kt_error *err) {
    char a[32], b[32];
    hub_fetch *f = s->f;
    uint64_t total = f->expect_size ? f->expect_size : f->server_size;
    f->interrupted = true;
    return kt_error_set(err, KT_ERR_IO, "the download stopped at %s of %s (%s); the part is kept in %s: run the same "
                        "'kettle pull' again to resume it", cli_human_bytes(f->size, a, sizeof a),
                        total ? cli_human_bytes(total, b, sizeof b) : "?", why, f->part_path);
}

static kt_status run_transfer(fetch_state *s, request *r, kt_error *err) {
    for (int attempt = 0;; attempt++) {
        CURLcode rc = perform(s, r);
        long code = response_code(r);
        if (rc == CURLE_OK) return KT_OK;
        if (rc == CURLE_HTTP_RETURNED_ERROR && code == 416 && s->offset > 0) {
            if (s->range_total == s->offset) { /* the part was whole already */
                if (!s->f->server_size) s->f->server_size = s->range_total;
                return KT_OK;
            }
            if (attempt == 0 && start_over(s)) continue;   /* not a prefix of this file */
        }
        if (rc == CURLE_ABORTED_BY_CALLBACK && g_interrupted) return stopped(s, "interrupted", err);
        if (s->fail[0]) return kt_error_set(err, KT_ERR_IO, "%s", s->fail);
        if (rc == CURLE_HTTP_RETURNED_ERROR || rc == CURLE_WRITE_ERROR) return transfer_error(r, rc, s->f->url, err);
        char why[CURL_ERROR_SIZE + 64];
        snprintf(why, sizeof why, "%s", r->curl_err[0] ? r->curl_err : curl_easy_strerror(rc));
        return stopped(s, why, err);
    }
}

static void finish_hash(fetch_state *s) {
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_digest(&s->sha, sizeof d, d);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++) snprintf(s->f->sha256 + 2 * i, 3, "%02x", d[i]);
}

kt_status hub_download(hub_fetch *f, kt_error *err) {
    fetch_state s = {.f = f, .fd = -1};
    request r = {0};
    f->size = 0, f->sha256[0] = 0, f->interrupted = false;
    kt_status st = open_part(&s, err);
    if (st == KT_OK) st = check_space(f, err);
    bool complete = st == KT_OK && f->expect_size && f->size == f->expect_size;
    if (st == KT_OK && !complete && !request_init(&r, f->url)) st = kt_error_set(err, KT_ERR_NOMEM, "out of memory");
    if (st == KT_OK && !complete) {
        struct sigaction sa = {.sa_handler = on_sigint}, old;
        sigemptyset(&sa.sa_mask);
        g_interrupted = 0;
        sigaction(SIGINT, &sa, &old);
        st = run_transfer(&s, &r, err);
        sigaction(SIGINT, &old, NULL);
        if (s.bar_on) cli_progress_end(&s.bar);
    }
    if (s.fd >= 0 && fsync(s.fd) != 0 && st == KT_OK)
        st = kt_error_set(err, KT_ERR_IO, "cannot write %s to disk: %s", f->part_path, strerror(errno));
    finish_hash(&s);
    if (s.fd >= 0) close(s.fd);
    request_free(&r);
    return st;
}
