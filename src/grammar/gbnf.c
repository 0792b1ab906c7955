/*
 * gbnf.c - GBNF text to the byte-level grammar of grammar.h.
 *
 * The surface syntax and its meaning follow llama.cpp's grammar parser
 * (llama-grammar.cpp), so grammars written for it work unchanged: the
 * same whitespace and newline rules (a rule ends at a newline unless inside
 * ( ) or right after '|'), the same escapes, the same expansion of
 * repetitions into generated right-recursive rules, and a rule defined
 * twice keeps its last definition. Where we differ it is to refuse what
 * llama.cpp would turn into a silent surprise: {m,n} with n < m, empty
 * classes [] / [^], invalid UTF-8 in the text, literals with code points
 * that UTF-8 cannot encode. {,n} (at most n) is accepted as {0,n}.
 *
 * What differs in the output is the alphabet: llama.cpp matches code
 * points, we match bytes. A literal becomes the BYTE elements of its UTF-8
 * encoding; a character class becomes one SET/BYTE element when it covers
 * only ASCII, else a generated rule whose alternatives are the UTF-8
 * byte-range sequences of its code points (the splitting regex engines use,
 * so overlong forms and surrogates are never accepted).
 *
 * Hostile text is bounded by the limits in grammar.h: text size, group
 * nesting (the parser recurses once per level), repeat counts and the
 * number of elements after expansion. The checks after parsing (nullable
 * rules, left recursion) are iterative, since generated rules can number
 * in the hundreds of thousands.
 */
#include "grammar/grammar.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#define MAX_CP 0x10FFFFu
#define UNBOUNDED UINT32_MAX /* {m,}: no upper repeat count */

typedef struct evec {
    kt_gelem *v;
    uint32_t n, cap;
} evec;

/* A rule while parsing: its alternatives, each ended by KT_GE_END. */
typedef struct prule {
    evec body;
    uint32_t n_alts;
    char *name;
    bool defined;  /* has a body (a name may be referenced before its definition) */
    bool written;  /* named in the text, so found by name; generated rules are not */
    size_t ref_off; /* where it was first named, for "undefined rule" */
} prule;

typedef struct cprange {
    uint32_t lo, hi; /* code points, inclusive */
} cprange;

typedef struct crvec {
    cprange *v;
    uint32_t n, cap;
} crvec;

typedef struct parser {
    const char *s;
    size_t n, pos;
    kt_error *err;
    prule *rules;
    uint32_t n_rules, cap_rules;
    uint32_t *name_slot; /* open addressing over written names: rule id + 1, 0 = empty */
    uint32_t name_mask;
    kt_byteset *sets;
    uint32_t n_sets, cap_sets;
    uint32_t *set_slot; /* open addressing over sets: set index + 1, 0 = empty */
    uint32_t set_mask;
    uint64_t n_elems;   /* elements emitted so far, against KT_GRAMMAR_MAX_ELEMS */
    uint32_t any_rule;  /* the shared rule for '.', UINT32_MAX until first used */
    unsigned depth;     /* ( ) nesting */
} parser;

/* ---- errors ---------------------------------------------------------- */

/* Sets "line L, column C: <fmt>" for byte offset `off`; returns false so
 * callers can `return fail(...)`. Columns count bytes, 1-based. */
static bool fail(parser *p, size_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail(parser *p, size_t off, const char *fmt, ...) {
    size_t line = 1, line_start = 0;
    for (size_t i = 0; i < off && i < p->n; i++)
        if (p->s[i] == '\n') line++, line_start = i + 1;
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    kt_error_set(p->err, KT_ERR_ARG, "line %zu, column %zu: %s", line, off - line_start + 1, what);
    return false;
}

static bool nomem(parser *p) {
    kt_error_set(p->err, KT_ERR_NOMEM, "out of memory compiling a grammar");
    return false;
}

/* Makes room for `need` items of `size` bytes in *v (capacity *cap). */
static bool grow(void **v, uint32_t *cap, uint64_t need, size_t size) {
    if (need <= *cap) return true;
    if (need > UINT32_MAX / 2) return false;
    uint32_t c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *nv = realloc(*v, (size_t)c * size);
    if (!nv) return false;
    *v = nv;
    *cap = c;
    return true;
}

/* ---- emitting elements ------------------------------------------------ */

static bool emit(parser *p, evec *out, kt_gelem_type type, uint32_t value) {
    if (p->n_elems >= KT_GRAMMAR_MAX_ELEMS) {
        kt_error_set(p->err, KT_ERR_ARG, "grammar expands to more than %u elements (the limit)",
                     KT_GRAMMAR_MAX_ELEMS);
        return false;
    }
    if (!grow((void **)&out->v, &out->cap, (uint64_t)out->n + 1, sizeof *out->v)) return nomem(p);
    out->v[out->n++] = (kt_gelem){(uint32_t)type, value};
    p->n_elems++;
    return true;
}

static uint64_t set_hash(const kt_byteset *s) {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 4; i++) h = (h ^ s->bits[i]) * 0xff51afd7ed558ccdull, h ^= h >> 29;
    return h;
}

static bool set_table_grow(parser *p) {
    uint32_t slots = p->set_mask ? (p->set_mask + 1) * 2 : 64;
    uint32_t *t = calloc(slots, sizeof *t);
    if (!t) return false;
    for (uint32_t i = 0; i < p->n_sets; i++) {
        uint32_t j = (uint32_t)set_hash(&p->sets[i]) & (slots - 1);
        while (t[j]) j = (j + 1) & (slots - 1);
        t[j] = i + 1;
    }
    free(p->set_slot);
    p->set_slot = t;
    p->set_mask = slots - 1;
    return true;
}

/* The index of `s` in p->sets, adding it if new (identical sets share). */
static bool intern_set(parser *p, const kt_byteset *s, uint32_t *index) {
    /* load factor <= 1/2 keeps probing short and guarantees an empty slot */
    if ((uint64_t)(p->n_sets + 1) * 2 > (uint64_t)p->set_mask + 1 && !set_table_grow(p)) return nomem(p);
    uint32_t j = (uint32_t)set_hash(s) & p->set_mask;
    for (; p->set_slot[j]; j = (j + 1) & p->set_mask) {
        if (memcmp(&p->sets[p->set_slot[j] - 1], s, sizeof *s) == 0) {
            *index = p->set_slot[j] - 1;
            return true;
        }
    }
    if (!grow((void **)&p->sets, &p->cap_sets, (uint64_t)p->n_sets + 1, sizeof *p->sets)) return nomem(p);
    p->sets[p->n_sets] = *s;
    p->set_slot[j] = p->n_sets + 1;
    *index = p->n_sets++;
    return true;
}

static void set_range(kt_byteset *s, uint32_t lo, uint32_t hi) {
    for (uint32_t b = lo; b <= hi; b++) s->bits[b >> 6] |= 1ull << (b & 63);
}

/* One byte position: BYTE when the set holds exactly one byte, else SET. */
static bool emit_byteset(parser *p, evec *out, const kt_byteset *s) {
    int count = 0, only = 0;
    for (int b = 0; b < 256; b++)
        if (kt_byteset_has(s, (uint8_t)b)) count++, only = b;
    if (count == 1) return emit(p, out, KT_GE_BYTE, (uint32_t)only);
    uint32_t index = 0; /* set by intern_set when it succeeds */
    return intern_set(p, s, &index) && emit(p, out, KT_GE_SET, index);
}

/* ---- rules ------------------------------------------------------------ */

static uint64_t name_hash(const char *s, size_t len) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h;
}

static bool name_table_grow(parser *p) {
    uint32_t slots = p->name_mask ? (p->name_mask + 1) * 2 : 64;
    uint32_t *t = calloc(slots, sizeof *t);
    if (!t) return false;
    for (uint32_t id = 0; id < p->n_rules; id++) {
        if (!p->rules[id].written) continue;
        const char *nm = p->rules[id].name;
        uint32_t j = (uint32_t)name_hash(nm, strlen(nm)) & (slots - 1);
        while (t[j]) j = (j + 1) & (slots - 1);
        t[j] = id + 1;
    }
    free(p->name_slot);
    p->name_slot = t;
    p->name_mask = slots - 1;
    return true;
}

/* Appends a rule with no body yet; its name is taken (owned). */
static bool add_rule(parser *p, char *name, bool written, size_t off, uint32_t *id) {
    if (!grow((void **)&p->rules, &p->cap_rules, (uint64_t)p->n_rules + 1, sizeof *p->rules)) {
        free(name);
        return nomem(p);
    }
    p->rules[p->n_rules] = (prule){.name = name, .written = written, .ref_off = off};
    *id = p->n_rules++;
    return true;
}

/* The rule written as name[0..len), created (undefined) on first mention. */
static bool named_rule(parser *p, const char *name, size_t len, size_t off, uint32_t *id) {
    /* every rule may be written, so keep slots >= 2 * rules */
    if ((uint64_t)(p->n_rules + 1) * 2 > (uint64_t)p->name_mask + 1 && !name_table_grow(p)) return nomem(p);
    uint32_t j = (uint32_t)name_hash(name, len) & p->name_mask;
    for (; p->name_slot[j]; j = (j + 1) & p->name_mask) {
        const char *nm = p->rules[p->name_slot[j] - 1].name;
        if (strlen(nm) == len && memcmp(nm, name, len) == 0) {
            *id = p->name_slot[j] - 1;
            return true;
        }
    }
    char *copy = malloc(len + 1);
    if (!copy) return nomem(p);
    memcpy(copy, name, len);
    copy[len] = 0;
    if (!add_rule(p, copy, true, off, id)) return false;
    p->name_slot[j] = *id + 1;
    return true;
}

/* A generated rule "<base>_<kind>_<id>" (or "<base>_<id>"). */
static bool generated_rule(parser *p, uint32_t base, const char *kind, uint32_t *id) {
    const char *b = p->rules[base].name;
    size_t len = strlen(b) + strlen(kind) + 16;
    char *name = malloc(len);
    if (!name) return nomem(p);
    snprintf(name, len, "%s_%s%s%u", b, kind, *kind ? "_" : "", p->n_rules);
    return add_rule(p, name, false, 0, id);
}

/* Gives rule `id` its body (owned); a second definition replaces the
 * first, as in llama.cpp. */
static void set_body(parser *p, uint32_t id, evec body, uint32_t n_alts) {
    prule *r = &p->rules[id];
    if (r->defined) p->n_elems -= r->body.n;
    free(r->body.v);
    r->body = body;
    r->n_alts = n_alts;
    r->defined = true;
}

/* ---- lexing ----------------------------------------------------------- */

/* The byte k ahead, 0 past the end (the text holds no NUL: checked first). */
static char at(const parser *p, size_t k) {
    return p->pos + k < p->n ? p->s[p->pos + k] : 0;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '-' || c == '_';
}

/* Spaces, tabs and comments; newlines too when newline_ok. */
static void skip_space(parser *p, bool newline_ok) {
    for (;;) {
        char c = at(p, 0);
        if (c == '#') {
            while (p->pos < p->n && at(p, 0) != '\n' && at(p, 0) != '\r') p->pos++;
        } else if (c == ' ' || c == '\t' || (newline_ok && (c == '\n' || c == '\r'))) {
            p->pos++;
        } else {
            return;
        }
    }
}

/* Decimal digits at pos; the value saturates at limit + 1 so overflow
 * cannot wrap into an accepted count. */
static uint64_t parse_uint(parser *p, uint64_t limit) {
    uint64_t v = 0;
    while (is_digit(at(p, 0))) {
        v = v * 10 + (uint64_t)(at(p, 0) - '0');
        if (v > limit) v = limit + 1;
        p->pos++;
    }
    return v;
}

/* One UTF-8 encoded code point of the text, strictly: no overlong forms,
 * no surrogates, nothing above U+10FFFF. */
static bool decode_utf8(parser *p, uint32_t *cp) {
    const uint8_t *s = (const uint8_t *)p->s + p->pos;
    size_t left = p->n - p->pos;
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        p->pos++;
        return true;
    }
    size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    static const uint32_t min_of_len[] = {0, 0, 0x80, 0x800, 0x10000};
    if (len == 0 || len > left) return fail(p, p->pos, "invalid UTF-8 in the grammar text");
    uint32_t v = c & (0x7Fu >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return fail(p, p->pos, "invalid UTF-8 in the grammar text");
        v = (v << 6) | (s[i] & 0x3Fu);
    }
    if (v < min_of_len[len] || v > MAX_CP || (v >= 0xD800 && v <= 0xDFFF))
        return fail(p, p->pos, "invalid UTF-8 in the grammar text");
    *cp = v;
    p->pos += len;
    return true;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class: an escape or a UTF-8 code point.
 * The caller has checked that pos is not at the end. */
static bool parse_char(parser *p, uint32_t *cp) {
    if (at(p, 0) != '\\') return decode_utf8(p, cp);
    size_t start = p->pos;
    char e = at(p, 1);
    int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = hex_value(at(p, 2 + (size_t)i));
            if (h < 0) return fail(p, start, "expecting %d hex digits after '\\%c'", digits, e);
            v = (v << 4) | (uint32_t)h;
        }
        p->pos += 2 + (size_t)digits;
        *cp = v;
        return true;
    }
    switch (e) {
    case 'n': *cp = '\n'; break;
    case 'r': *cp = '\r'; break;
    case 't': *cp = '\t'; break;
    case '\\': case '"': case '[': case ']': case '-': *cp = (uint8_t)e; break;
    default:
        if (p->pos + 1 >= p->n) return fail(p, start, "unexpected end of input after '\\'");
        return fail(p, start, "unknown escape '\\%c'", e);
    }
    p->pos += 2;
    return true;
}

/* ---- UTF-8 byte ranges -------------------------------------------------- */

static unsigned utf8_encode(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Adds to `body` the alternatives matching exactly the UTF-8 encodings of
 * code points lo..hi (0x80 <= lo <= hi, no surrogate inside). The range is
 * cut until every byte position ranges independently: first at encoded
 * length boundaries, then where a continuation byte would not span its
 * full 80-BF for every leading prefix. Recursion depth is a few levels. */
static bool utf8_split(parser *p, evec *body, uint32_t *n_alts, uint32_t lo, uint32_t hi) {
    static const uint32_t len_max[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= len_max[i] && hi > len_max[i])
            return utf8_split(p, body, n_alts, lo, len_max[i]) && utf8_split(p, body, n_alts, len_max[i] + 1, hi);
    uint8_t a[4], b[4];
    unsigned len = utf8_encode(lo, a);
    utf8_encode(hi, b);
    for (unsigned i = 1; i < len; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) == (hi & ~m)) continue;
        if (lo & m) return utf8_split(p, body, n_alts, lo, lo | m) && utf8_split(p, body, n_alts, (lo | m) + 1, hi);
        if ((hi & m) != m) return utf8_split(p, body, n_alts, lo, (hi & ~m) - 1) && utf8_split(p, body, n_alts, hi & ~m, hi);
    }
    for (unsigned i = 0; i < len; i++) {
        kt_byteset s = {{0}};
        set_range(&s, a[i], b[i]);
        if (!emit_byteset(p, body, &s)) return false;
    }
    (*n_alts)++;
    return emit(p, body, KT_GE_END, 0);
}

static int cprange_cmp(const void *x, const void *y) {
    const cprange *a = x, *b = y;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

static bool push_range(crvec *r, uint32_t lo, uint32_t hi) {
    if (!grow((void **)&r->v, &r->cap, (uint64_t)r->n + 1, sizeof *r->v)) return false;
    r->v[r->n++] = (cprange){lo, hi};
    return true;
}

/* The class's Unicode scalar values as sorted disjoint ranges: merged,
 * complemented when negated, clipped to U+10FFFF, surrogates removed. */
static bool normalize_ranges(const crvec *in, bool negated, crvec *out) {
    crvec merged = {0};
    cprange *v = in->v;
    if (in->n) qsort(v, in->n, sizeof *v, cprange_cmp);
    for (uint32_t i = 0; i < in->n; i++) {
        if (v[i].lo > MAX_CP) break;
        uint32_t hi = v[i].hi > MAX_CP ? MAX_CP : v[i].hi;
        if (merged.n && v[i].lo <= merged.v[merged.n - 1].hi + 1) {
            if (hi > merged.v[merged.n - 1].hi) merged.v[merged.n - 1].hi = hi;
        } else if (!push_range(&merged, v[i].lo, hi)) {
            free(merged.v);
            return false;
        }
    }
    crvec pos = merged;
    if (negated) {
        crvec comp = {0};
        uint32_t next = 0; /* first code point not yet covered */
        bool ok = true, done = false;
        for (uint32_t i = 0; i < merged.n && ok; i++) {
            if (merged.v[i].lo > next) ok = push_range(&comp, next, merged.v[i].lo - 1);
            if (merged.v[i].hi >= MAX_CP) done = true;
            next = merged.v[i].hi + 1;
        }
        if (ok && !done) ok = push_range(&comp, next, MAX_CP);
        free(merged.v);
        if (!ok) {
            free(comp.v);
            return false;
        }
        pos = comp;
    }
    *out = (crvec){0};
    for (uint32_t i = 0; i < pos.n; i++) {
        uint32_t lo = pos.v[i].lo, hi = pos.v[i].hi;
        bool ok = true;
        if (lo < 0xD800 && hi >= 0xD800) {
            ok = push_range(out, lo, 0xD7FF);
            lo = 0xE000;
        } else if (lo >= 0xD800 && lo <= 0xDFFF) {
            lo = 0xE000;
        }
        if (ok && lo <= hi) ok = push_range(out, lo, hi);
        if (!ok) {
            free(pos.v);
            free(out->v);
            return false;
        }
    }
    free(pos.v);
    return true;
}

/* Emits a class given as normalized ranges: one element if it is ASCII
 * only, else a RULE to a generated rule of UTF-8 sequences. */
static bool emit_class(parser *p, evec *out, const crvec *r, uint32_t base, const char *kind) {
    kt_byteset ascii = {{0}};
    bool has_ascii = false, has_multi = false;
    for (uint32_t i = 0; i < r->n; i++) {
        if (r->v[i].lo <= 0x7F) {
            set_range(&ascii, r->v[i].lo, r->v[i].hi < 0x7F ? r->v[i].hi : 0x7F);
            has_ascii = true;
        }
        if (r->v[i].hi >= 0x80) has_multi = true;
    }
    if (!has_multi) return emit_byteset(p, out, &ascii);
    uint32_t id;
    if (!generated_rule(p, base, kind, &id)) return false;
    evec body = {0};
    uint32_t n_alts = 0;
    bool ok = true;
    if (has_ascii) {
        ok = emit_byteset(p, &body, &ascii) && emit(p, &body, KT_GE_END, 0);
        n_alts++;
    }
    for (uint32_t i = 0; i < r->n && ok; i++) {
        if (r->v[i].hi < 0x80) continue;
        ok = utf8_split(p, &body, &n_alts, r->v[i].lo < 0x80 ? 0x80 : r->v[i].lo, r->v[i].hi);
    }
    if (!ok) {
        free(body.v);
        return false;
    }
    set_body(p, id, body, n_alts);
    return emit(p, out, KT_GE_RULE, id);
}

/* ---- the grammar ------------------------------------------------------- */

static bool parse_alternates(parser *p, uint32_t target, uint32_t base, bool nested);

/* "..." : the UTF-8 bytes of its code points. */
static bool parse_literal(parser *p, evec *out) {
    size_t start = p->pos++;
    for (;;) {
        if (p->pos >= p->n) return fail(p, start, "unterminated string literal");
        if (at(p, 0) == '"') break;
        size_t cpos = p->pos;
        uint32_t cp;
        if (!parse_char(p, &cp)) return false;
        if (cp > MAX_CP || (cp >= 0xD800 && cp <= 0xDFFF))
            return fail(p, cpos, "code point U+%04X has no UTF-8 encoding", (unsigned)cp);
        uint8_t bytes[4];
        unsigned len = utf8_encode(cp, bytes);
        for (unsigned i = 0; i < len; i++)
            if (!emit(p, out, KT_GE_BYTE, bytes[i])) return false;
    }
    p->pos++;
    return true;
}

/* [...] or [^...] with single characters and ranges a-z. */
static bool parse_class(parser *p, evec *out, uint32_t base) {
    size_t start = p->pos++;
    bool negated = at(p, 0) == '^';
    if (negated) p->pos++;
    if (at(p, 0) == ']') return fail(p, start, "empty character class");
    crvec raw = {0}, ranges = {0};
    bool ok = true;
    while (ok) {
        if (p->pos >= p->n) {
            ok = fail(p, start, "unterminated character class");
            break;
        }
        if (at(p, 0) == ']') break;
        uint32_t lo, hi;
        ok = parse_char(p, &lo);
        hi = lo;
        if (ok && at(p, 0) == '-' && at(p, 1) != ']') {
            if (p->pos + 1 >= p->n) {
                ok = fail(p, start, "unterminated character class");
                break;
            }
            p->pos++;
            ok = parse_char(p, &hi);
        }
        /* a reversed range matches nothing, as in llama.cpp */
        if (ok && lo <= hi && !push_range(&raw, lo, hi)) ok = nomem(p);
    }
    if (ok) {
        p->pos++;
        ok = normalize_ranges(&raw, negated, &ranges) ? emit_class(p, out, &ranges, base, "class") : nomem(p);
    }
    free(raw.v);
    free(ranges.v);
    return ok;
}

/* '.': any Unicode scalar value, one shared rule for the whole grammar. */
static bool parse_any(parser *p, evec *out, uint32_t base) {
    p->pos++;
    if (p->any_rule != UINT32_MAX) return emit(p, out, KT_GE_RULE, p->any_rule);
    crvec all = {0};
    bool ok = push_range(&all, 0, 0xD7FF) && push_range(&all, 0xE000, MAX_CP);
    uint32_t before = p->n_rules;
    ok = ok ? emit_class(p, out, &all, base, "any") : nomem(p);
    free(all.v);
    if (ok) p->any_rule = before; /* emit_class made exactly one rule */
    return ok;
}

/* <[id]> or !<[id]>. */
static bool parse_token_ref(parser *p, evec *out) {
    size_t start = p->pos;
    kt_gelem_type type = KT_GE_TOKEN;
    if (at(p, 0) == '!') {
        type = KT_GE_NOT_TOKEN;
        p->pos++;
    }
    if (at(p, 0) != '<') return fail(p, p->pos, "expecting '<' after '!'");
    if (at(p, 1) != '[')
        return fail(p, start, "a token written as text (<...>) needs a vocabulary; write its id as <[id]>");
    p->pos += 2;
    if (!is_digit(at(p, 0))) return fail(p, p->pos, "expecting a token id");
    uint64_t id = parse_uint(p, INT32_MAX);
    if (id > INT32_MAX) return fail(p, start, "token id is larger than %d", INT32_MAX);
    if (at(p, 0) != ']' || at(p, 1) != '>') return fail(p, p->pos, "expecting ']>'");
    p->pos += 2;
    return emit(p, out, type, (uint32_t)id);
}

/* Rewrites the symbol out[last..] as llama.cpp does:
 *   S{m,n} -> S x m, then S'(n-m) with S'(k) ::= S S'(k-1) | and S'(1) ::= S |
 *   S{m,}  -> S x m, then S'      with S'    ::= S S' |
 * so * + ? are {0,} {1,} {0,1}. */
static bool repeat(parser *p, evec *out, uint32_t last, uint32_t min, uint32_t max, uint32_t base, size_t off) {
    if (last == out->n) return fail(p, off, "expecting an item before '%c'", p->s[off]);
    uint32_t sym_n = out->n - last;
    if ((uint64_t)sym_n * (min ? min - 1 : 0) + p->n_elems > KT_GRAMMAR_MAX_ELEMS)
        return fail(p, off, "repetition expands to more than %u elements (the limit)", KT_GRAMMAR_MAX_ELEMS);
    kt_gelem *sym = malloc(sizeof *sym * sym_n);
    if (!sym) return nomem(p);
    memcpy(sym, out->v + last, sizeof *sym * sym_n);
    bool ok = true;
    if (min == 0) {
        out->n = last;
        p->n_elems -= sym_n;
    }
    for (uint32_t i = 1; i < min && ok; i++)
        for (uint32_t k = 0; k < sym_n && ok; k++) ok = emit(p, out, sym[k].type, sym[k].value);
    uint32_t n_opt = max == UNBOUNDED ? 1 : max - min;
    const char *kind = max == UNBOUNDED ? (min == 0 ? "star" : "plus") : (min == 0 && max == 1 ? "opt" : "rep");
    uint32_t prev = 0;
    for (uint32_t i = 0; i < n_opt && ok; i++) {
        uint32_t id;
        if (!(ok = generated_rule(p, base, kind, &id))) break;
        evec body = {0};
        for (uint32_t k = 0; k < sym_n && ok; k++) ok = emit(p, &body, sym[k].type, sym[k].value);
        if (ok && (i > 0 || max == UNBOUNDED)) ok = emit(p, &body, KT_GE_RULE, max == UNBOUNDED ? id : prev);
        ok = ok && emit(p, &body, KT_GE_END, 0) && emit(p, &body, KT_GE_END, 0);
        if (!ok) {
            free(body.v);
            break;
        }
        set_body(p, id, body, 2);
        prev = id;
    }
    if (ok && n_opt > 0) ok = emit(p, out, KT_GE_RULE, prev);
    free(sym);
    return ok;
}

/* {m} {m,} {m,n} {,n}; pos at '{'. */
static bool parse_braces(parser *p, evec *out, uint32_t last, uint32_t base, bool nested) {
    size_t start = p->pos++;
    skip_space(p, nested);
    uint64_t min = 0, max;
    bool has_min = is_digit(at(p, 0));
    if (has_min) min = parse_uint(p, KT_GRAMMAR_MAX_REPEAT);
    else if (at(p, 0) != ',') return fail(p, p->pos, "expecting a repeat count");
    skip_space(p, nested);
    if (at(p, 0) == '}') {
        max = min;
    } else if (at(p, 0) == ',') {
        p->pos++;
        skip_space(p, nested);
        if (is_digit(at(p, 0))) {
            max = parse_uint(p, KT_GRAMMAR_MAX_REPEAT);
            skip_space(p, nested);
        } else if (has_min) {
            max = UNBOUNDED;
        } else {
            return fail(p, p->pos, "expecting a repeat count");
        }
        if (at(p, 0) != '}') return fail(p, p->pos, "expecting '}'");
    } else {
        return fail(p, p->pos, "expecting ',' or '}'");
    }
    p->pos++;
    if (min > KT_GRAMMAR_MAX_REPEAT || (max != UNBOUNDED && max > KT_GRAMMAR_MAX_REPEAT))
        return fail(p, start, "repeat count is larger than the limit of %u", KT_GRAMMAR_MAX_REPEAT);
    if (max < min)
        return fail(p, start, "repeat {%u,%u} has its maximum below its minimum", (unsigned)min, (unsigned)max);
    return repeat(p, out, last, (uint32_t)min, (uint32_t)max, base, start);
}

/* ( alternates ) into a generated rule. */
static bool parse_group(parser *p, evec *out, uint32_t base) {
    size_t start = p->pos;
    if (p->depth >= KT_GRAMMAR_MAX_DEPTH)
        return fail(p, start, "groups nested deeper than the limit of %u", KT_GRAMMAR_MAX_DEPTH);
    p->pos++;
    skip_space(p, true);
    uint32_t id;
    if (!generated_rule(p, base, "", &id)) return false;
    p->depth++;
    bool ok = parse_alternates(p, id, base, true);
    p->depth--;
    if (!ok) return false;
    if (at(p, 0) != ')') return fail(p, p->pos, "expecting ')'");
    p->pos++;
    return emit(p, out, KT_GE_RULE, id);
}

/* One alternative: symbols until something that is not one ('|', ')',
 * a newline outside a group, the end). `last` is where the latest symbol
 * starts: what a following * + ? {..} applies to. As in llama.cpp it is
 * not moved by a repetition, so "a"{2}* repeats the pair. */
static bool parse_sequence(parser *p, evec *out, uint32_t base, bool nested) {
    uint32_t last = out->n;
    for (;;) {
        char c = at(p, 0);
        size_t here = p->pos;
        bool ok;
        if (c == '"') {
            last = out->n;
            ok = parse_literal(p, out);
        } else if (c == '[') {
            last = out->n;
            ok = parse_class(p, out, base);
        } else if (c == '<' || c == '!') {
            last = out->n;
            ok = parse_token_ref(p, out);
        } else if (is_word(c)) {
            while (is_word(at(p, 0))) p->pos++;
            uint32_t id;
            last = out->n;
            ok = named_rule(p, p->s + here, p->pos - here, here, &id) && emit(p, out, KT_GE_RULE, id);
        } else if (c == '(') {
            last = out->n;
            ok = parse_group(p, out, base);
        } else if (c == '.') {
            last = out->n;
            ok = parse_any(p, out, base);
        } else if (c == '*' || c == '+' || c == '?') {
            p->pos++;
            ok = repeat(p, out, last, c == '+', c == '?' ? 1 : UNBOUNDED, base, here);
        } else if (c == '{') {
            ok = parse_braces(p, out, last, base, nested);
        } else {
            return true;
        }
        if (!ok) return false;
        skip_space(p, nested);
    }
}

/* Alternatives separated by '|' (a newline may follow '|') as the body of
 * rule `target`; `base` names generated rules. */
static bool parse_alternates(parser *p, uint32_t target, uint32_t base, bool nested) {
    evec body = {0};
    uint32_t n_alts = 0;
    for (;;) {
        if (!parse_sequence(p, &body, base, nested) || !emit(p, &body, KT_GE_END, 0)) {
            free(body.v);
            return false;
        }
        n_alts++;
        if (at(p, 0) != '|') break;
        p->pos++;
        skip_space(p, true);
    }
    set_body(p, target, body, n_alts);
    return true;
}

/* name ::= alternates, ended by a newline or the end of the text. */
static bool parse_rule(parser *p) {
    size_t start = p->pos;
    while (is_word(at(p, 0))) p->pos++;
    if (p->pos == start) return fail(p, start, "expecting a rule name");
    uint32_t id;
    if (!named_rule(p, p->s + start, p->pos - start, start, &id)) return false;
    skip_space(p, false);
    if (at(p, 0) != ':' || at(p, 1) != ':' || at(p, 2) != '=') return fail(p, p->pos, "expecting '::='");
    p->pos += 3;
    skip_space(p, true);
    if (!parse_alternates(p, id, id, false)) return false;
    if (at(p, 0) == '\r') p->pos += at(p, 1) == '\n' ? 2 : 1;
    else if (at(p, 0) == '\n') p->pos++;
    else if (p->pos < p->n) return fail(p, p->pos, "expecting a newline or the end after the rule");
    skip_space(p, true);
    return true;
}

/* ---- checks on the compiled form ------------------------------------- */

/* nullable[r]: rule r derives the empty string. A worklist over
 * alternatives made only of RULE elements: each counts its not-yet-nullable
 * elements and makes its rule nullable when the count reaches 0. */
static bool find_nullable(const kt_grammar *g, bool *nullable) {
    uint32_t *cnt = calloc(g->n_alts_total + 1, sizeof *cnt);
    uint32_t *rule_of = malloc(sizeof *rule_of * (g->n_alts_total + 1));
    uint32_t *occ_start = calloc((size_t)g->n_rules + 2, sizeof *occ_start);
    uint32_t *occ = malloc(sizeof *occ * (g->n_elems + 1));
    uint32_t *queue = malloc(sizeof *queue * ((size_t)g->n_rules + 1));
    bool ok = cnt && rule_of && occ_start && occ && queue;
    uint32_t qn = 0;
    if (ok) {
        /* pass 1: alternatives without terminals, and RULE occurrences in them */
        for (uint32_t r = 0; r < g->n_rules; r++) {
            for (uint32_t a = g->rules[r].first_alt; a < g->rules[r].first_alt + g->rules[r].n_alts; a++) {
                rule_of[a] = r;
                bool terminal = false;
                uint32_t refs = 0;
                for (uint32_t e = g->alts[a]; g->elems[e].type != KT_GE_END; e++) {
                    if (g->elems[e].type == KT_GE_RULE) refs++;
                    else terminal = true;
                }
                cnt[a] = terminal ? UINT32_MAX : refs;
                if (terminal) continue;
                for (uint32_t e = g->alts[a]; g->elems[e].type != KT_GE_END; e++) occ_start[g->elems[e].value + 1]++;
                if (refs == 0 && !nullable[r]) nullable[r] = true, queue[qn++] = r;
            }
        }
        for (uint32_t r = 0; r < g->n_rules; r++) occ_start[r + 1] += occ_start[r];
        uint32_t *fill = calloc((size_t)g->n_rules + 1, sizeof *fill);
        ok = fill != NULL;
        for (uint32_t a = 0; ok && a < g->n_alts_total; a++) {
            if (cnt[a] == UINT32_MAX) continue;
            for (uint32_t e = g->alts[a]; g->elems[e].type != KT_GE_END; e++) {
                uint32_t s = g->elems[e].value;
                occ[occ_start[s] + fill[s]++] = a;
            }
        }
        free(fill);
        /* pass 2: propagate */
        for (uint32_t qi = 0; ok && qi < qn; qi++) {
            uint32_t r = queue[qi];
            for (uint32_t k = occ_start[r]; k < occ_start[r + 1]; k++) {
                uint32_t a = occ[k];
                if (--cnt[a] == 0 && !nullable[rule_of[a]]) nullable[rule_of[a]] = true, queue[qn++] = rule_of[a];
            }
        }
    }
    free(cnt);
    free(rule_of);
    free(occ_start);
    free(occ);
    free(queue);
    return ok;
}

/* Refuses a grammar where some rule can reach itself without consuming
 * input: an edge r -> s when s is called at the start of an alternative of
 * r or after only nullable rules; a cycle in these edges is left
 * recursion. Iterative DFS (three colours), since rules may be many. */
static kt_status check_left_recursion(const kt_grammar *g, kt_error *err) {
    size_t nr = g->n_rules;
    bool *nullable = calloc(nr + 1, sizeof *nullable);
    uint32_t *edge_start = calloc(nr + 2, sizeof *edge_start);
    uint32_t *edges = malloc(sizeof *edges * (g->n_elems + 1));
    uint8_t *colour = calloc(nr + 1, 1);
    uint32_t *stack = malloc(sizeof *stack * (nr + 1));
    uint32_t *next_edge = malloc(sizeof *next_edge * (nr + 1));
    kt_status st = KT_OK;
    if (!nullable || !edge_start || !edges || !colour || !stack || !next_edge || !find_nullable(g, nullable)) {
        st = kt_error_set(err, KT_ERR_NOMEM, "out of memory checking a grammar");
        goto done;
    }
    uint32_t n_edges = 0;
    for (uint32_t r = 0; r < g->n_rules; r++) {
        edge_start[r] = n_edges;
        for (uint32_t a = g->rules[r].first_alt; a < g->rules[r].first_alt + g->rules[r].n_alts; a++) {
            for (uint32_t e = g->alts[a]; g->elems[e].type == KT_GE_RULE; e++) {
                edges[n_edges++] = g->elems[e].value;
                if (!nullable[g->elems[e].value]) break;
            }
        }
    }
    edge_start[g->n_rules] = n_edges;
    /* colour: 0 unseen, 1 on the DFS path, 2 finished */
    for (uint32_t start = 0; start < g->n_rules && st == KT_OK; start++) {
        if (colour[start]) continue;
        uint32_t depth = 0;
        stack[depth] = start;
        next_edge[depth++] = edge_start[start];
        colour[start] = 1;
        while (depth) {
            uint32_t r = stack[depth - 1];
            if (next_edge[depth - 1] == edge_start[r + 1]) {
                colour[r] = 2;
                depth--;
                continue;
            }
            uint32_t s = edges[next_edge[depth - 1]++];
            if (colour[s] == 1) {
                st = kt_error_set(err, KT_ERR_ARG,
                                  "rule '%s' is left-recursive: it can reach itself without consuming input "
                                  "(a repetition of something that can match nothing, like (x?)*, does this)",
                                  g->rule_names[s]);
                break;
            }
            if (colour[s] == 0) {
                colour[s] = 1;
                stack[depth] = s;
                next_edge[depth++] = edge_start[s];
            }
        }
    }
done:
    free(nullable);
    free(edge_start);
    free(edges);
    free(colour);
    free(stack);
    free(next_edge);
    return st;
}

/* ---- building the result ---------------------------------------------- */

void kt_grammar_free(kt_grammar *g) {
    if (!g) return;
    if (g->rule_names)
        for (uint32_t r = 0; r < g->n_rules; r++) free(g->rule_names[r]);
    free(g->rule_names);
    free(g->elems);
    free(g->alts);
    free(g->rules);
    free(g->sets);
    free(g->rule_lexical);
    free(g->rest_lexical);
    free(g->rule_hash);
    free(g);
}

/* Flattens the parsed rules into the kt_grammar layout, taking the names
 * and sets from the parser. */
static kt_grammar *flatten(parser *p, uint32_t root) {
    kt_grammar *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    uint64_t n_elems = 0, n_alts = 0;
    for (uint32_t r = 0; r < p->n_rules; r++) n_elems += p->rules[r].body.n, n_alts += p->rules[r].n_alts;
    g->elems = malloc(sizeof *g->elems * (n_elems + 1));
    g->alts = malloc(sizeof *g->alts * (n_alts + 1));
    g->rules = malloc(sizeof *g->rules * ((size_t)p->n_rules + 1));
    g->rule_names = calloc((size_t)p->n_rules + 1, sizeof *g->rule_names);
    g->sets = malloc(sizeof *g->sets * ((size_t)p->n_sets + 1));
    if (!g->elems || !g->alts || !g->rules || !g->rule_names || !g->sets) {
        kt_grammar_free(g);
        return NULL;
    }
    g->n_rules = p->n_rules;
    for (uint32_t r = 0; r < p->n_rules; r++) {
        const prule *pr = &p->rules[r];
        g->rules[r] = (kt_grule){g->n_alts_total, pr->n_alts};
        /* each alternative starts at the body's start or after an END */
        bool at_start = true;
        for (uint32_t k = 0; k < pr->body.n; k++) {
            if (at_start) g->alts[g->n_alts_total++] = g->n_elems + k;
            at_start = pr->body.v[k].type == KT_GE_END;
        }
        memcpy(g->elems + g->n_elems, pr->body.v, sizeof *g->elems * pr->body.n);
        g->n_elems += pr->body.n;
        g->rule_names[r] = pr->name;
        p->rules[r].name = NULL;
    }
    if (p->n_sets) memcpy(g->sets, p->sets, sizeof *g->sets * p->n_sets);
    g->n_sets = p->n_sets;
    g->root = root;
    return g;
}

static void parser_free(parser *p) {
    for (uint32_t r = 0; r < p->n_rules; r++) {
        free(p->rules[r].body.v);
        free(p->rules[r].name);
    }
    free(p->rules);
    free(p->name_slot);
    free(p->sets);
    free(p->set_slot);
}

/* After the text: every named rule defined, the start rule present. */
static bool check_names(parser *p, const char *root, uint32_t *root_id) {
    for (uint32_t r = 0; r < p->n_rules; r++)
        if (!p->rules[r].defined) return fail(p, p->rules[r].ref_off, "undefined rule '%s'", p->rules[r].name);
    size_t len = strlen(root);
    for (uint32_t r = 0; r < p->n_rules; r++) {
        if (p->rules[r].written && strlen(p->rules[r].name) == len && memcmp(p->rules[r].name, root, len) == 0) {
            *root_id = r;
            return true;
        }
    }
    kt_error_set(p->err, KT_ERR_ARG, "grammar has no rule named '%s'", root);
    return false;
}

kt_grammar *kt_grammar_parse(const char *text, size_t n, const char *root, kt_error *err) {
    if (!text) {
        kt_error_set(err, KT_ERR_ARG, "grammar text is NULL");
        return NULL;
    }
    if (n > KT_GRAMMAR_MAX_TEXT) {
        kt_error_set(err, KT_ERR_ARG, "grammar text is %zu bytes, more than the limit of %u", n, KT_GRAMMAR_MAX_TEXT);
        return NULL;
    }
    parser p = {.s = text, .n = n, .err = err, .any_rule = UINT32_MAX};
    const char *nul = memchr(text, 0, n);
    if (nul) {
        fail(&p, (size_t)(nul - text), "NUL byte in the grammar text");
        return NULL;
    }
    bool ok = true;
    skip_space(&p, true);
    if (p.pos >= p.n) {
        kt_error_set(err, KT_ERR_ARG, "empty grammar: no rules");
        ok = false;
    }
    while (ok && p.pos < p.n) ok = parse_rule(&p);
    uint32_t root_id = 0;
    ok = ok && check_names(&p, root ? root : "root", &root_id);
    kt_grammar *g = NULL;
    if (ok) {
        g = flatten(&p, root_id);
        if (!g) kt_error_set(err, KT_ERR_NOMEM, "out of memory compiling a grammar");
    }
    parser_free(&p);
    if (g && check_left_recursion(g, err) != KT_OK) {
        kt_grammar_free(g);
        g = NULL;
    }
    if (g && !kt_grammar_analyze(g)) {
        kt_grammar_free(g);
        kt_error_set(err, KT_ERR_NOMEM, "out of memory compiling a grammar");
        g = NULL;
    }
    return g;
}
