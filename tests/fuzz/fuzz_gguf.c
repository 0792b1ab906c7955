/*
 * fuzz_gguf.c - libFuzzer target: the GGUF reader (gguf_open_buffer) on
 * arbitrary bytes, then every accessor over every key and tensor it
 * validated, so that the reader's invariant (every pointer it hands out
 * lies inside the buffer) is checked by ASan, not just asserted.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

/* Touches every byte of a string so ASan sees an out-of-bounds one. */
static unsigned touch(gguf_str s) {
    unsigned h = 0;
    for (uint64_t i = 0; i < s.len; i++) h += (unsigned char)s.ptr[i];
    return h;
}

static unsigned walk_array(const gguf_file *f, int64_t i) {
    unsigned h = 0;
    uint64_t n = gguf_kv_arr_n(f, i);
    if (gguf_kv_arr_type(f, i) == GGUF_STRING) {
        for (uint64_t j = 0; j < n; j++) h += touch(gguf_kv_arr_str(f, i, j));
    } else if (n > 0) {
        const uint8_t *p = gguf_kv_arr_data(f, i);
        if (p) h += p[0];
    }
    return h;
}

static unsigned walk_kv(const gguf_file *f, int64_t i) {
    unsigned h = touch(gguf_kv_key(f, i));
    int64_t vi;
    double vf;
    bool vb;
    gguf_str vs;
    if (gguf_kv_get_i64(f, i, &vi)) h += (unsigned)vi;
    if (gguf_kv_get_f64(f, i, &vf)) h += vf > 0;
    if (gguf_kv_get_bool(f, i, &vb)) h += vb;
    if (gguf_kv_get_str(f, i, &vs)) h += touch(vs);
    if (gguf_kv_type(f, i) == GGUF_ARRAY) h += walk_array(f, i);
    const void *raw;
    uint64_t n_raw;
    if (gguf_kv_raw(f, i, &raw, &n_raw) && n_raw > 0) h += ((const uint8_t *)raw)[n_raw - 1];
    return h;
}

static unsigned walk_tensor(const gguf_tensor *t) {
    unsigned h = touch(t->name);
    if (t->n_bytes > 0) {
        const uint8_t *p = t->data;
        h += p[0] + p[t->n_bytes - 1];
    }
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kt_error err = {0};
    gguf_file *f = gguf_open_buffer(data, size, "fuzz.gguf", &err);
    if (!f) return 0;
    volatile unsigned sink = gguf_version(f) + (unsigned)gguf_alignment(f);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) sink += walk_kv(f, i);
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) sink += walk_tensor(gguf_tensor_at(f, i));
    sink += gguf_find_key(f, "general.architecture") >= 0;
    sink += gguf_tensor_find(f, "token_embd.weight") != NULL;
    (void)sink;
    gguf_close(f);
    return 0;
}
