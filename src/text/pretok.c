/*
 * pretok.c - regex pre-tokenization for byte-level BPE (see pretok.h),
 * and Gemma 4's plain split at newlines.
 *
 * The families and their regexes are llama.cpp's (llm_tokenizer_bpe), in
 * the forms llama.cpp actually runs (e.g. llama3's "(?i:'s|...)" spelled
 * out as "'[sS]|..."). They are compiled with PCRE2_UTF | PCRE2_UCP, so
 * \s, \p{L}, \p{N}, \p{P} are Unicode-aware, and PCRE2_DOLLAR_ENDONLY, so
 * "$" means the end of the piece as in ECMAScript (std::regex), not "before
 * a final newline". Every regex sees one piece at a time as its whole
 * subject (lookaheads stop at the piece's end, as in llama.cpp). Empty
 * matches are never taken (PCRE2_NOTEMPTY): none of these regexes needs
 * one, and skipping them keeps the scan moving forward.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/pretok.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#define MAX_REGEX 6

struct kt_pretok {
    int n;
    pcre2_code *re[MAX_REGEX];
    bool jit[MAX_REGEX]; /* JIT-compiled: matched with pcre2_jit_match */
};

/* ---- the families ---------------------------------------------------- */

#define GPT2_RE "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

static const char *const RE_DEFAULT[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2_RE, "\\p{N}+", "[0-9][0-9][0-9]", NULL
};
static const char *const RE_GPT2[] = { GPT2_RE, NULL };
static const char *const RE_LLAMA3[] = {
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL
};
static const char *const RE_QWEN2[] = {
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL
};
/* Qwen 3.5: qwen2's with combining marks (\p{M}) counted with the
 * letters of a word ("e" + U+0301 stays one word, where qwen2 splits the
 * mark off) and so left out of the punctuation branch. */
static const char *const RE_QWEN35[] = {
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL
};
/* The letter class is llama.cpp's literal list; characters that Unicode
 * normalization would change (U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126,
 * U+212A) are written as escapes so no editor can alter them. No test
 * vector here covers deepseek-llm. */
static const char *const RE_DEEPSEEK_LLM[] = {
    "[\\r\\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚ"
    "Ḁ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\\x{1f7d}ᾀ-ᾴᾶ-ᾼ\\x{1fbe}ῂ-ῄῆ-ῌῐ-\\x{1fd3}ῖ-\\x{1fdb}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\\x{2126}ℨ\\x{212a}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄ"
    "Ⰰ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ\\x{10400}-\\x{1044f}𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲"
    "𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
    NULL
};
static const char *const RE_DEEPSEEK_CODER[] = {
    "[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}", NULL
};
static const char *const RE_FALCON[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2_RE, "[0-9][0-9][0-9]", NULL
};
static const char *const RE_STARCODER[] = { "\\p{N}", GPT2_RE, NULL };
static const char *const RE_GPT4O[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" CONTRACTIONS "?"
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" CONTRACTIONS "?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL
};

typedef struct family {
    const char *name;
    const char *const *re;
    bool ignore_merges, add_bos;
} family;

static const family FAMILIES[] = {
    { "default", RE_DEFAULT, false, false },
    { "gpt-2", RE_GPT2, false, false },
    { "mpt", RE_GPT2, false, false },
    { "olmo", RE_GPT2, false, false },
    { "jais", RE_GPT2, false, false },
    { "phi-2", RE_GPT2, false, false },
    { "llama3", RE_LLAMA3, true, true },
    { "llama-v3", RE_LLAMA3, true, true },
    { "llama-bpe", RE_LLAMA3, true, true },
    { "dbrx", RE_LLAMA3, false, false },
    { "smaug-bpe", RE_LLAMA3, false, false },
    { "qwen2", RE_QWEN2, false, false },
    { "stablelm2", RE_QWEN2, false, false },
    { "qwen35", RE_QWEN35, false, false },
    { "deepseek-llm", RE_DEEPSEEK_LLM, false, false },
    { "deepseek-coder", RE_DEEPSEEK_CODER, false, false },
    { "falcon", RE_FALCON, false, false },
    { "starcoder", RE_STARCODER, false, false },
    { "refact", RE_STARCODER, false, false },
    { "command-r", RE_STARCODER, false, false },
    { "smollm", RE_STARCODER, false, false },
    { "gpt-4o", RE_GPT4O, false, false },
};

static const family *find_family(const char *name, size_t n) {
    for (size_t i = 0; i < sizeof FAMILIES / sizeof FAMILIES[0]; i++)
        if (strlen(FAMILIES[i].name) == n && memcmp(FAMILIES[i].name, name, n) == 0)
            return &FAMILIES[i];
    return NULL;
}

/* ---- construction ---------------------------------------------------- */

static pcre2_code *compile(const char *pattern, bool *jit, kt_error *err) {
    int code;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &code, &at,
                                   NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        kt_error_set(err, KT_ERR_INTERNAL, "pre-tokenizer regex /%.60s/ at %zu: %s", pattern,
                     (size_t)at, (const char *)msg);
        return NULL;
    }
    *jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0; /* else the interpreter */
    return re;
}

kt_pretok *kt_pretok_new(const char *name, size_t name_len, bool *ignore_merges,
                         bool *add_bos, kt_error *err) {
    const family *f = find_family(name, name_len);
    if (!f) {
        kt_error_set(err, KT_ERR_UNSUPPORTED,
                     "tokenizer.ggml.pre: pre-tokenizer '%.*s' is not supported",
                     (int)(name_len > 64 ? 64 : name_len), name);
        return NULL;
    }
    kt_pretok *p = calloc(1, sizeof *p);
    if (!p) {
        kt_error_set(err, KT_ERR_NOMEM, "pre-tokenizer: out of memory");
        return NULL;
    }
    for (; f->re[p->n]; p->n++) {
        if (!(p->re[p->n] = compile(f->re[p->n], &p->jit[p->n], err))) {
            kt_pretok_free(p);
            return NULL;
        }
    }
    if (ignore_merges) *ignore_merges = f->ignore_merges;
    if (add_bos) *add_bos = f->add_bos;
    return p;
}

void kt_pretok_free(kt_pretok *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) pcre2_code_free(p->re[i]);
    free(p);
}

void kt_span_list_free(kt_span_list *l) {
    free(l->s);
    l->s = NULL;
    l->n = l->cap = 0;
}

/* ---- splitting ------------------------------------------------------- */

static bool span_add(kt_span_list *l, size_t off, size_t len) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        kt_span *s = realloc(l->s, cap * sizeof *s);
        if (!s) return false;
        l->s = s;
        l->cap = cap;
    }
    l->s[l->n++] = (kt_span){ (uint32_t)off, (uint32_t)len };
    return true;
}

/* Splits one piece with one regex into matches and gaps. Returns 0, or a
 * PCRE2 error code (< 0), or 1 out of memory. */
static int split_piece(const pcre2_code *re, bool jit, pcre2_match_data *md, const char *text,
                       kt_span piece, kt_span_list *out) {
    PCRE2_SPTR subj = (PCRE2_SPTR)(text + piece.off);
    size_t pos = 0, gap = 0, n = piece.len;
    while (pos < n) {
        /* The text is valid UTF-8 (checked by the caller): no check here. */
        int rc = jit ? pcre2_jit_match(re, subj, n, pos, PCRE2_NOTEMPTY, md, NULL)
                     : pcre2_match(re, subj, n, pos, PCRE2_NOTEMPTY | PCRE2_NO_UTF_CHECK, md,
                                   NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return rc;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[0] > gap && !span_add(out, piece.off + gap, ov[0] - gap)) return 1;
        if (!span_add(out, piece.off + ov[0], ov[1] - ov[0])) return 1;
        pos = gap = ov[1];
    }
    if (gap < n && !span_add(out, piece.off + gap, n - gap)) return 1;
    return 0;
}

kt_status kt_pretok_split_lines(const char *text, size_t len, kt_span_list *out,
                                kt_error *err) {
    out->n = 0;
    if (len > UINT32_MAX)
        return kt_error_set(err, KT_ERR_ARG, "pre-tokenizer: text too long (%zu bytes)", len);
    for (size_t at = 0, end; at < len; at = end) {
        bool nl = text[at] == '\n';
        for (end = at + 1; end < len && (text[end] == '\n') == nl; end++) {}
        if (!span_add(out, at, end - at))
            return kt_error_set(err, KT_ERR_NOMEM, "pre-tokenizer: out of memory");
    }
    return KT_OK;
}

kt_status kt_pretok_split(const kt_pretok *p, const char *text, size_t len,
                          kt_span_list *out, kt_span_list *tmp, kt_error *err) {
    out->n = 0;
    if (len == 0) return KT_OK;
    if (len > UINT32_MAX)
        return kt_error_set(err, KT_ERR_ARG, "pre-tokenizer: text too long (%zu bytes)", len);
    if (!span_add(out, 0, len))
        return kt_error_set(err, KT_ERR_NOMEM, "pre-tokenizer: out of memory");
    for (int r = 0; r < p->n; r++) {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->re[r], NULL);
        if (!md) return kt_error_set(err, KT_ERR_NOMEM, "pre-tokenizer: out of memory");
        tmp->n = 0;
        int rc = 0;
        for (size_t i = 0; i < out->n && rc == 0; i++)
            rc = split_piece(p->re[r], p->jit[r], md, text, out->s[i], tmp);
        pcre2_match_data_free(md);
        if (rc == 1) return kt_error_set(err, KT_ERR_NOMEM, "pre-tokenizer: out of memory");
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return kt_error_set(err, KT_ERR_INTERNAL, "pre-tokenizer: regex %d: %s", r,
                                (const char *)msg);
        }
        kt_span_list t = *out;
        *out = *tmp;
        *tmp = t;
    }
    return KT_OK;
}
