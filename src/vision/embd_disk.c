/*
 * embd_disk.c - see embd_disk.h.
 */
#define _POSIX_C_SOURCE 200809L
#include "vision/embd_disk.h"

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/error.h"
#include "gguf/gguf.h"
#include "vision/vision_internal.h"

#define KVE_MAGIC 0x3145564bu /* "KVE1" */
#define KVE_VERSION 1u

typedef struct kve_header {
    uint32_t magic, version;
    uint64_t fingerprint, hash, n_floats, checksum;
} kve_header;

struct kt_embd_disk {
    char dir[4096];
    uint64_t fingerprint;
    size_t max_bytes;
    kt_embd_disk_stats st;
};

uint64_t kt_vision_fingerprint(const kt_vision *v) {
    XXH3_state_t *st = XXH3_createState();
    if (!st) return 0;
    XXH3_64bits_reset(st);
    gguf_hash_tensors(v->file, st);
    if (kt_vision_uses_amx(v)) XXH3_64bits_update(st, "amx-bf16x3", 10); /* other towers keep their folders */
    uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
}

bool kt_embd_disk_check(const uint8_t *bytes, size_t n, uint64_t fingerprint, uint64_t hash, size_t n_floats) {
    kve_header h;
    if (n < sizeof h) return false;
    memcpy(&h, bytes, sizeof h);
    return h.magic == KVE_MAGIC && h.version == KVE_VERSION && h.fingerprint == fingerprint && h.hash == hash &&
           h.n_floats == n_floats && n_floats <= (SIZE_MAX - sizeof h) / sizeof(float) &&
           n == sizeof h + n_floats * sizeof(float) && XXH3_64bits(bytes + sizeof h, n - sizeof h) == h.checksum;
}

static void path_of(const kt_embd_disk *d, uint64_t hash, char *out, size_t cap) {
    snprintf(out, cap, "%s/%016llx.kve", d->dir, (unsigned long long)hash);
}

/* The folder's .kve files: their count and bytes; with `oldest`, the path
 * of the least recently written one. */
static void scan(kt_embd_disk *d, char *oldest, size_t cap) {
    DIR *dir = opendir(d->dir);
    d->st.bytes = 0, d->st.files = 0;
    if (oldest) oldest[0] = 0;
    if (!dir) return;
    time_t t_old = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        const size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".kve")) continue;
        char p[4400];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", d->dir, e->d_name);
        if (stat(p, &sb)) continue;
        d->st.bytes += (size_t)sb.st_size, d->st.files++;
        if (oldest && (!oldest[0] || sb.st_mtime < t_old)) snprintf(oldest, cap, "%s", p), t_old = sb.st_mtime;
    }
    closedir(dir);
}

kt_embd_disk *kt_embd_disk_open(const char *dir, const kt_vision *v, size_t max_bytes, kt_error *err) {
    kt_embd_disk *d = calloc(1, sizeof *d);
    if (!d) return kt_error_set(err, KT_ERR_NOMEM, "out of memory"), NULL;
    d->fingerprint = kt_vision_fingerprint(v);
    d->max_bytes = max_bytes ? max_bytes : (size_t)1 << 30;
    snprintf(d->dir, sizeof d->dir, "%s/images-%016llx", dir, (unsigned long long)d->fingerprint);
    if (mkdir(d->dir, 0700) && errno != EEXIST) {
        kt_error_set(err, KT_ERR_IO, "cannot make %s: %s", d->dir, strerror(errno));
        free(d);
        return NULL;
    }
    scan(d, NULL, 0);
    return d;
}

void kt_embd_disk_close(kt_embd_disk *d) {
    free(d);
}

float *kt_embd_disk_get(kt_embd_disk *d, uint64_t hash, size_t n_floats) {
    char p[4400];
    path_of(d, hash, p, sizeof p);
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    const size_t want = sizeof(kve_header) + n_floats * sizeof(float);
    uint8_t *bytes = n_floats <= (SIZE_MAX - sizeof(kve_header)) / sizeof(float) ? malloc(want + 1) : NULL;
    const size_t got = bytes ? fread(bytes, 1, want + 1, f) : 0; /* one more: a longer file is refused */
    fclose(f);
    if (!bytes || !kt_embd_disk_check(bytes, got, d->fingerprint, hash, n_floats)) {
        free(bytes);
        if (bytes && !unlink(p)) d->st.rejected++;
        return NULL;
    }
    float *out = malloc(n_floats * sizeof(float));
    if (out) memcpy(out, bytes + sizeof(kve_header), n_floats * sizeof(float)), d->st.reads++;
    free(bytes);
    return out;
}

/* Removes the oldest files while over budget. The folder is listed only
 * then: puts keep the byte count (a file replaced under the same name is
 * counted twice until the next listing, which only trims early). */
static void trim(kt_embd_disk *d) {
    if (d->st.bytes <= d->max_bytes) return;
    char oldest[4400];
    for (scan(d, oldest, sizeof oldest); d->st.bytes > d->max_bytes && oldest[0]; scan(d, oldest, sizeof oldest)) {
        if (unlink(oldest)) return;
        d->st.removed++;
    }
}

void kt_embd_disk_put(kt_embd_disk *d, uint64_t hash, const float *embd, size_t n_floats) {
    char p[4400], tmp[4500];
    path_of(d, hash, p, sizeof p);
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    kve_header h = {KVE_MAGIC, KVE_VERSION, d->fingerprint, hash, n_floats,
                    XXH3_64bits(embd, n_floats * sizeof(float))};
    FILE *f = fopen(tmp, "wb");
    bool ok = f && fwrite(&h, sizeof h, 1, f) == 1 && fwrite(embd, sizeof(float), n_floats, f) == n_floats;
    if (f && fclose(f)) ok = false;
    if (!ok || rename(tmp, p)) {
        unlink(tmp);
        return;
    }
    d->st.writes++;
    d->st.bytes += sizeof h + n_floats * sizeof(float), d->st.files++;
    trim(d);
}

kt_embd_disk_stats kt_embd_disk_get_stats(const kt_embd_disk *d) {
    return d->st;
}
