/*
 * gguf.c - the validating GGUF reader (v2 and v3); see gguf.h.
 *
 * Model files come from anywhere, so this file treats every byte as
 * hostile: the whole file is parsed and checked once, in gguf_open(), and
 * after that the accessors trust what they hand out without further checks
 * (the invariant promised in gguf.h). Nothing is copied: keys, strings,
 * arrays and tensor data point into the mapping (or the caller's buffer).
 *
 * How: a cursor (`reader`) walks the bytes; every read first checks that
 * the bytes are there with subtraction-only arithmetic (`n <= size - pos`,
 * which cannot overflow because pos <= size always holds), so a length of
 * 2^64-1 is reported, never added. Multi-byte values are read with memcpy
 * because the mapping gives them no alignment. Little-endian host assumed.
 *
 * Per key we keep its value span (for copying verbatim), and for string
 * arrays a table of element offsets so element j is O(1). Keys and tensor
 * names go into open-addressing hash indexes, which also find duplicates
 * while parsing. Every failure sets one line "NAME: problem" in err and
 * frees everything; the first problem found wins.
 */
#include "gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/huge.h"

#define HEADER_BYTES 24    /* magic, version, n_tensors, n_kv */
#define MIN_KV_BYTES 13    /* key length (8) + type (4) + a u8 value (1) */
#define MIN_TENSOR_BYTES 32 /* name length, n_dims, one dim, type, offset */
#define SHOW_MAX 64        /* bytes of a name quoted in a message */
/* Far beyond any real model (a few hundred keys, at most some thousands of
 * tensors); bounds what a hostile header can make us allocate. */
#define MAX_COUNT ((uint64_t)1 << 20)

/* ---- the parsed file ---------------------------------------------------- */

typedef struct gguf_kv {
    gguf_str key;
    gguf_type type;
    const uint8_t *raw;   /* the value as encoded, right after the type id */
    uint64_t raw_len;
    gguf_str str;         /* GGUF_STRING */
    gguf_type arr_type;   /* GGUF_ARRAY: element type, count, first element */
    uint64_t arr_n;
    const uint8_t *arr_data;
    uint64_t *arr_str_off; /* string arrays: file offset of each length */
} gguf_kv;

/* Open addressing, linear probing; a slot holds entry idx1 - 1, and
 * idx1 == 0 marks it empty, so a calloc'ed table is empty and its pages are
 * only touched as entries arrive (a hostile count costs address space, not
 * memory). The table has at least twice as many slots as entries, so
 * probing ends. */
typedef struct name_slot {
    const char *ptr;
    uint64_t len;
    int64_t idx1;
} name_slot;

typedef struct name_index {
    name_slot *slots;
    uint64_t mask;
} name_index;

struct gguf_file {
    char *name;
    const uint8_t *base;
    uint64_t size;
    void *map;       /* non-NULL when gguf_open mapped or copied the file */
    size_t map_size; /* bytes to unmap */
    bool copied;     /* map is our anonymous copy (GGUF_LOAD_COPY) */
    uint32_t version;
    uint64_t alignment, data_offset;
    int64_t n_kv, n_tensors;
    gguf_kv *kvs;
    gguf_tensor *tensors;
    name_index key_index, tensor_index;
};

/* ---- small helpers ------------------------------------------------------ */

static uint64_t hash_bytes(const char *p, uint64_t len) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (uint64_t i = 0; i < len; i++) h = (h ^ (uint8_t)p[i]) * 0x100000001b3ull;
    return h;
}

static bool index_init(name_index *ix, int64_t n) {
    uint64_t cap = 8;
    while (cap < 2 * (uint64_t)n) cap *= 2;
    ix->slots = calloc(cap, sizeof *ix->slots);
    if (!ix->slots) return false;
    ix->mask = cap - 1;
    return true;
}

/* Slot holding (p, len), or the empty slot where it would go. */
static name_slot *index_slot(const name_index *ix, const char *p, uint64_t len) {
    uint64_t h = hash_bytes(p, len) & ix->mask;
    for (;;) {
        name_slot *s = &ix->slots[h];
        if (s->idx1 == 0 || (s->len == len && memcmp(s->ptr, p, len) == 0)) return s;
        h = (h + 1) & ix->mask;
    }
}

/* Inserts s as entry idx; returns the earlier entry's index if s is
 * already there, else -1. Relies on the table having room (index_init). */
static int64_t index_insert(name_index *ix, gguf_str s, int64_t idx) {
    name_slot *slot = index_slot(ix, s.ptr, s.len);
    if (slot->idx1 != 0) return slot->idx1 - 1;
    *slot = (name_slot){s.ptr, s.len, idx + 1};
    return -1;
}

static int64_t index_find(const name_index *ix, const char *name) {
    if (!ix->slots || !name) return -1;
    return index_slot(ix, name, strlen(name))->idx1 - 1;
}

static uint64_t rd_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint32_t rd_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Bytes of one scalar of type t; 0 for STRING, ARRAY and unknown types. */
uint64_t gguf_type_size(gguf_type t) {
    switch (t) {
    case GGUF_U8: case GGUF_I8: case GGUF_BOOL: return 1;
    case GGUF_U16: case GGUF_I16: return 2;
    case GGUF_U32: case GGUF_I32: case GGUF_F32: return 4;
    case GGUF_U64: case GGUF_I64: case GGUF_F64: return 8;
    default: return 0;
    }
}

/* Copies up to SHOW_MAX bytes of a name from the file into buf (which has
 * room for SHOW_MAX + 4), replacing non-printable bytes with '?'. */
static void show(char *buf, const char *p, uint64_t len) {
    uint64_t n = len < SHOW_MAX ? len : SHOW_MAX;
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        buf[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    strcpy(buf + n, len > SHOW_MAX ? "..." : "");
}

/* ---- the cursor --------------------------------------------------------- */

typedef struct reader {
    const uint8_t *base;
    uint64_t size;
    uint64_t pos; /* invariant: pos <= size */
    const char *name;
    kt_error *err;
} reader;

/* Sets "NAME: message" and returns false. */
__attribute__((format(printf, 3, 4)))
static bool fail(reader *r, kt_status status, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kt_error_set(r->err, status, "%s: %s", r->name, msg);
    return false;
}

/* Checks that n more bytes exist; `ctx` and `what` name them. */
static bool need(reader *r, uint64_t n, const char *ctx, const char *what) {
    if (n <= r->size - r->pos) return true;
    return fail(r, KT_ERR_FORMAT,
                "truncated: %s: %s (%" PRIu64 " bytes at offset %" PRIu64
                ") past end of file (size %" PRIu64 ")",
                ctx, what, n, r->pos, r->size);
}

static bool read_u32(reader *r, uint32_t *v, const char *ctx, const char *what) {
    if (!need(r, 4, ctx, what)) return false;
    *v = rd_u32(r->base + r->pos);
    r->pos += 4;
    return true;
}

static bool read_u64(reader *r, uint64_t *v, const char *ctx, const char *what) {
    if (!need(r, 8, ctx, what)) return false;
    *v = rd_u64(r->base + r->pos);
    r->pos += 8;
    return true;
}

/* A string: u64 length, then the bytes (which must all be in the file). */
static bool read_str(reader *r, gguf_str *s, const char *ctx, const char *what) {
    char w[96];
    snprintf(w, sizeof w, "%s length", what);
    uint64_t len;
    if (!read_u64(r, &len, ctx, w)) return false;
    if (!need(r, len, ctx, what)) return false;
    s->ptr = (const char *)r->base + r->pos;
    s->len = len;
    r->pos += len;
    return true;
}

/* "key 3" before the key name is known, "key 'general.name'" after. */
static void ctx_name(char *ctx, size_t cap, const char *kind, int64_t i, const gguf_str *s) {
    if (!s) {
        snprintf(ctx, cap, "%s %" PRId64, kind, i);
        return;
    }
    char shown[SHOW_MAX + 4];
    show(shown, s->ptr, s->len);
    snprintf(ctx, cap, "%s '%s'", kind, shown);
}

/* ---- header ------------------------------------------------------------- */

static bool check_magic(reader *r) {
    if (r->size < 4)
        return fail(r, KT_ERR_FORMAT, "truncated: %" PRIu64 " bytes is too short for a GGUF header",
                    r->size);
    if (memcmp(r->base, "GGUF", 4) == 0) {
        r->pos = 4;
        return true;
    }
    char shown[20], *o = shown;
    for (int i = 0; i < 4; i++) {
        unsigned char c = r->base[i];
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') *o++ = (char)c;
        else o += sprintf(o, "\\x%02x", c);
    }
    *o = 0;
    return fail(r, KT_ERR_FORMAT, "not a GGUF file (magic '%s')", shown);
}

static bool check_version(reader *r, uint32_t version) {
    if (version == 2 || version == 3) return true;
    if (version == 1)
        return fail(r, KT_ERR_UNSUPPORTED,
                    "unsupported GGUF version 1 (only versions 2 and 3 are supported)");
    if (version != 0 && (version & 0xffff) == 0)
        return fail(r, KT_ERR_UNSUPPORTED,
                    "unsupported GGUF version %" PRIu32 " (a big-endian file?)", version);
    return fail(r, KT_ERR_UNSUPPORTED,
                "unsupported GGUF version %" PRIu32 " (only versions 2 and 3 are supported)",
                version);
}

/* Every kv and tensor info takes a minimum number of bytes, so counts that
 * could not fit are rejected before anything is allocated for them. */
static bool read_header(reader *r, gguf_file *f) {
    if (!check_magic(r)) return false;
    if (!read_u32(r, &f->version, "header", "version")) return false;
    if (!check_version(r, f->version)) return false;
    uint64_t nt, nkv;
    if (!read_u64(r, &nt, "header", "tensor count")) return false;
    if (!read_u64(r, &nkv, "header", "key count")) return false;
    uint64_t room = r->size - HEADER_BYTES;
    if (nt > room / MIN_TENSOR_BYTES)
        return fail(r, KT_ERR_FORMAT, "tensor count %" PRIu64 " absurd for file size %" PRIu64,
                    nt, r->size);
    if (nkv > room / MIN_KV_BYTES)
        return fail(r, KT_ERR_FORMAT, "key count %" PRIu64 " absurd for file size %" PRIu64,
                    nkv, r->size);
    if (nt * MIN_TENSOR_BYTES + nkv * MIN_KV_BYTES > room)
        return fail(r, KT_ERR_FORMAT,
                    "tensor count %" PRIu64 " and key count %" PRIu64
                    " absurd for file size %" PRIu64, nt, nkv, r->size);
    if (nt > MAX_COUNT || nkv > MAX_COUNT)
        return fail(r, KT_ERR_UNSUPPORTED,
                    "tensor count %" PRIu64 " or key count %" PRIu64 " above the limit of %" PRIu64,
                    nt, nkv, MAX_COUNT);
    f->n_tensors = (int64_t)nt;
    f->n_kv = (int64_t)nkv;
    return true;
}

/* ---- metadata ----------------------------------------------------------- */

static bool read_str_array(reader *r, gguf_kv *kv, const char *ctx) {
    if (kv->arr_n > (r->size - r->pos) / 8)
        return fail(r, KT_ERR_FORMAT,
                    "truncated: %s: array of %" PRIu64 " strings at offset %" PRIu64
                    " past end of file (size %" PRIu64 ")",
                    ctx, kv->arr_n, r->pos, r->size);
    kv->arr_str_off = malloc((kv->arr_n ? kv->arr_n : 1) * sizeof(uint64_t));
    if (!kv->arr_str_off)
        return fail(r, KT_ERR_NOMEM, "%s: out of memory for %" PRIu64 " strings", ctx, kv->arr_n);
    for (uint64_t j = 0; j < kv->arr_n; j++) {
        kv->arr_str_off[j] = r->pos;
        gguf_str s;
        char w[64];
        snprintf(w, sizeof w, "string %" PRIu64, j);
        if (!read_str(r, &s, ctx, w)) return false;
    }
    return true;
}

static bool read_array(reader *r, gguf_kv *kv, const char *ctx) {
    uint32_t et;
    if (!read_u32(r, &et, ctx, "array element type")) return false;
    if (et >= GGUF_TYPE_COUNT)
        return fail(r, KT_ERR_FORMAT, "%s: unknown array element type %" PRIu32, ctx, et);
    if (et == GGUF_ARRAY)
        return fail(r, KT_ERR_UNSUPPORTED,
                    "%s: nested arrays (array of array type) are not supported", ctx);
    if (!read_u64(r, &kv->arr_n, ctx, "array length")) return false;
    kv->arr_type = (gguf_type)et;
    kv->arr_data = r->base + r->pos;
    if (et == GGUF_STRING) return read_str_array(r, kv, ctx);
    uint64_t es = gguf_type_size(kv->arr_type);
    if (kv->arr_n > (r->size - r->pos) / es)
        return fail(r, KT_ERR_FORMAT,
                    "truncated: %s: array of %" PRIu64 " %s at offset %" PRIu64
                    " past end of file (size %" PRIu64 ")",
                    ctx, kv->arr_n, gguf_type_name(kv->arr_type), r->pos, r->size);
    r->pos += kv->arr_n * es;
    return true;
}

static bool read_value(reader *r, gguf_kv *kv, const char *ctx) {
    if (kv->type == GGUF_STRING) return read_str(r, &kv->str, ctx, "string value");
    if (kv->type == GGUF_ARRAY) return read_array(r, kv, ctx);
    char w[32];
    snprintf(w, sizeof w, "%s value", gguf_type_name(kv->type));
    if (!need(r, gguf_type_size(kv->type), ctx, w)) return false;
    r->pos += gguf_type_size(kv->type);
    return true;
}

static bool read_kv(reader *r, gguf_file *f, int64_t i) {
    gguf_kv *kv = &f->kvs[i];
    char ctx[SHOW_MAX + 32];
    ctx_name(ctx, sizeof ctx, "key", i, NULL);
    if (!read_str(r, &kv->key, ctx, "name")) return false;
    if (kv->key.len == 0) return fail(r, KT_ERR_FORMAT, "%s: empty key name", ctx);
    ctx_name(ctx, sizeof ctx, "key", i, &kv->key);
    int64_t dup = index_insert(&f->key_index, kv->key, i);
    if (dup >= 0)
        return fail(r, KT_ERR_FORMAT, "%s: duplicate key (keys %" PRId64 " and %" PRId64 ")",
                    ctx, dup, i);
    uint32_t t;
    if (!read_u32(r, &t, ctx, "value type")) return false;
    if (t >= GGUF_TYPE_COUNT)
        return fail(r, KT_ERR_FORMAT, "%s: unknown value type %" PRIu32, ctx, t);
    kv->type = (gguf_type)t;
    uint64_t start = r->pos;
    if (!read_value(r, kv, ctx)) return false;
    kv->raw = r->base + start;
    kv->raw_len = r->pos - start;
    return true;
}

/* general.alignment: absent means the default; present must be a u32
 * nonzero power of two (as llama.cpp requires). */
static bool read_alignment(reader *r, gguf_file *f) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = index_find(&f->key_index, "general.alignment");
    if (i < 0) return true;
    const gguf_kv *kv = &f->kvs[i];
    if (kv->type != GGUF_U32)
        return fail(r, KT_ERR_FORMAT, "general.alignment has type %s, expected u32",
                    gguf_type_name(kv->type));
    uint32_t a = rd_u32(kv->raw);
    if (a == 0 || (a & (a - 1)) != 0)
        return fail(r, KT_ERR_FORMAT, "general.alignment %" PRIu32 " is not a power of two", a);
    f->alignment = a;
    return true;
}

/* ---- tensor infos ------------------------------------------------------- */

static bool read_dims(reader *r, gguf_tensor *t, const char *ctx) {
    if (!read_u32(r, &t->n_dims, ctx, "n_dims")) return false;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return fail(r, KT_ERR_FORMAT, "%s: n_dims %" PRIu32 " (must be 1 to %d)", ctx, t->n_dims,
                    GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->dims[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t v;
        if (!read_u64(r, &v, ctx, "dim")) return false;
        if (v == 0 || v > (uint64_t)INT64_MAX)
            return fail(r, KT_ERR_FORMAT, "%s: dim %" PRIu32 " is %" PRId64 " (must be positive)",
                        ctx, d, (int64_t)v);
        t->dims[d] = (int64_t)v;
    }
    return true;
}

/* Element count and byte size, both overflow-checked; needs dims, type. */
static bool compute_size(reader *r, gguf_tensor *t, const char *ctx) {
    int64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
        if (__builtin_mul_overflow(n, t->dims[d], &n))
            return fail(r, KT_ERR_FORMAT,
                        "%s: dims [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                        "]: element count overflows int64",
                        ctx, t->dims[0], t->dims[1], t->dims[2], t->dims[3]);
    const kt_dtype_info *info = kt_dtype_get(t->type);
    if (t->dims[0] % info->block_size != 0)
        return fail(r, KT_ERR_FORMAT,
                    "%s: dim 0 (%" PRId64 ") is not a multiple of the %s block size %d", ctx,
                    t->dims[0], info->name, info->block_size);
    uint64_t bytes;
    if (__builtin_mul_overflow((uint64_t)(n / info->block_size), (uint64_t)info->block_bytes,
                               &bytes))
        return fail(r, KT_ERR_FORMAT, "%s: %" PRId64 " %s elements: byte size overflows", ctx, n,
                    info->name);
    t->n_bytes = bytes;
    return true;
}

static bool read_tensor_info(reader *r, gguf_file *f, int64_t i) {
    gguf_tensor *t = &f->tensors[i];
    char ctx[SHOW_MAX + 32];
    ctx_name(ctx, sizeof ctx, "tensor", i, NULL);
    if (!read_str(r, &t->name, ctx, "name")) return false;
    ctx_name(ctx, sizeof ctx, "tensor", i, &t->name);
    int64_t dup = index_insert(&f->tensor_index, t->name, i);
    if (dup >= 0)
        return fail(r, KT_ERR_FORMAT,
                    "%s: duplicate tensor name (tensors %" PRId64 " and %" PRId64 ")", ctx, dup, i);
    if (!read_dims(r, t, ctx)) return false;
    uint32_t type;
    if (!read_u32(r, &type, ctx, "type")) return false;
    if (!kt_dtype_known(type))
        return fail(r, KT_ERR_FORMAT, "%s: unknown tensor type %" PRIu32, ctx, type);
    t->type = (kt_dtype)type;
    if (!compute_size(r, t, ctx)) return false;
    return read_u64(r, &t->offset, ctx, "offset");
}

/* Needs f->data_offset and f->alignment. */
static bool check_tensor_data(reader *r, gguf_file *f, gguf_tensor *t) {
    char ctx[SHOW_MAX + 32];
    ctx_name(ctx, sizeof ctx, "tensor", 0, &t->name);
    if (t->offset % f->alignment != 0)
        return fail(r, KT_ERR_FORMAT, "%s: offset %" PRIu64 " is not aligned to %" PRIu64, ctx,
                    t->offset, f->alignment);
    uint64_t avail = f->data_offset <= r->size ? r->size - f->data_offset : 0;
    if (t->offset <= avail && t->n_bytes <= avail - t->offset) {
        t->data = r->base + f->data_offset + t->offset;
        return true;
    }
    uint64_t start, end;
    if (!__builtin_add_overflow(f->data_offset, t->offset, &start) &&
        !__builtin_add_overflow(start, t->n_bytes, &end))
        return fail(r, KT_ERR_FORMAT,
                    "%s: data [%" PRIu64 ", %" PRIu64 ") past end of file (size %" PRIu64 ")",
                    ctx, start, end, r->size);
    return fail(r, KT_ERR_FORMAT,
                "%s: data of %" PRIu64 " bytes at data offset %" PRIu64
                " past end of file (size %" PRIu64 ")",
                ctx, t->n_bytes, t->offset, r->size);
}

/* ---- open / close ------------------------------------------------------- */

static bool parse_kvs(reader *r, gguf_file *f) {
    f->kvs = calloc(f->n_kv ? (size_t)f->n_kv : 1, sizeof *f->kvs);
    if (!f->kvs || !index_init(&f->key_index, f->n_kv))
        return fail(r, KT_ERR_NOMEM, "out of memory for %" PRId64 " keys", f->n_kv);
    for (int64_t i = 0; i < f->n_kv; i++)
        if (!read_kv(r, f, i)) return false;
    return read_alignment(r, f);
}

static bool parse_tensors(reader *r, gguf_file *f) {
    f->tensors = calloc(f->n_tensors ? (size_t)f->n_tensors : 1, sizeof *f->tensors);
    if (!f->tensors || !index_init(&f->tensor_index, f->n_tensors))
        return fail(r, KT_ERR_NOMEM, "out of memory for %" PRId64 " tensors", f->n_tensors);
    for (int64_t i = 0; i < f->n_tensors; i++)
        if (!read_tensor_info(r, f, i)) return false;
    /* pos <= size and alignment <= 2^31, so this cannot overflow. */
    f->data_offset = (r->pos + f->alignment - 1) / f->alignment * f->alignment;
    /* Vocab-only files may end right after the metadata, without padding. */
    if (f->n_tensors == 0 && f->data_offset > r->size) f->data_offset = r->size;
    for (int64_t i = 0; i < f->n_tensors; i++)
        if (!check_tensor_data(r, f, &f->tensors[i])) return false;
    return true;
}

static gguf_file *parse(const void *data, uint64_t size, const char *name, kt_error *err) {
    gguf_file *f = calloc(1, sizeof *f);
    char *name_copy = strdup(name);
    if (!f || !name_copy) {
        free(f);
        free(name_copy);
        kt_error_set(err, KT_ERR_NOMEM, "%s: out of memory", name);
        return NULL;
    }
    f->name = name_copy;
    f->base = data;
    f->size = size;
    reader r = {f->base, size, 0, f->name, err};
    if (!read_header(&r, f) || !parse_kvs(&r, f) || !parse_tensors(&r, f)) {
        gguf_close(f);
        return NULL;
    }
    return f;
}

gguf_file *gguf_open_buffer(const void *data, size_t size, const char *name, kt_error *err) {
    if (!name) name = "<buffer>";
    if (!data && size > 0) {
        kt_error_set(err, KT_ERR_ARG, "%s: NULL buffer of %zu bytes", name, size);
        return NULL;
    }
    static const uint8_t empty[1];
    return parse(data ? data : empty, size, name, err);
}

/* The whole file in anonymous memory backed by huge pages where the
 * kernel has them, read-only once filled. NULL with err set on failure. */
/* Reads go in chunks of this, so a progress bar moves (and a 64 MiB
 * read() costs nothing next to one of the whole file). */
#define COPY_CHUNK ((size_t)64 << 20)

typedef struct load_progress {
    kt_progress_fn fn;
    void *user;
} load_progress;

static void *copy_to_huge_pages(int fd, size_t size, size_t *map_size, const char *path, const load_progress *lp,
                                kt_error *err) {
    char *buf = kt_huge_alloc(size, map_size);
    if (!buf) {
        kt_error_set(err, KT_ERR_NOMEM, "%s: cannot allocate %zu bytes to load the file: %s", path, size,
                     strerror(errno));
        return NULL;
    }
    size_t done = 0;
    while (done < size) {
        size_t want = size - done < COPY_CHUNK ? size - done : COPY_CHUNK;
        ssize_t n = read(fd, buf + done, want);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            kt_error_set(err, KT_ERR_IO, "%s: read failed after %zu of %zu bytes: %s", path, done, size,
                         n < 0 ? strerror(errno) : "unexpected end of file");
            munmap(buf, *map_size);
            return NULL;
        }
        done += (size_t)n;
        if (lp->fn) lp->fn(lp->user, "reading", done, size);
    }
    mprotect(buf, *map_size, PROT_READ); /* the same promise as a read-only map */
    return buf;
}

/* Bytes the kernel says can be allocated without swapping (MemAvailable),
 * or UINT64_MAX where that is unknown. */
static uint64_t mem_available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return UINT64_MAX;
    char line[256];
    unsigned long long kb = 0;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    fclose(f);
    return found ? (uint64_t)kb * 1024 : UINT64_MAX;
}

bool gguf_copy_fits(uint64_t file_bytes, uint64_t available_bytes) {
    return file_bytes <= available_bytes / 10 * 9;
}

/* *copied: whether the result is our copy (GGUF_LOAD_COPY that fits). */
static void *map_file(int fd, size_t size, gguf_load_mode mode, size_t *map_size, bool *copied,
                      const char *path, const load_progress *lp, kt_error *err) {
    /* a copy that does not fit would push the machine into swap or the
     * OOM killer; the mapping pages in from the file instead */
    *copied = mode == GGUF_LOAD_COPY && gguf_copy_fits(size, mem_available_bytes());
    if (*copied) return copy_to_huge_pages(fd, size, map_size, path, lp, err);
    if (mode == GGUF_LOAD_COPY) mode = GGUF_LOAD_MAP;
    *map_size = size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE | (mode == GGUF_LOAD_POPULATE ? MAP_POPULATE : 0), fd, 0);
    if (map == MAP_FAILED) {
        kt_error_set(err, KT_ERR_IO, "%s: cannot map %zu bytes: %s", path, size, strerror(errno));
        return NULL;
    }
    return map;
}

gguf_file *gguf_open(const char *path, kt_error *err) {
    return gguf_open_mode(path, GGUF_LOAD_MAP, err);
}

gguf_file *gguf_open_mode(const char *path, gguf_load_mode mode, kt_error *err) {
    return gguf_open_progress(path, mode, NULL, NULL, err);
}

gguf_file *gguf_open_progress(const char *path, gguf_load_mode mode, kt_progress_fn progress, void *user,
                              kt_error *err) {
    const load_progress lp = {progress, user};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        kt_error_set(err, KT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    const char *why = fstat(fd, &st) != 0 ? strerror(errno)
                      : !S_ISREG(st.st_mode) ? "not a regular file" : NULL;
    if (why) {
        kt_error_set(err, KT_ERR_IO, "%s: cannot read: %s", path, why);
        close(fd);
        return NULL;
    }
    size_t size = (size_t)st.st_size, map_size = 0;
    bool copied = false;
    void *map = size > 0 ? map_file(fd, size, mode, &map_size, &copied, path, &lp, err) : NULL;
    close(fd);
    if (size > 0 && !map) return NULL;
    gguf_file *f = gguf_open_buffer(map, size, path, err);
    if (!f) {
        if (map) munmap(map, map_size);
        return NULL;
    }
    f->map = map;
    f->map_size = map_size;
    f->copied = copied;
    return f;
}

bool gguf_set_writable(gguf_file *f, bool writable) {
    if (!f->copied || !f->map) return false;
    return mprotect(f->map, f->map_size, writable ? PROT_READ | PROT_WRITE : PROT_READ) == 0;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    for (int64_t i = 0; f->kvs && i < f->n_kv; i++) free(f->kvs[i].arr_str_off);
    free(f->kvs);
    free(f->tensors);
    free(f->key_index.slots);
    free(f->tensor_index.slots);
    if (f->map) munmap(f->map, f->map_size);
    free(f->name);
    free(f);
}

/* ---- file facts --------------------------------------------------------- */

uint32_t gguf_version(const gguf_file *f) { return f->version; }
uint64_t gguf_alignment(const gguf_file *f) { return f->alignment; }
uint64_t gguf_data_offset(const gguf_file *f) { return f->data_offset; }
uint64_t gguf_file_size(const gguf_file *f) { return f->size; }

/* ---- metadata accessors ------------------------------------------------- */

static const gguf_kv *kv_at(const gguf_file *f, int64_t i) {
    return (f && i >= 0 && i < f->n_kv) ? &f->kvs[i] : NULL;
}

int64_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }

int64_t gguf_find_key(const gguf_file *f, const char *key) {
    return index_find(&f->key_index, key);
}

gguf_str gguf_kv_key(const gguf_file *f, int64_t i) {
    const gguf_kv *kv = kv_at(f, i);
    return kv ? kv->key : (gguf_str){"", 0};
}

gguf_type gguf_kv_type(const gguf_file *f, int64_t i) {
    const gguf_kv *kv = kv_at(f, i);
    return kv ? kv->type : GGUF_TYPE_COUNT;
}

bool gguf_kv_raw(const gguf_file *f, int64_t i, const void **data, uint64_t *n_bytes) {
    const gguf_kv *kv = kv_at(f, i);
    if (!kv) return false;
    *data = kv->raw;
    *n_bytes = kv->raw_len;
    return true;
}

/* Integer value of an integer or bool kv, as u64 bits plus a sign flag. */
static bool kv_int(const gguf_kv *kv, uint64_t *mag, bool *neg) {
    const uint8_t *p = kv->raw;
    int64_t s = 0;
    *neg = false;
    switch (kv->type) {
    case GGUF_U8: case GGUF_BOOL: *mag = p[0]; return true;
    case GGUF_U16: { uint16_t v; memcpy(&v, p, 2); *mag = v; return true; }
    case GGUF_U32: *mag = rd_u32(p); return true;
    case GGUF_U64: *mag = rd_u64(p); return true;
    case GGUF_I8: s = (int8_t)p[0]; break;
    case GGUF_I16: { int16_t v; memcpy(&v, p, 2); s = v; break; }
    case GGUF_I32: { int32_t v; memcpy(&v, p, 4); s = v; break; }
    case GGUF_I64: memcpy(&s, p, 8); break;
    default: return false;
    }
    *neg = s < 0;
    *mag = (uint64_t)s; /* two's complement bits when negative */
    return true;
}

bool gguf_kv_get_i64(const gguf_file *f, int64_t i, int64_t *out) {
    const gguf_kv *kv = kv_at(f, i);
    uint64_t m;
    bool neg;
    if (!kv || !kv_int(kv, &m, &neg)) return false;
    if (kv->type == GGUF_BOOL) m = m != 0;
    if (!neg && m > (uint64_t)INT64_MAX) return false;
    *out = (int64_t)m;
    return true;
}

/* Floats as is; integers only when a double holds them exactly. */
bool gguf_kv_get_f64(const gguf_file *f, int64_t i, double *out) {
    const gguf_kv *kv = kv_at(f, i);
    if (!kv) return false;
    if (kv->type == GGUF_F32) {
        float v;
        memcpy(&v, kv->raw, 4);
        *out = v;
        return true;
    }
    if (kv->type == GGUF_F64) {
        memcpy(out, kv->raw, 8);
        return true;
    }
    int64_t v;
    if (kv->type == GGUF_BOOL || !gguf_kv_get_i64(f, i, &v)) return false;
    if (v > (1ll << 53) || v < -(1ll << 53)) return false;
    *out = (double)v;
    return true;
}

/* A bool, or an integer that is 0 or 1. */
bool gguf_kv_get_bool(const gguf_file *f, int64_t i, bool *out) {
    const gguf_kv *kv = kv_at(f, i);
    if (!kv) return false;
    if (kv->type == GGUF_BOOL) {
        *out = kv->raw[0] != 0;
        return true;
    }
    int64_t v;
    if (!gguf_kv_get_i64(f, i, &v) || (v != 0 && v != 1)) return false;
    *out = v == 1;
    return true;
}

bool gguf_kv_get_str(const gguf_file *f, int64_t i, gguf_str *out) {
    const gguf_kv *kv = kv_at(f, i);
    if (!kv || kv->type != GGUF_STRING) return false;
    *out = kv->str;
    return true;
}

gguf_type gguf_kv_arr_type(const gguf_file *f, int64_t i) {
    const gguf_kv *kv = kv_at(f, i);
    return (kv && kv->type == GGUF_ARRAY) ? kv->arr_type : GGUF_TYPE_COUNT;
}

uint64_t gguf_kv_arr_n(const gguf_file *f, int64_t i) {
    const gguf_kv *kv = kv_at(f, i);
    return (kv && kv->type == GGUF_ARRAY) ? kv->arr_n : 0;
}

const void *gguf_kv_arr_data(const gguf_file *f, int64_t i) {
    const gguf_kv *kv = kv_at(f, i);
    if (!kv || kv->type != GGUF_ARRAY || kv->arr_type == GGUF_STRING) return NULL;
    return kv->arr_data;
}

gguf_str gguf_kv_arr_str(const gguf_file *f, int64_t i, uint64_t j) {
    const gguf_kv *kv = kv_at(f, i);
    if (!kv || kv->type != GGUF_ARRAY || kv->arr_type != GGUF_STRING || j >= kv->arr_n)
        return (gguf_str){"", 0};
    const uint8_t *p = f->base + kv->arr_str_off[j];
    return (gguf_str){(const char *)p + 8, rd_u64(p)};
}

/* ---- by key name -------------------------------------------------------- */

bool gguf_get_i64(const gguf_file *f, const char *key, int64_t def, int64_t *out) {
    *out = def;
    int64_t v;
    if (!gguf_kv_get_i64(f, gguf_find_key(f, key), &v)) return false;
    *out = v;
    return true;
}

bool gguf_get_f64(const gguf_file *f, const char *key, double def, double *out) {
    *out = def;
    double v;
    if (!gguf_kv_get_f64(f, gguf_find_key(f, key), &v)) return false;
    *out = v;
    return true;
}

bool gguf_get_bool(const gguf_file *f, const char *key, bool def, bool *out) {
    *out = def;
    bool v;
    if (!gguf_kv_get_bool(f, gguf_find_key(f, key), &v)) return false;
    *out = v;
    return true;
}

bool gguf_get_str(const gguf_file *f, const char *key, char *buf, size_t cap) {
    gguf_str s;
    if (!gguf_kv_get_str(f, gguf_find_key(f, key), &s)) return false;
    if (cap == 0) return true;
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(buf, s.ptr, n);
    buf[n] = 0;
    return true;
}

const char *gguf_type_name(gguf_type t) {
    static const char *const NAMES[GGUF_TYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32",
        "bool", "string", "array", "u64", "i64", "f64",
    };
    return ((unsigned)t < GGUF_TYPE_COUNT) ? NAMES[t] : "unknown";
}

bool gguf_str_eq(gguf_str s, const char *cstr) {
    size_t n = strlen(cstr);
    return s.len == n && memcmp(s.ptr, cstr, n) == 0;
}

/* ---- tensors ------------------------------------------------------------ */

int64_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i) {
    return (i >= 0 && i < f->n_tensors) ? &f->tensors[i] : NULL;
}

const gguf_tensor *gguf_tensor_find(const gguf_file *f, const char *name) {
    int64_t i = index_find(&f->tensor_index, name);
    return i >= 0 ? &f->tensors[i] : NULL;
}

void gguf_hash_tensors(const gguf_file *f, XXH3_state_t *st) {
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        const uint64_t sample = 4096, n = t->n_bytes;
        XXH3_64bits_update(st, t->name.ptr, t->name.len);
        XXH3_64bits_update(st, &t->type, sizeof t->type);
        XXH3_64bits_update(st, t->dims, sizeof t->dims);
        XXH3_64bits_update(st, t->data, n < sample ? n : sample);
        if (n > sample) XXH3_64bits_update(st, (const uint8_t *)t->data + n - sample, sample);
    }
}
