/*
 * test_gguf.c - the GGUF reader and writer (src/gguf).
 *
 * Three kinds of test:
 *  - real files from ../shared (models and vocab-only files): known facts,
 *    and invariants that must hold for every tensor and key;
 *  - writer round trips: every value type, arrays, several tensor types
 *    with a non-default alignment, copying keys (a whole tokenizer) from
 *    another file, and the writer's argument checks;
 *  - hostile files: a small valid file built by hand in a byte buffer with
 *    the position of each interesting field recorded, then corrupted one
 *    field at a time; every prefix of valid files; and byte-flip fuzzing.
 *    Each must fail cleanly with a message naming the file and the problem
 *    (run under ASan to prove nothing reads past the buffer).
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

#include "base/rng.h"
#include "gguf/gguf.h"

/* ---- helpers ------------------------------------------------------------ */

static gguf_file *open_ok(const char *path) {
    kt_error err = {0};
    gguf_file *f = gguf_open(path, &err);
    if (!f) fail_msg("gguf_open(%s): %s", path, err.msg);
    return f;
}

static void assert_contains(const char *msg, const char *word) {
    if (!strstr(msg, word)) fail_msg("message '%s' lacks '%s'", msg, word);
}

static void assert_i64(const gguf_file *f, const char *key, int64_t want) {
    int64_t v = -12345;
    if (!gguf_get_i64(f, key, -1, &v)) fail_msg("key %s: no integer", key);
    assert_int_equal(v, want);
}

static void assert_str(const gguf_file *f, const char *key, const char *want) {
    char buf[256];
    if (!gguf_get_str(f, key, buf, sizeof buf)) fail_msg("key %s: no string", key);
    assert_string_equal(buf, want);
}

static void assert_arr(const gguf_file *f, const char *key, gguf_type t, uint64_t n) {
    int64_t i = gguf_find_key(f, key);
    assert_true(i >= 0);
    assert_int_equal(gguf_kv_type(f, i), GGUF_ARRAY);
    assert_int_equal(gguf_kv_arr_type(f, i), t);
    assert_int_equal(gguf_kv_arr_n(f, i), n);
}

static bool str_is(gguf_str s, const char *p, size_t n) {
    return s.len == n && memcmp(s.ptr, p, n) == 0;
}

static uint64_t pad_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

/* ---- real files --------------------------------------------------------- */

static void test_stories260k(void **state) {
    (void)state;
    gguf_file *f = open_ok(tu_shared("models/stories260K.gguf"));
    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_n_kv(f), 19);
    assert_int_equal(gguf_n_tensors(f), 48);
    assert_int_equal(gguf_alignment(f), 32);
    assert_int_equal(gguf_data_offset(f), 14176);
    assert_int_equal(gguf_file_size(f), 1185376);
    assert_str(f, "general.architecture", "llama");
    assert_str(f, "tokenizer.ggml.model", "llama");
    assert_i64(f, "llama.embedding_length", 64);
    assert_i64(f, "llama.block_count", 5);
    assert_i64(f, "llama.feed_forward_length", 172);
    assert_i64(f, "llama.attention.head_count", 8);
    assert_i64(f, "llama.attention.head_count_kv", 4);
    assert_i64(f, "llama.context_length", 2048);
    assert_i64(f, "tokenizer.ggml.padding_token_id", 4294967295ll);
    double eps = 0;
    assert_true(gguf_get_f64(f, "llama.attention.layer_norm_rms_epsilon", 0, &eps));
    assert_true(fabs(eps - 1e-5) < 1e-10);

    assert_arr(f, "tokenizer.ggml.tokens", GGUF_STRING, 512);
    int64_t tok = gguf_find_key(f, "tokenizer.ggml.tokens");
    assert_true(gguf_str_eq(gguf_kv_arr_str(f, tok, 0), "<unk>"));
    assert_true(gguf_str_eq(gguf_kv_arr_str(f, tok, 1), "<s>"));
    assert_true(gguf_str_eq(gguf_kv_arr_str(f, tok, 3), "<0x00>"));
    assert_null(gguf_kv_arr_data(f, tok));
    assert_arr(f, "tokenizer.ggml.scores", GGUF_F32, 512);
    assert_arr(f, "tokenizer.ggml.token_type", GGUF_I32, 512);
    const int32_t *tt = gguf_kv_arr_data(f, gguf_find_key(f, "tokenizer.ggml.token_type"));
    assert_int_equal(tt[0], 2);
    assert_int_equal(tt[1], 3);
    assert_int_equal(tt[3], 6);

    const gguf_tensor *t = gguf_tensor_find(f, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->dims[0], 64);
    assert_int_equal(t->dims[1], 512);
    assert_int_equal(t->dims[2], 1);
    assert_int_equal(t->type, KT_F32);
    assert_int_equal(t->offset, 0);
    assert_int_equal(t->n_bytes, 64 * 512 * 4);
    t = gguf_tensor_find(f, "blk.4.ffn_norm.weight");
    assert_non_null(t);
    assert_int_equal(t->offset, 1170944);
    assert_int_equal(t->dims[0], 64);
    assert_int_equal(t->n_dims, 1);
    assert_null(gguf_tensor_find(f, "blk.5.ffn_norm.weight"));

    /* Tensor data points at the right bytes of the file. */
    size_t size;
    char *bytes = tu_read_file(tu_shared("models/stories260K.gguf"), &size);
    assert_non_null(bytes);
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        t = gguf_tensor_at(f, i);
        assert_memory_equal(t->data, bytes + 14176 + t->offset, t->n_bytes);
    }
    free(bytes);
    gguf_close(f);
}

static void check_tiny(const char *rel, kt_dtype wtype, int64_t file_type) {
    gguf_file *f = open_ok(tu_shared(rel));
    assert_int_equal(gguf_n_tensors(f), 38);
    assert_str(f, "general.architecture", "llama");
    assert_str(f, "general.name", "test-tiny");
    assert_i64(f, "general.file_type", file_type);
    assert_i64(f, "llama.embedding_length", 256);
    assert_i64(f, "llama.block_count", 4);
    assert_i64(f, "llama.attention.head_count_kv", 2);
    assert_i64(f, "llama.vocab_size", 32000);
    double base = 0;
    assert_true(gguf_get_f64(f, "llama.rope.freq_base", 0, &base));
    assert_true(base == 10000.0);
    bool b = false;
    assert_true(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", false, &b));
    assert_true(b);
    assert_true(gguf_get_bool(f, "tokenizer.ggml.add_eos_token", true, &b));
    assert_false(b);
    assert_arr(f, "tokenizer.ggml.tokens", GGUF_STRING, 32000);
    const gguf_tensor *t = gguf_tensor_find(f, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->type, wtype);
    assert_int_equal(t->dims[0], 256);
    assert_int_equal(t->dims[1], 32000);
    assert_int_equal(t->n_bytes, kt_dtype_row_bytes(wtype, 256) * 32000);
    t = gguf_tensor_find(f, "blk.3.ffn_down.weight");
    assert_non_null(t);
    assert_int_equal(t->type, wtype);
    assert_int_equal(t->dims[0], 704);
    t = gguf_tensor_find(f, "output_norm.weight");
    assert_non_null(t);
    assert_int_equal(t->type, KT_F32);
    gguf_close(f);
}

static void test_tiny_models(void **state) {
    (void)state;
    check_tiny("models/test-tiny-F16.gguf", KT_F16, 1);
    check_tiny("models/test-tiny-Q8_0.gguf", KT_Q8_0, 7);
    check_tiny("models/test-tiny-Q4_0.gguf", KT_Q4_0, 2);
}

/* Invariants every valid file satisfies (the reader's promise). */
static void check_invariants(const gguf_file *f, const uint8_t *base, size_t size) {
    uint64_t a = gguf_alignment(f);
    assert_true(a > 0 && (a & (a - 1)) == 0);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        gguf_str k = gguf_kv_key(f, i);
        assert_true((const uint8_t *)k.ptr >= base && k.len <= size);
        assert_true((const uint8_t *)k.ptr + k.len <= base + size);
        char key[256];
        if (k.len < sizeof key && !memchr(k.ptr, 0, k.len)) {
            memcpy(key, k.ptr, k.len);
            key[k.len] = 0;
            assert_int_equal(gguf_find_key(f, key), i);
        }
        if (gguf_kv_arr_type(f, i) == GGUF_STRING) {
            for (uint64_t j = 0; j < gguf_kv_arr_n(f, i); j++) {
                gguf_str s = gguf_kv_arr_str(f, i, j);
                assert_true((const uint8_t *)s.ptr >= base && s.len <= size);
                assert_true((const uint8_t *)s.ptr + s.len <= base + size);
            }
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        assert_true(t->offset % a == 0);
        assert_true((const uint8_t *)t->data == base + gguf_data_offset(f) + t->offset);
        assert_true(gguf_data_offset(f) + t->offset + t->n_bytes <= size);
        int64_t rows = 1;
        for (int d = 1; d < GGUF_MAX_DIMS; d++) rows *= t->dims[d];
        assert_int_equal(t->n_bytes, kt_dtype_row_bytes(t->type, t->dims[0]) * (uint64_t)rows);
        if (t->name.len < 256 && !memchr(t->name.ptr, 0, t->name.len)) {
            char name[256];
            memcpy(name, t->name.ptr, t->name.len);
            name[t->name.len] = 0;
            assert_ptr_equal(gguf_tensor_find(f, name), t);
        }
    }
}

static const char *const REAL_FILES[] = {
    "models/stories260K.gguf",          "models/test-tiny-F16.gguf",
    "models/test-tiny-Q4_0.gguf",       "models/test-tiny-Q8_0.gguf",
    "vocab/ggml-vocab-bert-bge.gguf",   "vocab/ggml-vocab-deepseek-coder.gguf",
    "vocab/ggml-vocab-gpt-2.gguf",      "vocab/ggml-vocab-llama-spm.gguf",
    "vocab/ggml-vocab-phi-3.gguf",      "vocab/ggml-vocab-starcoder.gguf",
};

/* Every real file opens both mapped and from a buffer, with the same
 * result, and satisfies the invariants; in llama.cpp's files the tensors
 * are packed in order. */
static void test_all_real_files(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof REAL_FILES / sizeof *REAL_FILES; k++) {
        const char *path = tu_shared(REAL_FILES[k]);
        size_t size;
        uint8_t *bytes = (uint8_t *)tu_read_file(path, &size);
        assert_non_null(bytes);
        kt_error err = {0};
        gguf_file *fb = gguf_open_buffer(bytes, size, REAL_FILES[k], &err);
        if (!fb) fail_msg("%s", err.msg);
        check_invariants(fb, bytes, size);
        gguf_file *fm = open_ok(path);
        assert_int_equal(gguf_n_kv(fm), gguf_n_kv(fb));
        assert_int_equal(gguf_n_tensors(fm), gguf_n_tensors(fb));
        assert_int_equal(gguf_data_offset(fm), gguf_data_offset(fb));
        uint64_t expect = 0;
        for (int64_t i = 0; i < gguf_n_tensors(fm); i++) {
            const gguf_tensor *tm = gguf_tensor_at(fm, i), *tb = gguf_tensor_at(fb, i);
            assert_int_equal(tm->offset, expect);
            expect += pad_up(tm->n_bytes, gguf_alignment(fm));
            assert_memory_equal(tm->data, tb->data, tm->n_bytes);
        }
        gguf_close(fm);
        gguf_close(fb);
        free(bytes);
    }
}

static void test_vocab_files(void **state) {
    (void)state;
    static const struct {
        const char *file, *arch, *model, *first;
        uint64_t n_tokens, n_merges;
    } V[] = {
        {"vocab/ggml-vocab-gpt-2.gguf", "gpt2", "gpt2", "!", 50257, 50000},
        {"vocab/ggml-vocab-bert-bge.gguf", "bert", "bert", "[PAD]", 30522, 0},
        {"vocab/ggml-vocab-llama-spm.gguf", "llama", "llama", "<unk>", 32000, 0},
        {"vocab/ggml-vocab-deepseek-coder.gguf", "llama", "gpt2", "!", 32256, 31757},
        {"vocab/ggml-vocab-starcoder.gguf", "starcoder2", "gpt2", "<|endoftext|>", 49152, 48872},
    };
    for (size_t k = 0; k < sizeof V / sizeof *V; k++) {
        gguf_file *f = open_ok(tu_shared(V[k].file));
        assert_int_equal(gguf_n_tensors(f), 0);
        assert_str(f, "general.architecture", V[k].arch);
        assert_str(f, "tokenizer.ggml.model", V[k].model);
        assert_arr(f, "tokenizer.ggml.tokens", GGUF_STRING, V[k].n_tokens);
        int64_t i = gguf_find_key(f, "tokenizer.ggml.tokens");
        assert_true(gguf_str_eq(gguf_kv_arr_str(f, i, 0), V[k].first));
        if (V[k].n_merges) assert_arr(f, "tokenizer.ggml.merges", GGUF_STRING, V[k].n_merges);
        gguf_close(f);
    }
    gguf_file *f = open_ok(tu_shared("vocab/ggml-vocab-gpt-2.gguf"));
    int64_t m = gguf_find_key(f, "tokenizer.ggml.merges");
    assert_true(gguf_str_eq(gguf_kv_arr_str(f, m, 0), "\xc4\xa0 t")); /* "Ġ t" */
    assert_true(gguf_str_eq(gguf_kv_arr_str(f, m, 1), "\xc4\xa0 a"));
    gguf_close(f);
    f = open_ok(tu_shared("vocab/ggml-vocab-phi-3.gguf"));
    char buf[16];
    assert_true(gguf_get_str(f, "tokenizer.chat_template", buf, sizeof buf));
    assert_string_equal(buf, "{{ bos_token }}"); /* truncated to 15 bytes */
    assert_i64(f, "tokenizer.ggml.eos_token_id", 32000);
    gguf_close(f);
}

static void test_lookup_misses(void **state) {
    (void)state;
    gguf_file *f = open_ok(tu_shared("models/stories260K.gguf"));
    assert_int_equal(gguf_find_key(f, "no.such.key"), -1);
    assert_int_equal(gguf_find_key(f, ""), -1);
    assert_null(gguf_tensor_find(f, "no_such_tensor"));
    assert_null(gguf_tensor_at(f, -1));
    assert_null(gguf_tensor_at(f, 48));
    int64_t v = 0;
    assert_false(gguf_get_i64(f, "no.such.key", 7, &v));
    assert_int_equal(v, 7);
    assert_false(gguf_get_i64(f, "general.architecture", 9, &v)); /* a string */
    assert_int_equal(v, 9);
    double d = 0;
    assert_false(gguf_get_f64(f, "general.architecture", 2.5, &d));
    assert_true(d == 2.5);
    assert_true(gguf_get_f64(f, "llama.block_count", 0, &d)); /* u32 -> double */
    assert_true(d == 5.0);
    bool b = true;
    assert_false(gguf_get_bool(f, "llama.block_count", true, &b)); /* 5: no bool */
    assert_true(b);
    char buf[8] = "x";
    assert_false(gguf_get_str(f, "llama.block_count", buf, sizeof buf));
    assert_false(gguf_get_str(f, "no.such.key", buf, sizeof buf));
    assert_int_equal(gguf_kv_type(f, 19), GGUF_TYPE_COUNT);
    assert_int_equal(gguf_kv_type(f, -1), GGUF_TYPE_COUNT);
    assert_int_equal(gguf_kv_key(f, 99).len, 0);
    assert_int_equal(gguf_kv_arr_n(f, gguf_find_key(f, "llama.block_count")), 0);
    int64_t tok = gguf_find_key(f, "tokenizer.ggml.tokens");
    assert_int_equal(gguf_kv_arr_str(f, tok, 512).len, 0);
    assert_false(gguf_kv_get_i64(f, tok, &v));
    assert_string_equal(gguf_type_name(GGUF_U32), "u32");
    assert_string_equal(gguf_type_name(GGUF_ARRAY), "array");
    assert_string_equal(gguf_type_name(GGUF_STRING), "string");
    assert_string_equal(gguf_type_name((gguf_type)77), "unknown");
    gguf_close(f);
}

static void test_open_errors(void **state) {
    (void)state;
    kt_error err = {0};
    assert_null(gguf_open(tu_tmp("does-not-exist.gguf"), &err));
    assert_int_equal(err.status, KT_ERR_IO);
    assert_contains(err.msg, "does-not-exist.gguf");
    assert_null(gguf_open(tu_shared("models"), &err));
    assert_int_equal(err.status, KT_ERR_IO);
    assert_contains(err.msg, "not a regular file");
    const char *empty = tu_tmp("empty.gguf");
    assert_int_equal(tu_write_file(empty, "", 0), 0);
    assert_null(gguf_open(empty, &err));
    assert_int_equal(err.status, KT_ERR_FORMAT);
    assert_contains(err.msg, "empty.gguf: truncated");
    assert_null(gguf_open(tu_shared("models/stories260K.bin"), &err));
    assert_int_equal(err.status, KT_ERR_FORMAT);
    assert_contains(err.msg, "magic");
    assert_null(gguf_open_buffer(NULL, 0, "nothing", &err));
    assert_string_equal(err.msg, "nothing: truncated: 0 bytes is too short for a GGUF header");
    unlink(tu_tmp("empty.gguf"));
}

/* ---- writer round trip -------------------------------------------------- */

typedef struct scalar_case {
    const char *key;
    gguf_type type;
    uint8_t bytes[8];
} scalar_case;

static void fill_scalars(scalar_case *c) {
    uint8_t u8 = 200; int8_t i8 = -100; uint16_t u16 = 60000; int16_t i16 = -30000;
    uint32_t u32 = 4000000000u; int32_t i32 = -2000000000; float f32 = 1.5f;
    uint64_t u64 = UINT64_MAX; int64_t i64 = INT64_MIN; double f64 = 3.141592653589793;
    bool bl = true;
    const void *vals[] = {&u8, &i8, &u16, &i16, &u32, &i32, &f32, &bl, &u64, &i64, &f64};
    const gguf_type types[] = {GGUF_U8, GGUF_I8, GGUF_U16, GGUF_I16, GGUF_U32, GGUF_I32,
                               GGUF_F32, GGUF_BOOL, GGUF_U64, GGUF_I64, GGUF_F64};
    const size_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 8, 8};
    static char keys[11][32];
    for (int i = 0; i < 11; i++) {
        snprintf(keys[i], sizeof keys[i], "s.%s", gguf_type_name(types[i]));
        c[i].key = keys[i];
        c[i].type = types[i];
        memset(c[i].bytes, 0, 8);
        memcpy(c[i].bytes, vals[i], sizes[i]);
    }
}

typedef struct tensor_case {
    const char *name;
    kt_dtype type;
    uint32_t n_dims;
    int64_t dims[4];
} tensor_case;

static const tensor_case TENSORS[] = {
    {"t.f32", KT_F32, 2, {7, 3}},        {"t.f16", KT_F16, 1, {5}},
    {"t.q4_0", KT_Q4_0, 2, {64, 2}},     {"t.q8_0", KT_Q8_0, 3, {32, 3, 2}},
    {"t.q4_k", KT_Q4_K, 1, {256}},       {"t.i8", KT_I8, 4, {3, 1, 1, 2}},
    {"t.bf16", KT_BF16, 4, {1, 1, 1, 9}},
};
#define N_TENSORS (sizeof TENSORS / sizeof *TENSORS)

static uint8_t *tensor_bytes(int i, size_t *n) {
    const tensor_case *t = &TENSORS[i];
    int64_t rows = 1;
    for (uint32_t d = 1; d < t->n_dims; d++) rows *= t->dims[d];
    *n = kt_dtype_row_bytes(t->type, t->dims[0]) * (size_t)rows;
    uint8_t *p = malloc(*n);
    kt_rng r;
    kt_rng_seed(&r, 100 + (uint64_t)i);
    for (size_t j = 0; j < *n; j++) p[j] = (uint8_t)kt_rng_u64(&r);
    return p;
}

/* Asserts a writer call succeeds; the call passes `&e_`, a kt_error the
 * caller has in scope, whose message is shown on failure. */
#define OK(call) do { if ((call) != KT_OK) fail_msg("%s: %s", #call, e_.msg); } while (0)

static const gguf_str STRS[] = {{"", 0}, {"a", 1}, {"\xc4\xa0 t", 4}, {"x\0y", 3}};

/* Writes every value type and the TENSORS with alignment 64. */
static void write_roundtrip(const char *path) {
    kt_error e_ = {0};
    gguf_writer *w = gguf_writer_new(&e_);
    assert_non_null(w);
    scalar_case sc[11];
    fill_scalars(sc);
    OK(gguf_writer_set_str(w, "general.architecture", "test", &e_));
    OK(gguf_writer_set_u32(w, "general.alignment", 64, &e_));
    for (int i = 0; i < 11; i++)
        OK(gguf_writer_set_scalar(w, sc[i].key, sc[i].type, sc[i].bytes, &e_));
    OK(gguf_writer_set_u32(w, "w.u32", 123456789u, &e_));
    OK(gguf_writer_set_i32(w, "w.i32", -5, &e_));
    OK(gguf_writer_set_u64(w, "w.u64", 1ull << 40, &e_));
    OK(gguf_writer_set_f32(w, "w.f32", -0.25f, &e_));
    OK(gguf_writer_set_bool(w, "w.bool", false, &e_));
    OK(gguf_writer_set_str(w, "w.str", "hello, world", &e_));
    OK(gguf_writer_set_str(w, "w.empty", "", &e_));
    OK(gguf_writer_set_u32(w, "w.replace", 1, &e_));
    OK(gguf_writer_set_u32(w, "w.after", 2, &e_));
    OK(gguf_writer_set_str(w, "w.replace", "two", &e_)); /* replaces, keeps its place */
    uint8_t arr[5 * 8];
    for (int i = 0; i < (int)sizeof arr; i++) arr[i] = (uint8_t)(i * 37 + 1);
    for (int i = 0; i < 11; i++) {
        char key[32];
        snprintf(key, sizeof key, "a.%s", gguf_type_name(sc[i].type));
        if (sc[i].type == GGUF_BOOL) {
            bool bools[5] = {true, false, true, true, false};
            OK(gguf_writer_set_arr(w, key, GGUF_BOOL, bools, 5, &e_));
        } else {
            OK(gguf_writer_set_arr(w, key, sc[i].type, arr, 5, &e_));
        }
    }
    OK(gguf_writer_set_arr(w, "a.empty", GGUF_U32, NULL, 0, &e_));
    OK(gguf_writer_set_arr_str(w, "a.str", STRS, 4, &e_));
    OK(gguf_writer_set_arr_str(w, "a.str_empty", NULL, 0, &e_));
    for (size_t i = 0; i < N_TENSORS; i++)
        OK(gguf_writer_add_tensor(w, TENSORS[i].name, TENSORS[i].type, TENSORS[i].n_dims,
                                  TENSORS[i].dims, &e_));
    OK(gguf_writer_begin(w, path, &e_));
    for (size_t i = 0; i < N_TENSORS; i++) {
        size_t n;
        uint8_t *p = tensor_bytes((int)i, &n);
        OK(gguf_writer_write_tensor(w, p, n, &e_));
        free(p);
    }
    OK(gguf_writer_finish(w, &e_));
    gguf_writer_free(w);
}

static void check_roundtrip_kvs(const gguf_file *f) {
    scalar_case sc[11];
    fill_scalars(sc);
    assert_int_equal(gguf_n_kv(f), 2 + 11 + 9 + 11 + 3);
    for (int i = 0; i < 11; i++) {
        int64_t k = gguf_find_key(f, sc[i].key);
        assert_true(k >= 0);
        assert_int_equal(gguf_kv_type(f, k), sc[i].type);
        const void *raw;
        uint64_t n;
        assert_true(gguf_kv_raw(f, k, &raw, &n));
        assert_memory_equal(raw, sc[i].bytes, n);
    }
    assert_i64(f, "s.u8", 200);
    assert_i64(f, "s.i8", -100);
    assert_i64(f, "s.u16", 60000);
    assert_i64(f, "s.i16", -30000);
    assert_i64(f, "s.u32", 4000000000ll);
    assert_i64(f, "s.i32", -2000000000ll);
    assert_i64(f, "s.i64", INT64_MIN);
    assert_i64(f, "s.bool", 1);
    int64_t v;
    assert_false(gguf_get_i64(f, "s.u64", 0, &v)); /* UINT64_MAX does not fit */
    assert_false(gguf_get_i64(f, "s.f32", 0, &v));
    double d;
    assert_true(gguf_get_f64(f, "s.f32", 0, &d) && d == 1.5);
    assert_true(gguf_get_f64(f, "s.f64", 0, &d) && d == 3.141592653589793);
    assert_false(gguf_get_f64(f, "s.u64", 0, &d)); /* not exact as a double */
    assert_false(gguf_get_f64(f, "s.bool", 0, &d));
    bool b = false;
    assert_true(gguf_get_bool(f, "s.bool", false, &b) && b);
    assert_true(gguf_get_bool(f, "w.bool", true, &b) && !b);
    assert_i64(f, "w.u32", 123456789);
    assert_i64(f, "w.i32", -5);
    assert_i64(f, "w.u64", 1ll << 40);
    assert_true(gguf_get_f64(f, "w.f32", 0, &d) && d == -0.25);
    assert_str(f, "w.str", "hello, world");
    assert_str(f, "w.empty", "");
    assert_str(f, "w.replace", "two");
    assert_true(gguf_find_key(f, "w.replace") < gguf_find_key(f, "w.after"));
    assert_i64(f, "general.alignment", 64);
}

static void check_roundtrip_arrays(const gguf_file *f) {
    scalar_case sc[11];
    fill_scalars(sc);
    static const uint64_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 8, 8};
    uint8_t arr[5 * 8];
    for (int i = 0; i < (int)sizeof arr; i++) arr[i] = (uint8_t)(i * 37 + 1);
    for (int i = 0; i < 11; i++) {
        char key[32];
        snprintf(key, sizeof key, "a.%s", gguf_type_name(sc[i].type));
        assert_arr(f, key, sc[i].type, 5);
        const uint8_t *p = gguf_kv_arr_data(f, gguf_find_key(f, key));
        assert_non_null(p);
        if (sc[i].type == GGUF_BOOL) {
            static const uint8_t want[5] = {1, 0, 1, 1, 0};
            assert_memory_equal(p, want, 5);
        } else {
            assert_memory_equal(p, arr, 5 * sizes[i]);
        }
    }
    assert_arr(f, "a.empty", GGUF_U32, 0);
    assert_arr(f, "a.str_empty", GGUF_STRING, 0);
    assert_arr(f, "a.str", GGUF_STRING, 4);
    int64_t k = gguf_find_key(f, "a.str");
    for (uint64_t j = 0; j < 4; j++) {
        gguf_str s = gguf_kv_arr_str(f, k, j);
        assert_true(str_is(s, STRS[j].ptr, STRS[j].len));
    }
}

static void check_roundtrip_tensors(const gguf_file *f) {
    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_alignment(f), 64);
    assert_int_equal(gguf_data_offset(f) % 64, 0);
    assert_int_equal(gguf_n_tensors(f), N_TENSORS);
    uint64_t off = 0;
    for (size_t i = 0; i < N_TENSORS; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, (int64_t)i);
        assert_ptr_equal(gguf_tensor_find(f, TENSORS[i].name), t);
        assert_true(gguf_str_eq(t->name, TENSORS[i].name));
        assert_int_equal(t->type, TENSORS[i].type);
        assert_int_equal(t->n_dims, TENSORS[i].n_dims);
        for (uint32_t d = 0; d < 4; d++)
            assert_int_equal(t->dims[d], d < t->n_dims ? TENSORS[i].dims[d] : 1);
        assert_int_equal(t->offset, off); /* packed in order, as llama.cpp wants */
        size_t n;
        uint8_t *p = tensor_bytes((int)i, &n);
        assert_int_equal(t->n_bytes, n);
        assert_memory_equal(t->data, p, n);
        free(p);
        off += pad_up(n, 64);
    }
    assert_int_equal(gguf_file_size(f), gguf_data_offset(f) + off);
}

static void test_writer_roundtrip(void **state) {
    (void)state;
    const char *path = tu_tmp("roundtrip.gguf");
    write_roundtrip(path);
    gguf_file *f = open_ok(path);
    size_t size;
    uint8_t *bytes = (uint8_t *)tu_read_file(path, &size);
    assert_non_null(bytes);
    gguf_file *fb = gguf_open_buffer(bytes, size, "roundtrip", NULL);
    assert_non_null(fb);
    check_invariants(fb, bytes, size);
    gguf_close(fb);
    free(bytes);
    check_roundtrip_kvs(f);
    check_roundtrip_arrays(f);
    check_roundtrip_tensors(f);
    gguf_close(f);
    unlink(path);
}

/* Copying every key of a file reproduces each value byte for byte; a
 * tokenizer copied into a model file reads back identically. */
static void test_copy_kv(void **state) {
    (void)state;
    gguf_file *src = open_ok(tu_shared("vocab/ggml-vocab-llama-spm.gguf"));
    const char *path = tu_tmp("copy.gguf");
    kt_error e_ = {0};
    gguf_writer *w = gguf_writer_new(&e_);
    assert_non_null(w);
    OK(gguf_writer_set_str(w, "tokenizer.ggml.model", "placeholder", &e_));
    for (int64_t i = 0; i < gguf_n_kv(src); i++) OK(gguf_writer_copy_kv(w, src, i, &e_));
    int64_t dims[1] = {4};
    OK(gguf_writer_add_tensor(w, "x", KT_F32, 1, dims, &e_));
    OK(gguf_writer_begin(w, path, &e_));
    float x[4] = {1, 2, 3, 4};
    OK(gguf_writer_write_tensor(w, x, sizeof x, &e_));
    OK(gguf_writer_finish(w, &e_));
    gguf_writer_free(w);

    gguf_file *dst = open_ok(path);
    assert_int_equal(gguf_n_kv(dst), gguf_n_kv(src));
    assert_int_equal(gguf_find_key(dst, "tokenizer.ggml.model"), 0); /* replaced in place */
    for (int64_t i = 0; i < gguf_n_kv(src); i++) {
        gguf_str k = gguf_kv_key(src, i);
        char key[128];
        memcpy(key, k.ptr, k.len);
        key[k.len] = 0;
        int64_t j = gguf_find_key(dst, key);
        assert_true(j >= 0);
        assert_int_equal(gguf_kv_type(dst, j), gguf_kv_type(src, i));
        const void *a, *b;
        uint64_t na, nb;
        assert_true(gguf_kv_raw(src, i, &a, &na) && gguf_kv_raw(dst, j, &b, &nb));
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, na);
    }
    int64_t ts = gguf_find_key(src, "tokenizer.ggml.tokens");
    int64_t td = gguf_find_key(dst, "tokenizer.ggml.tokens");
    assert_int_equal(gguf_kv_arr_n(dst, td), 32000);
    for (uint64_t j = 0; j < 32000; j++) {
        gguf_str s = gguf_kv_arr_str(src, ts, j), d = gguf_kv_arr_str(dst, td, j);
        assert_true(str_is(d, s.ptr, s.len));
    }
    assert_memory_equal(gguf_tensor_find(dst, "x")->data, x, sizeof x);
    gguf_close(dst);
    gguf_close(src);
    unlink(path);
}

static void expect_arg(kt_status st, const kt_error *err, const char *word) {
    assert_int_equal(st, KT_ERR_ARG);
    assert_contains(err->msg, word);
}

static void test_writer_arg_errors(void **state) {
    (void)state;
    kt_error err = {0};
    gguf_writer *w = gguf_writer_new(&err);
    assert_non_null(w);
    expect_arg(gguf_writer_set_u32(w, "general.alignment", 3, &err), &err, "power of two");
    expect_arg(gguf_writer_set_u32(w, "general.alignment", 0, &err), &err, "power of two");
    expect_arg(gguf_writer_set_i32(w, "general.alignment", 32, &err), &err, "u32");
    expect_arg(gguf_writer_set_u32(w, "", 1, &err), &err, "empty key");
    expect_arg(gguf_writer_set_arr(w, "a", GGUF_STRING, "x", 1, &err), &err, "array");
    expect_arg(gguf_writer_set_scalar(w, "a", GGUF_ARRAY, "x", &err), &err, "scalar");
    int64_t d4[4] = {32, 2, 1, 1}, d0[2] = {0, 4}, dbig[2] = {1ll << 32, 1ll << 32};
    int64_t d33[1] = {33};
    expect_arg(gguf_writer_add_tensor(w, "t", (kt_dtype)4, 1, d4, &err), &err, "unknown type");
    /* kettle's in-memory layouts never reach a file */
    expect_arg(gguf_writer_add_tensor(w, "t", KT_Q4_0_X8, 1, d4, &err), &err, "unknown type");
    expect_arg(gguf_writer_add_tensor(w, "t", KT_F32, 0, d4, &err), &err, "n_dims");
    expect_arg(gguf_writer_add_tensor(w, "t", KT_F32, 5, d4, &err), &err, "n_dims");
    expect_arg(gguf_writer_add_tensor(w, "t", KT_F32, 2, d0, &err), &err, "dim 0");
    expect_arg(gguf_writer_add_tensor(w, "t", KT_F32, 2, dbig, &err), &err, "overflow");
    expect_arg(gguf_writer_add_tensor(w, "t", KT_Q4_0, 1, d33, &err), &err, "block size");
    char long_name[80];
    memset(long_name, 'n', 64);
    long_name[64] = 0;
    expect_arg(gguf_writer_add_tensor(w, long_name, KT_F32, 1, d4, &err), &err, "longer");
    assert_int_equal(gguf_writer_add_tensor(w, "t", KT_F32, 1, d4, &err), KT_OK);
    expect_arg(gguf_writer_add_tensor(w, "t", KT_F32, 1, d4, &err), &err, "duplicate");
    assert_int_equal(gguf_writer_add_tensor(w, "p", KT_F32, 2, d4, &err), KT_OK); /* written in parts */
    assert_int_equal(gguf_writer_finish(w, &err), KT_ERR_ARG);

    const char *path = tu_tmp("args.gguf");
    assert_int_equal(gguf_writer_begin(w, path, &err), KT_OK);
    expect_arg(gguf_writer_set_u32(w, "late", 1, &err), &err, "after gguf_writer_begin");
    expect_arg(gguf_writer_add_tensor(w, "u", KT_F32, 1, d4, &err), &err, "after");
    expect_arg(gguf_writer_finish(w, &err), &err, "only 0 of 2 tensors");
    float data[32] = {0}, parts[64];
    for (int i = 0; i < 64; i++) parts[i] = (float)i;
    expect_arg(gguf_writer_write_tensor(w, data, 100, &err), &err, "expected 128");
    assert_int_equal(gguf_writer_write_tensor(w, data, sizeof data, &err), KT_OK);
    /* "p" (256 bytes) in parts: 100, then 156; a whole write or too many
     * bytes in the middle refused, finish refused until the last part */
    assert_int_equal(gguf_writer_write_part(w, parts, 100, &err), KT_OK);
    expect_arg(gguf_writer_write_tensor(w, parts, sizeof parts, &err), &err, "given by write_part");
    expect_arg(gguf_writer_write_part(w, parts, 157, &err), &err, "157 more bytes given after 100");
    expect_arg(gguf_writer_finish(w, &err), &err, "only 1 of 2 tensors");
    assert_int_equal(gguf_writer_write_part(w, (const char *)parts + 100, 156, &err), KT_OK);
    expect_arg(gguf_writer_write_part(w, data, 4, &err), &err, "already written");
    assert_int_equal(gguf_writer_finish(w, &err), KT_OK);
    gguf_writer_free(w);
    gguf_file *f = open_ok(path);
    assert_int_equal(gguf_n_tensors(f), 2);
    const gguf_tensor *pt = gguf_tensor_find(f, "p");
    assert_true(pt && pt->n_bytes == sizeof parts && memcmp(pt->data, parts, sizeof parts) == 0);
    gguf_close(f);
    unlink(path);
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* A writer dropped before finish leaves no file behind; a bad directory is
 * an I/O error naming the path. */
static void test_writer_io(void **state) {
    (void)state;
    kt_error err = {0};
    gguf_writer *w = gguf_writer_new(&err);
    int64_t dims[1] = {8};
    assert_int_equal(gguf_writer_add_tensor(w, "t", KT_F32, 1, dims, &err), KT_OK);
    const char *bad = tu_tmp("no-such-dir/x.gguf");
    assert_int_equal(gguf_writer_begin(w, bad, &err), KT_ERR_IO);
    assert_contains(err.msg, "no-such-dir/x.gguf");
    gguf_writer_free(w);

    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s", tu_tmp("abandoned.gguf"));
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    unlink(path);
    w = gguf_writer_new(&err);
    assert_int_equal(gguf_writer_add_tensor(w, "t", KT_F32, 1, dims, &err), KT_OK);
    assert_int_equal(gguf_writer_begin(w, path, &err), KT_OK);
    assert_true(exists(tmp));
    assert_false(exists(path));
    gguf_writer_free(w);
    assert_false(exists(tmp));
    assert_false(exists(path));
}

/* Rewriting a file that is open for reading leaves the open mapping intact
 * (the writer renames a new file into place). */
static void test_writer_replaces_open_file(void **state) {
    (void)state;
    const char *p = tu_tmp("replace.gguf");
    char path[4096];
    snprintf(path, sizeof path, "%s", p);
    float v1[8] = {1, 2, 3, 4, 5, 6, 7, 8}, v2[8] = {9, 9, 9, 9, 9, 9, 9, 9};
    int64_t dims[1] = {8};
    for (int round = 0; round < 2; round++) {
        kt_error e_ = {0};
        gguf_file *old = round ? open_ok(path) : NULL;
        gguf_writer *w = gguf_writer_new(&e_);
        OK(gguf_writer_add_tensor(w, "t", KT_F32, 1, dims, &e_));
        OK(gguf_writer_begin(w, path, &e_));
        OK(gguf_writer_write_tensor(w, round ? v2 : v1, sizeof v1, &e_));
        OK(gguf_writer_finish(w, &e_));
        gguf_writer_free(w);
        if (old) {
            assert_memory_equal(gguf_tensor_find(old, "t")->data, v1, sizeof v1);
            gguf_close(old);
        }
    }
    gguf_file *f = open_ok(path);
    assert_memory_equal(gguf_tensor_find(f, "t")->data, v2, sizeof v2);
    gguf_close(f);
    unlink(path);
}

/* ---- hostile files ------------------------------------------------------ */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void b_put(buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void b_u8(buf *b, uint8_t v) { b_put(b, &v, 1); }
static void b_u32(buf *b, uint32_t v) { b_put(b, &v, 4); }
static void b_u64(buf *b, uint64_t v) { b_put(b, &v, 8); }
static void b_str(buf *b, const char *s) { b_u64(b, strlen(s)); b_put(b, s, strlen(s)); }
static void b_pad(buf *b) { while (b->n % 32) b_u8(b, 0); }

/* A small valid v3 file and where its fields are. */
typedef struct hfile {
    buf b;
    size_t version, n_tensors, n_kv, key0_len, align_type, align_val, name_len, u32_type;
    size_t kb_name, bool_val, arr_type, arr_n;
    size_t t0_ndims, t0_dim0, t0_dim1, t0_type, t1_name, t1_offset;
    size_t data_start, data_end;
} hfile;

static void build_kvs(hfile *h) {
    buf *b = &h->b;
    h->key0_len = b->n;
    b_str(b, "general.alignment");
    h->align_type = b->n;
    b_u32(b, GGUF_U32);
    h->align_val = b->n;
    b_u32(b, 32);
    b_str(b, "general.name");
    b_u32(b, GGUF_STRING);
    h->name_len = b->n;
    b_str(b, "hostile");
    b_str(b, "k.u32");
    h->u32_type = b->n;
    b_u32(b, GGUF_U32);
    b_u32(b, 7);
    b_str(b, "k.ka");
    b_u32(b, GGUF_U8);
    b_u8(b, 1);
    h->kb_name = b->n + 8;
    b_str(b, "k.kb");
    b_u32(b, GGUF_I8);
    b_u8(b, 0xff);
    b_str(b, "k.bool");
    b_u32(b, GGUF_BOOL);
    h->bool_val = b->n;
    b_u8(b, 1);
    b_str(b, "k.arr");
    b_u32(b, GGUF_ARRAY);
    h->arr_type = b->n;
    b_u32(b, GGUF_STRING);
    h->arr_n = b->n;
    b_u64(b, 3);
    b_str(b, "x");
    b_str(b, "yz");
    b_str(b, "");
}

static void build_hostile(hfile *h) {
    memset(h, 0, sizeof *h);
    buf *b = &h->b;
    b_put(b, "GGUF", 4);
    h->version = b->n;
    b_u32(b, 3);
    h->n_tensors = b->n;
    b_u64(b, 2);
    h->n_kv = b->n;
    b_u64(b, 7);
    build_kvs(h);
    b_str(b, "t.a"); /* F32 [8, 2] at 0: 64 bytes */
    h->t0_ndims = b->n;
    b_u32(b, 2);
    h->t0_dim0 = b->n;
    b_u64(b, 8);
    h->t0_dim1 = b->n;
    b_u64(b, 2);
    h->t0_type = b->n;
    b_u32(b, KT_F32);
    b_u64(b, 0);
    h->t1_name = b->n + 8; /* F32 [4] at 64: 16 bytes */
    b_str(b, "t.b");
    b_u32(b, 1);
    b_u64(b, 4);
    b_u32(b, KT_F32);
    h->t1_offset = b->n;
    b_u64(b, 64);
    b_pad(b);
    h->data_start = b->n;
    for (int i = 0; i < 20; i++) {
        float v = (float)i;
        b_put(b, &v, 4);
    }
    h->data_end = b->n;
    b_pad(b);
}

static void put32(hfile *h, size_t at, uint32_t v) { memcpy(h->b.p + at, &v, 4); }
static void put64(hfile *h, size_t at, uint64_t v) { memcpy(h->b.p + at, &v, 8); }

/* Opens an exact-size copy of the first n bytes (so ASan sees any
 * overread); returns the file or NULL with *err filled. */
static gguf_file *open_copy(const uint8_t *p, size_t n, kt_error *err, uint8_t **copy) {
    *copy = malloc(n ? n : 1);
    assert_non_null(*copy);
    memcpy(*copy, p, n);
    return gguf_open_buffer(*copy, n, "hostile.gguf", err);
}

static void expect_fail_n(const hfile *h, size_t n, kt_status st, const char *w1, const char *w2) {
    kt_error err = {0};
    uint8_t *copy;
    gguf_file *f = open_copy(h->b.p, n, &err, &copy);
    if (f) fail_msg("hostile file opened (expected '%s')", w1);
    if (err.status != st) fail_msg("status %d, expected %d: %s", err.status, st, err.msg);
    if (strncmp(err.msg, "hostile.gguf: ", 14) != 0)
        fail_msg("message lacks the name: %s", err.msg);
    assert_contains(err.msg, w1);
    if (w2) assert_contains(err.msg, w2);
    assert_null(strchr(err.msg, '\n'));
    free(copy);
}

static void expect_fail(const hfile *h, kt_status st, const char *w1, const char *w2) {
    expect_fail_n(h, h->b.n, st, w1, w2);
}

static gguf_file *open_h(const hfile *h, uint8_t **copy) {
    kt_error err = {0};
    gguf_file *f = open_copy(h->b.p, h->b.n, &err, copy);
    if (!f) fail_msg("%s", err.msg);
    return f;
}

static void test_hostile_valid_base(void **state) {
    (void)state;
    hfile h;
    build_hostile(&h);
    uint8_t *copy;
    gguf_file *f = open_h(&h, &copy);
    check_invariants(f, copy, h.b.n);
    assert_int_equal(gguf_data_offset(f), h.data_start);
    assert_str(f, "general.name", "hostile");
    assert_i64(f, "k.kb", -1);
    assert_arr(f, "k.arr", GGUF_STRING, 3);
    assert_true(gguf_str_eq(gguf_kv_arr_str(f, gguf_find_key(f, "k.arr"), 1), "yz"));
    const gguf_tensor *t = gguf_tensor_find(f, "t.b");
    assert_float_equal(((const float *)t->data)[0], 16.0f, 0);
    gguf_close(f);
    free(copy);
    put32(&h, h.version, 2); /* v2 has the same layout */
    f = open_h(&h, &copy);
    assert_int_equal(gguf_version(f), 2);
    gguf_close(f);
    free(copy);
    h.b.p[h.bool_val] = 2; /* any nonzero bool is true, as in llama.cpp */
    f = open_h(&h, &copy);
    bool b = false;
    assert_true(gguf_get_bool(f, "k.bool", false, &b) && b);
    gguf_close(f);
    free(copy);
    free(h.b.p);
}

static void test_hostile_header(void **state) {
    (void)state;
    hfile h;
    build_hostile(&h);
    memcpy(h.b.p, "GGUG", 4);
    expect_fail(&h, KT_ERR_FORMAT, "not a GGUF file", "magic 'GGUG'");
    memcpy(h.b.p, "\x00\xff" "ab", 4);
    expect_fail(&h, KT_ERR_FORMAT, "magic '\\x00\\xffab'", NULL);
    memcpy(h.b.p, "GGUF", 4);
    put32(&h, h.version, 1);
    expect_fail(&h, KT_ERR_UNSUPPORTED, "version 1", NULL);
    put32(&h, h.version, 99);
    expect_fail(&h, KT_ERR_UNSUPPORTED, "version 99", NULL);
    put32(&h, h.version, 0x03000000);
    expect_fail(&h, KT_ERR_UNSUPPORTED, "version", "big-endian");
    put32(&h, h.version, 3);
    put64(&h, h.n_kv, 1ull << 40);
    expect_fail(&h, KT_ERR_FORMAT, "key count 1099511627776 absurd", "file size");
    put64(&h, h.n_kv, 7);
    put64(&h, h.n_tensors, UINT64_MAX);
    expect_fail(&h, KT_ERR_FORMAT, "tensor count", "absurd");
    put64(&h, h.n_tensors, 2);
    /* Counts that fit the file but exceed the reader's limit. */
    size_t big = 24 + 64 + 13 * ((1u << 20) + 1);
    uint8_t *p = calloc(1, big);
    assert_non_null(p);
    memcpy(p, h.b.p, 24);
    uint64_t n = (1u << 20) + 1;
    memcpy(p + h.n_kv, &n, 8);
    kt_error err = {0};
    assert_null(gguf_open_buffer(p, big, "big.gguf", &err));
    assert_int_equal(err.status, KT_ERR_UNSUPPORTED);
    assert_contains(err.msg, "above the limit");
    free(p);
    expect_fail_n(&h, 3, KT_ERR_FORMAT, "truncated", NULL);
    expect_fail_n(&h, 6, KT_ERR_FORMAT, "truncated", "version");
    expect_fail_n(&h, 20, KT_ERR_FORMAT, "truncated", "key count");
    free(h.b.p);
}

static void test_hostile_kvs(void **state) {
    (void)state;
    hfile h;
    build_hostile(&h);
    char want[128];
    put64(&h, h.name_len, UINT64_MAX);
    snprintf(want, sizeof want, "past end of file (size %zu)", h.b.n);
    expect_fail(&h, KT_ERR_FORMAT, "key 'general.name': string value (18446744073709551615 bytes",
                want);
    put64(&h, h.name_len, h.b.n);
    expect_fail(&h, KT_ERR_FORMAT, "truncated", "past end");
    put64(&h, h.name_len, 7);
    put64(&h, h.key0_len, UINT64_MAX - 3);
    expect_fail(&h, KT_ERR_FORMAT, "truncated: key 0: name", "past end");
    put64(&h, h.key0_len, 0);
    expect_fail(&h, KT_ERR_FORMAT, "key 0: empty key", NULL);
    put64(&h, h.key0_len, 17);
    put32(&h, h.u32_type, 13);
    expect_fail(&h, KT_ERR_FORMAT, "key 'k.u32': unknown value type 13", NULL);
    put32(&h, h.u32_type, UINT32_MAX);
    expect_fail(&h, KT_ERR_FORMAT, "unknown value type", NULL);
    put32(&h, h.u32_type, GGUF_U32);
    h.b.p[h.kb_name + 3] = 'a'; /* "k.kb" -> "k.ka" */
    expect_fail(&h, KT_ERR_FORMAT, "key 'k.ka': duplicate key", NULL);
    h.b.p[h.kb_name + 3] = 'b';
    put32(&h, h.arr_type, GGUF_ARRAY);
    expect_fail(&h, KT_ERR_UNSUPPORTED, "key 'k.arr'", "nested arrays");
    put32(&h, h.arr_type, 50);
    expect_fail(&h, KT_ERR_FORMAT, "unknown array element type 50", NULL);
    put32(&h, h.arr_type, GGUF_F64);
    put64(&h, h.arr_n, 1ull << 62);
    expect_fail(&h, KT_ERR_FORMAT, "array of 4611686018427387904 f64", "past end");
    put32(&h, h.arr_type, GGUF_STRING);
    expect_fail(&h, KT_ERR_FORMAT, "array of 4611686018427387904 strings", "past end");
    put64(&h, h.arr_n, 3);
    put32(&h, h.align_val, 3);
    expect_fail(&h, KT_ERR_FORMAT, "general.alignment 3 is not a power of two", NULL);
    put32(&h, h.align_val, 0);
    expect_fail(&h, KT_ERR_FORMAT, "general.alignment 0", "power of two");
    put32(&h, h.align_val, 32);
    put32(&h, h.align_type, GGUF_I32);
    expect_fail(&h, KT_ERR_FORMAT, "general.alignment has type i32, expected u32", NULL);
    free(h.b.p);
}

static void test_hostile_tensors(void **state) {
    (void)state;
    hfile h;
    build_hostile(&h);
    put32(&h, h.t0_ndims, 5);
    expect_fail(&h, KT_ERR_FORMAT, "tensor 't.a': n_dims 5", NULL);
    put32(&h, h.t0_ndims, 0);
    expect_fail(&h, KT_ERR_FORMAT, "n_dims 0", NULL);
    put32(&h, h.t0_ndims, 2);
    put64(&h, h.t0_dim0, 0);
    expect_fail(&h, KT_ERR_FORMAT, "dim 0 is 0", "positive");
    put64(&h, h.t0_dim0, UINT64_MAX);
    expect_fail(&h, KT_ERR_FORMAT, "dim 0 is -1", "positive");
    put64(&h, h.t0_dim0, 1ull << 32);
    put64(&h, h.t0_dim1, 1ull << 32);
    expect_fail(&h, KT_ERR_FORMAT, "element count overflows", NULL);
    put64(&h, h.t0_dim0, 1ull << 31);
    put64(&h, h.t0_dim1, 1ull << 31);
    expect_fail(&h, KT_ERR_FORMAT, "byte size overflows", NULL);
    put64(&h, h.t0_dim0, 8);
    put64(&h, h.t0_dim1, 2);
    put32(&h, h.t0_type, 4); /* Q4_2: removed from ggml */
    expect_fail(&h, KT_ERR_FORMAT, "unknown tensor type 4", NULL);
    put32(&h, h.t0_type, 99);
    expect_fail(&h, KT_ERR_FORMAT, "unknown tensor type 99", NULL);
    put32(&h, h.t0_type, KT_Q4_0_X8); /* an in-memory layout, not a file type */
    expect_fail(&h, KT_ERR_FORMAT, "unknown tensor type 64", NULL);
    put32(&h, h.t0_type, KT_Q4_0);
    expect_fail(&h, KT_ERR_FORMAT, "dim 0 (8) is not a multiple of the Q4_0 block size 32", NULL);
    put32(&h, h.t0_type, KT_F32);
    h.b.p[h.t1_name + 2] = 'a';
    expect_fail(&h, KT_ERR_FORMAT, "tensor 't.a': duplicate tensor name", NULL);
    h.b.p[h.t1_name + 2] = 'b';
    put64(&h, h.t1_offset, 65);
    expect_fail(&h, KT_ERR_FORMAT, "offset 65 is not aligned to 32", NULL);
    put64(&h, h.t1_offset, 96);
    char want[128];
    snprintf(want, sizeof want, "tensor 't.b': data [%zu, %zu) past end of file (size %zu)",
             h.data_start + 96, h.data_start + 112, h.b.n);
    expect_fail(&h, KT_ERR_FORMAT, want, NULL);
    put64(&h, h.t1_offset, UINT64_MAX - 31);
    expect_fail(&h, KT_ERR_FORMAT, "tensor 't.b'", "past end of file");
    put64(&h, h.t1_offset, 1ull << 63);
    expect_fail(&h, KT_ERR_FORMAT, "tensor 't.b'", "past end of file");
    put64(&h, h.t1_offset, 64);
    expect_fail_n(&h, h.data_end - 1, KT_ERR_FORMAT, "tensor 't.b'", "past end of file");
    free(h.b.p);
}

/* Every proper prefix that cuts into the tensor data or before must fail
 * with a message; prefixes that keep all the data (only the trailing
 * padding lost) are still valid. */
static void check_prefixes(const uint8_t *p, size_t size, uint64_t data_end) {
    for (size_t n = 0; n < size; n++) {
        kt_error err = {0};
        uint8_t *copy;
        gguf_file *f = open_copy(p, n, &err, &copy);
        if (n >= data_end) {
            if (!f) fail_msg("prefix %zu of %zu: %s", n, size, err.msg);
            check_invariants(f, copy, n);
        } else {
            if (f) fail_msg("prefix %zu of %zu opened", n, size);
            assert_int_equal(err.status, KT_ERR_FORMAT);
            if (!strstr(err.msg, "truncated") && !strstr(err.msg, "past end") &&
                !strstr(err.msg, "absurd"))
                fail_msg("prefix %zu: %s", n, err.msg);
        }
        gguf_close(f);
        free(copy);
    }
}

static void test_every_prefix(void **state) {
    (void)state;
    hfile h;
    build_hostile(&h);
    check_prefixes(h.b.p, h.b.n, h.data_end);
    free(h.b.p);

    const char *path = tu_tmp("prefix.gguf");
    write_roundtrip(path);
    size_t size;
    uint8_t *bytes = (uint8_t *)tu_read_file(path, &size);
    assert_non_null(bytes);
    gguf_file *f = gguf_open_buffer(bytes, size, "prefix", NULL);
    assert_non_null(f);
    const gguf_tensor *last = gguf_tensor_at(f, gguf_n_tensors(f) - 1);
    uint64_t end = gguf_data_offset(f) + last->offset + last->n_bytes;
    gguf_close(f);
    check_prefixes(bytes, size, end);
    free(bytes);
    unlink(path);
}

/* Corrupt bytes anywhere: opening must either fail with a one-line message
 * or give a file that keeps the reader's invariants; never crash. */
static void fuzz_one(const uint8_t *p, size_t n) {
    kt_error err = {0};
    uint8_t *copy;
    gguf_file *f = open_copy(p, n, &err, &copy);
    if (f) check_invariants(f, copy, n);
    else assert_true(err.msg[0] != 0 && !strchr(err.msg, '\n'));
    gguf_close(f);
    free(copy);
}

static void test_fuzz(void **state) {
    (void)state;
    hfile h;
    build_hostile(&h);
    uint8_t *p = malloc(h.b.n);
    static const uint8_t VALUES[] = {0x00, 0x01, 0x7f, 0x80, 0xff};
    for (size_t i = 0; i < h.b.n; i++) {
        for (size_t v = 0; v <= sizeof VALUES; v++) {
            memcpy(p, h.b.p, h.b.n);
            p[i] = v < sizeof VALUES ? VALUES[v] : (uint8_t)(p[i] ^ 0xff);
            fuzz_one(p, h.b.n);
        }
    }
    kt_rng r;
    kt_rng_seed(&r, 42);
    for (int it = 0; it < 5000; it++) {
        memcpy(p, h.b.p, h.b.n);
        int flips = 1 + (int)(kt_rng_u64(&r) % 4);
        for (int k = 0; k < flips; k++) p[kt_rng_u64(&r) % h.b.n] = (uint8_t)kt_rng_u64(&r);
        fuzz_one(p, (size_t)(kt_rng_u64(&r) % (h.b.n + 1)));
    }
    free(p);
    free(h.b.p);
}

/* A copy is made only when the file fits in 90% of the available memory;
 * otherwise the loader maps (gguf.h). */
static void test_copy_fits(void **state) {
    (void)state;
    assert_true(gguf_copy_fits(900, 1000));
    assert_false(gguf_copy_fits(901, 1000));
    assert_true(gguf_copy_fits(0, 0));
    assert_false(gguf_copy_fits(1, 0));
    assert_true(gguf_copy_fits((uint64_t)20 << 30, UINT64_MAX)); /* unknown: assumed to fit */
    assert_false(gguf_copy_fits((uint64_t)20 << 30, (uint64_t)16 << 30));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_fits),
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_tiny_models),
        cmocka_unit_test(test_all_real_files),
        cmocka_unit_test(test_vocab_files),
        cmocka_unit_test(test_lookup_misses),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_writer_roundtrip),
        cmocka_unit_test(test_copy_kv),
        cmocka_unit_test(test_writer_arg_errors),
        cmocka_unit_test(test_writer_io),
        cmocka_unit_test(test_writer_replaces_open_file),
        cmocka_unit_test(test_hostile_valid_base),
        cmocka_unit_test(test_hostile_header),
        cmocka_unit_test(test_hostile_kvs),
        cmocka_unit_test(test_hostile_tensors),
        cmocka_unit_test(test_every_prefix),
        cmocka_unit_test(test_fuzz),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
