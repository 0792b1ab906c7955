/*
 * session_file.c - a kt_session's KV on disk (kt_session_save / _load),
 * so `kettle chat --session FILE` continues a conversation after a
 * restart without prefilling it again.
 *
 * Layout (little-endian, as the machine):
 *   0  8  magic "KTSESS03"       8  8  model fingerprint (kt_model_kv_fingerprint)
 *   16 4  n_layer                20 4  row_bytes (one position's K or V row)
 *   24 4  n tokens               28 4  note bytes
 *   32 4  window_from: the first position a sliding-window layer's rows
 *         are saved from (0 without such layers)
 *   36 4  1 when a hybrid model's recurrent state follows the rows, else 0
 *   40 4  n_images: the images among the n positions (kt_session_eval_image)
 *   44    token ids (n x int32: what the caller gave, its stand-ins for
 *         image rows included), the note, each image's (at, n_tokens,
 *         grid_x, grid_y) as int32s (their positions' layout, which the
 *         rows' rotary positions were made with), then per layer the K rows and
 *         the V rows of positions 0..n-1 (a window layer's from
 *         window_from), then the recurrent state after position n - 1
 *         (a hybrid model: its slot's bytes), then the XXH3-64 checksum
 *         of everything before it.
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
#include "kv/state_pool.h"

#define HEADER 44
#define IMAGE_BYTES 16 /* four int32 an image */
static const char MAGIC[8] = {'K', 'T', 'S', 'E', 'S', 'S', '0', '3'};

static uint64_t session_fingerprint(const kt_session *s) {
    const kv_pool_params *p = kv_pool_get_params(s->kv);
    return kt_model_kv_fingerprint(s->model, (int)p->type, 0, s->n_ctx); /* one block: no block size */
}

/* Positions of layer l that the file holds rows of: [first_row, n). */
static int first_row(const kt_session *s, int l, int window_from) {
    return kv_pool_layer_windowed(s->kv, l) ? window_from : 0;
}

/* A hybrid model's recurrent state (0 bytes otherwise). */
static size_t state_bytes(const kt_session *s) {
    const kv_state_pool *sp = kv_pool_state(s->kv);
    return sp ? kv_state_slot_bytes(sp) : 0;
}

static size_t file_bytes(const kt_session *s, size_t row_bytes, int n, int window_from, size_t note, int n_images) {
    size_t rows = 0;
    for (int l = 0; l < kv_pool_get_params(s->kv)->n_layer; l++) rows += 2 * (size_t)(n - first_row(s, l, window_from));
    return HEADER + 4 * (size_t)n + note + IMAGE_BYTES * (size_t)n_images + rows * row_bytes + state_bytes(s) + 8;
}

/* The images wholly inside the first n positions; -1 if one is cut. */
static int images_within(const kt_session *s, int n) {
    int k = 0;
    while (k < s->images.n && s->images.v[k].at + s->images.v[k].n_tokens <= n) k++;
    return k < s->images.n && s->images.v[k].at < n ? -1 : k;
}

/* Positions [from, to) of layer l's `kind` rows into the file at `at`;
 * returns the bytes written. */
static size_t save_rows(const kt_session *s, int l, kv_kind kind, int from, int to, uint8_t *at) {
    const size_t row = kv_pool_row_bytes(s->kv);
    for (int p = from; p < to; p++) memcpy(at + (size_t)(p - from) * row, kv_seq_row(s->seq, l, kind, p), row);
    return (size_t)(to > from ? to - from : 0) * row;
}

/* Positions [from, to) of layer l's `kind` rows from the file at `at`. */
static void load_rows(kt_session *s, int l, kv_kind kind, int from, int to, const uint8_t *at) {
    const size_t row = kv_pool_row_bytes(s->kv);
    for (int p = from; p < to; p++) memcpy(kv_seq_row(s->seq, l, kind, p), at + (size_t)(p - from) * row, row);
}

kt_status kt_session_save(const kt_session *s, const char *path, const int32_t *tokens, int n, const char *note,
                          kt_error *err) {
    if (n < 0 || n > s->seq->len)
        return kt_error_set(err, KT_ERR_ARG, "session save: %d positions, the session holds %d", n,
                            s->seq->len);
    const int n_images = images_within(s, n);
    if (n_images < 0)
        return kt_error_set(err, KT_ERR_ARG, "session save: position %d falls inside an image: save before or after it", n);
    if (kv_pool_has_state(s->kv) && n != s->seq->len)
        return kt_error_set(err, KT_ERR_ARG, "session save: %s is a hybrid model, whose recurrent state is the one after "
                            "all %d positions: save them all, not %d", s->model->llm->cfg.arch, s->seq->len, n);
    const kv_pool_params *p = kv_pool_get_params(s->kv);
    const size_t row = kv_pool_row_bytes(s->kv), note_len = note ? strlen(note) : 0;
    /* the window layers hold rows from their first held block on */
    int window_from = kv_pool_n_window_layers(s->kv) > 0 ? s->seq->win_lo * s->seq->block_tokens : 0;
    if (window_from > n) window_from = n;
    if (n < s->seq->len && window_from > 0 && kv_window_first_block(s->kv, n) < s->seq->win_lo)
        return kt_error_set(err, KT_ERR_ARG, "session save: the sliding-window layers no longer hold what position "
                            "%d attends", n);
    const size_t total = file_bytes(s, row, n, window_from, note_len, n_images);
    uint8_t *buf = malloc(total);
    if (!buf) return kt_error_set(err, KT_ERR_NOMEM, "session save: out of memory for %zu bytes", total);
    const uint64_t fp = session_fingerprint(s);
    const uint32_t head[7] = {(uint32_t)p->n_layer, (uint32_t)row, (uint32_t)n, (uint32_t)note_len,
                              (uint32_t)window_from, kv_pool_has_state(s->kv) ? 1u : 0u, (uint32_t)n_images};
    memcpy(buf, MAGIC, 8), memcpy(buf + 8, &fp, 8), memcpy(buf + 16, head, sizeof head);
    uint8_t *at = buf + HEADER;
    memcpy(at, tokens, 4 * (size_t)n), at += 4 * (size_t)n;
    memcpy(at, note ? note : "", note_len), at += note_len;
    for (int k = 0; k < n_images; k++, at += IMAGE_BYTES) {
        const req_image *im = &s->images.v[k];
        const int32_t v[4] = {im->at, im->n_tokens, im->grid_x, im->grid_y};
        memcpy(at, v, sizeof v);
    }
    for (int l = 0; l < p->n_layer; l++)
        for (int k = 0; k < 2; k++) at += save_rows(s, l, (kv_kind)k, first_row(s, l, window_from), n, at);
    if (s->seq->state) memcpy(at, s->seq->state, state_bytes(s));
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

/* Checks buf against s; returns the header's n, note length and
 * window_from. */
static kt_status check_file(const kt_session *s, const char *path, const uint8_t *buf, size_t size, int *n,
                            size_t *note_len, int *window_from, int *n_images, kt_error *err) {
    const kv_pool_params *p = kv_pool_get_params(s->kv);
    uint32_t head[7];
    uint64_t fp, sum;
    if (size >= 8 && !memcmp(buf, MAGIC, 6) && memcmp(buf, MAGIC, 8))
        return kt_error_set(err, KT_ERR_FORMAT, "%s is a session file of another kettle version (%.8s; this one reads "
                            "%.8s): start the conversation again", path, (const char *)buf, MAGIC);
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
    if (head[5] != (kv_pool_has_state(s->kv) ? 1u : 0u) || head[4] > head[2] || (head[4] > 0 && kv_pool_n_window_layers(s->kv) == 0))
        return kt_error_set(err, KT_ERR_FORMAT, "%s has a bad header", path);
    if (head[2] > 0 && kv_window_first_block(s->kv, (int)head[2]) * kv_pool_get_params(s->kv)->block_tokens <
                           (int)head[4])
        return kt_error_set(err, KT_ERR_ARG, "%s holds the sliding-window layers' rows from position %u only, and "
                            "this session needs them from %d: use the context (-c) it was saved with", path, head[4],
                            kv_window_first_block(s->kv, (int)head[2]) * kv_pool_get_params(s->kv)->block_tokens);
    if (head[6] > head[2] || size != file_bytes(s, head[1], (int)head[2], (int)head[4], head[3], (int)head[6]))
        return kt_error_set(err, KT_ERR_FORMAT, "%s is truncated or has extra bytes", path);
    memcpy(&sum, buf + size - 8, 8);
    if (sum != XXH3_64bits(buf, size - 8))
        return kt_error_set(err, KT_ERR_FORMAT, "%s is corrupt (its checksum does not match)", path);
    *n = (int)head[2], *note_len = head[3], *window_from = (int)head[4], *n_images = (int)head[6];
    return KT_OK;
}

/* The file's images (at `at`) into s, checked as kt_session_eval_image
 * checks them: in order, apart, inside the n positions, each grid its
 * token count. A checksum that matches makes a bad one unlikely, not
 * impossible (a file written by hand). */
static kt_status restore_images(kt_session *s, const char *path, const uint8_t *at, int n_images, int n, kt_error *err) {
    req_image *v = n_images ? calloc((size_t)n_images, sizeof *v) : NULL;
    if (n_images && !v) return kt_error_set(err, KT_ERR_NOMEM, "out of memory restoring %s", path);
    int end = 0;
    for (int k = 0; k < n_images; k++, at += IMAGE_BYTES) {
        int32_t x[4];
        memcpy(x, at, sizeof x);
        if (x[0] < end || x[2] < 1 || x[3] < 1 || x[2] > 4096 || x[3] > 4096 || x[1] != x[2] * x[3] || x[1] > n - x[0]) {
            free(v);
            return kt_error_set(err, KT_ERR_FORMAT, "%s: image %d's layout is bad", path, k);
        }
        v[k] = (req_image){.at = x[0], .n_tokens = x[1], .grid_x = x[2], .grid_y = x[3], .n_pos = x[2] > x[3] ? x[2] : x[3]};
        end = x[0] + x[1];
    }
    free(s->images.v);
    s->images.v = v, s->images.n = n_images;
    return KT_OK;
}

/* Appends the file's n positions a block at a time, each block's rows
 * copied in as it is appended (a window layer's from window_from: the
 * blocks before it give their window slots back as the sequence grows,
 * and those left before window_from are given back at the end). */
static kt_status restore_rows(kt_session *s, const uint8_t *rows, int n, int window_from, kt_error *err) {
    const int n_layer = kv_pool_get_params(s->kv)->n_layer, bt = s->seq->block_tokens;
    const size_t row = kv_pool_row_bytes(s->kv);
    for (int p0 = 0; p0 < n; p0 += bt) {
        const int p1 = p0 + bt < n ? p0 + bt : n;
        if (kv_seq_append(s->seq, p1 - p0, err) != KT_OK) return err->status;
        const uint8_t *at = rows;
        for (int l = 0; l < n_layer; l++)
            for (int k = 0; k < 2; k++) {
                const int from = first_row(s, l, window_from), lo = p0 > from ? p0 : from;
                if (lo < p1) load_rows(s, l, (kv_kind)k, lo, p1, at + (size_t)(lo - from) * row);
                at += (size_t)(n - from) * row;
            }
    }
    kv_seq_window_trim(s->seq, window_from / bt);
    return KT_OK;
}

kt_status kt_session_load(kt_session *s, const char *path, int32_t **tokens, int *n_out, char **note,
                          kt_error *err) {
    *tokens = NULL, *note = NULL, *n_out = 0;
    kt_session_truncate(s, 0);
    size_t size = 0, note_len = 0;
    int n = 0, window_from = 0, n_images = 0;
    uint8_t *buf = read_file(path, &size, err);
    if (!buf) return err->status;
    kt_status st = check_file(s, path, buf, size, &n, &note_len, &window_from, &n_images, err);
    if (st == KT_OK && (!(*tokens = malloc(4 * (size_t)n + 4)) || !(*note = malloc(note_len + 1))))
        st = kt_error_set(err, KT_ERR_NOMEM, "out of memory restoring %s", path);
    const uint8_t *images = buf + HEADER + 4 * (size_t)n + note_len;
    if (st == KT_OK) st = restore_images(s, path, images, n_images, n, err);
    if (st == KT_OK) st = restore_rows(s, images + IMAGE_BYTES * (size_t)n_images, n, window_from, err);
    if (st == KT_OK && s->seq->state) /* a hybrid model: the state after the n positions, last before the checksum */
        memcpy(s->seq->state, buf + size - 8 - state_bytes(s), state_bytes(s));
    if (st != KT_OK) {
        kt_session_truncate(s, 0);
        free(buf), free(*tokens), free(*note);
        *tokens = NULL, *note = NULL;
        return st;
    }
    const uint8_t *at = buf + HEADER;
    memcpy(*tokens, at, 4 * (size_t)n), at += 4 * (size_t)n;
    memcpy(*note, at, note_len), (*note)[note_len] = 0;
    *n_out = n;
    free(buf);
    return KT_OK;
}
