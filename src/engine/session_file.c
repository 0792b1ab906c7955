/*
 * session_file.c - a kt_session's KV on disk (kt_session_save / _load),
 * so `kettle chat --session FILE` continues a conversation after a
 * restart without prefilling it again.
 *
 * Layout (little-endian, as the machine):
 *   0  8  magic "KTSESS01"       8  8  model fingerprint (kt_model_kv_fingerprint)
 *   16 4  n_layer                20 4  row_bytes (one position's K or V row)
 *   24 4  n tokens               28 4  note bytes
 *   32    token ids (n x int32), the note, then per layer the K rows and
 *         the V rows of positions 0..n-1, then the XXH3-64 checksum of
 *         everything before it.
 * A file is restored only when its size, magic, fingerprint, layout and
 * checksum all match; nothing is written into the session before that.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/error.h"
#include "engine/model_internal.h"

#define HEADER 32
static const char MAGIC[8] = {'K', 'T', 'S', 'E', 'S', 'S', '0', '1'};

static uint64_t session_fingerprint(const kt_session *s) {
    const kv_pool_params *p = kv_pool_get_params(s->kv);
    return kt_model_kv_fingerprint(s->model, (int)p->type, 0, s->n_ctx); /* one block: no block size */
}

static size_t file_bytes(size_t row_bytes, int n_layer, int n, size_t note) {
    return HEADER + 4 * (size_t)n + note + 2 * (size_t)n_layer * (size_t)n * row_bytes + 8;
}

kt_status kt_session_save(const kt_session *s, const char *path, const int32_t *tokens, int n, const char *note,
                          kt_error *err) {
    if (n < 0 || n > s->seq->len)
        return kt_error_set(err, KT_ERR_ARG, "session save: %d positions, the session holds %d", n,
                            s->seq->len);
    const kv_pool_params *p = kv_pool_get_params(s->kv);
    const size_t row = kv_pool_row_bytes(s->kv), note_len = note ? strlen(note) : 0;
    const size_t total = file_bytes(row, p->n_layer, n, note_len);
    uint8_t *buf = malloc(total);
    if (!buf) return kt_error_set(err, KT_ERR_NOMEM, "session save: out of memory for %zu bytes", total);
    const uint64_t fp = session_fingerprint(s);
    const uint32_t head[4] = {(uint32_t)p->n_layer, (uint32_t)row, (uint32_t)n, (uint32_t)note_len};
    memcpy(buf, MAGIC, 8), memcpy(buf + 8, &fp, 8), memcpy(buf + 16, head, sizeof head);
    uint8_t *at = buf + HEADER;
    memcpy(at, tokens, 4 * (size_t)n), at += 4 * (size_t)n;
    memcpy(at, note ? note : "", note_len), at += note_len;
    for (int l = 0; l < p->n_layer; l++)
        for (int k = 0; k < 2; k++, at += (size_t)n * row)
            if (n > 0) memcpy(at, kv_seq_row(s->seq, l, (kv_kind)k, 0), (size_t)n * row); /* one block: rows in a row */
    const uint64_t sum = XXH3_64bits(buf, total - 8);
    memcpy(buf + total - 8, &sum, 8);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    bool ok = f && fwrite(buf, 1, total, f) == total;
    ok = f && fflush(f) == 0 && fsync(fileno(f)) == 0 && ok;
    if (f) ok = fclose(f) == 0 && ok;
    int saved_errno = errno;
    ok = ok && rename(tmp, path) == 0;
    if (!ok) saved_errno = errno, unlink(tmp);
    free(buf);
    return ok ? KT_OK : kt_error_set(err, KT_ERR_IO, "cannot write the session to %s: %s", path, strerror(saved_errno));
}

/* The whole file; NULL with err. */
static uint8_t *read_file(const char *path, size_t *size, kt_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return kt_error_set(err, KT_ERR_IO, "cannot open the session %s: %s", path, strerror(errno)), NULL;
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0, got;
    do {
        if (n == cap) {
            cap = cap ? 2 * cap : 1 << 16;
            uint8_t *b = realloc(buf, cap);
            if (!b) {
                free(buf), fclose(f);
                return kt_error_set(err, KT_ERR_NOMEM, "out of memory reading %s", path), NULL;
            }
            buf = b;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got > 0);
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return kt_error_set(err, KT_ERR_IO, "cannot read the session %s", path), NULL;
    }
    *size = n;
    return buf;
}

/* Checks buf against s; returns the header's n and note length. */
static kt_status check_file(const kt_session *s, const char *path, const uint8_t *buf, size_t size, int *n,
                            size_t *note_len, kt_error *err) {
    const kv_pool_params *p = kv_pool_get_params(s->kv);
    uint32_t head[4];
    uint64_t fp, sum;
    if (size < HEADER + 8 || memcmp(buf, MAGIC, 8) != 0)
        return kt_error_set(err, KT_ERR_FORMAT, "%s is not a kettle session file (or is truncated)", path);
    memcpy(&fp, buf + 8, 8), memcpy(head, buf + 16, sizeof head);
    if (fp != session_fingerprint(s) || head[0] != (uint32_t)p->n_layer || head[1] != kv_pool_row_bytes(s->kv))
        return kt_error_set(err, KT_ERR_ARG,
                            "%s was saved with another model or KV type (fingerprint %016llx, this one %016llx)",
                            path, (unsigned long long)fp, (unsigned long long)session_fingerprint(s));
    if (head[2] > (uint32_t)s->n_ctx)
        return kt_error_set(err, KT_ERR_ARG, "%s holds %u positions, more than this context's %d (raise -c)", path,
                            head[2], s->n_ctx);
    if (size != file_bytes(head[1], (int)head[0], (int)head[2], head[3]))
        return kt_error_set(err, KT_ERR_FORMAT, "%s is truncated or has extra bytes", path);
    memcpy(&sum, buf + size - 8, 8);
    if (sum != XXH3_64bits(buf, size - 8))
        return kt_error_set(err, KT_ERR_FORMAT, "%s is corrupt (its checksum does not match)", path);
    *n = (int)head[2], *note_len = head[3];
    return KT_OK;
}

kt_status kt_session_load(kt_session *s, const char *path, int32_t **tokens, int *n_out, char **note,
                          kt_error *err) {
    *tokens = NULL, *note = NULL, *n_out = 0;
    kt_session_truncate(s, 0);
    size_t size = 0, note_len = 0;
    int n = 0;
    uint8_t *buf = read_file(path, &size, err);
    if (!buf) return err->status;
    kt_status st = check_file(s, path, buf, size, &n, &note_len, err);
    if (st == KT_OK && (!(*tokens = malloc(4 * (size_t)n + 4)) || !(*note = malloc(note_len + 1))))
        st = kt_error_set(err, KT_ERR_NOMEM, "out of memory restoring %s", path);
    if (st == KT_OK) st = kv_seq_append(s->seq, n, err);
    if (st != KT_OK) {
        free(buf), free(*tokens), free(*note);
        *tokens = NULL, *note = NULL;
        return st;
    }
    const size_t row = kv_pool_row_bytes(s->kv);
    const uint8_t *at = buf + HEADER;
    memcpy(*tokens, at, 4 * (size_t)n), at += 4 * (size_t)n;
    memcpy(*note, at, note_len), (*note)[note_len] = 0, at += note_len;
    for (int l = 0; l < kv_pool_get_params(s->kv)->n_layer; l++)
        for (int k = 0; k < 2; k++, at += (size_t)n * row)
            if (n > 0) memcpy(kv_seq_row(s->seq, l, (kv_kind)k, 0), at, (size_t)n * row);
    *n_out = n;
    free(buf);
    return KT_OK;
}
