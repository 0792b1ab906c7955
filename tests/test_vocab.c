/*
 * test_vocab.c - the SentencePiece tokenizer (text/vocab.h), its loaders
 * and writer, and the incremental detokenizer (text/detok.h).
 *
 * Reference data (../shared):
 * - vocab/NAME.gguf + .inp/.out: llama.cpp's tokenizer test vectors. Every
 *   pair must load and match line for line, whatever its tokenizer model
 *   ("llama" SentencePiece, "gpt2" byte-level BPE, "bert" WordPiece,
 *   "gemma4"); one kettle cannot load is a failure. Byte-level BPE and
 *   Gemma 4 texts must also decode back to themselves.
 * - models/tok512.bin and stories260K.gguf: the same 512-token vocabulary
 *   in llama2.c's and GGUF form; both must give the same ids for any text.
 * - tests/data/vocab-gpt-4o: llama.cpp's ids for the pre-tokenizer "gpt-4o"
 *   (gpt-oss's o200k) on llama-bpe's vocabulary (test_vocab_gpt4o).
 * - golden/NAME.json: llama.cpp's prompt ids and greedy text; the prompt must
 *   encode to prompt_ids and gen_ids must detokenize to gen_text exactly.
 * It also measures encode throughput on ~1 MB of text (printed). With
 * KT_VOCAB_BENCH=1 in the environment it runs no tests, only a benchmark
 * of byte-level BPE encode and decode on English and C source (printed).
 */
#include "testutil.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/timing.h"
#include "gguf/gguf.h"
#include "text/detok.h"
#include "text/pretok.h"
#include "text/utf8.h"
#include "text/vocab.h"

/* ---- helpers ----------------------------------------------------------- */

static kt_vocab *load_gguf_vocab(const char *path) {
    kt_error err = { 0 };
    gguf_file *f = gguf_open(path, &err);
    if (!f) fprintf(stderr, "%s: %s\n", path, err.msg);
    assert_non_null(f);
    kt_vocab *v = kt_vocab_from_gguf(f, &err);
    if (!v) fprintf(stderr, "%s: %s\n", path, err.msg);
    assert_non_null(v);
    gguf_close(f); /* the vocabulary keeps copies of everything */
    return v;
}

static kt_vocab *load_tok512(void) {
    kt_error err = { 0 };
    kt_vocab *v = kt_vocab_from_llama2c(tu_shared("models/tok512.bin"), 512, &err);
    if (!v) fprintf(stderr, "tok512.bin: %s\n", err.msg);
    assert_non_null(v);
    return v;
}

/* Encodes through the two-call protocol; *n gets the count. Caller frees. */
static int32_t *encode(const kt_vocab *v, const char *text, size_t len, bool bos, int *n) {
    kt_error err = { 0 };
    int need = kt_vocab_encode(v, text, len, bos, NULL, 0, &err);
    if (need < 0) fprintf(stderr, "encode: %s\n", err.msg);
    assert_true(need >= 0);
    int32_t *ids = malloc(((size_t)need + 1) * sizeof *ids);
    assert_non_null(ids);
    assert_int_equal(kt_vocab_encode(v, text, len, bos, ids, need, &err), need);
    *n = need;
    return ids;
}

static void print_ids(const char *label, const int32_t *ids, int n) {
    fprintf(stderr, "%s:", label);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

static bool ids_equal(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

/* Growable string for concatenating detokenizer output. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s) {
    size_t n = strlen(s);
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->len, s, n + 1);
    b->len += n;
}

/* Pushes ids one at a time; every chunk must be valid UTF-8. Returns the
 * concatenation (caller frees) and counts chunks that held bytes back. */
static char *detok_all(const kt_vocab *v, const int32_t *ids, int n, bool strip,
                       int *n_empty) {
    kt_text_detok *d = kt_text_detok_new(v, strip);
    assert_non_null(d);
    sbuf b = { 0 };
    sb_add(&b, "");
    int empty = 0;
    for (int i = 0; i < n; i++) {
        const char *chunk = kt_text_detok_push(d, ids[i]);
        assert_non_null(chunk);
        assert_true(kt_utf8_valid(chunk, strlen(chunk), NULL));
        empty += chunk[0] == 0;
        sb_add(&b, chunk);
    }
    const char *rest = kt_text_detok_flush(d);
    assert_true(kt_utf8_valid(rest, strlen(rest), NULL));
    sb_add(&b, rest);
    kt_text_detok_free(d);
    if (n_empty) *n_empty = empty;
    return b.p;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names in dir ending in suffix; NULL-terminated, caller frees. */
static char **list_dir(const char *dir, const char *suffix, int *n) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    char **names = NULL;
    int cnt = 0;
    struct dirent *e;
    size_t sl = strlen(suffix);
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l <= sl || strcmp(e->d_name + l - sl, suffix) != 0) continue;
        names = realloc(names, (size_t)(cnt + 2) * sizeof *names);
        assert_non_null(names);
        names[cnt] = strdup(e->d_name);
        assert_non_null(names[cnt]);
        cnt++;
    }
    closedir(d);
    if (cnt) qsort(names, (size_t)cnt, sizeof *names, cmp_str);
    *n = cnt;
    return names;
}

static void free_list(char **names, int n) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* ---- llama.cpp's test vectors ------------------------------------------ */

static void add_text(char ***texts, size_t **lens, int n, char *p, size_t len) {
    *texts = realloc(*texts, (size_t)(n + 1) * sizeof **texts);
    *lens = realloc(*lens, (size_t)(n + 1) * sizeof **lens);
    assert_true(*texts && *lens);
    (*texts)[n] = p;
    (*lens)[n] = len;
}

/* Texts of an .inp file: each one ends at "\n__ggml_vocab_test__\n"
 * (llama.cpp's test-tokenizer-0 reads it the same way), and whatever
 * follows the last separator is one more text unless it is empty
 * (gemma-4's file ends with a text, not with a separator). */
static int split_inp(char *raw, char ***texts, size_t **lens) {
    static const char sep[] = "\n__ggml_vocab_test__\n";
    int n = 0;
    char *p = raw, *hit;
    *texts = NULL;
    *lens = NULL;
    while ((hit = strstr(p, sep)) != NULL) {
        add_text(texts, lens, n++, p, (size_t)(hit - p));
        p = hit + strlen(sep);
    }
    if (*p) add_text(texts, lens, n++, p, strlen(p));
    return n;
}

/* Lines of an .out file (the last one may lack its newline). */
static int count_lines(const char *s) {
    int n = 0;
    for (const char *nl; *s; s = nl + 1, n++)
        if ((nl = strchr(s, '\n')) == NULL) return n + 1;
    return n;
}

/* Parses one line of an .out file ("  1 2 3") into ids; returns count. */
static int parse_line(const char *line, size_t len, int32_t *ids, int cap) {
    int n = 0;
    size_t i = 0;
    while (i < len) {
        while (i < len && line[i] == ' ') i++;
        if (i >= len) break;
        char *end;
        long x = strtol(line + i, &end, 10);
        assert_true(end > line + i);
        assert_true(n < cap);
        ids[n++] = (int32_t)x;
        i = (size_t)(end - line);
    }
    return n;
}

/* Runs the texts of inp_path against the ids of out_path (one line a
 * text); returns the number of texts (all must match). */
static int run_files(const kt_vocab *v, const char *name, const char *inp_path, const char *out_path) {
    char *inp = tu_read_file(inp_path, NULL);
    if (!inp) fprintf(stderr, "cannot read %s\n", inp_path);
    assert_non_null(inp);
    char *out = tu_read_file(out_path, NULL);
    if (!out) fprintf(stderr, "cannot read %s\n", out_path);
    assert_non_null(out);

    char **texts;
    size_t *lens;
    int n_texts = split_inp(inp, &texts, &lens);
    assert_true(n_texts > 0);
    if (count_lines(out) != n_texts)
        fprintf(stderr, "%s: %d texts but %d lines of ids\n", name, n_texts, count_lines(out));
    assert_int_equal(count_lines(out), n_texts);
    char *line = out;
    int bad = 0;
    for (int t = 0; t < n_texts; t++) {
        assert_non_null(line);
        char *nl = strchr(line, '\n');
        size_t ll = nl ? (size_t)(nl - line) : strlen(line);
        int32_t want[4096];
        int nw = parse_line(line, ll, want, 4096);
        int ng;
        int32_t *got = encode(v, texts[t], lens[t], false, &ng);
        if (!ids_equal(got, ng, want, nw)) {
            fprintf(stderr, "%s: text %d '%.*s' differs\n", name, t, (int)lens[t], texts[t]);
            print_ids("  want", want, nw);
            print_ids("  got ", got, ng);
            bad++;
        }
        free(got);
        line = nl ? nl + 1 : NULL;
    }
    free(texts);
    free(lens);
    free(inp);
    free(out);
    assert_int_equal(bad, 0);
    return n_texts;
}

/* Runs one shared .inp/.out pair (vocab/NAME.inp, vocab/NAME.out). */
static int run_pair(const kt_vocab *v, const char *name) {
    char inp[4096], out[4096];
    snprintf(inp, sizeof inp, "%s%s.inp", tu_shared("vocab/"), name);
    snprintf(out, sizeof out, "%s%s.out", tu_shared("vocab/"), name);
    return run_files(v, name, inp, out);
}

/* Every pair in shared/vocab must load and match: a tokenizer model or
 * pre-tokenizer that kettle does not support is a failure, not a skip. */
static void test_vocab_vectors(void **state) {
    (void)state;
    int n_files;
    char **files = list_dir(tu_shared("vocab"), ".gguf", &n_files);
    assert_true(n_files > 0);
    int texts = 0;
    for (int i = 0; i < n_files; i++) {
        char path[4096], model[64];
        snprintf(path, sizeof path, "%s/%s", tu_shared("vocab"), files[i]);
        kt_error err = { 0 };
        gguf_file *f = gguf_open(path, &err);
        if (!f) fprintf(stderr, "%s: %s\n", path, err.msg);
        assert_non_null(f);
        if (!gguf_get_str(f, "tokenizer.ggml.model", model, sizeof model)) model[0] = 0;
        kt_vocab *v = kt_vocab_from_gguf(f, &err);
        gguf_close(f);
        if (!v) fprintf(stderr, "%s (model '%s'): %s\n", path, model, err.msg);
        assert_non_null(v);
        int n = run_pair(v, files[i]);
        printf("%s: %d texts match\n", files[i], n);
        texts += n;
        kt_vocab_free(v);
    }
    printf("vocab test vectors: all %d pairs match (%d texts)\n", n_files, texts);
    free_list(files, n_files);
}

/* gpt-oss's o200k tokenizer (tokenizer.ggml.pre "gpt-4o": llama.cpp's
 * LLAMA_VOCAB_PRE_TYPE_GPT4O regex, which splits CamelCase words, keeps
 * "/" and newlines after punctuation, ...). There is no o200k vocabulary
 * here, so llama-bpe's vocabulary is written again (kettle's GGUF writer,
 * every key copied) with pre "gpt-4o", and the texts of the shared vocab
 * tests plus tests/data/vocab-gpt-4o/extra.inp must give the ids
 * llama.cpp's llama-tokenize gives for that same vocabulary
 * (tests/data/vocab-gpt-4o/README.md says how they were made). The same
 * text through llama-bpe's own pre-tokenizer must differ, or the check
 * would not see which regex ran. */
static void test_vocab_gpt4o(void **state) {
    (void)state;
    kt_error err = { 0 };
    gguf_file *src = gguf_open(tu_shared("vocab/ggml-vocab-llama-bpe.gguf"), &err);
    assert_non_null(src);
    gguf_writer *w = gguf_writer_new(&err);
    assert_non_null(w);
    for (int64_t i = 0; i < gguf_n_kv(src); i++)
        if (!gguf_str_eq(gguf_kv_key(src, i), "tokenizer.ggml.pre"))
            assert_int_equal(gguf_writer_copy_kv(w, src, i, &err), KT_OK);
    assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt-4o", &err), KT_OK);
    const char *path = tu_tmp("vocab-llama-bpe-gpt-4o.gguf");
    assert_int_equal(gguf_writer_begin(w, path, &err), KT_OK);
    assert_int_equal(gguf_writer_finish(w, &err), KT_OK);
    gguf_writer_free(w);
    kt_vocab *bpe = kt_vocab_from_gguf(src, &err);
    assert_non_null(bpe);
    gguf_close(src);
    kt_vocab *v = load_gguf_vocab(path);
    static const char *const files[][2] = {
        { "ggml-vocab-gpt-2.gguf.inp", "gpt-2.out" },     { "ggml-vocab-llama-bpe.gguf.inp", "llama-bpe.out" },
        { "ggml-vocab-gemma-4.gguf.inp", "gemma-4.out" }, { "ggml-vocab-qwen35.gguf.inp", "qwen35.out" },
        { NULL, "extra.out" },
    };
    int texts = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char inp[4096], out[4096];
        if (files[i][0]) snprintf(inp, sizeof inp, "%s%s", tu_shared("vocab/"), files[i][0]);
        else snprintf(inp, sizeof inp, "%s/vocab-gpt-4o/extra.inp", KT_TEST_DATA);
        snprintf(out, sizeof out, "%s/vocab-gpt-4o/%s", KT_TEST_DATA, files[i][1]);
        texts += run_files(v, files[i][1], inp, out);
    }
    printf("gpt-4o pre-tokenizer: %d texts match llama.cpp\n", texts);
    char inp[4096], **tx;
    size_t *lens;
    snprintf(inp, sizeof inp, "%s/vocab-gpt-4o/extra.inp", KT_TEST_DATA);
    char *raw = tu_read_file(inp, NULL);
    assert_non_null(raw);
    int n_tx = split_inp(raw, &tx, &lens), n_differ = 0;
    for (int t = 0; t < n_tx; t++) {
        int n4o, nbpe;
        int32_t *a = encode(v, tx[t], lens[t], false, &n4o), *b = encode(bpe, tx[t], lens[t], false, &nbpe);
        n_differ += !ids_equal(a, n4o, b, nbpe);
        free(a), free(b);
    }
    printf("gpt-4o vs llama-bpe's pre-tokenizer: %d of %d extra texts differ\n", n_differ, n_tx);
    assert_true(n_differ >= 3);
    free(tx), free(lens), free(raw);
    kt_vocab_free(v);
    kt_vocab_free(bpe);
    remove(path);
}

/* Every text of the .inp file of a lossless pair (byte-level BPE, Gemma
 * 4's) decodes back to itself, through decode_piece and through the
 * incremental detokenizer. */
static void check_roundtrip(const char *name, kt_vocab_kind kind) {
    char path[4096];
    snprintf(path, sizeof path, "%s%s", tu_shared("vocab/"), name);
    kt_vocab *v = load_gguf_vocab(path);
    assert_int_equal(kt_vocab_get_kind(v), kind);
    snprintf(path, sizeof path, "%s%s.inp", tu_shared("vocab/"), name);
    char *inp = tu_read_file(path, NULL);
    assert_non_null(inp);
    char **texts;
    size_t *lens;
    int n_texts = split_inp(inp, &texts, &lens);
    for (int t = 0; t < n_texts; t++) {
        int n;
        int32_t *ids = encode(v, texts[t], lens[t], false, &n);
        sbuf b = { 0 };
        sb_add(&b, "");
        for (int i = 0; i < n; i++) {
            char piece[256];
            int k = kt_vocab_decode_piece(v, ids[i], piece, sizeof piece - 1);
            assert_true(k >= 0 && k < (int)sizeof piece);
            piece[k] = 0;
            sb_add(&b, piece);
        }
        char *d = detok_all(v, ids, n, false, NULL);
        if (b.len != lens[t] || memcmp(b.p, texts[t], lens[t]) != 0)
            fprintf(stderr, "%s: text %d decodes to '%s'\n", name, t, b.p);
        assert_int_equal(b.len, lens[t]);
        assert_memory_equal(b.p, texts[t], lens[t]);
        assert_string_equal(d, b.p);
        free(d);
        free(b.p);
        free(ids);
    }
    printf("%s: %d texts decode back to themselves\n", name, n_texts);
    free(texts);
    free(lens);
    free(inp);
    kt_vocab_free(v);
}

static size_t random_text(kt_rng *r, char *buf, size_t cap); /* below */

/* What a text decodes back to: itself, except that a vocabulary whose
 * pieces write ' ' as "▁" ("gemma4") cannot tell a "▁" typed in the text
 * from a space, so it comes back as " ". */
static void expected_decode(const kt_vocab *v, const char *text, char *out) {
    bool spm = kt_vocab_get_kind(v) == KT_VOCAB_GEMMA4;
    size_t o = 0;
    for (const char *p = text; *p;) {
        bool sp = spm && strncmp(p, "\xE2\x96\x81", 3) == 0;
        out[o++] = sp ? ' ' : *p;
        p += sp ? 3 : 1;
    }
    out[o] = 0;
}

/* Random texts, and long runs of one kind of character (one huge word
 * for the regexes and the merge heap), decode back to themselves. */
static void check_roundtrip_extra(const char *name, kt_rng *r) {
    char path[4096];
    snprintf(path, sizeof path, "%s%s", tu_shared("vocab/"), name);
    kt_vocab *v = load_gguf_vocab(path);
    char buf[512], want[512];
    for (int i = 0; i < 500; i++) {
        size_t len = random_text(r, buf, sizeof buf);
        int n;
        int32_t *ids = encode(v, buf, len, false, &n);
        char *d = detok_all(v, ids, n, false, NULL);
        expected_decode(v, buf, want);
        if (strcmp(d, want) != 0) fprintf(stderr, "%s: '%s' decodes to '%s'\n", name, buf, d);
        assert_string_equal(d, want);
        free(d);
        free(ids);
    }
    static const char fill[] = { ' ', 'a', '7', '\n', '!' };
    size_t big = 100000;
    char *text = malloc(big + 2);
    assert_non_null(text);
    for (size_t k = 0; k < sizeof fill; k++) {
        memset(text, fill[k], big);
        text[big] = 'x';
        text[big + 1] = 0;
        int n;
        int32_t *ids = encode(v, text, big + 1, false, &n);
        char *d = detok_all(v, ids, n, false, NULL);
        assert_string_equal(d, text);
        free(d);
        free(ids);
    }
    free(text);
    kt_vocab_free(v);
}

static void test_bpe_roundtrip(void **state) {
    (void)state;
    check_roundtrip("ggml-vocab-gpt-2.gguf", KT_VOCAB_BPE);
    check_roundtrip("ggml-vocab-deepseek-coder.gguf", KT_VOCAB_BPE);
    check_roundtrip("ggml-vocab-starcoder.gguf", KT_VOCAB_BPE);
    check_roundtrip("ggml-vocab-qwen35.gguf", KT_VOCAB_BPE);
    check_roundtrip("ggml-vocab-gemma-4.gguf", KT_VOCAB_GEMMA4);
    kt_rng r;
    kt_rng_seed(&r, 99);
    check_roundtrip_extra("ggml-vocab-gpt-2.gguf", &r);
    check_roundtrip_extra("ggml-vocab-deepseek-coder.gguf", &r);
    check_roundtrip_extra("ggml-vocab-starcoder.gguf", &r);
    check_roundtrip_extra("ggml-vocab-qwen35.gguf", &r);
    check_roundtrip_extra("ggml-vocab-gemma-4.gguf", &r);
}

/* Decoding maps GPT-2 characters back to bytes ("Ġ" is a space). */
static void test_bpe_decode(void **state) {
    (void)state;
    kt_vocab *v = load_gguf_vocab(tu_shared("vocab/ggml-vocab-gpt-2.gguf"));
    char buf[64];
    int32_t id = kt_vocab_find(v, "\xC4\xA0the", 5); /* "Ġthe" */
    assert_true(id >= 0);
    assert_int_equal(kt_vocab_decode_piece(v, id, buf, sizeof buf), 4);
    assert_memory_equal(buf, " the", 4);
    assert_int_equal(kt_vocab_decode_piece(v, id, buf, 2), 4); /* truncated, same count */
    id = kt_vocab_find(v, "\xC4\x8A", 2); /* "Ċ" */
    assert_int_equal(kt_vocab_decode_piece(v, id, buf, sizeof buf), 1);
    assert_int_equal(buf[0], '\n');
    assert_int_equal(kt_vocab_bos(v), 50256);
    assert_false(kt_vocab_add_bos(v));
    assert_false(kt_vocab_add_space_prefix(v));
    assert_int_equal(kt_vocab_unk(v), -1);
    /* Writing is for "llama" vocabularies only. */
    kt_error err = { 0 };
    gguf_writer *w = gguf_writer_new(&err);
    assert_non_null(w);
    assert_int_equal(kt_vocab_write_gguf(v, w, &err), KT_ERR_UNSUPPORTED);
    gguf_writer_free(w);
    kt_vocab_free(v);
}

/* ---- special tokens in text (kt_vocab_encode_ex) ------------------------ */

static int32_t *encode_ex(const kt_vocab *v, const char *text, bool parse, int *n) {
    kt_error err = { 0 };
    size_t len = strlen(text);
    int need = kt_vocab_encode_ex(v, text, len, false, parse, NULL, 0, &err);
    assert_true(need >= 0);
    int32_t *ids = malloc(((size_t)need + 1) * sizeof *ids);
    assert_non_null(ids);
    assert_int_equal(kt_vocab_encode_ex(v, text, len, false, parse, ids, need, &err), need);
    *n = need;
    return ids;
}

static bool contains(const int32_t *ids, int n, int32_t id) {
    for (int i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

/* "A<tok>B" with parsing is enc(A) tok enc_after_special(B), where the SPM
 * prefix rule gives B its "▁" again; without parsing tok never appears. */
static void check_special(const kt_vocab *v, const char *tok, int32_t id, const char *a,
                          const char *b, const char *b_alone) {
    char text[256];
    snprintf(text, sizeof text, "%s%s%s", a, tok, b);
    int na, nb, nx, ny;
    int32_t *ia = encode_ex(v, a, true, &na), *ib = encode_ex(v, b_alone, true, &nb);
    int32_t *x = encode_ex(v, text, true, &nx), *y = encode_ex(v, text, false, &ny);
    assert_int_equal(nx, na + 1 + nb);
    assert_memory_equal(x, ia, (size_t)na * sizeof *x);
    assert_int_equal(x[na], id);
    assert_memory_equal(x + na + 1, ib, (size_t)nb * sizeof *x);
    assert_false(contains(y, ny, id));
    free(ia);
    free(ib);
    free(x);
    free(y);
}

static void test_parse_specials(void **state) {
    (void)state;
    kt_vocab *v = load_gguf_vocab(tu_shared("vocab/ggml-vocab-llama-spm.gguf"));
    check_special(v, "<s>", 1, "Hi", "there", "there");
    check_special(v, "</s>", 2, "Hi ", " x", " x");
    check_special(v, "<unk>", 0, "a", "b", "b");
    int n;
    int32_t *x = encode_ex(v, "<s><s></s>", true, &n);
    int32_t want[] = { 1, 1, 2 };
    assert_true(ids_equal(x, n, want, 3));
    free(x);
    x = encode_ex(v, "<0x0A>", true, &n); /* byte tokens are never matched */
    assert_false(contains(x, n, 13));
    free(x);
    kt_vocab_free(v);

    v = load_gguf_vocab(tu_shared("vocab/ggml-vocab-gpt-2.gguf"));
    assert_int_equal(kt_vocab_type(v, 50256), KT_TOKEN_CONTROL);
    check_special(v, "<|endoftext|>", 50256, "Hello", " world", " world");
    x = encode_ex(v, "<|endoftext|>", true, &n);
    assert_int_equal(n, 1);
    assert_int_equal(x[0], 50256);
    free(x);
    kt_vocab_free(v);

    /* Longest first: "<fim_prefix>" is not cut by a shorter special. */
    v = load_gguf_vocab(tu_shared("vocab/ggml-vocab-starcoder.gguf"));
    check_special(v, "<fim_prefix>", 1, "def f", "():", "():");
    check_special(v, "<|endoftext|>", 0, "x", "y", "y");
    kt_vocab_free(v);
}

/* ---- WordPiece ------------------------------------------------------------ */

static void assert_same_encoding(const kt_vocab *v, const char *a, const char *b) {
    int na, nb;
    int32_t *ia = encode(v, a, strlen(a), false, &na), *ib = encode(v, b, strlen(b), false, &nb);
    if (!ids_equal(ia, na, ib, nb)) {
        fprintf(stderr, "'%s' vs '%s'\n", a, b);
        print_ids("  a", ia, na);
        print_ids("  b", ib, nb);
    }
    assert_true(ids_equal(ia, na, ib, nb));
    free(ia);
    free(ib);
}

static void test_wpm(void **state) {
    (void)state;
    kt_vocab *v = load_gguf_vocab(tu_shared("vocab/ggml-vocab-bert-bge.gguf"));
    assert_int_equal(kt_vocab_get_kind(v), KT_VOCAB_WPM);
    assert_int_equal(kt_vocab_bos(v), 101); /* [CLS] */
    assert_int_equal(kt_vocab_eos(v), 102); /* [SEP] */
    assert_int_equal(kt_vocab_unk(v), 100);
    assert_int_equal(kt_vocab_pad(v), 0);
    assert_true(kt_vocab_add_bos(v));
    assert_true(kt_vocab_add_eos(v));
    assert_false(kt_vocab_add_space_prefix(v));

    /* Lowercase, accents stripped, control and format characters dropped,
     * any White_Space separates words. */
    assert_same_encoding(v, "Hello World", "hello world");
    assert_same_encoding(v, "Caf\xC3\xA9 na\xC3\xAFve", "cafe naive");
    assert_same_encoding(v, "ab\x01" "c\xE2\x80\x8D" "d", "abcd");
    assert_same_encoding(v, "a\xE3\x80\x80" "b\t\n c", "a b c");

    /* Punctuation is a word of its own; decoding puts "▁" back as " ". */
    int n;
    int32_t *ids = encode(v, "Hello, World!", 13, true, &n);
    assert_int_equal(ids[0], 101);
    char *text = detok_all(v, ids + 1, n - 1, true, NULL);
    assert_string_equal(text, "hello , world !");
    free(text);
    free(ids);

    /* A word with no tokenization at all is one [UNK]. */
    ids = encode(v, "a \xF0\x9F\xA6\x80\xF0\x9F\xA6\x80 b", 12, false, &n);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], 100);
    free(ids);
    assert_int_equal(kt_vocab_encode(v, "", 0, false, NULL, 0, NULL), 0);
    assert_int_equal(kt_vocab_encode(v, " \t\n", 3, false, NULL, 0, NULL), 0);

    /* [CLS] and [SEP] in text only with parse_specials. */
    check_special(v, "[SEP]", 102, "hi", "there", "there");
    check_special(v, "[MASK]", 103, "a", "b", "b");
    kt_vocab_free(v);
}

/* ---- llama2.c tokenizer.bin vs its GGUF copy ---------------------------- */

static void assert_same_vocab(const kt_vocab *a, const kt_vocab *b) {
    assert_int_equal(kt_vocab_size(a), kt_vocab_size(b));
    for (int i = 0; i < kt_vocab_size(a); i++) {
        size_t la, lb;
        const char *pa = kt_vocab_piece(a, i, &la), *pb = kt_vocab_piece(b, i, &lb);
        if (la != lb || memcmp(pa, pb, la) != 0)
            fprintf(stderr, "token %d: '%.*s' vs '%.*s'\n", i, (int)la, pa, (int)lb, pb);
        assert_int_equal(la, lb);
        assert_memory_equal(pa, pb, la);
        assert_true(kt_vocab_score(a, i) == kt_vocab_score(b, i));
        assert_int_equal(kt_vocab_type(a, i), kt_vocab_type(b, i));
    }
    assert_int_equal(kt_vocab_bos(a), kt_vocab_bos(b));
    assert_int_equal(kt_vocab_eos(a), kt_vocab_eos(b));
    assert_int_equal(kt_vocab_unk(a), kt_vocab_unk(b));
    assert_int_equal(kt_vocab_pad(a), kt_vocab_pad(b));
    assert_int_equal(kt_vocab_add_bos(a), kt_vocab_add_bos(b));
    assert_int_equal(kt_vocab_add_eos(a), kt_vocab_add_eos(b));
    assert_int_equal(kt_vocab_add_space_prefix(a), kt_vocab_add_space_prefix(b));
}

static void assert_same_ids(const kt_vocab *a, const kt_vocab *b, const char *text, size_t len) {
    int na, nb;
    int32_t *ia = encode(a, text, len, true, &na), *ib = encode(b, text, len, true, &nb);
    if (!ids_equal(ia, na, ib, nb)) {
        fprintf(stderr, "text '%.*s'\n", (int)len, text);
        print_ids("  a", ia, na);
        print_ids("  b", ib, nb);
    }
    assert_true(ids_equal(ia, na, ib, nb));
    free(ia);
    free(ib);
}

/* A random string over pieces that exercise merges, spaces, newlines,
 * multi-byte characters (byte fallback in a 512-token vocabulary) and
 * control-token lookalikes. */
static size_t random_text(kt_rng *r, char *buf, size_t cap) {
    static const char *parts[] = { "a", "b", "the", " ", "  ", "\n", "Once", " upon", "Lily",
                                   ".", ",", "!", "é", "世界", "😀", "<s>", "</s>", "<unk>",
                                   "▁", "\t", "0x41", "<0x41>", "'s", "ball", "1", "23",
                                   "ing", "er", " re", "ation", "   ", "Hello", "ü", "ß",
                                   "приве", "т", "\xE2\x80\x8A", "™", "    }", "{" };
    size_t n = 0, k = kt_rng_u64(r) % 24;
    for (size_t i = 0; i < k; i++) {
        const char *p = parts[kt_rng_u64(r) % (sizeof parts / sizeof parts[0])];
        size_t l = strlen(p);
        if (n + l >= cap) break;
        memcpy(buf + n, p, l);
        n += l;
    }
    buf[n] = 0;
    return n;
}

/* The specification, naively (O(n^2)): normalize, then merge the best
 * pair (highest score, leftmost on ties) until none is a token, then byte
 * fallback. No user-defined tokens. Returns the id count. */
static bool can_merge(const kt_vocab *v, int32_t id) {
    kt_token_type t = kt_vocab_type(v, id);
    return id >= 0 && t != KT_TOKEN_CONTROL && t != KT_TOKEN_UNKNOWN && t != KT_TOKEN_BYTE;
}

static int naive_encode(const kt_vocab *v, const char *text, size_t len, int32_t *out) {
    if (len == 0) return 0; /* no fragment at all, so no "▁" either */
    char *buf = malloc(3 * len + 3);
    size_t *off = malloc((3 * len + 3) * sizeof *off), *n = malloc((3 * len + 3) * sizeof *n);
    assert_true(buf && off && n);
    size_t bl = 0;
    memcpy(buf, "\xE2\x96\x81", 3);
    bl = 3;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(buf + bl, "\xE2\x96\x81", 3); bl += 3; }
        else buf[bl++] = text[i];
    }
    size_t m = 0;
    for (size_t i = 0; i < bl; i += n[m - 1]) {
        off[m] = i;
        n[m++] = (size_t)kt_utf8_len((uint8_t)buf[i]);
    }
    for (;;) {
        long best = -1;
        float best_score = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            int32_t id = kt_vocab_find(v, buf + off[i], n[i] + n[i + 1]);
            if (!can_merge(v, id)) continue;
            if (best < 0 || kt_vocab_score(v, id) > best_score) {
                best = (long)i;
                best_score = kt_vocab_score(v, id);
            }
        }
        if (best < 0) break;
        n[best] += n[best + 1];
        memmove(off + best + 1, off + best + 2, (m - (size_t)best - 2) * sizeof *off);
        memmove(n + best + 1, n + best + 2, (m - (size_t)best - 2) * sizeof *n);
        m--;
    }
    int k = 0;
    for (size_t i = 0; i < m; i++) {
        int32_t id = kt_vocab_find(v, buf + off[i], n[i]);
        if (can_merge(v, id)) {
            out[k++] = id;
            continue;
        }
        for (size_t j = 0; j < n[i]; j++) {
            char hex[8];
            snprintf(hex, sizeof hex, "<0x%02X>", (uint8_t)buf[off[i] + j]);
            out[k++] = kt_vocab_find(v, hex, 6);
        }
    }
    free(buf);
    free(off);
    free(n);
    return k;
}

static void check_naive(const kt_vocab *v, kt_rng *r, int n_texts) {
    char buf[512];
    int32_t want[2048];
    for (int i = 0; i < n_texts; i++) {
        size_t len = random_text(r, buf, sizeof buf);
        int nw = naive_encode(v, buf, len, want), ng;
        int32_t *got = encode(v, buf, len, false, &ng);
        if (!ids_equal(got, ng, want, nw)) {
            fprintf(stderr, "text '%s'\n", buf);
            print_ids("  naive", want, nw);
            print_ids("  got  ", got, ng);
        }
        assert_true(ids_equal(got, ng, want, nw));
        free(got);
    }
}

/* The run-splitting, heap-based encoder gives what the plain definition
 * gives, on both vocabularies. */
static void test_matches_naive(void **state) {
    (void)state;
    kt_rng r;
    kt_rng_seed(&r, 77);
    kt_vocab *v = load_tok512();
    check_naive(v, &r, 3000);
    kt_vocab_free(v);
    v = load_gguf_vocab(tu_shared("vocab/ggml-vocab-llama-spm.gguf"));
    check_naive(v, &r, 3000);
    kt_vocab_free(v);
}

static void test_llama2c_matches_gguf(void **state) {
    (void)state;
    kt_vocab *a = load_tok512();
    kt_vocab *b = load_gguf_vocab(tu_shared("models/stories260K.gguf"));
    assert_same_vocab(a, b);
    size_t len;
    const char *p = kt_vocab_piece(a, 1, &len);
    assert_int_equal(len, 3);
    assert_memory_equal(p, "<s>", 3);

    /* n_vocab <= 0 reads every token of the file. */
    kt_error err = { 0 };
    kt_vocab *c = kt_vocab_from_llama2c(tu_shared("models/tok512.bin"), 0, &err);
    assert_non_null(c);
    assert_same_vocab(a, c);
    kt_vocab_free(c);

    char *story = tu_read_file(tu_shared("golden/stories260K.once.txt"), &len);
    assert_non_null(story);
    assert_same_ids(a, b, story, len);
    free(story);
    kt_rng r;
    kt_rng_seed(&r, 2024);
    char buf[512];
    for (int i = 0; i < 2000; i++) {
        size_t n = random_text(&r, buf, sizeof buf);
        assert_same_ids(a, b, buf, n);
    }
    kt_vocab_free(a);
    kt_vocab_free(b);
}

/* ---- golden prompts and texts ------------------------------------------ */

static int32_t *json_ids(json_t *arr, int *n) {
    assert_true(json_is_array(arr));
    *n = (int)json_array_size(arr);
    int32_t *ids = malloc(((size_t)*n + 1) * sizeof *ids);
    assert_non_null(ids);
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return ids;
}

static void check_golden(const kt_vocab *v, json_t *doc, const char *name) {
    const char *prompt = json_string_value(json_object_get(doc, "prompt"));
    const char *gen_text = json_string_value(json_object_get(doc, "gen_text"));
    assert_non_null(prompt);
    assert_non_null(gen_text);
    int np, ng, n;
    int32_t *want = json_ids(json_object_get(doc, "prompt_ids"), &np);
    int32_t *gen = json_ids(json_object_get(doc, "gen_ids"), &ng);
    int32_t *got = encode(v, prompt, strlen(prompt), kt_vocab_add_bos(v), &n);
    if (!ids_equal(got, n, want, np)) {
        fprintf(stderr, "%s: prompt '%s'\n", name, prompt);
        print_ids("  want", want, np);
        print_ids("  got ", got, n);
    }
    assert_true(ids_equal(got, n, want, np));
    /* llama.cpp's detokenizer drops the leading space of the first piece
     * (gen_ids alone start mid-sentence: "▁a big" reads "a big"). */
    char *text = detok_all(v, gen, ng, true, NULL);
    if (strcmp(text, gen_text) != 0)
        fprintf(stderr, "%s: gen_text differs:\n  want '%s'\n  got  '%s'\n", name, gen_text, text);
    assert_string_equal(text, gen_text);
    free(text);
    /* The whole sequence decodes to the prompt, then the continuation as
     * it reads after it (its leading space kept). */
    char *cont = detok_all(v, gen, ng, false, NULL);
    int32_t *all = malloc(((size_t)np + (size_t)ng) * sizeof *all);
    assert_non_null(all);
    memcpy(all, want, (size_t)np * sizeof *all);
    memcpy(all + np, gen, (size_t)ng * sizeof *all);
    text = detok_all(v, all, np + ng, true, NULL);
    assert_int_equal(strncmp(text, prompt, strlen(prompt)), 0);
    assert_string_equal(text + strlen(prompt), cont);
    free(cont);
    free(text);
    free(all);
    free(want);
    free(gen);
    free(got);
}

static void test_golden(void **state) {
    (void)state;
    int n_files;
    char **files = list_dir(tu_shared("golden"), ".json", &n_files);
    assert_true(n_files > 0);
    kt_vocab *tok512 = load_tok512();
    for (int i = 0; i < n_files; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", tu_shared("golden"), files[i]);
        json_error_t jerr;
        json_t *doc = json_load_file(path, 0, &jerr);
        if (!doc) fprintf(stderr, "%s: %s\n", path, jerr.text);
        assert_non_null(doc);
        const char *model = json_string_value(json_object_get(doc, "model"));
        assert_non_null(model);
        snprintf(path, sizeof path, "%s/%s", tu_shared("models"), model);
        kt_vocab *v = load_gguf_vocab(path);
        check_golden(v, doc, files[i]);
        if (kt_vocab_size(v) == 512) check_golden(tok512, doc, files[i]);
        printf("%s: prompt ids and gen_text match\n", files[i]);
        kt_vocab_free(v);
        json_decref(doc);
    }
    kt_vocab_free(tok512);
    free_list(files, n_files);
}

/* ---- detokenizer --------------------------------------------------------- */

static bool has_byte_token(const kt_vocab *v, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++)
        if (kt_vocab_type(v, ids[i]) == KT_TOKEN_BYTE) return true;
    return false;
}

static void check_split_utf8(const kt_vocab *v) {
    static const char text[] = "héllo 😀 世界";
    int n, held;
    int32_t *ids = encode(v, text, strlen(text), true, &n);
    assert_true(has_byte_token(v, ids, n));
    char *out = detok_all(v, ids, n, true, &held);
    assert_string_equal(out, text);
    assert_true(held >= 2); /* BOS, and at least one partial character */
    free(out);
    free(ids);
}

static void test_detok_split_utf8(void **state) {
    (void)state;
    kt_vocab *v = load_tok512();
    check_split_utf8(v);
    kt_vocab_free(v);
    v = load_gguf_vocab(tu_shared("vocab/ggml-vocab-llama-spm.gguf"));
    check_split_utf8(v);
    kt_vocab_free(v);
}

/* Pushes the given ids and returns the concatenated output (with flush). */
static char *detok_ids(const kt_vocab *v, const int32_t *ids, int n) {
    return detok_all(v, ids, n, false, NULL);
}

#define BYTE(b) ((int32_t)(b) + 3) /* llama2.c layout: <0xNN> is NN + 3 */

static void test_detok_invalid(void **state) {
    (void)state;
    kt_vocab *v = load_tok512();
    int32_t a = kt_vocab_find(v, "a", 1);
    assert_true(a > 258);
    struct { int32_t ids[6]; int n; const char *want; } cases[] = {
        { { BYTE(0xFF) }, 1, "\xEF\xBF\xBD" },
        { { BYTE(0xE4), BYTE(0xB8), a }, 3, "\xEF\xBF\xBD" "a" },
        { { BYTE(0xE4) }, 1, "\xEF\xBF\xBD" }, /* flush of an incomplete tail */
        { { BYTE(0xF0), BYTE(0x9F), BYTE(0xE4), BYTE(0xB8), BYTE(0x96) }, 5,
          "\xEF\xBF\xBD" "世" },
        { { BYTE(0xC0), BYTE(0xAF) }, 2, "\xEF\xBF\xBD\xEF\xBF\xBD" }, /* overlong */
        { { BYTE(0xED), BYTE(0xA0), BYTE(0x80) }, 3,
          "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" }, /* surrogate */
        { { BYTE(0x80), a }, 2, "\xEF\xBF\xBD" "a" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = detok_ids(v, cases[i].ids, cases[i].n);
        if (strcmp(out, cases[i].want) != 0) fprintf(stderr, "case %zu: '%s'\n", i, out);
        assert_string_equal(out, cases[i].want);
        free(out);
    }
    /* <unk> between the bytes of a character breaks it. */
    int32_t brk[] = { BYTE(0xE4), 0, BYTE(0xB8) };
    char *out = detok_ids(v, brk, 3);
    assert_string_equal(out, "\xEF\xBF\xBD<unk>\xEF\xBF\xBD");
    free(out);
    /* Control tokens decode to nothing and do not break a character. */
    int32_t ctl[] = { BYTE(0xE4), 1, BYTE(0xB8), 2, BYTE(0x96) };
    out = detok_ids(v, ctl, 5);
    assert_string_equal(out, "世");
    free(out);

    /* strip_leading_space: only the first piece with bytes loses one space. */
    int32_t once = kt_vocab_find(v, "\xE2\x96\x81" "Once", 7);
    int32_t sp = kt_vocab_find(v, "\xE2\x96\x81" "a", 4);
    assert_true(once > 0 && sp > 0);
    int32_t seq[] = { 1, once, sp };
    char *s1 = detok_all(v, seq, 3, true, NULL), *s2 = detok_all(v, seq, 3, false, NULL);
    assert_string_equal(s1, "Once a");
    assert_string_equal(s2, " Once a");
    free(s1);
    free(s2);
    assert_null(kt_text_detok_new(NULL, false));
    kt_vocab_free(v);
}

static void test_decode_piece(void **state) {
    (void)state;
    kt_vocab *v = load_gguf_vocab(tu_shared("vocab/ggml-vocab-llama-spm.gguf"));
    char buf[64];
    int32_t the = kt_vocab_find(v, "\xE2\x96\x81the", 6);
    assert_true(the > 0);
    assert_int_equal(kt_vocab_decode_piece(v, the, buf, sizeof buf), 4);
    assert_memory_equal(buf, " the", 4);
    memset(buf, 'x', sizeof buf);
    assert_int_equal(kt_vocab_decode_piece(v, the, buf, 2), 4); /* needs 4, wrote 2 */
    assert_memory_equal(buf, " tx", 3);
    assert_int_equal(kt_vocab_decode_piece(v, the, NULL, 0), 4);
    assert_int_equal(kt_vocab_decode_piece(v, 13, buf, sizeof buf), 1); /* <0x0A> */
    assert_int_equal(buf[0], '\n');
    assert_int_equal(kt_vocab_type(v, 13), KT_TOKEN_BYTE);
    assert_int_equal(kt_vocab_decode_piece(v, 1, buf, sizeof buf), 0); /* <s> */
    assert_int_equal(kt_vocab_decode_piece(v, 2, buf, sizeof buf), 0); /* </s> */
    assert_int_equal(kt_vocab_decode_piece(v, 0, buf, sizeof buf), 5); /* <unk> */
    assert_memory_equal(buf, "<unk>", 5);
    assert_int_equal(kt_vocab_decode_piece(v, -1, buf, sizeof buf), 0);
    assert_int_equal(kt_vocab_decode_piece(v, 32000, buf, sizeof buf), 0);
    assert_null(kt_vocab_piece(v, 32000, NULL));
    assert_int_equal(kt_vocab_size(v), 32000);
    assert_int_equal(kt_vocab_bos(v), 1);
    assert_int_equal(kt_vocab_eos(v), 2);
    assert_true(kt_vocab_add_bos(v));
    assert_false(kt_vocab_add_eos(v));
    kt_vocab_free(v);
}

/* ---- encoder edge cases -------------------------------------------------- */

static void expect_bad_utf8(const kt_vocab *v, const char *text, size_t len, size_t off) {
    kt_error err = { 0 };
    int32_t ids[64];
    assert_int_equal(kt_vocab_encode(v, text, len, true, ids, 64, &err), -1);
    assert_int_equal(err.status, KT_ERR_ARG);
    char want[64];
    snprintf(want, sizeof want, "offset %zu", off);
    if (!strstr(err.msg, want)) fprintf(stderr, "message: %s (want %s)\n", err.msg, want);
    assert_non_null(strstr(err.msg, want));
}

static void test_encode_edges(void **state) {
    (void)state;
    kt_vocab *v = load_gguf_vocab(tu_shared("vocab/ggml-vocab-llama-spm.gguf"));
    expect_bad_utf8(v, "ab\xC3(x", 5, 2);
    expect_bad_utf8(v, "\xC0\xAF", 2, 0);            /* overlong */
    expect_bad_utf8(v, "xy\xED\xA0\x80", 5, 2);      /* surrogate */
    expect_bad_utf8(v, "abc\xE4\xB8", 5, 3);         /* truncated at the end */
    expect_bad_utf8(v, "\xF4\x90\x80\x80", 4, 0);    /* above U+10FFFF */
    expect_bad_utf8(v, "ok\xFF", 3, 2);

    /* Empty text: BOS alone, or nothing. */
    int32_t ids[64];
    kt_error err = { 0 };
    assert_int_equal(kt_vocab_encode(v, "", 0, true, ids, 64, &err), 1);
    assert_int_equal(ids[0], 1);
    assert_int_equal(kt_vocab_encode(v, NULL, 0, false, NULL, 0, &err), 0);

    /* A short buffer: the count is still right, and only cap ids are written. */
    const char *t = "Hello world, this is a test";
    int n;
    int32_t *full = encode(v, t, strlen(t), true, &n);
    assert_true(n > 4);
    for (int i = 0; i < 64; i++) ids[i] = -7;
    assert_int_equal(kt_vocab_encode(v, t, strlen(t), true, ids, 3, &err), n);
    assert_memory_equal(ids, full, 3 * sizeof *ids);
    assert_int_equal(ids[3], -7);
    free(full);

    /* Control tokens written in text are plain text. */
    static const char *ctl[] = { "<s>", "</s>", "<unk>", "a<s>b</s>", "<0x0A>" };
    for (size_t i = 0; i < sizeof ctl / sizeof ctl[0]; i++) {
        int32_t *x = encode(v, ctl[i], strlen(ctl[i]), false, &n);
        for (int j = 0; j < n; j++) {
            kt_token_type ty = kt_vocab_type(v, x[j]);
            assert_true(ty != KT_TOKEN_CONTROL && ty != KT_TOKEN_UNKNOWN);
            assert_true(ty != KT_TOKEN_BYTE || x[j] != 13);
        }
        free(x);
    }
    /* Bad arguments. */
    assert_int_equal(kt_vocab_encode(v, "a", 1, false, NULL, 5, &err), -1);
    assert_int_equal(err.status, KT_ERR_ARG);
    assert_int_equal(kt_vocab_encode(NULL, "a", 1, false, NULL, 0, &err), -1);
    kt_vocab_free(v);
}

/* Phi-3's vocabulary marks "</s>" user-defined: it is matched in text as a
 * whole, and the text after it gets the "▁" prefix again (llama.cpp). */
static void test_user_defined(void **state) {
    (void)state;
    kt_vocab *v = load_gguf_vocab(tu_shared("vocab/ggml-vocab-phi-3.gguf"));
    assert_int_equal(kt_vocab_type(v, 2), KT_TOKEN_USER_DEFINED);
    int na, nb, n;
    int32_t *a = encode(v, "Hi", 2, false, &na);
    int32_t *b = encode(v, "there", 5, false, &nb);
    int32_t *x = encode(v, "Hi</s>there</s></s>", 19, true, &n);
    assert_int_equal(n, 1 + na + 1 + nb + 2);
    assert_int_equal(x[0], 1);
    assert_memory_equal(x + 1, a, (size_t)na * sizeof *a);
    assert_int_equal(x[1 + na], 2);
    assert_memory_equal(x + 2 + na, b, (size_t)nb * sizeof *b);
    assert_int_equal(x[2 + na + nb], 2);
    assert_int_equal(x[3 + na + nb], 2);
    /* A user-defined token decodes to its text. */
    char *s = detok_all(v, x, n, true, NULL);
    assert_string_equal(s, "Hi</s> there</s></s>");
    free(s);
    free(a);
    free(b);
    free(x);
    /* Control tokens of the same vocabulary are not matched. */
    x = encode(v, "<|endoftext|><s>", 16, false, &n);
    for (int i = 0; i < n; i++) assert_true(x[i] != 32000 && x[i] != 1);
    free(x);
    kt_vocab_free(v);
}

/* ---- writing GGUF -------------------------------------------------------- */

static void write_vocab_file(const kt_vocab *v, const char *path) {
    kt_error err = { 0 };
    gguf_writer *w = gguf_writer_new(&err);
    assert_non_null(w);
    if (kt_vocab_write_gguf(v, w, &err) != KT_OK) fprintf(stderr, "write: %s\n", err.msg);
    assert_int_equal(err.status, KT_OK);
    assert_int_equal(gguf_writer_begin(w, path, &err), KT_OK);
    assert_int_equal(gguf_writer_finish(w, &err), KT_OK);
    gguf_writer_free(w);
}

static void test_write_gguf(void **state) {
    (void)state;
    kt_vocab *a = load_tok512();
    const char *path = tu_tmp("vocab_roundtrip.gguf");
    write_vocab_file(a, path);
    kt_vocab *b = load_gguf_vocab(path);
    assert_same_vocab(a, b);
    kt_vocab *c = load_gguf_vocab(tu_shared("models/stories260K.gguf"));
    assert_same_vocab(b, c);
    assert_same_ids(a, b, "Once upon a time, 世界!", strlen("Once upon a time, 世界!"));
    kt_vocab_free(a);
    kt_vocab_free(b);
    kt_vocab_free(c);

    /* The 32000-token vocabulary survives the trip as well. */
    a = load_gguf_vocab(tu_shared("vocab/ggml-vocab-llama-spm.gguf"));
    write_vocab_file(a, path);
    b = load_gguf_vocab(path);
    assert_same_vocab(a, b);
    kt_vocab_free(a);
    kt_vocab_free(b);
}

/* ---- validation ---------------------------------------------------------- */

/* A small vocabulary written with one thing broken. */
typedef struct bad_case {
    const char *model;      /* NULL: no tokenizer.ggml.model */
    bool no_tokens, tokens_as_i32;
    int n_scores;           /* entries in scores; 0: key absent */
    int32_t type3;          /* type of token 3 (normally 6) */
    int64_t bos;            /* bos_token_id written as u32 when >= 0 */
    bool bos_as_str, flag_as_str;
    const char *piece4;     /* token 4's piece */
    const char *piece3;     /* token 3's piece (a byte token) */
    kt_status expect;
    const char *expect_msg;
} bad_case;

enum { BAD_N = 6 };

static void write_bad(const bad_case *c, const char *path) {
    kt_error err = { 0 };
    gguf_writer *w = gguf_writer_new(&err);
    assert_non_null(w);
    const char *pieces[BAD_N] = { "<unk>", "<s>", "</s>", c->piece3 ? c->piece3 : "<0x41>",
                                  c->piece4 ? c->piece4 : "\xE2\x96\x81" "a", "b" };
    gguf_str strs[BAD_N];
    int32_t types[BAD_N] = { 2, 3, 3, c->type3 ? c->type3 : 6, 1, 1 };
    float scores[BAD_N + 1] = { 0, 0, 0, 0, -1, -2, -3 };
    for (int i = 0; i < BAD_N; i++) strs[i] = (gguf_str){ pieces[i], strlen(pieces[i]) };
    if (c->model) gguf_writer_set_str(w, "tokenizer.ggml.model", c->model, &err);
    if (c->tokens_as_i32)
        gguf_writer_set_arr(w, "tokenizer.ggml.tokens", GGUF_I32, types, BAD_N, &err);
    else if (!c->no_tokens)
        gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, BAD_N, &err);
    if (c->n_scores)
        gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_F32, scores, (uint64_t)c->n_scores, &err);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_I32, types, BAD_N, &err);
    if (c->bos >= 0) gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos, &err);
    if (c->bos_as_str) gguf_writer_set_str(w, "tokenizer.ggml.bos_token_id", "1", &err);
    if (c->flag_as_str) gguf_writer_set_str(w, "tokenizer.ggml.add_bos_token", "yes", &err);
    gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", UINT32_MAX, &err);
    assert_int_equal(err.status, KT_OK);
    assert_int_equal(gguf_writer_begin(w, path, &err), KT_OK);
    assert_int_equal(gguf_writer_finish(w, &err), KT_OK);
    gguf_writer_free(w);
}

static void test_validation(void **state) {
    (void)state;
    const bad_case cases[] = {
        { .model = "llama", .n_scores = BAD_N, .bos = 1, .expect = KT_OK },
        { .model = NULL, .n_scores = BAD_N, .bos = 1, .expect = KT_ERR_FORMAT,
          .expect_msg = "tokenizer.ggml.model" },
        { .model = "t5", .n_scores = BAD_N, .bos = 1, .expect = KT_ERR_UNSUPPORTED,
          .expect_msg = "tokenizer model 't5' is not supported yet" },
        { .model = "llama", .no_tokens = true, .n_scores = BAD_N, .bos = 1,
          .expect = KT_ERR_FORMAT, .expect_msg = "missing key tokenizer.ggml.tokens" },
        { .model = "llama", .tokens_as_i32 = true, .n_scores = BAD_N, .bos = 1,
          .expect = KT_ERR_FORMAT, .expect_msg = "tokenizer.ggml.tokens: expected an array of string" },
        { .model = "llama", .n_scores = BAD_N + 1, .bos = 1, .expect = KT_ERR_FORMAT,
          .expect_msg = "tokenizer.ggml.scores" },
        { .model = "llama", .n_scores = BAD_N, .type3 = 9, .bos = 1, .expect = KT_ERR_FORMAT,
          .expect_msg = "tokenizer.ggml.token_type[3]" },
        { .model = "llama", .n_scores = BAD_N, .bos = BAD_N, .expect = KT_ERR_FORMAT,
          .expect_msg = "tokenizer.ggml.bos_token_id" },
        { .model = "llama", .n_scores = BAD_N, .bos = -1, .bos_as_str = true,
          .expect = KT_ERR_FORMAT, .expect_msg = "tokenizer.ggml.bos_token_id" },
        { .model = "llama", .n_scores = BAD_N, .bos = 1, .flag_as_str = true,
          .expect = KT_ERR_FORMAT, .expect_msg = "tokenizer.ggml.add_bos_token" },
        { .model = "llama", .n_scores = BAD_N, .bos = 1, .piece4 = "a\xC3(",
          .expect = KT_ERR_FORMAT, .expect_msg = "tokenizer.ggml.tokens[4]" },
        { .model = "llama", .n_scores = BAD_N, .bos = 1, .piece3 = "<0xZZ>",
          .expect = KT_ERR_FORMAT, .expect_msg = "tokenizer.ggml.tokens[3]" },
    };
    const char *path = tu_tmp("vocab_bad.gguf");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_bad(&cases[i], path);
        kt_error err = { 0 };
        gguf_file *f = gguf_open(path, &err);
        assert_non_null(f);
        kt_vocab *v = kt_vocab_from_gguf(f, &err);
        gguf_close(f);
        if (err.status != cases[i].expect ||
            (cases[i].expect_msg && !strstr(err.msg, cases[i].expect_msg)))
            fprintf(stderr, "case %zu: status %d, '%s'\n", i, err.status, err.msg);
        assert_int_equal(err.status, cases[i].expect);
        if (cases[i].expect != KT_OK) {
            assert_null(v);
            assert_non_null(strstr(err.msg, cases[i].expect_msg));
            continue;
        }
        assert_non_null(v);
        assert_int_equal(kt_vocab_pad(v), -1); /* u32 max means none */
        assert_int_equal(kt_vocab_eos(v), 2);  /* llama.cpp's default */
        /* "a" + "b" merge nowhere; "A" falls back to <0x41>. */
        int n;
        int32_t *ids = encode(v, "aA", 2, true, &n);
        int32_t want[] = { 1, 4, 3 };
        assert_true(ids_equal(ids, n, want, 3));
        free(ids);
        /* "c" has no byte token: one <unk>. */
        ids = encode(v, "c", 1, false, &n);
        assert_int_equal(n, 2);
        assert_int_equal(ids[1], 0);
        free(ids);
        kt_vocab_free(v);
    }
    assert_null(kt_vocab_from_gguf(NULL, NULL));
}

/* A small byte-level BPE vocabulary written with one thing broken. */
typedef struct bpe_case {
    const char *pre;        /* NULL: no tokenizer.ggml.pre */
    bool pre_as_u32;
    bool no_merges, merges_as_i32;
    const char *merge1;     /* the second merge (normally "\xC4\xA0 ab", "Ġ ab") */
    kt_status expect;
    const char *expect_msg;
} bpe_case;

static void write_bpe(const bpe_case *c, const char *path) {
    kt_error err = { 0 };
    gguf_writer *w = gguf_writer_new(&err);
    assert_non_null(w);
    const char *pieces[] = { "a", "b", "ab", "\xC4\xA0", "\xC4\xA0" "ab", "c", "<|end|>" };
    const char *merges[] = { "a b", c->merge1 ? c->merge1 : "\xC4\xA0 ab" };
    int32_t types[] = { 1, 1, 1, 1, 1, 1, 3 };
    gguf_str strs[7], ms[2];
    for (int i = 0; i < 7; i++) strs[i] = (gguf_str){ pieces[i], strlen(pieces[i]) };
    for (int i = 0; i < 2; i++) ms[i] = (gguf_str){ merges[i], strlen(merges[i]) };
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", &err);
    if (c->pre) gguf_writer_set_str(w, "tokenizer.ggml.pre", c->pre, &err);
    if (c->pre_as_u32) gguf_writer_set_u32(w, "tokenizer.ggml.pre", 2, &err);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, 7, &err);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_I32, types, 7, &err);
    if (c->merges_as_i32)
        gguf_writer_set_arr(w, "tokenizer.ggml.merges", GGUF_I32, types, 2, &err);
    else if (!c->no_merges)
        gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", ms, 2, &err);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 6, &err);
    assert_int_equal(err.status, KT_OK);
    assert_int_equal(gguf_writer_begin(w, path, &err), KT_OK);
    assert_int_equal(gguf_writer_finish(w, &err), KT_OK);
    gguf_writer_free(w);
}

/* The small vocabulary's behaviour: merges by rank, the space character,
 * bytes with no token dropped (llama.cpp), defaults. */
static void check_small_bpe(const kt_vocab *v, bool add_bos) {
    int n;
    int32_t *ids = encode(v, "ab ab abd c", 11, false, &n);
    int32_t want[] = { 2, 4, 4, 3, 5 }; /* ab Ġab Ġab (d: no token) Ġ c */
    if (!ids_equal(ids, n, want, 5)) print_ids("got", ids, n);
    assert_true(ids_equal(ids, n, want, 5));
    free(ids);
    assert_int_equal(kt_vocab_eos(v), 6);
    assert_int_equal(kt_vocab_bos(v), -1); /* the default 11 is out of range */
    assert_int_equal(kt_vocab_add_bos(v), add_bos); /* llama3's default is true */
}

static void test_bpe_validation(void **state) {
    (void)state;
    const bpe_case cases[] = {
        { .pre = "gpt-2", .expect = KT_OK },
        { .pre = NULL, .expect = KT_OK }, /* "default" */
        { .pre = "starcoder", .expect = KT_OK },
        { .pre = "llama-bpe", .expect = KT_OK },
        { .pre = "qwen2", .expect = KT_OK },
        { .pre = "qwen35", .expect = KT_OK },
        { .pre = "gpt-4o", .expect = KT_OK },
        { .pre = "deepseek-llm", .expect = KT_OK },
        { .pre = "falcon", .expect = KT_OK },
        { .pre = "no-such-pre", .expect = KT_ERR_UNSUPPORTED, .expect_msg = "tokenizer.ggml.pre" },
        { .pre_as_u32 = true, .expect = KT_ERR_FORMAT, .expect_msg = "tokenizer.ggml.pre" },
        { .pre = "gpt-2", .no_merges = true, .expect = KT_ERR_FORMAT,
          .expect_msg = "missing key tokenizer.ggml.merges" },
        { .pre = "gpt-2", .merges_as_i32 = true, .expect = KT_ERR_FORMAT,
          .expect_msg = "tokenizer.ggml.merges: expected an array of string" },
        { .pre = "gpt-2", .merge1 = "ab", .expect = KT_ERR_FORMAT,
          .expect_msg = "tokenizer.ggml.merges[1]" },
        { .pre = "gpt-2", .merge1 = "a x", .expect = KT_ERR_FORMAT,
          .expect_msg = "tokenizer.ggml.merges[1]" },
        { .pre = "gpt-2", .merge1 = "a ", .expect = KT_ERR_FORMAT,
          .expect_msg = "tokenizer.ggml.merges[1]" },
        { .pre = "gpt-2", .merge1 = "", .expect = KT_ERR_FORMAT,
          .expect_msg = "tokenizer.ggml.merges[1]" },
    };
    const char *path = tu_tmp("vocab_bpe.gguf");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_bpe(&cases[i], path);
        kt_error err = { 0 };
        gguf_file *f = gguf_open(path, &err);
        assert_non_null(f);
        kt_vocab *v = kt_vocab_from_gguf(f, &err);
        gguf_close(f);
        if (err.status != cases[i].expect ||
            (cases[i].expect_msg && !strstr(err.msg, cases[i].expect_msg)))
            fprintf(stderr, "bpe case %zu: status %d, '%s'\n", i, err.status, err.msg);
        assert_int_equal(err.status, cases[i].expect);
        if (cases[i].expect != KT_OK) {
            assert_null(v);
            assert_non_null(strstr(err.msg, cases[i].expect_msg));
            continue;
        }
        assert_non_null(v);
        check_small_bpe(v, cases[i].pre && strcmp(cases[i].pre, "llama-bpe") == 0);
        kt_vocab_free(v);
    }
}

/* ---- Gemma 4 ("gemma4") --------------------------------------------------- */

/* A small "gemma4" vocabulary: newline runs, "▁", byte tokens for "b" and
 * "é" only, and two merges; "\n\n\n" is a token no merge builds. */
static void write_gemma4(const char *path, bool merges) {
    kt_error err = { 0 };
    gguf_writer *w = gguf_writer_new(&err);
    assert_non_null(w);
    const char *pieces[] = { "<pad>", "<eos>", "<bos>", "<unk>", "\n", "\n\n", "\n\n\n", "a",
                             "\xE2\x96\x81", "\xE2\x96\x81" "a", "<0x62>", "<0xC3>", "<0xA9>",
                             "c" };
    int32_t types[] = { 3, 3, 3, 2, 1, 1, 1, 1, 1, 1, 6, 6, 6, 1 };
    const char *ms[] = { "\n \n", "\xE2\x96\x81 a" };
    enum { N = sizeof pieces / sizeof pieces[0] };
    gguf_str strs[N], mstrs[2];
    for (int i = 0; i < N; i++) strs[i] = (gguf_str){ pieces[i], strlen(pieces[i]) };
    for (int i = 0; i < 2; i++) mstrs[i] = (gguf_str){ ms[i], strlen(ms[i]) };
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gemma4", &err);
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt-2", &err); /* not read */
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, N, &err);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_I32, types, N, &err);
    if (merges) gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", mstrs, 2, &err);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 2, &err);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 1, &err);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false, &err);
    assert_int_equal(err.status, KT_OK);
    assert_int_equal(gguf_writer_begin(w, path, &err), KT_OK);
    assert_int_equal(gguf_writer_finish(w, &err), KT_OK);
    gguf_writer_free(w);
}

static void expect_ids(const kt_vocab *v, const char *text, const int32_t *want, int nw) {
    int n;
    int32_t *ids = encode(v, text, strlen(text), false, &n);
    if (!ids_equal(ids, n, want, nw)) {
        fprintf(stderr, "'%s'\n", text);
        print_ids("  want", want, nw);
        print_ids("  got ", ids, n);
    }
    assert_true(ids_equal(ids, n, want, nw));
    free(ids);
}

/* The rules the test vectors cannot tell apart, on the small vocabulary:
 * a newline run that is a token is taken whole, merges run by rank over
 * "▁"-escaped UTF-8, bytes fall back to <0xNN> or are dropped ("d" has
 * neither a token nor a byte token, "c" is a token but no byte token). */
static void test_gemma4_small(void **state) {
    (void)state;
    const char *path = tu_tmp("vocab_gemma4.gguf");
    write_gemma4(path, true);
    kt_vocab *v = load_gguf_vocab(path);
    assert_int_equal(kt_vocab_get_kind(v), KT_VOCAB_GEMMA4);
    assert_true(kt_vocab_add_bos(v)); /* forced on, as llama.cpp */
    assert_false(kt_vocab_add_space_prefix(v));
    assert_int_equal(kt_vocab_bos(v), 2);
    assert_int_equal(kt_vocab_eos(v), 1);
    assert_int_equal(kt_vocab_unk(v), -1); /* no key: none */
    assert_int_equal(kt_vocab_pad(v), -1);
    int32_t w1[] = { 7, 9, 6, 10, 8, 11, 12, 13 }; /* a ▁a \n\n\n b ▁ é c (d dropped) */
    expect_ids(v, "a a\n\n\nb \xC3\xA9" "cd", w1, 8);
    int32_t w2[] = { 5, 5, 5, 4 }; /* not a token: merged by rank */
    expect_ids(v, "\n\n\n\n\n\n\n", w2, 4);
    int32_t w3[] = { 9, 9 }; /* a typed "▁" is a space: ▁a ▁a */
    expect_ids(v, "\xE2\x96\x81" "a a", w3, 2);
    int n;
    int32_t *ids = encode(v, "a a\n\n\nb \xC3\xA9", 10, true, &n);
    assert_int_equal(ids[0], 2);
    char *d = detok_all(v, ids, n, false, NULL);
    assert_string_equal(d, "a a\n\n\nb \xC3\xA9");
    free(d);
    free(ids);
    kt_vocab_free(v);

    write_gemma4(path, false);
    kt_error err = { 0 };
    gguf_file *f = gguf_open(path, &err);
    assert_non_null(f);
    assert_null(kt_vocab_from_gguf(f, &err));
    gguf_close(f);
    assert_int_equal(err.status, KT_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "missing key tokenizer.ggml.merges"));
}

/* The real vocabulary: its special ids, decoding of "▁", byte fallback for
 * a character it has no token for, newline runs, special tokens. */
static void test_gemma4(void **state) {
    (void)state;
    kt_vocab *v = load_gguf_vocab(tu_shared("vocab/ggml-vocab-gemma-4.gguf"));
    assert_int_equal(kt_vocab_get_kind(v), KT_VOCAB_GEMMA4);
    assert_int_equal(kt_vocab_bos(v), 2);
    assert_int_equal(kt_vocab_eos(v), 1);
    assert_int_equal(kt_vocab_unk(v), 3);
    assert_int_equal(kt_vocab_pad(v), 0);
    assert_true(kt_vocab_add_bos(v));
    assert_false(kt_vocab_add_eos(v));
    assert_false(kt_vocab_add_space_prefix(v));
    char buf[64];
    int32_t id = kt_vocab_find(v, "\xE2\x96\x81\xE2\x96\x81", 6); /* "▁▁" */
    assert_true(id >= 0);
    assert_int_equal(kt_vocab_decode_piece(v, id, buf, sizeof buf), 2);
    assert_memory_equal(buf, "  ", 2);
    assert_int_equal(kt_vocab_decode_piece(v, 2, buf, sizeof buf), 0); /* <bos> */
    id = kt_vocab_find(v, "<0x0A>", 6);
    assert_int_equal(kt_vocab_type(v, id), KT_TOKEN_BYTE);
    assert_int_equal(kt_vocab_decode_piece(v, id, buf, sizeof buf), 1);
    assert_int_equal(buf[0], '\n');

    /* U+10FFFD has no token: its four bytes, reassembled by the detokenizer. */
    static const char pua[] = "x \xF4\x8F\xBF\xBD";
    int n, held;
    int32_t *ids = encode(v, pua, strlen(pua), false, &n);
    assert_true(has_byte_token(v, ids, n));
    char *d = detok_all(v, ids, n, false, &held);
    assert_string_equal(d, pua);
    assert_true(held >= 3);
    free(d);
    free(ids);

    int32_t nl3 = kt_vocab_find(v, "\n\n\n", 3);
    assert_true(nl3 >= 0);
    expect_ids(v, "\n\n\n", &nl3, 1);
    assert_same_encoding(v, "a\xE2\x96\x81" "b", "a b");

    /* User-defined tokens always, control ones only when asked. */
    int32_t tc = kt_vocab_find(v, "<|tool_call>", 12);
    assert_int_equal(kt_vocab_type(v, tc), KT_TOKEN_USER_DEFINED);
    ids = encode(v, "x<|tool_call>y", 14, false, &n);
    assert_true(contains(ids, n, tc));
    free(ids);
    int32_t turn = kt_vocab_find(v, "<|turn>", 7);
    assert_int_equal(kt_vocab_type(v, turn), KT_TOKEN_CONTROL);
    check_special(v, "<|turn>", turn, "Hi", "user\nthere", "user\nthere");
    kt_vocab_free(v);
}

/* ---- pre-tokenizer ------------------------------------------------------- */

/* The spans kt_pretok_split makes of text, as "[a][b]...". */
static void expect_split(const char *pre, const char *text, const char *want) {
    kt_error err = { 0 };
    kt_pretok *p = kt_pretok_new(pre, strlen(pre), NULL, NULL, &err);
    assert_non_null(p);
    kt_span_list out = { 0 }, tmp = { 0 };
    assert_int_equal(kt_pretok_split(p, text, strlen(text), &out, &tmp, &err), KT_OK);
    char got[512];
    size_t o = 0;
    for (size_t i = 0; i < out.n; i++)
        o += (size_t)snprintf(got + o, sizeof got - o, "[%.*s]", (int)out.s[i].len,
                              text + out.s[i].off);
    if (strcmp(got, want) != 0) fprintf(stderr, "%s: '%s' splits as %s\n", pre, text, got);
    assert_string_equal(got, want);
    kt_span_list_free(&out);
    kt_span_list_free(&tmp);
    kt_pretok_free(p);
}

/* qwen35 keeps combining marks (\p{M}) in the word of their letter; qwen2
 * splits them off (the test vectors encode the same either way). */
static void test_pretok_marks(void **state) {
    (void)state;
    static const char text[] = "ca\xCC\x80" "fe\xCC\x81 \xCC\x81x! y";
    expect_split("qwen35", text, "[ca\xCC\x80" "fe\xCC\x81][ \xCC\x81x][!][ y]");
    expect_split("qwen2", text, "[ca][\xCC\x80" "fe][\xCC\x81][ \xCC\x81][x][!][ y]");
    kt_span_list out = { 0 };
    kt_error err = { 0 };
    assert_int_equal(kt_pretok_split_lines("a\n\nb c\n", 7, &out, &err), KT_OK);
    assert_int_equal(out.n, 4);
    assert_int_equal(out.s[1].off, 1);
    assert_int_equal(out.s[1].len, 2);
    assert_int_equal(out.s[2].len, 3);
    kt_span_list_free(&out);
}

static void expect_llama2c_error(const char *path, int n_vocab, kt_status st) {
    kt_error err = { 0 };
    kt_vocab *v = kt_vocab_from_llama2c(path, n_vocab, &err);
    if (v || err.status != st) fprintf(stderr, "%s (%d): %d '%s'\n", path, n_vocab, err.status, err.msg);
    assert_null(v);
    assert_int_equal(err.status, st);
}

static void test_llama2c_errors(void **state) {
    (void)state;
    const char *good = tu_shared("models/tok512.bin");
    expect_llama2c_error(good, 600, KT_ERR_FORMAT); /* runs out */
    expect_llama2c_error(good, 400, KT_ERR_FORMAT); /* bytes left over */
    expect_llama2c_error(good, 100, KT_ERR_FORMAT); /* too small for the layout */
    expect_llama2c_error("/nonexistent/tokenizer.bin", 512, KT_ERR_IO);
    size_t size;
    char *buf = tu_read_file(good, &size);
    assert_non_null(buf);
    const char *path = tu_tmp("tok_bad.bin");
    assert_int_equal(tu_write_file(path, buf, size - 3), 0);
    expect_llama2c_error(path, 512, KT_ERR_FORMAT);
    char *p = memmem(buf, size, "<0x00>", 6);
    assert_non_null(p);
    p[4] = '7'; /* token 3 no longer stands for byte 0 */
    assert_int_equal(tu_write_file(path, buf, size), 0);
    expect_llama2c_error(path, 512, KT_ERR_FORMAT);
    free(buf);
}

/* ---- throughput ---------------------------------------------------------- */

static void test_throughput(void **state) {
    (void)state;
    kt_vocab *v = load_gguf_vocab(tu_shared("vocab/ggml-vocab-llama-spm.gguf"));
    size_t len;
    char *story = tu_read_file(tu_shared("golden/stories260K.once.txt"), &len);
    assert_non_null(story);
    size_t total = 1 << 20, n = 0;
    char *text = malloc(total + len);
    assert_non_null(text);
    while (n < total) {
        memcpy(text + n, story, len);
        n += len;
    }
    /* Best of three, so a cold cache or a busy machine does not decide. */
    kt_error err = { 0 };
    double best = 1e30;
    int count = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = kt_time_ms();
        count = kt_vocab_encode(v, text, n, true, NULL, 0, &err);
        double ms = kt_time_ms() - t0;
        if (ms < best) best = ms;
    }
    /* English runs about 3 to 4 bytes per token with this vocabulary. */
    assert_true(count > (int)(n / 8) && count < (int)(n / 2));
    printf("encode throughput (Llama 2 vocab): %.2f MB in %.1f ms = %.1f MB/s (%d tokens)\n",
           (double)n / 1e6, best, (double)n / 1e3 / best, count);
    free(text);
    free(story);
    kt_vocab_free(v);
}

/* ---- KT_VOCAB_BENCH=1: byte-level BPE throughput ------------------------- */

/* ~1 MB: src copies of buf[0..len) back to back. */
static char *repeat_to_mb(const char *src, size_t len, size_t *out_len) {
    size_t total = 1 << 20, n = 0;
    char *text = malloc(total + len);
    if (!text) return NULL;
    while (n < total) {
        memcpy(text + n, src, len);
        n += len;
    }
    *out_len = n;
    return text;
}

/* The output of a shell command (e.g. files concatenated). */
static char *command_output(const char *cmd, size_t *len) {
    char *out = NULL;
    if (tu_run(cmd, &out, NULL) != 0 || !out) {
        free(out);
        return NULL;
    }
    *len = strlen(out);
    return out;
}

/* Best of five encode and decode (decode_piece into one buffer) runs. */
static int bench_one(const kt_vocab *v, const char *label, const char *text, size_t n) {
    kt_error err = { 0 };
    int count = kt_vocab_encode(v, text, n, false, NULL, 0, &err);
    int32_t *ids = count > 0 ? malloc((size_t)count * sizeof *ids) : NULL;
    char *out = malloc(n + 1);
    if (!ids || !out) {
        fprintf(stderr, "%s: encode failed or out of memory: %s\n", label, err.msg);
        free(ids);
        free(out);
        return 1;
    }
    double enc = 1e30, dec = 1e30;
    size_t o = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = kt_time_ms();
        kt_vocab_encode(v, text, n, false, ids, count, &err);
        double t1 = kt_time_ms();
        o = 0;
        for (int i = 0; i < count; i++)
            o += (size_t)kt_vocab_decode_piece(v, ids[i], out + o, (int)(n - o));
        double t2 = kt_time_ms();
        if (t1 - t0 < enc) enc = t1 - t0;
        if (t2 - t1 < dec) dec = t2 - t1;
    }
    int ok = o == n && memcmp(out, text, n) == 0;
    printf("%-22s %.2f MB, %d tokens: encode %.1f ms = %.1f MB/s, decode %.1f ms = %.1f MB/s%s\n",
           label, (double)n / 1e6, count, enc, (double)n / 1e3 / enc, dec, (double)n / 1e3 / dec,
           ok ? "" : " (ROUND TRIP FAILED)");
    free(ids);
    free(out);
    return ok ? 0 : 1;
}

static int run_bench(void) {
    kt_error err = { 0 };
    gguf_file *f = gguf_open(tu_shared("vocab/ggml-vocab-gpt-2.gguf"), &err);
    kt_vocab *v = f ? kt_vocab_from_gguf(f, &err) : NULL;
    gguf_close(f);
    size_t ls = 0, lc = 0, ne = 0, nc = 0;
    char *story = tu_read_file(tu_shared("golden/stories260K.once.txt"), &ls);
    /* every .c file of kettle's src/ (found from this file's path) */
    char dir[4096], cmd[4300];
    snprintf(dir, sizeof dir, "%s", __FILE__);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    snprintf(cmd, sizeof cmd, "cat %s/../src/*/*.c", dir);
    char *src = command_output(cmd, &lc);
    /* varied English prose: Debian's licence texts (about 300 KB) */
    size_t ll = 0, nl = 0;
    char *lic = command_output("cat /usr/share/common-licenses/* 2>/dev/null", &ll);
    char *en = story ? repeat_to_mb(story, ls, &ne) : NULL;
    char *c = src ? repeat_to_mb(src, lc, &nc) : NULL;
    char *prose = lic && ll > 0 ? repeat_to_mb(lic, ll, &nl) : NULL;
    int rc = 1;
    if (v && en && c) {
        printf("byte-level BPE, GPT-2 vocabulary, one thread, best of 5\n");
        rc = bench_one(v, "English (stories)", en, ne);
        if (prose) rc |= bench_one(v, "English (licences)", prose, nl);
        rc |= bench_one(v, "C source (src/*/*.c)", c, nc);
    } else {
        fprintf(stderr, "bench: cannot load the vocabulary or the texts: %s\n", err.msg);
    }
    free(story);
    free(src);
    free(lic);
    free(prose);
    free(en);
    free(c);
    kt_vocab_free(v);
    return rc;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocab_vectors),
        cmocka_unit_test(test_vocab_gpt4o),
        cmocka_unit_test(test_llama2c_matches_gguf),
        cmocka_unit_test(test_matches_naive),
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_detok_split_utf8),
        cmocka_unit_test(test_detok_invalid),
        cmocka_unit_test(test_decode_piece),
        cmocka_unit_test(test_encode_edges),
        cmocka_unit_test(test_user_defined),
        cmocka_unit_test(test_write_gguf),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_llama2c_errors),
        cmocka_unit_test(test_throughput),
        cmocka_unit_test(test_bpe_roundtrip),
        cmocka_unit_test(test_bpe_decode),
        cmocka_unit_test(test_parse_specials),
        cmocka_unit_test(test_bpe_validation),
        cmocka_unit_test(test_wpm),
        cmocka_unit_test(test_gemma4_small),
        cmocka_unit_test(test_gemma4),
        cmocka_unit_test(test_pretok_marks),
    };
    const char *bench = getenv("KT_VOCAB_BENCH");
    if (bench && strcmp(bench, "1") == 0) return run_bench();
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
