/*
 * test_constraint.c - the fast token masks (src/grammar/constraint.h)
 * against the reference matcher (kt_gmatch), and the token trie.
 *
 * For real vocabularies and llama.cpp's grammars, random walks through
 * each grammar compare, at every step, the whole mask with what the
 * reference matcher says of every token; the walk then takes a random
 * allowed token in both. Any difference is a failure naming the token.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "gguf/gguf.h"
#include "grammar/constraint.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/token_trie.h"
#include "testutil.h"
#include "text/vocab.h"

static kt_vocab *load_vocab(const char *name) {
    kt_error err = {0};
    gguf_file *f = gguf_open(tu_shared(name), &err);
    if (!f) fail_msg("%s", err.msg);
    kt_vocab *v = kt_vocab_from_gguf(f, &err);
    gguf_close(f);
    if (!v) fail_msg("%s", err.msg);
    return v;
}

static kt_grammar *parse(const char *text) {
    kt_error err = {0};
    kt_grammar *g = kt_grammar_parse(text, strlen(text), NULL, &err);
    if (!g) fail_msg("%s", err.msg);
    return g;
}

/* The trie: every token with bytes is under the node of its bytes, the
 * subtree ranges hold exactly the tokens with that prefix. */
static void test_trie_layout(void **state) {
    (void)state;
    const char *words[] = {"a", "ab", "abc", "b", "ab", "", "ba", "\xe2\x82", "\xe2\x82\xac"};
    const int n = 9;
    const uint8_t *bytes[9];
    uint32_t lens[9];
    for (int i = 0; i < n; i++) bytes[i] = (const uint8_t *)words[i], lens[i] = (uint32_t)strlen(words[i]);
    kt_error err = {0};
    kt_token_trie *t = kt_token_trie_new(n, bytes, lens, &err);
    assert_non_null(t);
    assert_int_equal(t->n_sorted, 8); /* "" is not in it */
    assert_false(kt_token_trie_has(t, 5));
    assert_int_equal(t->max_depth, 3);
    /* walk every node, rebuilding its path: tokens at it have that path */
    uint8_t path[8];
    uint32_t depth_end[8], depth = 0;
    depth_end[0] = t->end[0];
    int seen = 0;
    for (uint32_t i = 1; i < t->n_nodes; i++) {
        while (i >= depth_end[depth]) depth--;
        path[depth] = t->byte[i];
        depth_end[++depth] = t->end[i];
        for (uint32_t k = t->first[i]; k < t->first[i + 1]; k++, seen++) {
            int32_t id = t->sorted[k];
            assert_int_equal(lens[id], depth);
            assert_memory_equal(bytes[id], path, depth);
        }
    }
    assert_int_equal(seen, 8);
    /* the subtree of "a" holds a, ab, ab (twice), abc */
    uint32_t a = 1;
    assert_int_equal(t->byte[a], 'a');
    assert_int_equal(t->first[t->end[a]] - t->first[a], 4);
    kt_token_trie_free(t);
}

/* Is b[0..n) a prefix of valid UTF-8 (read from a character boundary)?
 * The plain definition, to check the trie's summaries against. */
static bool utf8_prefix_ok(const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = b[i];
        size_t len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!len) return false;
        uint8_t lo = 0x80, hi = 0xBF; /* the second byte's range */
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
        for (size_t k = 1; k < len && i + k < n; k++)
            if (b[i + k] < (k == 1 ? lo : 0x80) || b[i + k] > (k == 1 ? hi : 0xBF)) return false;
        i += len;
    }
    return true;
}

/* The per-node summaries the walks skip subtrees with (below_ascii,
 * below_flags, below_height), recomputed from the tokens under each node
 * of a real vocabulary. A token's path passes through every node of its
 * prefix, so its bytes past a node's depth are what lies below it. */
static void test_trie_summaries(void **state) {
    (void)state;
    kt_vocab *v = load_vocab("vocab/ggml-vocab-llama-spm.gguf");
    kt_error err = {0};
    kt_token_trie *t = kt_token_trie_from_vocab(v, &err);
    assert_non_null(t);
    uint32_t *depth = tu_xmalloc(sizeof(uint32_t) * t->n_nodes), stack[70000], sp = 0;
    depth[0] = 0, stack[0] = 0;
    int n_high = 0, n_invalid = 0;
    for (uint32_t i = 1; i < t->n_nodes; i++) {
        while (i >= t->end[stack[sp]]) sp--;
        depth[i] = sp + 1, stack[++sp] = i;
    }
    for (uint32_t i = 0; i < t->n_nodes; i++) {
        uint64_t ascii[2] = {0, 0};
        bool high = false, valid = true;
        uint32_t height = 0;
        for (uint32_t k = t->first[i]; k < t->first[t->end[i]]; k++) {
            int32_t id = t->sorted[k];
            const uint8_t *b = t->bytes + t->tok_off[id];
            uint32_t len = t->tok_len[id];
            if (len - depth[i] > height) height = len - depth[i];
            for (uint32_t d = depth[i]; d < len; d++) {
                if (b[d] < 0x80) ascii[b[d] >> 6] |= 1ull << (b[d] & 63);
                else high = true;
            }
            valid &= utf8_prefix_ok(b + depth[i], len - depth[i]);
        }
        assert_true(t->below_ascii[i][0] == ascii[0] && t->below_ascii[i][1] == ascii[1]);
        assert_int_equal(t->below_height[i], height);
        assert_int_equal(!!(t->below_flags[i] & KT_TRIE_HIGH_BELOW), high);
        assert_int_equal(!!(t->below_flags[i] & KT_TRIE_UTF8_BELOW), valid);
        n_high += high, n_invalid += !valid;
    }
    assert_true(n_high > 1000 && n_invalid > 0); /* both kinds occur: the check saw something */
    free(depth);
    kt_token_trie_free(t);
    kt_vocab_free(v);
}

/* What the reference matcher says of token id after state m. */
static bool ref_allows(const kt_gmatch *m, const kt_token_trie *t, int32_t id) {
    if (!kt_token_trie_has(t, id)) return false;
    kt_gmatch *x = kt_gmatch_clone(m);
    assert_non_null(x);
    bool ok = kt_gmatch_token(x, id, t->bytes + t->tok_off[id], t->tok_len[id]);
    kt_gmatch_free(x);
    return ok;
}

static bool bit(const uint64_t *mask, int32_t id) {
    return (mask[(uint32_t)id >> 6] >> ((uint32_t)id & 63)) & 1;
}

/* Random walks of `steps` tokens through g over trie t: the mask equals
 * the reference's verdict on every token, kt_constraint_allows agrees with
 * the mask, can_end agrees, and EOG is allowed exactly where it can end.
 * Prefers tokens longer than one byte so walks get somewhere. Tokens the
 * mask refuses are checked every `stride`-th (1: all). Returns the number
 * of steps taken.
 * Under AddressSanitizer the tokens the mask allows are checked every
 * ALLOWED_STRIDE-th too (a different share each step): inside a string
 * nearly the whole vocabulary is allowed, and the slow reference on each
 * of them is most of the test's time there. The walk is the same (it
 * picks among every allowed token of the mask, and the reference takes
 * each pick), and every path of the mask and the reference still runs. */
#define ALLOWED_STRIDE (TU_SANITIZED ? 8 : 1)
static int compare_walks(const kt_grammar *g, const kt_token_trie *t, kt_gmask_cache *cache, int walks, int steps,
                         uint64_t seed, int stride) {
    const int32_t eog = 0; /* a control id in every vocabulary used here */
    const uint32_t n_words = ((uint32_t)t->n_vocab + 63) / 64;
    uint64_t *mask = tu_xmalloc(n_words * 8);
    int32_t *allowed = tu_xmalloc(sizeof(int32_t) * (size_t)t->n_vocab);
    int32_t *picks = tu_xmalloc(sizeof(int32_t) * (size_t)steps), *refused = tu_xmalloc(sizeof(int32_t) * (size_t)steps);
    kt_rng rng;
    kt_rng_seed(&rng, seed);
    int taken = 0;
    kt_error err = {0};
    for (int w = 0; w < walks; w++) {
        kt_constraint *c = kt_constraint_new(g, t, cache, &eog, 1, &err);
        if (!c) fail_msg("%s", err.msg);
        kt_gmatch *m = kt_gmatch_new(g, &err);
        if (!m) fail_msg("%s", err.msg);
        int n_picks = 0;
        for (int s = 0; s < steps; s++) {
            refused[s] = -1;
            kt_constraint_mask(c, mask);
            assert_null(kt_constraint_error(c));
            int n_allowed = 0, n_long = 0;
            for (int32_t id = 0; id < t->n_vocab; id++) {
                /* every token the mask allows (ALLOWED_STRIDE-th under ASan);
                 * of the others, every stride-th (a different share each step) */
                if (bit(mask, id) && id != eog && (id + s) % ALLOWED_STRIDE != 0) {
                    allowed[n_allowed++] = id; /* unchecked here; the reference takes it if picked */
                    n_long += t->tok_len[id] > 1;
                    continue;
                }
                if (!bit(mask, id) && (id + s) % stride != 0 && id != eog) continue;
                bool want = id == eog ? kt_gmatch_can_end(m) : ref_allows(m, t, id);
                if (bit(mask, id) != want)
                    fail_msg("walk %d step %d: token %d (%.*s) is %s by the mask, %s by the reference", w, s, (int)id,
                             (int)t->tok_len[id], (const char *)t->bytes + t->tok_off[id],
                             bit(mask, id) ? "allowed" : "refused", want ? "allowed" : "refused");
                if (kt_constraint_allows(c, id) != want) fail_msg("walk %d step %d: allows(%d) disagrees", w, s, (int)id);
                if (!want && refused[s] < 0) refused[s] = id;
                if (want && id != eog) {
                    allowed[n_allowed++] = id;
                    n_long += t->tok_len[id] > 1;
                }
            }
            assert_int_equal(kt_constraint_can_end(c), kt_gmatch_can_end(m));
            if (n_allowed == 0) break;
            int32_t pick;
            do pick = allowed[kt_rng_u64(&rng) % (uint64_t)n_allowed];
            while (n_long > 0 && t->tok_len[pick] < 2 && kt_rng_u64(&rng) % 4);
            assert_true(kt_constraint_accept(c, pick));
            assert_true(kt_gmatch_token(m, pick, t->bytes + t->tok_off[pick], t->tok_len[pick]));
            picks[n_picks++] = pick;
            taken++;
        }
        /* the walk as speculative proposals: all taken from the start; a
         * refused token at step j cuts the run there; nothing changes */
        kt_constraint *c2 = kt_constraint_new(g, t, cache, &eog, 1, &err);
        assert_non_null(c2);
        assert_int_equal(kt_constraint_allows_run(c2, picks, n_picks), n_picks);
        const int j = n_picks / 2;
        if (j < n_picks && refused[j] >= 0) {
            const int32_t keep = picks[j];
            picks[j] = refused[j];
            assert_int_equal(kt_constraint_allows_run(c2, picks, n_picks), j);
            picks[j] = keep;
        }
        if (n_picks) assert_true(kt_constraint_accept(c2, picks[0]));
        kt_constraint_free(c2);
        kt_gmatch_free(m);
        kt_constraint_free(c);
    }
    free(mask), free(allowed), free(picks), free(refused);
    return taken;
}

static char *grammar_file(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "structured/llamacpp_grammar/grammars/%s", name);
    char *text = tu_read_file(tu_shared(rel), NULL);
    if (!text) fail_msg("cannot read %s", rel);
    return text;
}

/* Under AddressSanitizer (the CI's second build, which looks for memory
 * errors, not for wrong masks) each vocabulary takes one walk of half the
 * steps, comparing 16 x fewer of the refused tokens with the slow
 * reference matcher: the same paths run, within the CI's time; the
 * Release build walks as given. */
static void check_vocab(const char *vocab_name, int walks, int steps, int stride) {
    if (TU_SANITIZED) walks = 1, steps = (steps + 1) / 2, stride *= 16;
    if (TU_SANITIZED)
        printf("  (ASan build: %d walk of %d steps, every %dth refused and every %dth allowed token checked)\n", walks,
               steps, stride, ALLOWED_STRIDE);
    kt_vocab *v = load_vocab(vocab_name);
    kt_error err = {0};
    kt_token_trie *t = kt_token_trie_from_vocab(v, &err);
    if (!t) fail_msg("%s", err.msg);
    kt_gmask_cache *cache = kt_gmask_cache_new(t, 64u << 20, &err);
    assert_non_null(cache);
    const char *files[] = {"json.gbnf", "arithmetic.gbnf", "list.gbnf", "japanese.gbnf", "c.gbnf", "chess.gbnf"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char *text = grammar_file(files[i]);
        kt_grammar *g = parse(text);
        int taken = compare_walks(g, t, cache, walks, steps, 1000 + i, stride);
        printf("%s, %s: %d steps compared over %d tokens\n", vocab_name, files[i], taken, t->n_vocab);
        assert_true(taken >= walks); /* every walk got at least one token in */
        kt_grammar_free(g);
        free(text);
    }
    uint64_t computed, hits;
    size_t bytes;
    kt_gmask_cache_counts(cache, &computed, &hits, &bytes);
    printf("%s: %llu classes computed, %llu found in the cache, %zu bytes\n", vocab_name,
           (unsigned long long)computed, (unsigned long long)hits, bytes);
    kt_gmask_cache_free(cache);
    kt_token_trie_free(t);
    kt_vocab_free(v);
}

static void test_llama_spm(void **state) {
    (void)state;
    check_vocab("vocab/ggml-vocab-llama-spm.gguf", 2, 8, 4);
}

static void test_llama3_bpe(void **state) {
    (void)state;
    check_vocab("vocab/ggml-vocab-llama-bpe.gguf", 1, 6, 16);
}

/* Hand-made grammars over a byte-level vocabulary (every byte, and some
 * multi-byte tokens that cross rule and character boundaries): UTF-8
 * split across tokens, token references, nullable rules, repetition. */
static void test_small_vocab(void **state) {
    (void)state;
    static const char *extra[] = {"ab", "b\"", "\":", "\",", "\"}", "{\"", "12", "3.", "  ", "\xce\xb1", "\xce",
                                  "\xb1\xce", "a\xce", "true", "null", "[1", "],", "x=", "\n"};
    enum { N_EXTRA = sizeof extra / sizeof *extra, N = 1 + 256 + N_EXTRA };
    const uint8_t *bytes[N];
    uint32_t lens[N];
    static uint8_t single[256];
    bytes[0] = NULL, lens[0] = 0; /* id 0: the control EOG */
    for (int b = 0; b < 256; b++) single[b] = (uint8_t)b, bytes[1 + b] = &single[b], lens[1 + b] = 1;
    for (int i = 0; i < N_EXTRA; i++) bytes[257 + i] = (const uint8_t *)extra[i], lens[257 + i] = (uint32_t)strlen(extra[i]);
    kt_error err = {0};
    kt_token_trie *t = kt_token_trie_new(N, bytes, lens, &err);
    assert_non_null(t);
    kt_gmask_cache *cache = kt_gmask_cache_new(t, 1u << 20, &err);
    const char *grammars[] = {
        "root ::= \"{\" ws pair (\",\" ws pair)* \"}\"\npair ::= str \":\" ws val\nstr ::= \"\\\"\" [a-z\\u03b1]* \"\\\"\"\n"
        "val ::= str | [0-9]+ (\".\" [0-9]+)? | \"true\" | \"null\" | \"[\" val (\",\" val)* \"]\"\nws ::= [ \\n]*",
        "root ::= [^x]{2,5} \"x\" | \"a\"? \"b\"? \"c\"",
        "root ::= (\"\\u03b1\" | [\\u0100-\\u2fff])+ \"=\"?",
        "root ::= x x\nx ::= \"a\" x | \"\"",
    };
    for (size_t i = 0; i < sizeof grammars / sizeof *grammars; i++) {
        kt_grammar *g = parse(grammars[i]);
        int taken = compare_walks(g, t, cache, 20, 16, 7 + i, 1);
        assert_true(taken > 20);
        kt_grammar_free(g);
    }
    kt_gmask_cache_free(cache);
    kt_token_trie_free(t);
}

/* The grammar kettle compiles a JSON Schema (text) to. */
static kt_grammar *schema_grammar(const char *schema_text) {
    json_error_t jerr;
    json_t *schema = json_loads(schema_text, 0, &jerr);
    if (!schema) fail_msg("bad schema in the test: %s", jerr.text);
    kt_error err = {0};
    char *gbnf = kt_json_schema_to_gbnf(schema, &err);
    if (!gbnf) fail_msg("%s", err.msg);
    kt_grammar *g = parse(gbnf);
    free(gbnf);
    json_decref(schema);
    return g;
}

/* Grammars of JSON schemas, where the walks take whole subtrees: string
 * bodies (loops, with UTF-8), strings of bounded length (chains of
 * states, one per character), patterns and formats, over a real
 * vocabulary, token by token against the reference. */
static void test_schema_grammars(void **state) {
    (void)state;
    if (TU_SANITIZED) printf("  (ASan build: every %dth allowed token checked)\n", ALLOWED_STRIDE);
    kt_vocab *v = load_vocab("vocab/ggml-vocab-llama-spm.gguf");
    kt_error err = {0};
    kt_token_trie *t = kt_token_trie_from_vocab(v, &err);
    kt_gmask_cache *cache = kt_gmask_cache_new(t, 64u << 20, &err);
    assert_non_null(cache);
    const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":24},"
        "\"tag\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":5},\"note\":{\"type\":\"string\"}},"
        "\"required\":[\"name\",\"tag\",\"note\"],\"additionalProperties\":false}",
        "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"pattern\":\"^[a-z ]{3,40}$\"}},"
        "\"required\":[\"id\"]}",
        "{\"type\":\"object\",\"properties\":{\"home\":{\"type\":\"string\",\"format\":\"uri\"}},"
        "\"required\":[\"home\"],\"additionalProperties\":{\"type\":\"string\"}}",
    };
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
        kt_grammar *g = schema_grammar(schemas[i]);
        int taken = compare_walks(g, t, cache, 1, 20, 300 + i, 32);
        printf("schema %zu: %d steps compared over %d tokens\n", i, taken, t->n_vocab);
        assert_true(taken >= 8); /* got into the strings */
        kt_grammar_free(g);
    }
    kt_gmask_cache_free(cache);
    kt_token_trie_free(t);
    kt_vocab_free(v);
}

/* The mask against the reference before every token of `text`, cut
 * greedily into the longest tokens the reference takes (as a model's
 * output would be): every allowed_stride-th token the mask allows, every
 * stride-th it refuses, and every one that the text goes on with. Such text crosses from a string into what follows it inside
 * one token (`",`), which is where classes are composed. Returns the
 * number of tokens taken; the text must be taken whole. */
static int compare_along(const kt_grammar *g, const kt_token_trie *t, kt_gmask_cache *cache, const char *text,
                         int stride, int allowed_stride) {
    const int32_t eog = 0;
    uint64_t *mask = tu_xmalloc(((size_t)t->n_vocab + 63) / 64 * 8);
    kt_error err = {0};
    kt_constraint *c = kt_constraint_new(g, t, cache, &eog, 1, &err);
    kt_gmatch *m = kt_gmatch_new(g, &err);
    assert_non_null(c), assert_non_null(m);
    const size_t n = strlen(text);
    size_t at = 0;
    int taken = 0;
    for (int step = 0;; step++) {
        kt_constraint_mask(c, mask);
        int32_t best = -1;
        for (int32_t id = 1; id < t->n_vocab; id++) {
            const bool ahead = t->tok_len[id] <= n - at && !memcmp(t->bytes + t->tok_off[id], text + at, t->tok_len[id]);
            if (!ahead && (id + step) % (bit(mask, id) ? allowed_stride : stride) != 0) continue;
            bool want = ref_allows(m, t, id);
            if (bit(mask, id) != want)
                fail_msg("at byte %zu of %s: token %d (%.*s) is %s by the mask, %s by the reference", at, text, (int)id,
                         (int)t->tok_len[id], (const char *)t->bytes + t->tok_off[id],
                         bit(mask, id) ? "allowed" : "refused", want ? "allowed" : "refused");
            if (want && ahead && (best < 0 || t->tok_len[id] > t->tok_len[best]))
                best = id;
        }
        assert_int_equal(bit(mask, eog), kt_gmatch_can_end(m));
        if (at == n) break;
        if (best < 0) fail_msg("nothing allowed takes %s at byte %zu", text, at);
        assert_true(kt_constraint_accept(c, best));
        assert_true(kt_gmatch_token(m, best, t->bytes + t->tok_off[best], t->tok_len[best]));
        at += t->tok_len[best], taken++;
    }
    assert_true(kt_constraint_can_end(c));
    kt_gmatch_free(m);
    kt_constraint_free(c);
    free(mask);
    return taken;
}

/* JSON-Schema grammars along real instances: optional properties,
 * additional properties (their keys' automaton), bounded and unbounded
 * strings, each followed by other text; one cache for all, as a server
 * has it, so later schemas are masked from classes earlier ones made. */
static void schema_instances(const char *vocab_name, size_t from, size_t to, int allowed_stride) {
    kt_vocab *v = load_vocab(vocab_name);
    kt_error err = {0};
    kt_token_trie *t = kt_token_trie_from_vocab(v, &err);
    kt_gmask_cache *cache = kt_gmask_cache_new(t, 64u << 20, &err);
    const struct {
        const char *schema, *text;
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"string\"}}}",
         "{\"a\": \"hello world\", \"b\": \"xyz\", \"ab\": \"x, y\", \"zz\": \"\\u00e9\"}"},
        {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},"
         "\"kind\":{\"type\":\"string\",\"maxLength\":64}},\"additionalProperties\":false}",
         "{\"name\": \"The \\\"quoted\\\" one\", \"kind\": \"caf\u00e9, cr\u00e8me\"}"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\","
         "\"maxLength\":12},\"n\":{\"type\":\"integer\"}},\"required\":[\"id\"]}}",
         "[{\"id\": \"a1\", \"n\": 3}, {\"id\": \"b\"}, {\"id\": \"\", \"n\": -40}]"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"string\"}}}",
         "{\"a\":\"]\",\"b\":\"\",\"c\":\"}\"}"},
        {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"kids\":{\"type\":\"array\","
         "\"items\":{\"$ref\":\"#\"}}},\"additionalProperties\":false}",
         "{\"name\": \"a\" ,\n \"kids\": [{\"name\": \"b\" }, {\"name\":\"c\"\n}]}"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"string\"}}}",
         "{\"zz\": \"\\u00e9\"}"},
    };
    const int scale = TU_SANITIZED ? 4 : 1;
    for (size_t i = from; i < to && i < sizeof cases / sizeof *cases; i++) {
        kt_grammar *g = schema_grammar(cases[i].schema);
        int taken = compare_along(g, t, cache, cases[i].text, 16 * scale, allowed_stride * scale);
        printf("%s, instance %zu: %d tokens compared over %d tokens\n", vocab_name, i, taken, t->n_vocab);
        kt_grammar_free(g);
    }
    kt_gmask_cache_free(cache);
    kt_token_trie_free(t);
    kt_vocab_free(v);
}

/* Every case at Llama 2's vocabulary; the first also at Llama 3's, whose
 * tokens cross from a string into the text after it in more ways (`":`
 * after an additional property's key). Of the tokens the mask allows,
 * every 4th is checked (every 32nd at Llama 3's, four times as many);
 * under AddressSanitizer, where the reference is slow, 4 x fewer of
 * both, allowed and refused. */
static void test_schema_instances(void **state) {
    (void)state;
    schema_instances("vocab/ggml-vocab-llama-spm.gguf", 0, 6, 4);
    schema_instances("vocab/ggml-vocab-llama-bpe.gguf", 0, 1, 32);
}

/* Classes are keyed by structure, not by where it is: a bounded string
 * (hundreds of generated rules) at different positions of two grammars
 * with different rules around it shares its classes, and a string of
 * another bound does not. */
static void test_cache_sharing_by_structure(void **state) {
    (void)state;
    kt_vocab *v = load_vocab("vocab/ggml-vocab-llama-spm.gguf");
    kt_error err = {0};
    kt_token_trie *t = kt_token_trie_from_vocab(v, &err);
    kt_gmask_cache *cache = kt_gmask_cache_new(t, 64u << 20, &err);
    kt_grammar *g[3] = {
        parse("root ::= \"{\\\"a\\\": \" s tail\ntail ::= \"}\" | \",\" root \"!\"\n"
              "s ::= \"\\\"\" [^\"\\\\]{0,300} \"\\\"\""),
        parse("n ::= [0-9]+\nroot ::= \"[\" n? s tail\ntail ::= \"]\" | \",\" root \"?\"\n"
              "s ::= \"\\\"\" [^\"\\\\]{0,300} \"\\\"\""),
        parse("root ::= \"[\" s tail\ntail ::= \"]\" | \",\" root \"?\"\n"
              "s ::= \"\\\"\" [^\"\\\\]{0,299} \"\\\"\""),
    };
    const char *into[3] = {"{\"a\": \"", "[\"", "[\""};
    const int32_t eog = 2;
    uint64_t *mask = tu_xmalloc(((size_t)t->n_vocab + 63) / 64 * 8);
    uint64_t computed[3], hits[3];
    for (int i = 0; i < 3; i++) {
        kt_constraint *c = kt_constraint_new(g[i], t, cache, &eog, 1, &err);
        assert_non_null(c);
        for (const char *p = into[i]; *p; p++) assert_true(kt_constraint_accept(c, 3 + (uint8_t)*p));
        for (int k = 0; k < 3; k++) assert_true(kt_constraint_accept(c, 3 + 'x')); /* three characters in */
        kt_constraint_mask(c, mask);
        assert_true((mask[(3 + 'y') >> 6] >> ((3 + 'y') & 63)) & 1);
        kt_gmask_cache_counts(cache, &computed[i], &hits[i], NULL);
        kt_constraint_free(c);
    }
    assert_true(computed[0] > 0);
    assert_int_equal(computed[1], computed[0]); /* the same bound elsewhere: every class found */
    assert_true(hits[1] > hits[0]);
    assert_true(computed[2] > computed[1]);     /* another bound: its own classes */
    for (int i = 0; i < 3; i++) kt_grammar_free(g[i]);
    free(mask);
    kt_gmask_cache_free(cache);
    kt_token_trie_free(t);
    kt_vocab_free(v);
}

/* Two grammars with the same string rule: the second finds its classes
 * in the cache; a class a live constraint holds is never dropped, however
 * small the cache. */
static void test_cache_sharing(void **state) {
    (void)state;
    kt_vocab *v = load_vocab("vocab/ggml-vocab-llama-spm.gguf");
    kt_error err = {0};
    kt_token_trie *t = kt_token_trie_from_vocab(v, &err);
    kt_gmask_cache *cache = kt_gmask_cache_new(t, 64u << 20, &err);
    /* what follows the string nests (a list in a list), so the string's
     * classes stop at the string and are the same in both */
    kt_grammar *a = parse("root ::= \"{\\\"a\\\": \" s tail\ntail ::= \"}\" | \",\" root \"!\"\n"
                          "s ::= \"\\\"\" [^\"\\\\]* \"\\\"\"");
    kt_grammar *b = parse("root ::= \"[\" s tail\ntail ::= \"]\" | \",\" root \"?\"\ns ::= \"\\\"\" [^\"\\\\]* \"\\\"\"");
    const int32_t eog = 2;
    uint64_t *mask = tu_xmalloc(((size_t)t->n_vocab + 63) / 64 * 8);
    const char *into_a = "{\"a\": \"", *into_b = "[\"";
    kt_constraint *ca = kt_constraint_new(a, t, cache, &eog, 1, &err), *cb = kt_constraint_new(b, t, cache, &eog, 1, &err);
    assert_non_null(ca), assert_non_null(cb);
    /* feed byte tokens (<0xNN>) up to the string body */
    for (const char *p = into_a; *p; p++) assert_true(kt_constraint_accept(ca, 3 + (uint8_t)*p));
    for (const char *p = into_b; *p; p++) assert_true(kt_constraint_accept(cb, 3 + (uint8_t)*p));
    kt_constraint_mask(ca, mask);
    uint64_t computed_a, hits_a;
    kt_gmask_cache_counts(cache, &computed_a, &hits_a, NULL);
    kt_constraint_mask(cb, mask);
    uint64_t computed_b, hits_b;
    kt_gmask_cache_counts(cache, &computed_b, &hits_b, NULL);
    assert_int_equal(computed_b, computed_a); /* the string body's classes were there */
    assert_true(hits_b > hits_a);
    kt_constraint_free(ca), kt_constraint_free(cb);
    kt_grammar_free(a), kt_grammar_free(b);
    free(mask);
    kt_gmask_cache_free(cache);
    kt_token_trie_free(t);
    kt_vocab_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trie_layout),   cmocka_unit_test(test_small_vocab),
        cmocka_unit_test(test_cache_sharing), cmocka_unit_test(test_cache_sharing_by_structure), cmocka_unit_test(test_schema_instances), cmocka_unit_test(test_llama_spm),
        cmocka_unit_test(test_llama3_bpe),    cmocka_unit_test(test_trie_summaries),
        cmocka_unit_test(test_schema_grammars),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
