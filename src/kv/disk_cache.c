/*
 * disk_cache.c - the disk tier of the prefix cache (see disk_cache.h).
 *
 * The index: one entry per block file, in a hash table by key and in a
 * list by last use (oldest first), under `mu`. An entry is made when a
 * write is queued (pending: not readable yet) so the same block is never
 * queued twice; the writer makes the file and fills in its size, or drops
 * the entry if the write fails.
 *
 * File layout (little-endian, as the machine):
 *   0   8  magic "KTKVBLK2"
 *   8   8  fingerprint
 *   16 16  key (lo, hi)      32 16  parent key (lo, hi)
 *   48  4  block_tokens      52  4  n_layer     56  4  row_bytes   60 4  kv type
 *   64  4  window layers whose rows the file holds (0, or all of them)
 *   68  4  0
 *   72     ids (block_tokens x int32), then for each layer its K rows and
 *          its V rows (block_tokens x row_bytes each; a sliding-window
 *          layer's only where the block still had them when it was
 *          written), then the XXH3-64 checksum of everything before it.
 *
 * A file without window rows still serves a hit that ends a window's
 * length past it (kv_pool_window_covers decides).
 *
 * A hybrid model's state snapshot (kv_disk_put_state) is a file of its
 * own, <state key>.kvs, the state key being the block's with a fixed
 * tweak (so both live in one index, one use list, one size limit):
 *   0   8  magic "KTKVSTA1"   8  8  fingerprint   16 16  key (lo, hi)
 *   32  8  state bytes        40     the state, then the XXH3-64 checksum
 * At most STATE_QUEUE_MAX of them wait for the writer at a time (each
 * is tens of MB for a real model).
 */
#include "kv/disk_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/error.h"

#define HEADER_BYTES 72
#define MAX_BLOCK_TOKENS 64
#define QUEUE_MAX 512 /* blocks waiting for the writer; past that, writes are dropped */
#define STATE_HEADER_BYTES 40
#define STATE_QUEUE_MAX 4
static const char MAGIC[8] = {'K', 'T', 'K', 'V', 'B', 'L', 'K', '2'};
static const char STATE_MAGIC[8] = {'K', 'T', 'K', 'V', 'S', 'T', 'A', '1'};

typedef struct entry {
    kv_disk_key key;
    uint64_t bytes;
    bool pending;
    bool state; /* a .kvs state file, not a .kvb block */
    struct entry *older, *newer; /* the use list */
    struct entry *next_in_slot;  /* the hash chain */
} entry;

typedef struct job {
    kv_disk_key key, parent;
    int32_t ids[MAX_BLOCK_TOKENS];
    uint8_t *kv;  /* a state job: the state */
    bool windows; /* kv holds the window layers' rows too */
    bool state;
} job;

struct kv_disk {
    char *dir; /* dir/<fingerprint> */
    uint64_t fingerprint, max_bytes;
    int block_tokens, n_layer, kv_type, n_win_layers;
    uint8_t *windowed; /* per layer (NULL: no window layers) */
    size_t row_bytes, kv_bytes, file_bytes; /* a file with every layer's rows */
    size_t file_bytes_nowin;                /* one without the window layers' */
    size_t state_bytes, state_file_bytes;   /* a hybrid model's snapshots (0: none) */
    int q_states;                           /* state jobs queued */

    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_idle;
    entry **slots;
    size_t n_slots;
    entry *oldest, *newest;
    job queue[QUEUE_MAX];
    int q_head, q_len;
    bool writing, stop;
    kv_disk_stats st;
    pthread_t writer;
    bool writer_started;
    uint64_t tmp_seq;
};

/* ---- keys ---- */

kv_disk_key kv_disk_root(void) {
    return (kv_disk_key){0x6b6574746c652d6bull, 0x762d726f6f742d31ull};
}

kv_disk_key kv_disk_chain(kv_disk_key parent, const int32_t *ids, int block_tokens) {
    uint8_t buf[16 + 4 * MAX_BLOCK_TOKENS];
    int n = block_tokens < MAX_BLOCK_TOKENS ? block_tokens : MAX_BLOCK_TOKENS;
    memcpy(buf, &parent.lo, 8);
    memcpy(buf + 8, &parent.hi, 8);
    memcpy(buf + 16, ids, 4 * (size_t)n);
    XXH128_hash_t h = XXH3_128bits(buf, 16 + 4 * (size_t)n);
    return (kv_disk_key){h.low64, h.high64};
}

kv_disk_key kv_disk_state_key(kv_disk_key block) {
    return (kv_disk_key){block.lo ^ 0x7374617465736e70ull, block.hi ^ 0x6b6574746c652d73ull};
}

static bool key_eq(kv_disk_key a, kv_disk_key b) {
    return a.lo == b.lo && a.hi == b.hi;
}

/* ---- the index (mu held) ---- */

static entry **slot_of(kv_disk *d, kv_disk_key key) {
    return &d->slots[key.lo % d->n_slots];
}

static entry *find(kv_disk *d, kv_disk_key key) {
    for (entry *e = *slot_of(d, key); e; e = e->next_in_slot)
        if (key_eq(e->key, key)) return e;
    return NULL;
}

static void use_unlink(kv_disk *d, entry *e) {
    if (e->older) e->older->newer = e->newer;
    else d->oldest = e->newer;
    if (e->newer) e->newer->older = e->older;
    else d->newest = e->older;
    e->older = e->newer = NULL;
}

static void use_push_newest(kv_disk *d, entry *e) {
    e->older = d->newest, e->newer = NULL;
    if (d->newest) d->newest->newer = e;
    else d->oldest = e;
    d->newest = e;
}

static entry *index_add(kv_disk *d, kv_disk_key key, uint64_t bytes, bool pending, bool state) {
    entry *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->key = key, e->bytes = bytes, e->pending = pending, e->state = state;
    entry **s = slot_of(d, key);
    e->next_in_slot = *s;
    *s = e;
    use_push_newest(d, e);
    if (!pending) d->st.files++, d->st.bytes += bytes;
    return e;
}

static void index_remove(kv_disk *d, entry *e) {
    for (entry **p = slot_of(d, e->key); *p; p = &(*p)->next_in_slot)
        if (*p == e) {
            *p = e->next_in_slot;
            break;
        }
    use_unlink(d, e);
    if (!e->pending) d->st.files--, d->st.bytes -= e->bytes;
    free(e);
}

/* ---- files ---- */

static void file_path(const kv_disk *d, kv_disk_key key, bool state, char *out, size_t cap) {
    snprintf(out, cap, "%s/%016" PRIx64 "%016" PRIx64 "%s", d->dir, key.hi, key.lo, state ? ".kvs" : ".kvb");
}

/* Name -> key and kind, for files found at start; false for other names. */
static bool parse_name(const char *name, kv_disk_key *key, bool *state) {
    if (strlen(name) != 36 || (strcmp(name + 32, ".kvb") != 0 && strcmp(name + 32, ".kvs") != 0)) return false;
    *state = strcmp(name + 32, ".kvs") == 0;
    char hi[17] = {0}, lo[17] = {0};
    memcpy(hi, name, 16), memcpy(lo, name + 16, 16);
    char *end1, *end2;
    key->hi = strtoull(hi, &end1, 16), key->lo = strtoull(lo, &end2, 16);
    return *end1 == 0 && *end2 == 0;
}

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static void write_header(const kv_disk *d, uint8_t *h, kv_disk_key key, kv_disk_key parent, bool windows) {
    memcpy(h, MAGIC, 8);
    put_u64(h + 8, d->fingerprint);
    put_u64(h + 16, key.lo), put_u64(h + 24, key.hi);
    put_u64(h + 32, parent.lo), put_u64(h + 40, parent.hi);
    put_u32(h + 48, (uint32_t)d->block_tokens), put_u32(h + 52, (uint32_t)d->n_layer);
    put_u32(h + 56, (uint32_t)d->row_bytes), put_u32(h + 60, (uint32_t)d->kv_type);
    put_u32(h + 64, windows ? (uint32_t)d->n_win_layers : 0), put_u32(h + 68, 0);
}

static size_t file_size(const kv_disk *d, bool windows) {
    return windows ? d->file_bytes : d->file_bytes_nowin;
}

static size_t job_file_size(const kv_disk *d, const job *j) {
    return j->state ? d->state_file_bytes : file_size(d, j->windows);
}

/* Whether the file's layer l rows are there. */
static bool layer_in_file(const kv_disk *d, int l, bool windows) {
    return windows || !d->windowed || !d->windowed[l];
}

static bool write_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        b += w, n -= (size_t)w;
    }
    return true;
}

/* Writes one job's file: a temporary, fsynced, then renamed into place. */
static bool write_block_file(kv_disk *d, const job *j, uint64_t seq) {
    const size_t n = job_file_size(d, j);
    uint8_t *buf = malloc(n);
    if (!buf) return false;
    if (j->state) {
        memcpy(buf, STATE_MAGIC, 8);
        put_u64(buf + 8, d->fingerprint);
        put_u64(buf + 16, j->key.lo), put_u64(buf + 24, j->key.hi);
        put_u64(buf + 32, d->state_bytes);
        memcpy(buf + STATE_HEADER_BYTES, j->kv, d->state_bytes);
    } else {
        write_header(d, buf, j->key, j->parent, j->windows);
        memcpy(buf + HEADER_BYTES, j->ids, 4 * (size_t)d->block_tokens);
        memcpy(buf + HEADER_BYTES + 4 * (size_t)d->block_tokens, j->kv,
               n - HEADER_BYTES - 4 * (size_t)d->block_tokens - 8);
    }
    put_u64(buf + n - 8, XXH3_64bits(buf, n - 8));
    char tmp[4200], path[4200];
    snprintf(tmp, sizeof tmp, "%s/.tmp-%d-%" PRIu64, d->dir, (int)getpid(), seq);
    file_path(d, j->key, j->state, path, sizeof path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    bool ok = fd >= 0 && write_all(fd, buf, n) && fsync(fd) == 0;
    if (fd >= 0) ok = close(fd) == 0 && ok;
    ok = ok && rename(tmp, path) == 0;
    if (!ok) unlink(tmp);
    free(buf);
    return ok;
}

/* Removes the oldest complete files until the limit holds (mu held). */
static void enforce_limit(kv_disk *d) {
    for (entry *e = d->oldest; e && d->st.bytes > d->max_bytes;) {
        entry *next = e->newer;
        if (!e->pending) {
            char path[4200];
            file_path(d, e->key, e->state, path, sizeof path);
            unlink(path);
            index_remove(d, e);
            d->st.removed++;
        }
        e = next;
    }
}

static void *writer_main(void *arg) {
    kv_disk *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (d->q_len == 0 && !d->stop) {
            pthread_cond_broadcast(&d->cv_idle);
            pthread_cond_wait(&d->cv_work, &d->mu);
        }
        if (d->q_len == 0) break;
        job j = d->queue[d->q_head];
        d->q_head = (d->q_head + 1) % QUEUE_MAX;
        d->q_len--;
        d->q_states -= j.state;
        d->writing = true;
        uint64_t seq = d->tmp_seq++;
        pthread_mutex_unlock(&d->mu);
        bool ok = write_block_file(d, &j, seq);
        const size_t n_bytes = job_file_size(d, &j);
        free(j.kv);
        pthread_mutex_lock(&d->mu);
        d->writing = false;
        entry *e = find(d, j.key);
        if (e && ok) {
            e->pending = false;
            e->bytes = n_bytes;
            d->st.files++, d->st.bytes += e->bytes, d->st.writes++;
            enforce_limit(d);
        } else if (e) {
            index_remove(d, e);
            d->st.write_errors++;
        }
    }
    pthread_cond_broadcast(&d->cv_idle);
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* ---- opening ---- */

static bool make_dir(const char *path, kt_error *err) {
    if (mkdir(path, 0755) == 0 || errno == EEXIST) {
        struct stat s;
        if (stat(path, &s) == 0 && S_ISDIR(s.st_mode)) return true;
        errno = ENOTDIR;
    }
    kt_error_set(err, KT_ERR_IO, "--cache-dir: cannot make the directory %s: %s", path, strerror(errno));
    return false;
}

static bool check_writable(const char *dir, kt_error *err) {
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.tmp-probe-%d", dir, (int)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        kt_error_set(err, KT_ERR_IO, "--cache-dir: cannot write in %s: %s", dir, strerror(errno));
        return false;
    }
    close(fd);
    unlink(probe);
    return true;
}

typedef struct found {
    kv_disk_key key;
    uint64_t bytes;
    int64_t mtime_ns;
    bool state;
} found;

static int by_mtime(const void *a, const void *b) {
    int64_t x = ((const found *)a)->mtime_ns, y = ((const found *)b)->mtime_ns;
    return (x > y) - (x < y);
}

/* A temporary ".tmp-PID-SEQ" is a killed writer's when no process PID
 * lives here, or when it is older than any write takes. Replicas sharing
 * the directory must not remove each other's writes in progress. */
static bool temp_is_orphan(const char *name, const char *path) {
    long pid = strtol(name + 5, NULL, 10);
    if (pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno == ESRCH)) return true;
    struct stat s;
    return stat(path, &s) == 0 && time(NULL) - s.st_mtime > 600;
}

/* Indexes the block files of d->dir, oldest first; removes temporaries
 * and files of the wrong size (never loadable). */
static bool scan(kv_disk *d, kt_error *err) {
    DIR *dir = opendir(d->dir);
    if (!dir) return kt_error_set(err, KT_ERR_IO, "--cache-dir: cannot read %s: %s", d->dir, strerror(errno)), false;
    found *list = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", d->dir, de->d_name);
        if (!strncmp(de->d_name, ".tmp-", 5)) {
            if (temp_is_orphan(de->d_name, path)) unlink(path); /* a write a killed run left */
            continue;
        }
        kv_disk_key key;
        bool state;
        struct stat s;
        if (!parse_name(de->d_name, &key, &state) || stat(path, &s) != 0 || !S_ISREG(s.st_mode)) continue;
        if (state ? (!d->state_bytes || (uint64_t)s.st_size != d->state_file_bytes)
                  : ((uint64_t)s.st_size != d->file_bytes && (uint64_t)s.st_size != d->file_bytes_nowin)) {
            unlink(path);
            d->st.rejected++;
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            found *l = realloc(list, cap * sizeof *l);
            if (!l) break;
            list = l;
        }
        list[n++] = (found){key, (uint64_t)s.st_size, (int64_t)s.st_mtim.tv_sec * 1000000000 + s.st_mtim.tv_nsec, state};
    }
    closedir(dir);
    if (n > 1) qsort(list, n, sizeof *list, by_mtime);
    for (size_t i = 0; i < n; i++) index_add(d, list[i].key, list[i].bytes, false, list[i].state);
    free(list);
    enforce_limit(d);
    return true;
}

kv_disk *kv_disk_open(const char *dir, size_t max_bytes, uint64_t fingerprint, const kv_pool_params *layout,
                      kt_error *err) {
    if (layout->block_tokens > MAX_BLOCK_TOKENS)
        return kt_error_set(err, KT_ERR_ARG, "disk cache: blocks of %d positions (at most %d)", layout->block_tokens,
                            MAX_BLOCK_TOKENS), NULL;
    kv_disk *d = calloc(1, sizeof *d);
    if (!d) return kt_error_set(err, KT_ERR_NOMEM, "disk cache: out of memory"), NULL;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv_work, NULL);
    pthread_cond_init(&d->cv_idle, NULL);
    d->fingerprint = fingerprint, d->max_bytes = max_bytes;
    d->block_tokens = layout->block_tokens, d->n_layer = layout->n_layer, d->kv_type = (int)layout->type;
    d->row_bytes = kv_row_bytes(layout->type, layout->kv_dim);
    const size_t layer_bytes = 2 * (size_t)layout->block_tokens * d->row_bytes;
    d->kv_bytes = (size_t)layout->n_layer * layer_bytes;
    d->file_bytes = HEADER_BYTES + 4 * (size_t)layout->block_tokens + d->kv_bytes + 8;
    d->n_win_layers = kv_params_n_windowed(layout);
    d->file_bytes_nowin = d->file_bytes - (size_t)d->n_win_layers * layer_bytes;
    d->state_bytes = layout->state_bytes;
    d->state_file_bytes = layout->state_bytes ? STATE_HEADER_BYTES + layout->state_bytes + 8 : 0;
    if (d->n_win_layers > 0 && (d->windowed = malloc((size_t)layout->n_layer)))
        memcpy(d->windowed, layout->windowed, (size_t)layout->n_layer);
    d->n_slots = 4096;
    d->slots = calloc(d->n_slots, sizeof *d->slots);
    size_t len = strlen(dir) + 24;
    d->dir = malloc(len);
    if (!d->slots || !d->dir || (d->n_win_layers > 0 && !d->windowed)) {
        kv_disk_close(d);
        return kt_error_set(err, KT_ERR_NOMEM, "disk cache: out of memory"), NULL;
    }
    snprintf(d->dir, len, "%s/%016" PRIx64, dir, fingerprint);
    if (!make_dir(dir, err) || !make_dir(d->dir, err) || !check_writable(d->dir, err) || !scan(d, err)) {
        kv_disk_close(d);
        return NULL;
    }
    if (pthread_create(&d->writer, NULL, writer_main, d) != 0) {
        kv_disk_close(d);
        return kt_error_set(err, KT_ERR_INTERNAL, "disk cache: cannot start its writer thread"), NULL;
    }
    d->writer_started = true;
    return d;
}

void kv_disk_close(kv_disk *d) {
    if (!d) return;
    if (d->writer_started) {
        pthread_mutex_lock(&d->mu);
        d->stop = true;
        pthread_cond_signal(&d->cv_work);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->writer, NULL);
    }
    for (entry *e = d->oldest, *next; e; e = next) next = e->newer, free(e);
    for (int i = 0; i < d->q_len; i++) free(d->queue[(d->q_head + i) % QUEUE_MAX].kv);
    free(d->slots);
    free(d->dir);
    free(d->windowed);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv_work);
    pthread_cond_destroy(&d->cv_idle);
    free(d);
}

/* ---- the engine's side ---- */

void kv_disk_put(kv_disk *d, const kv_pool *pool, int32_t id, kv_disk_key key, kv_disk_key parent,
                 const int32_t *ids) {
    pthread_mutex_lock(&d->mu);
    bool skip = find(d, key) != NULL;
    if (!skip && d->q_len == QUEUE_MAX) skip = true, d->st.dropped++;
    pthread_mutex_unlock(&d->mu);
    if (skip) return;
    uint8_t *kv = malloc(d->kv_bytes);
    if (!kv) return;
    const bool windows = d->n_win_layers > 0 && kv_pool_has_window(pool, id);
    const size_t plane = (size_t)d->block_tokens * d->row_bytes;
    uint8_t *at = kv;
    for (int l = 0; l < d->n_layer; l++)
        for (int k = 0; k < 2 && layer_in_file(d, l, windows); k++, at += plane)
            memcpy(at, kv_pool_row(pool, id, l, (kv_kind)k, 0), plane);
    pthread_mutex_lock(&d->mu);
    if (find(d, key) || d->q_len == QUEUE_MAX || !index_add(d, key, 0, true, false)) {
        pthread_mutex_unlock(&d->mu);
        free(kv);
        return;
    }
    job *j = &d->queue[(d->q_head + d->q_len++) % QUEUE_MAX];
    j->key = key, j->parent = parent, j->kv = kv, j->windows = windows, j->state = false;
    memcpy(j->ids, ids, 4 * (size_t)d->block_tokens);
    pthread_cond_signal(&d->cv_work);
    pthread_mutex_unlock(&d->mu);
}

/* A file of key that another process sharing the directory wrote after
 * our scan: indexed now (mu held), so it loads and counts toward the size
 * limit like ours. One stat, on a miss only. */
static bool adopt_foreign_file(kv_disk *d, kv_disk_key key) {
    char path[4200];
    file_path(d, key, false, path, sizeof path);
    struct stat s;
    if (stat(path, &s) != 0 || !S_ISREG(s.st_mode)) return false;
    if ((uint64_t)s.st_size != d->file_bytes && (uint64_t)s.st_size != d->file_bytes_nowin) return false;
    return index_add(d, key, (uint64_t)s.st_size, false, false) != NULL;
}

bool kv_disk_has(kv_disk *d, kv_disk_key key) {
    pthread_mutex_lock(&d->mu);
    entry *e = find(d, key);
    if (!e && adopt_foreign_file(d, key)) {
        enforce_limit(d);
        e = find(d, key); /* the limit may have taken it at once */
    }
    bool has = e && !e->pending;
    pthread_mutex_unlock(&d->mu);
    return has;
}

bool kv_disk_check_block(const uint8_t *h, size_t got, const kv_disk_expect *x, bool *windows) {
    /* every read below is inside h: the header once got covers it, the
     * rest once got is exactly the size this kind of file has */
    *windows = got >= HEADER_BYTES && x->n_win_layers > 0 && get_u32(h + 64) == x->n_win_layers;
    const size_t n = *windows ? x->file_bytes : x->file_bytes_nowin;
    return got == n && n >= HEADER_BYTES + 4 * (size_t)x->block_tokens + 8 &&
           !((get_u32(h + 64) != 0 && !*windows) || get_u32(h + 68) != 0 || memcmp(h, MAGIC, 8) != 0 ||
             get_u64(h + 8) != x->fingerprint || get_u64(h + 16) != x->key.lo || get_u64(h + 24) != x->key.hi ||
             get_u64(h + 32) != x->parent.lo || get_u64(h + 40) != x->parent.hi ||
             get_u32(h + 48) != x->block_tokens || get_u32(h + 52) != x->n_layer ||
             get_u32(h + 56) != x->row_bytes || get_u32(h + 60) != x->kv_type ||
             memcmp(h + HEADER_BYTES, x->ids, 4 * (size_t)x->block_tokens) != 0 ||
             get_u64(h + n - 8) != XXH3_64bits(h, n - 8));
}

/* What the file of key after parent holding ids must say for d. */
static kv_disk_expect expect_of(const kv_disk *d, kv_disk_key key, kv_disk_key parent, const int32_t *ids) {
    return (kv_disk_expect){.fingerprint = d->fingerprint, .block_tokens = (uint32_t)d->block_tokens,
                            .n_layer = (uint32_t)d->n_layer, .row_bytes = (uint32_t)d->row_bytes,
                            .kv_type = (uint32_t)d->kv_type, .n_win_layers = (uint32_t)d->n_win_layers,
                            .file_bytes = d->file_bytes, .file_bytes_nowin = d->file_bytes_nowin,
                            .key = key, .parent = parent, .ids = ids};
}

/* The whole file of key, checked, and whether it holds the window
 * layers' rows; NULL (bad set when it exists but does not check)
 * otherwise. */
/* Up to cap bytes of the file at path into a new buffer (*got of them);
 * NULL when it cannot be opened (removed meanwhile: a miss) or a read
 * fails (which says nothing of the file: a miss, and the file stays). */
static uint8_t *read_up_to(const char *path, size_t cap, size_t *got) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    uint8_t *buf = malloc(cap);
    ssize_t r = 0;
    *got = 0;
    while (buf && *got < cap && (r = read(fd, buf + *got, cap - *got)) != 0) {
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break;
        *got += (size_t)r;
    }
    close(fd);
    if (r < 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* After a read of key's file: a good one becomes the newest used, a bad
 * one (checked and failed) is removed and counted (mu taken here). */
static void note_read(kv_disk *d, kv_disk_key key, bool state, bool good, bool bad) {
    pthread_mutex_lock(&d->mu);
    entry *e = find(d, key);
    if (good && e) {
        use_unlink(d, e);
        use_push_newest(d, e);
        d->st.reads++;
    } else if (bad && e && !e->pending) {
        char path[4200];
        file_path(d, key, state, path, sizeof path);
        unlink(path);
        index_remove(d, e);
        d->st.rejected++;
    }
    pthread_mutex_unlock(&d->mu);
}

static uint8_t *read_checked(kv_disk *d, kv_disk_key key, kv_disk_key parent, const int32_t *ids, bool *bad,
                             bool *windows) {
    char path[4200];
    file_path(d, key, false, path, sizeof path);
    *bad = *windows = false;
    size_t got;
    uint8_t *buf = read_up_to(path, d->file_bytes + 1, &got); /* one byte more: a longer file is seen */
    if (!buf) return NULL;
    const kv_disk_expect x = expect_of(d, key, parent, ids);
    *bad = !kv_disk_check_block(buf, got, &x, windows);
    if (*bad) {
        free(buf);
        return NULL;
    }
    return buf;
}

bool kv_disk_get(kv_disk *d, kv_pool *pool, int32_t id, kv_disk_key key, kv_disk_key parent, const int32_t *ids) {
    if (!kv_disk_has(d, key)) return false;
    bool bad, windows = false;
    uint8_t *buf = read_checked(d, key, parent, ids, &bad, &windows);
    note_read(d, key, false, buf != NULL, bad);
    if (!buf) return false;
    const uint8_t *at = buf + HEADER_BYTES + 4 * (size_t)d->block_tokens;
    const size_t plane = (size_t)d->block_tokens * d->row_bytes;
    /* the window rows need a slot; without one the block is loaded without them */
    const bool keep_windows = windows && kv_pool_window_alloc(pool, id, NULL) == KT_OK;
    for (int l = 0; l < d->n_layer; l++)
        for (int k = 0; k < 2 && layer_in_file(d, l, windows); k++, at += plane)
            if (layer_in_file(d, l, keep_windows)) memcpy(kv_pool_row(pool, id, l, (kv_kind)k, 0), at, plane);
    free(buf);
    return true;
}

/* ---- state snapshots ---- */

void kv_disk_put_state(kv_disk *d, kv_disk_key block, const void *state) {
    if (!d->state_bytes) return;
    const kv_disk_key key = kv_disk_state_key(block);
    pthread_mutex_lock(&d->mu);
    bool skip = find(d, key) != NULL;
    if (!skip && (d->q_len == QUEUE_MAX || d->q_states == STATE_QUEUE_MAX)) skip = true, d->st.dropped++;
    pthread_mutex_unlock(&d->mu);
    if (skip) return;
    uint8_t *copy = malloc(d->state_bytes);
    if (!copy) return;
    memcpy(copy, state, d->state_bytes);
    pthread_mutex_lock(&d->mu);
    if (find(d, key) || d->q_len == QUEUE_MAX || d->q_states == STATE_QUEUE_MAX || !index_add(d, key, 0, true, true)) {
        pthread_mutex_unlock(&d->mu);
        free(copy);
        return;
    }
    job *j = &d->queue[(d->q_head + d->q_len++) % QUEUE_MAX];
    memset(j, 0, sizeof *j);
    j->key = key, j->kv = copy, j->state = true;
    d->q_states++;
    pthread_cond_signal(&d->cv_work);
    pthread_mutex_unlock(&d->mu);
}

bool kv_disk_has_state(kv_disk *d, kv_disk_key block) {
    if (!d->state_bytes) return false;
    pthread_mutex_lock(&d->mu);
    entry *e = find(d, kv_disk_state_key(block));
    const bool has = e && !e->pending;
    pthread_mutex_unlock(&d->mu);
    return has;
}

bool kv_disk_check_state(const uint8_t *h, size_t got, uint64_t fingerprint, kv_disk_key key, size_t state_bytes) {
    const size_t n = STATE_HEADER_BYTES + state_bytes + 8;
    return got == n && memcmp(h, STATE_MAGIC, 8) == 0 && get_u64(h + 8) == fingerprint && get_u64(h + 16) == key.lo &&
           get_u64(h + 24) == key.hi && get_u64(h + 32) == state_bytes && get_u64(h + n - 8) == XXH3_64bits(h, n - 8);
}

bool kv_disk_get_state(kv_disk *d, kv_disk_key block, void *out) {
    if (!kv_disk_has_state(d, block)) return false;
    const kv_disk_key key = kv_disk_state_key(block);
    char path[4200];
    file_path(d, key, true, path, sizeof path);
    size_t got;
    uint8_t *buf = read_up_to(path, d->state_file_bytes + 1, &got);
    const bool ok = buf && kv_disk_check_state(buf, got, d->fingerprint, key, d->state_bytes);
    note_read(d, key, true, ok, buf && !ok);
    if (ok) memcpy(out, buf + STATE_HEADER_BYTES, d->state_bytes);
    free(buf);
    return ok;
}

void kv_disk_get_stats(kv_disk *d, kv_disk_stats *out) {
    pthread_mutex_lock(&d->mu);
    *out = d->st;
    pthread_mutex_unlock(&d->mu);
}

void kv_disk_flush(kv_disk *d) {
    pthread_mutex_lock(&d->mu);
    while (d->q_len > 0 || d->writing) pthread_cond_wait(&d->cv_idle, &d->mu);
    pthread_mutex_unlock(&d->mu);
}
