/*
 * gguf_write.c - the streaming GGUF v3 writer; see gguf.h.
 *
 * Converters and the quantizer write models far larger than memory, so
 * only the metadata is held: every key's value is kept already encoded as
 * GGUF bytes (so writing it, and copying one verbatim from another file,
 * is a plain byte copy), and every tensor's description. gguf_writer_begin()
 * computes each tensor's offset (its predecessors' sizes, each padded to the
 * alignment, which is what llama.cpp's reader insists on), writes header,
 * keys, tensor infos and padding; then each tensor's bytes arrive in
 * declaration order and are followed by padding to the alignment.
 *
 * The output goes to "PATH.tmp.PID" and is renamed to PATH only when
 * gguf_writer_finish() has flushed and closed it without error, so PATH
 * never holds a half-written model. Every allocation and every write is
 * checked; a failed write puts the writer in a failed state, removes the
 * temporary file and names PATH in the message. 64-bit sizes throughout.
 */
#include "gguf/gguf.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"

#define IO_BUF_BYTES ((size_t)4 << 20)
#define MAX_TENSOR_NAME 63 /* llama.cpp: GGML_MAX_NAME (64) with the NUL */
#define WHO "gguf writer"

typedef struct wkv {
    char *key;
    gguf_type type;
    uint8_t *val; /* the value as GGUF encodes it, after the type id */
    uint64_t len;
} wkv;

typedef struct wtensor {
    char *name;
    kt_dtype type;
    uint32_t n_dims;
    int64_t dims[GGUF_MAX_DIMS];
    uint64_t n_bytes;
    uint64_t offset; /* set by gguf_writer_begin */
} wtensor;

typedef enum wstate { W_DECLARE, W_WRITE, W_DONE, W_FAILED } wstate;

struct gguf_writer {
    wkv *kvs;
    int64_t n_kv, cap_kv;
    wtensor *tensors;
    int64_t n_tensors, cap_tensors;
    uint32_t alignment;
    wstate state;
    FILE *fp;
    char *path, *tmp_path, *iobuf;
    uint64_t pos;      /* bytes written so far */
    uint64_t end;      /* the size the finished file must have */
    int64_t next;      /* index of the next tensor to write */
    uint64_t part;     /* bytes of that tensor written so far (gguf_writer_write_part) */
    int io_errno;      /* errno of the first failed write */
};

/* ---- memory ------------------------------------------------------------- */

static bool grow(void **items, int64_t *cap, int64_t n, size_t elem) {
    if (n < *cap) return true;
    int64_t ncap = *cap ? *cap * 2 : 16;
    void *p = realloc(*items, (size_t)ncap * elem);
    if (!p) return false;
    *items = p;
    *cap = ncap;
    return true;
}

static kt_status nomem(kt_error *err, const char *what) {
    return kt_error_set(err, KT_ERR_NOMEM, WHO ": out of memory for %s", what);
}

gguf_writer *gguf_writer_new(kt_error *err) {
    gguf_writer *w = calloc(1, sizeof *w);
    if (!w) {
        nomem(err, "a writer");
        return NULL;
    }
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    return w;
}

/* Drops an unfinished output file. */
static void discard_output(gguf_writer *w) {
    if (w->fp) fclose(w->fp);
    w->fp = NULL;
    if (w->tmp_path) unlink(w->tmp_path);
}

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    if (w->state == W_WRITE) discard_output(w);
    for (int64_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].val);
    }
    for (int64_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->kvs);
    free(w->tensors);
    free(w->path);
    free(w->tmp_path);
    free(w->iobuf);
    free(w);
}

/* ---- keys --------------------------------------------------------------- */

static int64_t find_kv(const gguf_writer *w, const char *key) {
    for (int64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kvs[i].key, key) == 0) return i;
    return -1;
}

static kt_status check_key(const gguf_writer *w, const char *key, kt_error *err) {
    if (!key || !*key) return kt_error_set(err, KT_ERR_ARG, WHO ": empty key name");
    if (w->state != W_DECLARE)
        return kt_error_set(err, KT_ERR_ARG, WHO ": key '%s' set after gguf_writer_begin", key);
    return KT_OK;
}

/* general.alignment must be a u32 nonzero power of two (the reader and
 * llama.cpp reject anything else); val is its encoding. */
static kt_status check_alignment(gguf_writer *w, gguf_type type, const uint8_t *val,
                                 kt_error *err) {
    if (type != GGUF_U32)
        return kt_error_set(err, KT_ERR_ARG, WHO ": general.alignment must be u32, not %s",
                            gguf_type_name(type));
    uint32_t a;
    memcpy(&a, val, 4);
    if (a == 0 || (a & (a - 1)) != 0)
        return kt_error_set(err, KT_ERR_ARG,
                            WHO ": general.alignment %" PRIu32 " is not a power of two", a);
    w->alignment = a;
    return KT_OK;
}

/* Adds or replaces key (keeping its place); takes ownership of val, which
 * holds len bytes of the encoded value, and frees it on failure. */
static kt_status put_kv(gguf_writer *w, const char *key, gguf_type type, uint8_t *val,
                        uint64_t len, kt_error *err) {
    kt_status st = check_key(w, key, err);
    if (st == KT_OK && strcmp(key, "general.alignment") == 0)
        st = check_alignment(w, type, val, err);
    int64_t i = st == KT_OK ? find_kv(w, key) : -1;
    if (st == KT_OK && i < 0) {
        char *k = strdup(key);
        if (!k || !grow((void **)&w->kvs, &w->cap_kv, w->n_kv, sizeof *w->kvs)) {
            free(k);
            st = nomem(err, key);
        } else {
            i = w->n_kv++;
            w->kvs[i] = (wkv){k, type, NULL, 0};
        }
    }
    if (st != KT_OK) {
        free(val);
        return st;
    }
    free(w->kvs[i].val);
    w->kvs[i].type = type;
    w->kvs[i].val = val;
    w->kvs[i].len = len;
    return KT_OK;
}

kt_status gguf_writer_set_scalar(gguf_writer *w, const char *key, gguf_type type, const void *v,
                                 kt_error *err) {
    uint64_t n = gguf_type_size(type);
    if (n == 0 || !v)
        return kt_error_set(err, KT_ERR_ARG, WHO ": key '%s': %s is not a scalar type",
                            key ? key : "", gguf_type_name(type));
    uint8_t *val = malloc(n);
    if (!val) return nomem(err, key);
    if (type == GGUF_BOOL) val[0] = *(const bool *)v ? 1 : 0;
    else memcpy(val, v, n);
    return put_kv(w, key, type, val, n, err);
}

kt_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v, kt_error *err) {
    return gguf_writer_set_scalar(w, key, GGUF_U32, &v, err);
}

kt_status gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v, kt_error *err) {
    return gguf_writer_set_scalar(w, key, GGUF_I32, &v, err);
}

kt_status gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v, kt_error *err) {
    return gguf_writer_set_scalar(w, key, GGUF_U64, &v, err);
}

kt_status gguf_writer_set_f32(gguf_writer *w, const char *key, float v, kt_error *err) {
    return gguf_writer_set_scalar(w, key, GGUF_F32, &v, err);
}

kt_status gguf_writer_set_bool(gguf_writer *w, const char *key, bool v, kt_error *err) {
    return gguf_writer_set_scalar(w, key, GGUF_BOOL, &v, err);
}

kt_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *v, kt_error *err) {
    if (!v) return kt_error_set(err, KT_ERR_ARG, WHO ": key '%s': NULL string", key ? key : "");
    uint64_t n = strlen(v);
    uint8_t *val = malloc(8 + n);
    if (!val) return nomem(err, key);
    memcpy(val, &n, 8);
    memcpy(val + 8, v, n);
    return put_kv(w, key, GGUF_STRING, val, 8 + n, err);
}

kt_status gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_type type, const void *data,
                              uint64_t n, kt_error *err) {
    uint64_t es = gguf_type_size(type), bytes;
    if (es == 0 || (!data && n > 0))
        return kt_error_set(err, KT_ERR_ARG, WHO ": key '%s': bad array (element type %s)",
                            key ? key : "", gguf_type_name(type));
    if (__builtin_mul_overflow(n, es, &bytes) || bytes > SIZE_MAX - 12)
        return kt_error_set(err, KT_ERR_ARG, WHO ": key '%s': array of %" PRIu64 " is too large",
                            key ? key : "", n);
    uint8_t *val = malloc((size_t)bytes + 12);
    if (!val) return nomem(err, key);
    uint32_t t = (uint32_t)type;
    memcpy(val, &t, 4);
    memcpy(val + 4, &n, 8);
    if (bytes) memcpy(val + 12, data, (size_t)bytes);
    return put_kv(w, key, GGUF_ARRAY, val, bytes + 12, err);
}

/* Encoded size of a string array; false if it overflows or a string is
 * missing. */
static bool str_array_size(const gguf_str *strs, uint64_t n, uint64_t *total) {
    uint64_t sum = 12;
    for (uint64_t j = 0; j < n; j++) {
        if (!strs[j].ptr && strs[j].len) return false;
        if (__builtin_add_overflow(sum, (uint64_t)8, &sum) ||
            __builtin_add_overflow(sum, strs[j].len, &sum))
            return false;
    }
    *total = sum;
    return sum <= SIZE_MAX;
}

kt_status gguf_writer_set_arr_str(gguf_writer *w, const char *key, const gguf_str *strs,
                                  uint64_t n, kt_error *err) {
    uint64_t total = 12;
    if (n > 0 && (!strs || !str_array_size(strs, n, &total)))
        return kt_error_set(err, KT_ERR_ARG, WHO ": key '%s': bad string array", key ? key : "");
    uint8_t *val = malloc((size_t)total);
    if (!val) return nomem(err, key);
    uint32_t t = GGUF_STRING;
    memcpy(val, &t, 4);
    memcpy(val + 4, &n, 8);
    uint8_t *p = val + 12;
    for (uint64_t j = 0; j < n; j++) {
        memcpy(p, &strs[j].len, 8);
        if (strs[j].len) memcpy(p + 8, strs[j].ptr, (size_t)strs[j].len);
        p += 8 + strs[j].len;
    }
    return put_kv(w, key, GGUF_ARRAY, val, total, err);
}

/* The reader validated the value, so its bytes are copied as they are. */
kt_status gguf_writer_copy_kv(gguf_writer *w, const gguf_file *f, int64_t i, kt_error *err) {
    const void *raw;
    uint64_t len;
    if (!gguf_kv_raw(f, i, &raw, &len))
        return kt_error_set(err, KT_ERR_ARG, WHO ": no key %" PRId64 " to copy", i);
    gguf_str k = gguf_kv_key(f, i);
    if (memchr(k.ptr, 0, (size_t)k.len))
        return kt_error_set(err, KT_ERR_ARG, WHO ": key %" PRId64 " has a NUL byte in its name", i);
    char *key = malloc((size_t)k.len + 1);
    uint8_t *val = malloc(len ? (size_t)len : 1);
    if (!key || !val) {
        free(key);
        free(val);
        return nomem(err, "a copied key");
    }
    memcpy(key, k.ptr, (size_t)k.len);
    key[k.len] = 0;
    memcpy(val, raw, (size_t)len);
    kt_status st = put_kv(w, key, gguf_kv_type(f, i), val, len, err);
    free(key);
    return st;
}

/* ---- tensors ------------------------------------------------------------ */

/* Checks shape and type and computes the byte size, overflow-checked. */
static kt_status tensor_size(const char *name, kt_dtype type, uint32_t n_dims,
                             const int64_t *dims, uint64_t *n_bytes, kt_error *err) {
    if (!kt_dtype_known(type))
        return kt_error_set(err, KT_ERR_ARG, WHO ": tensor '%s': unknown type %d", name, (int)type);
    if (n_dims == 0 || n_dims > GGUF_MAX_DIMS || !dims)
        return kt_error_set(err, KT_ERR_ARG,
                            WHO ": tensor '%s': n_dims %" PRIu32 " (must be 1 to %d)", name,
                            n_dims, GGUF_MAX_DIMS);
    int64_t n = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (dims[d] <= 0)
            return kt_error_set(err, KT_ERR_ARG, WHO ": tensor '%s': dim %" PRIu32 " is %" PRId64,
                                name, d, dims[d]);
        if (__builtin_mul_overflow(n, dims[d], &n))
            return kt_error_set(err, KT_ERR_ARG, WHO ": tensor '%s': element count overflows",
                                name);
    }
    const kt_dtype_info *info = kt_dtype_get(type);
    if (dims[0] % info->block_size != 0)
        return kt_error_set(err, KT_ERR_ARG,
                            WHO ": tensor '%s': dim 0 (%" PRId64 ") is not a multiple of the %s "
                            "block size %d", name, dims[0], info->name, info->block_size);
    if (__builtin_mul_overflow((uint64_t)(n / info->block_size), (uint64_t)info->block_bytes,
                               n_bytes))
        return kt_error_set(err, KT_ERR_ARG, WHO ": tensor '%s': byte size overflows", name);
    return KT_OK;
}

static kt_status check_tensor_name(const gguf_writer *w, const char *name, kt_error *err) {
    if (!name || !*name) return kt_error_set(err, KT_ERR_ARG, WHO ": empty tensor name");
    if (strlen(name) > MAX_TENSOR_NAME)
        return kt_error_set(err, KT_ERR_ARG, WHO ": tensor name '%s' longer than %d bytes", name,
                            MAX_TENSOR_NAME);
    if (w->state != W_DECLARE)
        return kt_error_set(err, KT_ERR_ARG, WHO ": tensor '%s' added after gguf_writer_begin",
                            name);
    for (int64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return kt_error_set(err, KT_ERR_ARG, WHO ": duplicate tensor name '%s'", name);
    return KT_OK;
}

kt_status gguf_writer_add_tensor(gguf_writer *w, const char *name, kt_dtype type,
                                 uint32_t n_dims, const int64_t *dims, kt_error *err) {
    kt_status st = check_tensor_name(w, name, err);
    wtensor t = {.type = type, .n_dims = n_dims};
    if (st == KT_OK) st = tensor_size(name, type, n_dims, dims, &t.n_bytes, err);
    if (st != KT_OK) return st;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t.dims[d] = d < n_dims ? dims[d] : 1;
    t.name = strdup(name);
    if (!t.name || !grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors, sizeof t)) {
        free(t.name);
        return nomem(err, name);
    }
    w->tensors[w->n_tensors++] = t;
    return KT_OK;
}

/* ---- output ------------------------------------------------------------- */

static bool wr(gguf_writer *w, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, w->fp) != n) {
        w->io_errno = errno ? errno : EIO;
        return false;
    }
    w->pos += n;
    return true;
}

static bool wr_u32(gguf_writer *w, uint32_t v) { return wr(w, &v, 4); }
static bool wr_u64(gguf_writer *w, uint64_t v) { return wr(w, &v, 8); }

static bool wr_str(gguf_writer *w, const char *s) {
    size_t n = strlen(s);
    return wr_u64(w, n) && wr(w, s, n);
}

/* Zeros up to the next multiple of the alignment. */
static bool wr_pad(gguf_writer *w) {
    static const uint8_t zeros[4096];
    uint64_t n = (w->alignment - w->pos % w->alignment) % w->alignment;
    while (n > 0) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        if (!wr(w, zeros, k)) return false;
        n -= k;
    }
    return true;
}

/* Puts the writer in the failed state and drops the temporary file. */
static kt_status io_fail(gguf_writer *w, const char *what, kt_error *err) {
    int e = w->io_errno ? w->io_errno : (errno ? errno : EIO);
    w->state = W_FAILED;
    discard_output(w);
    return kt_error_set(err, KT_ERR_IO, "%s: %s: %s", w->path, what, strerror(e));
}

static uint64_t pad_to(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

/* Sets every tensor's offset; data size in *total. */
static kt_status layout(gguf_writer *w, uint64_t *total, kt_error *err) {
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_tensors; i++) {
        wtensor *t = &w->tensors[i];
        t->offset = off;
        if (t->n_bytes > UINT64_MAX - w->alignment ||
            __builtin_add_overflow(off, pad_to(t->n_bytes, w->alignment), &off))
            return kt_error_set(err, KT_ERR_ARG, WHO ": data section size overflows at '%s'",
                                t->name);
    }
    *total = off;
    return KT_OK;
}

static bool write_kvs(gguf_writer *w) {
    for (int64_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kvs[i];
        if (!wr_str(w, kv->key) || !wr_u32(w, kv->type) || !wr(w, kv->val, (size_t)kv->len))
            return false;
    }
    return true;
}

static bool write_infos(gguf_writer *w) {
    for (int64_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        bool ok = wr_str(w, t->name) && wr_u32(w, t->n_dims);
        for (uint32_t d = 0; ok && d < t->n_dims; d++) ok = wr_u64(w, (uint64_t)t->dims[d]);
        if (!ok || !wr_u32(w, (uint32_t)t->type) || !wr_u64(w, t->offset)) return false;
    }
    return true;
}

static kt_status open_output(gguf_writer *w, const char *path, kt_error *err) {
    size_t n = strlen(path) + 32;
    w->path = strdup(path);
    w->tmp_path = malloc(n);
    w->iobuf = malloc(IO_BUF_BYTES);
    if (!w->path || !w->tmp_path || !w->iobuf) return nomem(err, path);
    snprintf(w->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
    w->fp = fopen(w->tmp_path, "wb");
    if (!w->fp)
        return kt_error_set(err, KT_ERR_IO, "%s: cannot create %s: %s", path, w->tmp_path,
                            strerror(errno));
    setvbuf(w->fp, w->iobuf, _IOFBF, IO_BUF_BYTES);
    return KT_OK;
}

kt_status gguf_writer_begin(gguf_writer *w, const char *path, kt_error *err) {
    if (w->state != W_DECLARE || !path)
        return kt_error_set(err, KT_ERR_ARG,
                            WHO ": gguf_writer_begin called twice or without a path");
    uint64_t data_size = 0;
    kt_status st = layout(w, &data_size, err);
    if (st == KT_OK) st = open_output(w, path, err);
    if (st != KT_OK) {
        w->state = W_FAILED;
        return st;
    }
    w->state = W_WRITE;
    bool ok = wr(w, "GGUF", 4) && wr_u32(w, 3) && wr_u64(w, (uint64_t)w->n_tensors) &&
              wr_u64(w, (uint64_t)w->n_kv) && write_kvs(w) && write_infos(w) && wr_pad(w);
    if (!ok) return io_fail(w, "write failed", err);
    /* Invariant from here: pos - (header end) is the next tensor's offset. */
    w->end = w->pos + data_size;
    return KT_OK;
}

kt_status gguf_writer_write_tensor(gguf_writer *w, const void *data, size_t n_bytes,
                                   kt_error *err) {
    if (w->state == W_WRITE && w->part)
        return kt_error_set(err, KT_ERR_ARG, "%s: tensor '%s': write_tensor after %" PRIu64
                            " bytes of it given by write_part", w->path, w->tensors[w->next].name, w->part);
    if (w->state == W_WRITE && w->next < w->n_tensors && n_bytes != w->tensors[w->next].n_bytes)
        return kt_error_set(err, KT_ERR_ARG,
                            "%s: tensor '%s': %zu bytes given, expected %" PRIu64, w->path,
                            w->tensors[w->next].name, n_bytes, w->tensors[w->next].n_bytes);
    return gguf_writer_write_part(w, data, n_bytes, err);
}

kt_status gguf_writer_write_part(gguf_writer *w, const void *data, size_t n_bytes,
                                 kt_error *err) {
    if (w->state != W_WRITE)
        return kt_error_set(err, KT_ERR_ARG, WHO ": write_tensor outside begin/finish");
    if (w->next >= w->n_tensors)
        return kt_error_set(err, KT_ERR_ARG, "%s: all %" PRId64 " tensors already written",
                            w->path, w->n_tensors);
    const wtensor *t = &w->tensors[w->next];
    if (n_bytes > t->n_bytes - w->part || (!data && n_bytes))
        return kt_error_set(err, KT_ERR_ARG,
                            "%s: tensor '%s': %zu more bytes given after %" PRIu64 ", expected %" PRIu64
                            " in all", w->path, t->name, n_bytes, w->part, t->n_bytes);
    if (!wr(w, data, n_bytes)) return io_fail(w, "write failed", err);
    w->part += n_bytes;
    if (w->part < t->n_bytes) return KT_OK;
    if (!wr_pad(w)) return io_fail(w, "write failed", err);
    w->part = 0;
    w->next++;
    return KT_OK;
}

kt_status gguf_writer_finish(gguf_writer *w, kt_error *err) {
    if (w->state != W_WRITE)
        return kt_error_set(err, KT_ERR_ARG, WHO ": finish without a successful begin");
    if (w->next != w->n_tensors)
        return kt_error_set(err, KT_ERR_ARG, "%s: only %" PRId64 " of %" PRId64 " tensors written",
                            w->path, w->next, w->n_tensors);
    if (w->pos != w->end)
        return kt_error_set(err, KT_ERR_INTERNAL, "%s: wrote %" PRIu64 " bytes, expected %" PRIu64,
                            w->path, w->pos, w->end);
    errno = 0;
    if (fflush(w->fp) != 0 || ferror(w->fp)) return io_fail(w, "write failed", err);
    FILE *fp = w->fp;
    w->fp = NULL;
    if (fclose(fp) != 0) return io_fail(w, "close failed", err);
    if (rename(w->tmp_path, w->path) != 0) return io_fail(w, "cannot rename temporary file", err);
    w->state = W_DONE;
    return KT_OK;
}
