/*
 * gguf.h - GGUF files (v2 and v3): a validating reader over mmap, and a
 * streaming writer.
 *
 * Reader invariant: once gguf_open() returns non-NULL, every key, string,
 * array and tensor in the file has been checked against the file size, so
 * callers may use any pointer it hands out without further bounds checks:
 * strings lie inside the mapping, array element counts times element sizes
 * fit in the file, every tensor's offset + size lies inside the data
 * section and is aligned, dims are positive and their product does not
 * overflow, and every tensor type is known with its first dim a multiple of
 * the type's block size. Nothing is copied: tensor data and strings point
 * into the mapping and live until gguf_close().
 *
 * Strings in GGUF are not NUL-terminated: they are (ptr, len) pairs here.
 */
#ifndef KT_GGUF_H
#define KT_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <xxhash.h>

#include "base/dtype.h"
#include "kettle.h"

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

typedef enum gguf_type {
    GGUF_U8 = 0,
    GGUF_I8 = 1,
    GGUF_U16 = 2,
    GGUF_I16 = 3,
    GGUF_U32 = 4,
    GGUF_I32 = 5,
    GGUF_F32 = 6,
    GGUF_BOOL = 7,
    GGUF_STRING = 8,
    GGUF_ARRAY = 9,
    GGUF_U64 = 10,
    GGUF_I64 = 11,
    GGUF_F64 = 12,
    GGUF_TYPE_COUNT = 13
} gguf_type;

typedef struct gguf_str {
    const char *ptr; /* not NUL-terminated */
    uint64_t len;
} gguf_str;

typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;
    int64_t dims[GGUF_MAX_DIMS]; /* dims[0] is contiguous; unused dims = 1 */
    kt_dtype type;
    uint64_t offset;     /* relative to the data section */
    uint64_t n_bytes;    /* computed from dims and type */
    const void *data;    /* inside the mapping */
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Opens, maps and validates the whole file. Errors name the file and the
 * problem ("x.gguf: tensor 'blk.0.attn_q.weight': data [100, 4196) past end
 * of file (size 4000)"). */
gguf_file *gguf_open(const char *path, kt_error *err);
/* How gguf_open_mode brings the file into memory:
 *   MAP       mmap, pages faulted in on first use (zero-copy; the default)
 *   POPULATE  mmap with every page mapped up front: a slower open, but the
 *             first forward pass pays no page faults
 *   COPY      read into anonymous memory backed by huge pages where the
 *             kernel allows: costs a copy at open and memory of the file's
 *             size, and decode of large F16 models reads up to 2x faster
 *             (fewer TLB misses). Never combine with madvise(DONTNEED) on
 *             tensor data: on anonymous memory that discards it. A file
 *             larger than 90% of the memory available (MemAvailable) is
 *             mapped instead (gguf_copy_fits). */
typedef enum gguf_load_mode { GGUF_LOAD_MAP, GGUF_LOAD_POPULATE, GGUF_LOAD_COPY } gguf_load_mode;

gguf_file *gguf_open_mode(const char *path, gguf_load_mode mode, kt_error *err);
/* gguf_open_mode telling `progress` (may be NULL) the bytes a copy has
 * read, as stage "reading" (kettle.h's kt_progress_fn). */
gguf_file *gguf_open_progress(const char *path, gguf_load_mode mode, kt_progress_fn progress, void *user,
                              kt_error *err);

/* Whether a copy of file_bytes fits in available_bytes (with a margin). */
bool gguf_copy_fits(uint64_t file_bytes, uint64_t available_bytes);

/* A copied file (GGUF_LOAD_COPY) made writable, so that the loader can
 * rewrite tensor data in place (weight repacking), then read-only again.
 * False for mapped files and buffers, or if mprotect fails. */
bool gguf_set_writable(gguf_file *f, bool writable);

/* Same over a caller-owned buffer (tests, fuzzing); `name` is used in
 * messages. The buffer must outlive the gguf_file. */
gguf_file *gguf_open_buffer(const void *data, size_t size, const char *name,
                            kt_error *err);
void gguf_close(gguf_file *f);

uint32_t gguf_version(const gguf_file *f);
uint64_t gguf_alignment(const gguf_file *f);
uint64_t gguf_data_offset(const gguf_file *f); /* start of data section */
uint64_t gguf_file_size(const gguf_file *f);

/* ---- metadata ---- */
int64_t gguf_n_kv(const gguf_file *f);
/* Index of key, or -1. */
int64_t gguf_find_key(const gguf_file *f, const char *key);
gguf_str gguf_kv_key(const gguf_file *f, int64_t i);
gguf_type gguf_kv_type(const gguf_file *f, int64_t i);

/* Scalar getters: convert any integer type that holds the value exactly
 * (u8..i64 and bool to integers; f32/f64 to double). Return false if the
 * key's type is not convertible or the value does not fit. */
bool gguf_kv_get_i64(const gguf_file *f, int64_t i, int64_t *out);
bool gguf_kv_get_f64(const gguf_file *f, int64_t i, double *out);
bool gguf_kv_get_bool(const gguf_file *f, int64_t i, bool *out);
bool gguf_kv_get_str(const gguf_file *f, int64_t i, gguf_str *out);

/* Arrays: element type, count, raw little-endian data for numeric element
 * types (NULL for strings and nested arrays), and string elements. */
gguf_type gguf_kv_arr_type(const gguf_file *f, int64_t i);
uint64_t gguf_kv_arr_n(const gguf_file *f, int64_t i);
const void *gguf_kv_arr_data(const gguf_file *f, int64_t i);
gguf_str gguf_kv_arr_str(const gguf_file *f, int64_t i, uint64_t j);

/* Key i's value exactly as encoded in the file: the bytes after its type
 * id (a scalar; a u64 length and the bytes of a string; an array's element
 * type, count and elements). Lets a kv be copied verbatim (see
 * gguf_writer_copy_kv). False if i is out of range. */
bool gguf_kv_raw(const gguf_file *f, int64_t i, const void **data, uint64_t *n_bytes);

/* Convenience by key name, with a default when the key is absent. They
 * return false (and leave *out at the default) if the key is absent or of
 * an incompatible type. */
bool gguf_get_i64(const gguf_file *f, const char *key, int64_t def, int64_t *out);
bool gguf_get_f64(const gguf_file *f, const char *key, double def, double *out);
bool gguf_get_bool(const gguf_file *f, const char *key, bool def, bool *out);
/* Copies the string NUL-terminated into buf (truncating to cap - 1);
 * false if absent or not a string. */
bool gguf_get_str(const gguf_file *f, const char *key, char *buf, size_t cap);

/* Bytes of one value of a scalar type; 0 for STRING, ARRAY and unknown. */
uint64_t gguf_type_size(gguf_type t);
/* Human-readable name of a value type ("u32", "string", "array"). */
const char *gguf_type_name(gguf_type t);
bool gguf_str_eq(gguf_str s, const char *cstr);

/* ---- tensors ---- */
int64_t gguf_n_tensors(const gguf_file *f);
/* Every tensor's name, type, shape and samples of its data (its first
 * and last 4 KiB) into st: what tells two files' weights apart in a
 * fingerprint (another file of the same shapes differs) without reading
 * gigabytes. */
void gguf_hash_tensors(const gguf_file *f, XXH3_state_t *st);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i);
/* NULL if absent. */
const gguf_tensor *gguf_tensor_find(const gguf_file *f, const char *name);

/* ---- writer ----
 *
 * Streaming: add every key and every tensor's description first, then
 * gguf_writer_begin() writes the header and tensor infos, then each
 * tensor's bytes are written in the order the tensors were added with
 * gguf_writer_write_tensor() (so a multi-GB model never needs to be held in
 * memory), then gguf_writer_finish(). Writes version 3, alignment from
 * "general.alignment" if set (u32) else 32.
 *
 * The bytes go to a temporary file beside `path` that gguf_writer_finish()
 * renames to `path`, so `path` never holds a partial file (and may be a file
 * that is still open for reading); gguf_writer_free() before finish, or a
 * failed write, removes the temporary file.
 */
typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(kt_error *err);
void gguf_writer_free(gguf_writer *w);

kt_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v, kt_error *err);
kt_status gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v, kt_error *err);
kt_status gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v, kt_error *err);
kt_status gguf_writer_set_f32(gguf_writer *w, const char *key, float v, kt_error *err);
kt_status gguf_writer_set_bool(gguf_writer *w, const char *key, bool v, kt_error *err);
kt_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *v, kt_error *err);
/* Any scalar type (u8 .. f64 and bool, not STRING/ARRAY): `v` points to
 * one value of that type (bool: a C bool). */
kt_status gguf_writer_set_scalar(gguf_writer *w, const char *key, gguf_type type,
                                 const void *v, kt_error *err);
/* Numeric array: n elements of `type` (not STRING/ARRAY), copied. */
kt_status gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_type type,
                              const void *data, uint64_t n, kt_error *err);
/* String array: n strings given as (ptr, len) pairs, copied. */
kt_status gguf_writer_set_arr_str(gguf_writer *w, const char *key,
                                  const gguf_str *strs, uint64_t n, kt_error *err);
/* Copies key i of f (any type, arrays included) into the writer. */
kt_status gguf_writer_copy_kv(gguf_writer *w, const gguf_file *f, int64_t i, kt_error *err);

/* Declares a tensor; its bytes come later via gguf_writer_write_tensor. */
kt_status gguf_writer_add_tensor(gguf_writer *w, const char *name, kt_dtype type,
                                 uint32_t n_dims, const int64_t *dims, kt_error *err);

kt_status gguf_writer_begin(gguf_writer *w, const char *path, kt_error *err);
/* Writes the next tensor's bytes (exactly its size) and the padding. */
kt_status gguf_writer_write_tensor(gguf_writer *w, const void *data, size_t n_bytes,
                                   kt_error *err);
/* Writes the next n_bytes of the next tensor: a tensor given in parts
 * (their sizes adding up to its size) is padded and done after its last
 * part, so a writer of a large tensor holds only a part in memory. */
kt_status gguf_writer_write_part(gguf_writer *w, const void *data, size_t n_bytes,
                                 kt_error *err);
/* Checks every tensor was written, flushes and closes the file. */
kt_status gguf_writer_finish(gguf_writer *w, kt_error *err);

#endif
