/*
 * json_schema.c - JSON Schema to GBNF (see json_schema.h).
 *
 * The technique is llama.cpp's and llguidance's: every (sub)schema becomes
 * a rule; objects list their properties in definition order, required and
 * optional (an optional one may be left out, the order stays), then any
 * additional properties; integers in a range get an exact digit-by-digit
 * grammar. What kettle adds is the policy: the grammar must never accept
 * a JSON text the schema rejects. So every keyword is either enforced
 * exactly, or the schema is refused naming the keyword and its JSON
 * pointer. The language may be *smaller* than the schema's (kettle's
 * output form), never larger.
 *
 * How a schema is read:
 *   - A subschema is a set of conjuncts: the schema itself, its allOf
 *     members and $ref targets, flattened (A and A is A, so a conjunct seen
 *     twice counts once, which also ends $ref cycles). The conjuncts'
 *     constraints are intersected per type: types (a bit mask), number
 *     bounds, string lengths, item counts; properties and items keep one
 *     list of conjuncts per position and are compiled lazily, so a
 *     recursive schema becomes a recursive rule (rules are memoised by
 *     their set of conjuncts).
 *   - anyOf distributes over the other conjuncts: (S and (A or B)) is
 *     (S and A) or (S and B). oneOf is read as anyOf only where its
 *     branches are provably disjoint (different types, different const or
 *     enum values, or a required property with different constant values,
 *     the "discriminator" shape); otherwise it is refused (llguidance's
 *     policy).
 *   - A schema without "type" allows every type, each under the keywords
 *     that apply to it (JSON Schema semantics, as llguidance; llama.cpp
 *     guesses a type instead). additionalProperties defaults to true, as
 *     in JSON Schema and llguidance; additional properties are written
 *     after the named ones and their keys can never spell a named key.
 *   - The empty schema and `true` allow any JSON value; `false` none. A
 *     property or item whose schema allows nothing cannot appear; a root
 *     that allows nothing is refused (a grammar cannot say "nothing").
 *
 * Output form (a subset of JSON the schema accepts): whitespace is at most
 * " " or 1-2 newlines and 20 spaces or tabs, only after { [ , : and
 * values inside containers; numbers have at most 16 integer digits (so they
 * are exact in a double); bounded numbers have no exponent; enum and const
 * values are written compactly; object keys and the strings of `format`
 * and `pattern` spell ordinary characters raw (no \u escapes for them).
 *
 * Supported: type (and arrays of types, OpenAPI "nullable"), enum, const,
 * properties, required, additionalProperties, items, prefixItems,
 * additionalItems (older tuple form of items), minItems, maxItems, anyOf,
 * oneOf (as above), allOf, $ref (local: "#", "#/json/pointer", the root
 * $id followed by a pointer; $defs and definitions), minLength,
 * maxLength, pattern (the subset of json_schema_regex.c), format (date,
 * time, date-time, uuid, email, uri, ipv4), minimum, maximum,
 * exclusiveMinimum, exclusiveMaximum (integers exactly; numbers when the
 * bounds are integers), boolean schemas, and the no-op forms of some
 * otherwise refused keywords (uniqueItems false, minProperties 0, ...).
 * Refused: every keyword that constrains in some draft and is not listed
 * above (KW_REFUSED). Keywords no draft defines are annotations, as the
 * spec says (title, description, $comment, x-..., and also misspellings
 * and vendor keys, which no validator enforces either).
 */
#include "grammar/json_schema.h"
#include "grammar/gbnf_text.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/json_safe.h"
#include "grammar/grammar.h"

/* Limits for hostile schemas; each breach is an error naming it. */
#define MAX_DEPTH 64u          /* nested subschemas being compiled at once */
#define MAX_RULES 50000u       /* rules in the output */
#define MAX_REF_CHAIN 32u      /* $ref followed through $ref ... */
#define MAX_ENUM 4096u         /* values of one enum */
#define MAX_PREFIX 64u         /* prefixItems positions */
#define MAX_ALTS 256u          /* anyOf/oneOf branches after distribution */
#define MAX_INT 9999999999999999LL /* 16 digits: exact in a double */

enum {
    T_NULL = 1, T_BOOL = 2, T_OBJ = 4, T_ARR = 8, T_STR = 16, T_INT = 32, T_FRAC = 64,
    T_NUM = T_INT | T_FRAC, T_ALL = 127
};

/* ---- growing text: grammar/gbnf_text.h ---------------------------------- */

/* A GBNF literal for bytes s[0..n): quotes, backslashes and control bytes
 * escaped, UTF-8 passed through. */
static void sb_lit(sbuf *b, const char *s, size_t n) {
    sb_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') sb_printf(b, "\\%c", c);
        else if (c < 0x20 || c == 0x7F) sb_printf(b, "\\x%02X", c);
        else sb_putn(b, (const char *)&c, 1);
    }
    sb_puts(b, "\"");
}

/* ---- the shared rules (written when used) ------------------------------ */

enum { P_WS, P_CHAR, P_STRING, P_NUMBER, P_INTEGER, P_VALUE, P_KCHAR, P_DATE, P_TIME, P_DATETIME, P_UUID,
       P_EMAIL, P_URI, P_IPV4, P_N };

static const struct prelude {
    const char *text;
    unsigned deps; /* bits of other entries it uses */
} PRELUDE[P_N] = {
    [P_WS] = {"ws ::= ( \" \" | \"\\n\"{1,2} [ \\t]{0,20} )?\n", 0},
    [P_CHAR] = {"char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" uesc )\n"
                "uesc ::= [0-9A-Ca-cE-Fe-f] hex{3} | [Dd] [0-7] hex{2}"
                " | [Dd] [89ABab] hex{2} \"\\\\u\" [Dd] [C-Fc-f] hex{2}\n"
                "hex ::= [0-9A-Fa-f]\n", 0},
    [P_STRING] = {"string ::= \"\\\"\" char* \"\\\"\"\n", 1u << P_CHAR},
    [P_NUMBER] = {"number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n", 0},
    [P_INTEGER] = {"integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n", 0},
    [P_VALUE] = {"value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
                 "object ::= \"{\" ws ( member ( \",\" ws member )* )? \"}\"\n"
                 "member ::= string ws \":\" ws value ws\n"
                 "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n",
                 1u << P_WS | 1u << P_STRING | 1u << P_NUMBER},
    /* a key character in its one canonical spelling, so that "not this
     * key" grammars are exact: raw, or \" \\ \b \f \n \r \t, or \u00XX
     * for the other control characters */
    [P_KCHAR] = {"kchar ::= [^\"\\\\\\x00-\\x1F] | kesc\n"
                 "kesc ::= \"\\\\\" [\"\\\\bfnrt] | \"\\\\u00\" ( \"0\" [0-7BEF] | \"1\" [0-9A-F] )\n", 0},
    [P_DATE] = {"fmt-date ::= \"\\\"\" date \"\\\"\"\n"
                "date ::= year \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" d31 | ( \"0\" [469] | \"11\" ) \"-\" d30"
                " | \"02-\" d28 ) | leap-year \"-02-29\"\n"
                "year ::= [0-9]{4}\n"
                "d31 ::= \"0\" [1-9] | [12] [0-9] | \"3\" [01]\n"
                "d30 ::= \"0\" [1-9] | [12] [0-9] | \"30\"\n"
                "d28 ::= \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]\n"
                "leap-year ::= [0-9] [0-9] ( \"0\" [48] | [2468] [048] | [13579] [26] )"
                " | ( \"0\" [048] | [2468] [048] | [13579] [26] ) \"00\"\n", 0},
    /* seconds stop at 59: a leap second is valid only at 23:59 UTC, which
     * an offset makes a matter of arithmetic; refusing 60 is exact */
    [P_TIME] = {"fmt-time ::= \"\\\"\" time \"\\\"\"\n"
                "time ::= hh \":\" mm \":\" mm ( \".\" [0-9]+ )? ( \"Z\" | [+-] hh \":\" mm )\n"
                "hh ::= [01] [0-9] | \"2\" [0-3]\n"
                "mm ::= [0-5] [0-9]\n", 0},
    [P_DATETIME] = {"fmt-date-time ::= \"\\\"\" date \"T\" time \"\\\"\"\n", 1u << P_DATE | 1u << P_TIME},
    [P_UUID] = {"fmt-uuid ::= \"\\\"\" hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12} \"\\\"\"\n",
                1u << P_CHAR},
    /* dot-atom local part @ a host name of LDH labels */
    [P_EMAIL] = {"fmt-email ::= \"\\\"\" atom ( \".\" atom )* \"@\" label ( \".\" label )* \"\\\"\"\n"
                 "atom ::= [A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+\n"
                 "label ::= [A-Za-z0-9] ( [A-Za-z0-9-]{0,61} [A-Za-z0-9] )?\n", 0},
    /* RFC 3986 URI; IP-literal hosts ([...]) are left out */
    [P_URI] = {"fmt-uri ::= \"\\\"\" [A-Za-z] [A-Za-z0-9+.-]* \":\" uri-hier ( \"?\" uri-q* )? ( \"#\" uri-q* )? \"\\\"\"\n"
               "uri-hier ::= \"//\" ( uri-u* \"@\" )? uri-h* ( \":\" [0-9]* )? ( \"/\" uri-p* )*"
               " | ( \"/\" ( uri-p+ ( \"/\" uri-p* )* )? | uri-p+ ( \"/\" uri-p* )* )?\n"
               "uri-h ::= [A-Za-z0-9._~!$&'()*+,;=-] | \"%\" hex hex\n"
               "uri-u ::= uri-h | \":\"\n"
               "uri-p ::= uri-u | \"@\"\n"
               "uri-q ::= uri-p | [/?]\n", 1u << P_CHAR},
    [P_IPV4] = {"fmt-ipv4 ::= \"\\\"\" octet ( \".\" octet ){3} \"\\\"\"\n"
                "octet ::= [0-9] | [1-9] [0-9] | \"1\" [0-9]{2} | \"2\" [0-4] [0-9] | \"25\" [0-5]\n", 0},
};

static const struct {
    const char *name;
    int prelude;
} FORMATS[] = {{"date", P_DATE}, {"time", P_TIME}, {"date-time", P_DATETIME}, {"uuid", P_UUID},
               {"email", P_EMAIL}, {"uri", P_URI}, {"ipv4", P_IPV4}};

/* ---- conjuncts and the converter's state ------------------------------- */

enum { DONE_ANYOF = 1, DONE_ONEOF = 2 };

typedef struct conj {
    const json_t *s;  /* an object schema */
    const char *ptr;  /* its JSON pointer, "" for the root */
    unsigned done;    /* applicators already distributed (DONE_*) */
} conj;

typedef struct clist {
    conj *v;
    size_t n, cap;
    bool empty; /* a `false` was among them: nothing validates */
} clist;

typedef struct memo {
    char *key;
    char *name;
    bool empty;
} memo;

typedef struct cx {
    const json_t *root;
    const char *root_id; /* the root's $id, for refs that spell it out */
    kt_error *err;
    bool failed;
    sbuf rules;
    memo *memo; /* open addressing, cap a power of two */
    size_t n_memo, cap_memo;
    char **arena; /* every string made here, freed at the end */
    size_t n_arena, cap_arena;
    unsigned used; /* PRELUDE bits */
    unsigned depth;
    unsigned n_rules;
    const kt_schema_opts *opts; /* NULL: every bound enforced or refused */
} cx;

/* The name of "no JSON value": a subschema that nothing satisfies. */
static const char EMPTY[] = "";

static void *fail(cx *c, const char *ptr, kt_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void *fail(cx *c, const char *ptr, kt_status st, const char *fmt, ...) {
    if (c->failed) return NULL;
    c->failed = true;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (*ptr) kt_error_set(c->err, st, "at %.80s: %s", ptr, msg);
    else kt_error_set(c->err, st, "at the root: %s", msg);
    return NULL;
}

static void *nomem(cx *c) { return fail(c, "", KT_ERR_NOMEM, "out of memory"); }

/* Keeps s (malloc'd) until the end; NULL (and the error) when s is. */
static char *keep(cx *c, char *s) {
    if (!s) return nomem(c);
    if (c->n_arena == c->cap_arena) {
        size_t cap = c->cap_arena ? c->cap_arena * 2 : 64;
        char **a = realloc(c->arena, cap * sizeof *a);
        if (!a) {
            free(s);
            return nomem(c);
        }
        c->arena = a;
        c->cap_arena = cap;
    }
    return c->arena[c->n_arena++] = s;
}

static char *kstrdup(cx *c, const char *s) { return keep(c, strdup(s)); }

/* Takes over a buffer's text. */
static char *ktake(cx *c, sbuf *b) {
    if (b->oom) {
        free(b->p);
        return nomem(c);
    }
    if (!b->p) return kstrdup(c, "");
    return keep(c, b->p);
}

/* ptr + "/" + key with JSON-pointer escaping (~0 ~1). */
static char *ptr_join(cx *c, const char *ptr, const char *key) {
    sbuf b = {0};
    sb_puts(&b, ptr);
    sb_puts(&b, "/");
    for (const char *k = key; *k; k++) {
        if (*k == '~') sb_puts(&b, "~0");
        else if (*k == '/') sb_puts(&b, "~1");
        else sb_putn(&b, k, 1);
    }
    return ktake(c, &b);
}

static char *ptr_index(cx *c, const char *ptr, const char *key, size_t i) {
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%zu", i);
    char *p = ptr_join(c, ptr, key);
    return p ? ptr_join(c, p, tmp) : NULL;
}

static bool cl_push(cx *c, clist *l, conj v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        conj *p = realloc(l->v, cap * sizeof *p);
        if (!p) return nomem(c), false;
        l->v = p;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return true;
}

/* ---- the memo table ------------------------------------------------------ */

static uint64_t hash_str(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static memo *memo_find(cx *c, const char *key) {
    if (!c->cap_memo) return NULL;
    for (size_t i = hash_str(key) & (c->cap_memo - 1);; i = (i + 1) & (c->cap_memo - 1)) {
        if (!c->memo[i].key) return NULL;
        if (!strcmp(c->memo[i].key, key)) return &c->memo[i];
    }
}

static bool memo_grow(cx *c) {
    size_t cap = c->cap_memo ? c->cap_memo * 2 : 256;
    memo *m = calloc(cap, sizeof *m);
    if (!m) return nomem(c), false;
    for (size_t j = 0; j < c->cap_memo; j++) {
        if (!c->memo[j].key) continue;
        size_t i = hash_str(c->memo[j].key) & (cap - 1);
        while (m[i].key) i = (i + 1) & (cap - 1);
        m[i] = c->memo[j];
    }
    free(c->memo);
    c->memo = m;
    c->cap_memo = cap;
    return true;
}

static memo *memo_add(cx *c, char *key, char *name) {
    if ((c->n_memo + 1) * 2 > c->cap_memo && !memo_grow(c)) return NULL;
    size_t i = hash_str(key) & (c->cap_memo - 1);
    while (c->memo[i].key) i = (i + 1) & (c->cap_memo - 1);
    c->memo[i] = (memo){key, name, false};
    c->n_memo++;
    return &c->memo[i];
}

/* ---- keywords ------------------------------------------------------------ */

static bool in_list(const char *k, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(k, *list)) return true;
    return false;
}

/* A refused keyword can still be harmless in its no-op form. */
static bool is_noop(const char *k, const json_t *v) {
    if (!strcmp(k, "uniqueItems")) return json_is_false(v);
    if (!strcmp(k, "minProperties") || !strcmp(k, "minContains")) return json_is_integer(v) && json_integer_value(v) == 0;
    /* every key of a JSON object is a string: zod writes this for z.record */
    if (!strcmp(k, "propertyNames"))
        return json_is_true(v) || (json_is_object(v) && (json_object_size(v) == 0 ||
                                                         (json_object_size(v) == 1 &&
                                                          json_is_string(json_object_get(v, "type")) &&
                                                          !strcmp(json_string_value(json_object_get(v, "type")), "string"))));
    if (!strcmp(k, "patternProperties") || !strcmp(k, "dependentRequired") || !strcmp(k, "dependentSchemas") ||
        !strcmp(k, "dependencies"))
        return json_is_object(v) && json_object_size(v) == 0;
    return false;
}

/* Keywords that constrain instances in some JSON Schema draft (or in
 * OpenAPI) and that kettle does not enforce. Any other unknown keyword is
 * an annotation: JSON Schema 2020-12 (section 6.5) says to treat unknown
 * keywords so, every validator ignores them, and refusing them would
 * refuse most real schemas ("name", "self", "links", "_format", ...). */
static const char *const KW_REFUSED[] = {
    "uniqueItems", "contains", "minContains", "maxContains", "patternProperties", "propertyNames",
    "dependentRequired", "dependentSchemas", "dependencies", "if", "then", "else", "not", "multipleOf",
    "divisibleBy", "minProperties", "maxProperties", "unevaluatedProperties", "unevaluatedItems",
    "$dynamicRef", "$recursiveRef", "disallow", "extends", NULL};

static bool check_keywords(cx *c, const json_t *s, const char *ptr) {
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (!in_list(k, KW_REFUSED) || is_noop(k, v)) continue;
        /* then/else without if: ignored by the spec */
        if ((!strcmp(k, "then") || !strcmp(k, "else")) && !json_object_get(s, "if")) continue;
        return fail(c, ptr, KT_ERR_UNSUPPORTED, "keyword '%s' is not supported", k), false;
    }
    return true;
}

static unsigned type_bit(const char *t) {
    static const struct { const char *n; unsigned b; } T[] = {
        {"null", T_NULL}, {"boolean", T_BOOL}, {"object", T_OBJ}, {"array", T_ARR},
        {"string", T_STR}, {"integer", T_INT}, {"number", T_NUM}};
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (!strcmp(t, T[i].n)) return T[i].b;
    return 0;
}

/* The types one conjunct allows; false with the error set on a bad type. */
static bool conj_types(cx *c, const conj *cj, unsigned *out) {
    const json_t *t = json_object_get(cj->s, "type");
    unsigned m = 0;
    if (!t) {
        *out = T_ALL;
        return true;
    }
    if (json_is_string(t)) {
        m = type_bit(json_string_value(t));
        if (!m) return fail(c, cj->ptr, KT_ERR_ARG, "'%s' is not a type name", json_string_value(t)), false;
    } else if (json_is_array(t)) {
        size_t i;
        const json_t *e;
        json_array_foreach(t, i, e) {
            unsigned b = json_is_string(e) ? type_bit(json_string_value(e)) : 0;
            if (!b) return fail(c, cj->ptr, KT_ERR_ARG, "'type' lists something that is not a type name"), false;
            m |= b;
        }
    } else {
        return fail(c, cj->ptr, KT_ERR_ARG, "'type' must be a string or an array"), false;
    }
    if (json_is_true(json_object_get(cj->s, "nullable"))) m |= T_NULL;
    *out = m;
    return true;
}

/* ---- $ref ---------------------------------------------------------------- */

/* Decodes %XX of a URI fragment. */
static char *pct_decode(const char *s) {
    size_t n = strlen(s);
    char *o = malloc(n + 1), *q = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i++) {
        int h1, h2;
        if (s[i] == '%' && i + 2 < n + 0 + 1 && (h1 = s[i + 1]) && (h2 = s[i + 2]) && strchr("0123456789abcdefABCDEF", h1) &&
            strchr("0123456789abcdefABCDEF", h2)) {
            char t[3] = {(char)h1, (char)h2, 0};
            *q++ = (char)strtol(t, NULL, 16);
            i += 2;
        } else {
            *q++ = s[i];
        }
    }
    *q = 0;
    return o;
}

/* Walks a JSON pointer from the root; refuses a ref taken inside a
 * subschema with its own $id (its refs resolve against another base). */
static const json_t *walk_pointer(cx *c, const char *frag, const char *at, char **canon) {
    const json_t *node = c->root;
    sbuf canonical = {0};
    const char *p = frag;
    while (*p == '/') {
        p++;
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        sbuf tok = {0};
        for (size_t i = 0; i < len; i++) {
            if (p[i] == '~' && i + 1 < len && (p[i + 1] == '0' || p[i + 1] == '1')) {
                sb_puts(&tok, p[i + 1] == '0' ? "~" : "/");
                i++;
            } else {
                sb_putn(&tok, p + i, 1);
            }
        }
        const char *key = tok.p ? tok.p : "";
        const json_t *next = NULL;
        if (json_is_object(node)) {
            next = json_object_get(node, key);
        } else if (json_is_array(node)) {
            char *end;
            long idx = strtol(key, &end, 10);
            if (*key && !*end && idx >= 0) next = json_array_get(node, (size_t)idx);
        }
        sb_puts(&canonical, "/");
        sb_putn(&canonical, p, len);
        free(tok.p);
        if (!next) {
            free(canonical.p);
            return fail(c, at, KT_ERR_ARG, "$ref '#%.100s' points at nothing", frag);
        }
        node = next;
        p += len;
    }
    *canon = ktake(c, &canonical);
    return *canon ? node : NULL;
}

/* Is there a nested $id on the way from the root to `ptr` (inclusive)? */
static bool nested_id(cx *c, const char *ptr) {
    const json_t *node = c->root;
    const char *p = ptr;
    while (*p == '/') {
        p++;
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char key[256];
        size_t k = 0;
        for (size_t i = 0; i < len && k + 1 < sizeof key; i++) {
            if (p[i] == '~' && i + 1 < len) key[k++] = p[++i] == '0' ? '~' : '/';
            else key[k++] = p[i];
        }
        key[k] = 0;
        node = json_is_object(node) ? json_object_get(node, key)
               : json_is_array(node) ? json_array_get(node, (size_t)strtoul(key, NULL, 10)) : NULL;
        if (!node) return false;
        if (json_is_object(node) && json_is_string(json_object_get(node, "$id"))) return true;
        p += len;
    }
    (void)c;
    return false;
}

static const json_t *resolve_ref(cx *c, const conj *cj, char **target) {
    const json_t *r = json_object_get(cj->s, "$ref");
    if (!json_is_string(r)) return fail(c, cj->ptr, KT_ERR_ARG, "$ref must be a string");
    const char *ref = json_string_value(r);
    size_t idlen = c->root_id ? strlen(c->root_id) : 0;
    if (idlen && c->root_id[idlen - 1] == '#') idlen--;
    if (idlen && !strncmp(ref, c->root_id, idlen) && (ref[idlen] == '#' || !ref[idlen])) ref += idlen;
    if (!*ref) ref = "#";
    if (ref[0] != '#')
        return fail(c, cj->ptr, KT_ERR_UNSUPPORTED, "$ref '%.100s' is not supported (only local refs, '#...')", ref);
    if (ref[1] && ref[1] != '/')
        return fail(c, cj->ptr, KT_ERR_UNSUPPORTED, "$ref '%.100s' to an anchor is not supported", ref);
    if (nested_id(c, cj->ptr))
        return fail(c, cj->ptr, KT_ERR_UNSUPPORTED, "$ref inside a subschema with its own $id is not supported");
    char *frag = keep(c, pct_decode(ref + 1));
    return frag ? walk_pointer(c, frag, cj->ptr, target) : NULL;
}

/* ---- flattening: allOf and $ref become more conjuncts --------------------- */

static bool flat_add(cx *c, clist *l, const json_t *s, const char *ptr, unsigned done, unsigned refs) {
    if (refs > MAX_REF_CHAIN) return fail(c, ptr, KT_ERR_UNSUPPORTED, "$ref chain longer than %u", MAX_REF_CHAIN), false;
    if (json_is_true(s)) return true;
    if (json_is_false(s)) {
        l->empty = true;
        return true;
    }
    if (!json_is_object(s)) return fail(c, ptr, KT_ERR_ARG, "a schema must be an object or a boolean"), false;
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].done == done && !strcmp(l->v[i].ptr, ptr)) return true;
    if (!check_keywords(c, s, ptr) || !cl_push(c, l, (conj){s, ptr, done})) return false;
    const json_t *all = json_object_get(s, "allOf");
    if (all) {
        if (!json_is_array(all) || !json_array_size(all))
            return fail(c, ptr, KT_ERR_ARG, "allOf must be a non-empty array"), false;
        for (size_t i = 0; i < json_array_size(all); i++) {
            char *p = ptr_index(c, ptr, "allOf", i);
            if (!p || !flat_add(c, l, json_array_get(all, i), p, 0, refs)) return false;
        }
    }
    if (json_object_get(s, "$ref")) {
        conj self = {s, ptr, done};
        char *target = NULL;
        const json_t *t = resolve_ref(c, &self, &target);
        if (!t || !flat_add(c, l, t, target, 0, refs + 1)) return false;
    }
    return true;
}

static int conj_cmp(const void *a, const void *b) {
    const conj *x = a, *y = b;
    int d = strcmp(x->ptr, y->ptr);
    return d ? d : (int)x->done - (int)y->done;
}

/* The memo key: the sorted conjuncts. */
static char *clist_key(cx *c, clist *l) {
    qsort(l->v, l->n, sizeof *l->v, conj_cmp);
    sbuf b = {0};
    for (size_t i = 0; i < l->n; i++) sb_printf(&b, "%s%s~%u", i ? "|" : "", l->v[i].ptr, l->v[i].done);
    if (!b.p) sb_puts(&b, "");
    return ktake(c, &b);
}

/* A rule name from the pointer's last token (letters, digits, '-'). */
static char *rule_name(cx *c, const char *ptr) {
    const char *last = strrchr(ptr, '/');
    last = last ? last + 1 : ptr;
    sbuf b = {0};
    for (const char *p = last; *p && b.n < 24; p++) {
        char ch = *p;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')) sb_putn(&b, &ch, 1);
        else if (b.n && b.p[b.n - 1] != '-') sb_puts(&b, "-");
    }
    if (!b.n || (b.p[0] >= '0' && b.p[0] <= '9')) {
        char *old = b.p;
        b = (sbuf){0};
        sb_puts(&b, "s");
        if (old) sb_puts(&b, old);
        free(old);
    }
    if (!b.oom && b.p[b.n - 1] != '-') sb_puts(&b, "-"); /* oom: nothing to read (ktake reports it) */
    sb_printf(&b, "%u", c->n_rules);
    return ktake(c, &b);
}

/* ---- the merged constraints of a conjunction ------------------------------ */

typedef struct node {
    unsigned types;
    bool has_lo, lo_x, has_hi, hi_x;
    double lo, hi;
    const char *lo_ptr, *hi_ptr;
    long min_len, max_len; /* -1: none */
    const char *len_ptr;   /* where the tightest length bound was, for messages */
    const char *pattern, *pattern_ptr;
    const char *format, *format_ptr;
    long min_items, max_items;
    const conj *en; /* the first conjunct with enum or const */
} node;

static bool get_count(cx *c, const conj *cj, const char *k, long *out) {
    const json_t *v = json_object_get(cj->s, k);
    if (!v) return true;
    double d = json_is_number(v) ? json_number_value(v) : -1;
    if (d < 0 || d != floor(d)) return fail(c, cj->ptr, KT_ERR_ARG, "'%s' must be a non-negative integer", k), false;
    *out = d > 1e9 ? 1000000000L : (long)d;
    return true;
}

static void tighten_lo(node *n, double v, bool x, const char *ptr) {
    if (!n->has_lo || v > n->lo || (v == n->lo && x)) n->has_lo = true, n->lo = v, n->lo_x = x, n->lo_ptr = ptr;
}

static void tighten_hi(node *n, double v, bool x, const char *ptr) {
    if (!n->has_hi || v < n->hi || (v == n->hi && x)) n->has_hi = true, n->hi = v, n->hi_x = x, n->hi_ptr = ptr;
}

/* minimum/maximum and both spellings of the exclusive bounds (draft 4's
 * booleans and the later numbers). */
static bool merge_bounds(cx *c, node *n, const conj *cj) {
    static const char *const K[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    const json_t *v[4];
    for (int i = 0; i < 4; i++) {
        v[i] = json_object_get(cj->s, K[i]);
        if (v[i] && !json_is_number(v[i]) && !(i >= 2 && json_is_boolean(v[i])))
            return fail(c, cj->ptr, KT_ERR_ARG, "'%s' must be a number", K[i]), false;
    }
    if (v[0]) tighten_lo(n, json_number_value(v[0]), json_is_true(v[2]), cj->ptr);
    if (v[1]) tighten_hi(n, json_number_value(v[1]), json_is_true(v[3]), cj->ptr);
    if (v[2] && json_is_number(v[2])) tighten_lo(n, json_number_value(v[2]), true, cj->ptr);
    if (v[3] && json_is_number(v[3])) tighten_hi(n, json_number_value(v[3]), true, cj->ptr);
    return true;
}

/* The formats some JSON Schema draft defines. Any other value ("starts_with",
 * "includes": what zod writes beside the pattern that enforces them) is an
 * annotation, as an unknown keyword is: JSON Schema asserts only formats
 * it defines, and refusing would refuse every such schema. */
static bool is_defined_format(const char *f) {
    static const char *const DEFINED[] = {
        "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4",
        "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template", "json-pointer",
        "relative-json-pointer", "regex", "color", "style", "phone", "host-name", "ip-address", "utc-millisec", NULL};
    return in_list(f, DEFINED);
}

static bool merge_string(cx *c, node *n, const conj *cj) {
    long mn = -1, mx = -1;
    if (!get_count(c, cj, "minLength", &mn) || !get_count(c, cj, "maxLength", &mx)) return false;
    if (mn > n->min_len) n->min_len = mn, n->len_ptr = cj->ptr;
    if (mx >= 0 && (n->max_len < 0 || mx < n->max_len)) n->max_len = mx, n->len_ptr = cj->ptr;
    const json_t *p = json_object_get(cj->s, "pattern"), *f = json_object_get(cj->s, "format");
    if (p) {
        if (!json_is_string(p)) return fail(c, cj->ptr, KT_ERR_ARG, "'pattern' must be a string"), false;
        if (n->pattern && strcmp(n->pattern, json_string_value(p)))
            return fail(c, cj->ptr, KT_ERR_UNSUPPORTED, "two different 'pattern's on one string are not supported"), false;
        n->pattern = json_string_value(p), n->pattern_ptr = cj->ptr;
    }
    if (f && json_is_string(f) && !is_defined_format(json_string_value(f))) f = NULL; /* an annotation */
    if (f) {
        if (!json_is_string(f)) return fail(c, cj->ptr, KT_ERR_ARG, "'format' must be a string"), false;
        if (n->format && strcmp(n->format, json_string_value(f)))
            return fail(c, cj->ptr, KT_ERR_UNSUPPORTED, "two different 'format's on one string are not supported"), false;
        n->format = json_string_value(f), n->format_ptr = cj->ptr;
    }
    return true;
}

static bool merge(cx *c, const clist *l, node *n) {
    *n = (node){.types = T_ALL, .min_len = 0, .max_len = -1, .min_items = 0, .max_items = -1};
    for (size_t i = 0; i < l->n; i++) {
        const conj *cj = &l->v[i];
        unsigned t;
        long mi = -1, ma = -1;
        if (!conj_types(c, cj, &t) || !merge_bounds(c, n, cj) || !merge_string(c, n, cj)) return false;
        if (!get_count(c, cj, "minItems", &mi) || !get_count(c, cj, "maxItems", &ma)) return false;
        n->types &= t;
        if (mi > n->min_items) n->min_items = mi;
        if (ma >= 0 && (n->max_items < 0 || ma < n->max_items)) n->max_items = ma;
        if (!n->en && (json_object_get(cj->s, "enum") || json_object_get(cj->s, "const"))) n->en = cj;
        const json_t *e = json_object_get(cj->s, "enum");
        if (e && !json_is_array(e)) return fail(c, cj->ptr, KT_ERR_ARG, "'enum' must be an array"), false;
    }
    return true;
}

/* ---- enum and const -------------------------------------------------------- */

static unsigned value_type(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_NULL: return T_NULL;
    case JSON_TRUE: case JSON_FALSE: return T_BOOL;
    case JSON_OBJECT: return T_OBJ;
    case JSON_ARRAY: return T_ARR;
    case JSON_STRING: return T_STR;
    case JSON_INTEGER: return T_INT;
    default: {
        double d = json_real_value(v);
        return d == floor(d) && fabs(d) < 1e300 ? T_INT : T_FRAC;
    }
    }
}

/* JSON Schema equality: 1 and 1.0 are equal. */
static bool value_equal(const json_t *a, const json_t *b) {
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    if (json_is_array(a) && json_is_array(b)) {
        if (json_array_size(a) != json_array_size(b)) return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!value_equal(json_array_get(a, i), json_array_get(b, i))) return false;
        return true;
    }
    if (json_is_object(a) && json_is_object(b)) {
        if (json_object_size(a) != json_object_size(b)) return false;
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)a, k, v) {
            const json_t *w = json_object_get(b, k);
            if (!w || !value_equal(v, w)) return false;
        }
        return true;
    }
    return json_equal(a, b);
}

/* Does v satisfy a conjunct's enum/const? */
static bool in_enum(const conj *cj, const json_t *v) {
    const json_t *k = json_object_get(cj->s, "const"), *e = json_object_get(cj->s, "enum");
    if (k && !value_equal(k, v)) return false;
    if (e) {
        for (size_t i = 0; i < json_array_size(e); i++)
            if (value_equal(json_array_get(e, i), v)) return true;
        return false;
    }
    return true;
}

static size_t utf8_len(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static const char *const KW_ARRAY[] = {"items", "prefixItems", "additionalItems", "minItems", "maxItems", NULL};
static const char *const KW_OBJECT[] = {"properties", "required", "additionalProperties", NULL};

static bool has_any(const clist *l, const char *const *kws) {
    for (size_t i = 0; i < l->n; i++)
        for (const char *const *k = kws; *k; k++)
            if (json_object_get(l->v[i].s, *k)) return true;
    return false;
}

/* 1: v satisfies the conjunction, 0: it does not, -1: cannot tell (error
 * set: kettle does not check that keyword against constants). */
static int value_ok(cx *c, const clist *l, const node *n, const json_t *v) {
    unsigned t = value_type(v);
    if (!(t & n->types) && !(t == T_INT && (n->types & T_INT))) return 0;
    for (size_t i = 0; i < l->n; i++)
        if (!in_enum(&l->v[i], v)) return 0;
    if (t & T_NUM) {
        double d = json_number_value(v);
        if (n->has_lo && (d < n->lo || (n->lo_x && d == n->lo))) return 0;
        if (n->has_hi && (d > n->hi || (n->hi_x && d == n->hi))) return 0;
    }
    if (t == T_STR) {
        size_t len = utf8_len(json_string_value(v));
        if ((long)len < n->min_len || (n->max_len >= 0 && (long)len > n->max_len)) return 0;
        if (n->pattern || n->format)
            return fail(c, n->en->ptr, KT_ERR_UNSUPPORTED, "enum/const together with '%s' is not supported",
                        n->pattern ? "pattern" : "format"), -1;
    }
    if ((t == T_ARR && has_any(l, KW_ARRAY)) || (t == T_OBJ && has_any(l, KW_OBJECT)))
        return fail(c, n->en->ptr, KT_ERR_UNSUPPORTED, "enum/const of %s together with %s keywords is not supported",
                    t == T_ARR ? "arrays" : "objects", t == T_ARR ? "array" : "object"), -1;
    return 1;
}

/* Shortest decimal that reads back as d. */
static void put_real(sbuf *b, double d) {
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, d);
        if (strtod(tmp, NULL) == d) break;
    }
    sb_lit(b, tmp, strlen(tmp));
}

/* One enum value as a GBNF alternative: compact JSON; numbers in their
 * short forms (an integral one also with ".0"). */
static bool put_value(cx *c, sbuf *b, const json_t *v) {
    if (json_is_number(v)) {
        double d = json_number_value(v);
        if (json_is_integer(v) || (d == floor(d) && fabs(d) < 1e15)) {
            char tmp[32];
            snprintf(tmp, sizeof tmp, "%lld", json_is_integer(v) ? (long long)json_integer_value(v) : (long long)d);
            sb_lit(b, tmp, strlen(tmp));
            sb_puts(b, " ( \".0\" )?");
        } else {
            put_real(b, d);
        }
        return true;
    }
    char *s = kt_json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
    if (!s) return nomem(c), false;
    sb_lit(b, s, strlen(s));
    free(s);
    return true;
}

/* Writes the alternatives of the enum values that pass; *any: some did. */
static bool emit_enum(cx *c, const clist *l, const node *n, sbuf *b, bool *any) {
    const json_t *k = json_object_get(n->en->s, "const"), *e = json_object_get(n->en->s, "enum");
    size_t count = k ? 1 : json_array_size(e);
    if (count > MAX_ENUM) return fail(c, n->en->ptr, KT_ERR_UNSUPPORTED, "enum of more than %u values", MAX_ENUM), false;
    for (size_t i = 0; i < count; i++) {
        const json_t *v = k ? k : json_array_get(e, i);
        int ok = value_ok(c, l, n, v);
        if (ok < 0) return false;
        if (!ok) continue;
        sb_puts(b, *any ? " | " : "");
        if (!put_value(c, b, v)) return false;
        *any = true;
    }
    return true;
}

/* ---- integer and number ranges -------------------------------------------- */

static int ndigits(long long v) {
    int n = 1;
    while (v >= 10) v /= 10, n++;
    return n;
}

static long long pow10ll(int k) {
    long long p = 1;
    while (k-- > 0) p *= 10;
    return p;
}

/* Numbers from lo to hi written with exactly strlen(lo) digits, lo and hi
 * of the same length (leading digits may be 0 in the inner positions). */
static void range_same(sbuf *b, const char *lo, const char *hi) {
    size_t n = strlen(lo);
    if (!n) return;
    if (strspn(lo, "0") == n && strspn(hi, "9") == n) {
        sb_printf(b, "[0-9]{%zu}", n);
        return;
    }
    if (lo[0] == hi[0]) {
        sb_printf(b, "\"%c\"", lo[0]);
        if (n > 1) sb_puts(b, " "), range_same(b, lo + 1, hi + 1);
        return;
    }
    bool lo_full = strspn(lo + 1, "0") == n - 1, hi_full = strspn(hi + 1, "9") == n - 1;
    char a = lo_full ? lo[0] : (char)(lo[0] + 1), z = hi_full ? hi[0] : (char)(hi[0] - 1);
    bool sep = false;
    sb_puts(b, "( ");
    if (!lo_full) {
        char nines[20];
        memset(nines, '9', n - 1);
        nines[n - 1] = 0;
        sb_printf(b, "\"%c\" ", lo[0]);
        range_same(b, lo + 1, nines);
        sep = true;
    }
    if (a <= z) {
        sb_puts(b, sep ? " | " : "");
        sb_printf(b, "[%c-%c]", a, z);
        if (n > 1) sb_printf(b, " [0-9]{%zu}", n - 1);
        sep = true;
    }
    if (!hi_full) {
        char zeros[20];
        memset(zeros, '0', n - 1);
        zeros[n - 1] = 0;
        sb_puts(b, sep ? " | " : "");
        sb_printf(b, "\"%c\" ", hi[0]);
        range_same(b, zeros, hi + 1);
    }
    sb_puts(b, " )");
}

/* Non-negative integers lo..hi (lo <= hi <= MAX_INT), no leading zeros,
 * as one parenthesised expression. */
static void uint_range(sbuf *b, long long lo, long long hi) {
    sb_puts(b, "( ");
    bool sep = false;
    for (int len = ndigits(lo); len <= ndigits(hi); len++) {
        long long a = len == 1 ? 0 : pow10ll(len - 1), z = pow10ll(len) - 1;
        if (a < lo) a = lo;
        if (z > hi) z = hi;
        if (a > z) continue;
        char sa[24], sz[24];
        snprintf(sa, sizeof sa, "%lld", a);
        snprintf(sz, sizeof sz, "%lld", z);
        sb_puts(b, sep ? " | " : "");
        if (len > 1 && a == pow10ll(len - 1) && z == pow10ll(len) - 1 && hi == MAX_INT && lo <= a) {
            /* every longer length too: [1-9] [0-9]{len-1,15} */
            sb_printf(b, "[1-9] [0-9]{%d,%d}", len - 1, ndigits(MAX_INT) - 1);
            break;
        }
        range_same(b, sa, sz);
        sep = true;
    }
    sb_puts(b, " )");
}

/* Integers lo..hi, both within +-MAX_INT, lo <= hi. */
static void int_range(sbuf *b, long long lo, long long hi) {
    bool sep = false;
    sb_puts(b, "( ");
    if (lo < 0) {
        long long a = hi < 0 ? -hi : 1;
        sb_puts(b, "\"-\" ");
        uint_range(b, a, -lo);
        sep = true;
    }
    if (hi >= 0) {
        sb_puts(b, sep ? " | " : "");
        uint_range(b, lo > 0 ? lo : 0, hi);
    }
    sb_puts(b, " )");
}

/* Non-negative decimals without exponent in the interval from a to b
 * (b < 0: no upper bound), bounds integers, a_x/b_x exclusive. */
static bool pos_decimal(sbuf *b, long long a, bool a_x, long long z, bool z_x) {
    bool sep = false;
    long long ilo = a_x ? a + 1 : a, ihi = z < 0 ? MAX_INT : z - 1;
    sb_puts(b, "( ");
    if (ilo <= ihi) {
        uint_range(b, ilo, ihi);
        sb_puts(b, " ( \".\" [0-9]+ )?");
        sep = true;
    }
    if (a_x && (z < 0 || a < z)) { /* a itself plus a non-zero fraction */
        sb_printf(b, "%s\"%lld.\" [0-9]* [1-9] [0-9]*", sep ? " | " : "", a);
        sep = true;
    }
    if (z >= 0 && !z_x && (z > a || !a_x)) { /* z itself, fraction zero */
        sb_printf(b, "%s\"%lld\" ( \".\" \"0\"+ )?", sep ? " | " : "", z);
        sep = true;
    }
    sb_puts(b, " )");
    return sep;
}

/* An integer bound after rounding into the type: lo up, hi down. */
static bool int_bounds(const node *n, long long *lo, long long *hi) {
    double l = -(double)MAX_INT, h = (double)MAX_INT;
    if (n->has_lo) l = n->lo_x ? floor(n->lo) + 1 : ceil(n->lo);
    if (n->has_hi) h = n->hi_x ? ceil(n->hi) - 1 : floor(n->hi);
    if (l < -(double)MAX_INT) l = -(double)MAX_INT;
    if (h > (double)MAX_INT) h = (double)MAX_INT;
    if (l > h) return false;
    *lo = (long long)l;
    *hi = (long long)h;
    return true;
}

static bool emit_integer(cx *c, const node *n, sbuf *b, bool *any) {
    long long lo, hi;
    if (!n->has_lo && !n->has_hi) {
        c->used |= 1u << P_INTEGER;
        sb_printf(b, "%sinteger", *any ? " | " : "");
        *any = true;
        return true;
    }
    if (!int_bounds(n, &lo, &hi)) return true;
    sb_puts(b, *any ? " | " : "");
    int_range(b, lo, hi);
    *any = true;
    return true;
}

/* Numbers with bounds: exact only for integer bounds (see pos_decimal). */
static bool emit_number(cx *c, const node *n, sbuf *b, bool *any) {
    if (!n->has_lo && !n->has_hi) {
        c->used |= 1u << P_NUMBER;
        sb_printf(b, "%snumber", *any ? " | " : "");
        *any = true;
        return true;
    }
    if ((n->has_lo && (n->lo != floor(n->lo) || fabs(n->lo) > 1e15)) ||
        (n->has_hi && (n->hi != floor(n->hi) || fabs(n->hi) > 1e15)))
        return fail(c, n->has_lo && n->lo != floor(n->lo) ? n->lo_ptr : n->hi_ptr, KT_ERR_UNSUPPORTED,
                    "a bound on a number that is not an integer (or over 1e15) is not supported"), false;
    long long lo = n->has_lo ? (long long)n->lo : 0, hi = n->has_hi ? (long long)n->hi : 0;
    sbuf t = {0};
    bool some = false;
    if (!n->has_lo || lo < 0) { /* negatives: -y */
        long long a = n->has_hi && hi < 0 ? -hi : 0;
        bool a_x = n->has_hi && hi < 0 ? n->hi_x : true;
        sb_puts(&t, "\"-\" ");
        some = pos_decimal(&t, a, a_x, n->has_lo ? -lo : -1, n->lo_x);
        if (!some) t.n = 0;
    }
    if (!n->has_hi || hi >= 0) {
        long long a = n->has_lo && lo > 0 ? lo : 0;
        bool a_x = n->has_lo && lo >= 0 ? n->lo_x : false;
        size_t mark = t.n;
        sb_puts(&t, some ? " | " : "");
        if (pos_decimal(&t, a, a_x, n->has_hi ? hi : -1, n->hi_x)) some = true;
        else t.n = mark;
    }
    if (t.oom) b->oom = true;
    if (some && !t.oom) { /* oom: t.p may be NULL, and b fails anyway */
        t.p[t.n] = 0;
        sb_printf(b, "%s( ", *any ? " | " : "");
        sb_puts(b, t.p);
        sb_puts(b, " )");
        *any = true;
    }
    free(t.p);
    return true;
}

/* ---- strings --------------------------------------------------------------- */

/* Adds "at PTR: what" to opts->relaxed (cut when full). */
static void note_relaxed(cx *c, const char *ptr, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note_relaxed(cx *c, const char *ptr, const char *fmt, ...) {
    kt_schema_opts *o = (kt_schema_opts *)c->opts;
    if (!o->relaxed || !o->relaxed_cap) return;
    size_t len = strlen(o->relaxed);
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(o->relaxed + len, o->relaxed_cap - len, "%sat %s: %s", len ? "; " : "", *ptr ? ptr : "the root", what);
}

/* A count bound past the grammar's repeat limit, under relax_bounds: a
 * maximum is left out (the value may be longer), a minimum lowered to the
 * limit (enforced as far as a grammar can); each said in opts->relaxed.
 * False: refused (no relaxing asked for). */
static bool relax_counts(cx *c, const char *ptr, const char *what, long *min, long *max) {
    const long limit = (long)KT_GRAMMAR_MAX_REPEAT;
    if (*min <= limit && *max <= limit) return true;
    if (!c->opts || !c->opts->relax_bounds)
        return fail(c, ptr, KT_ERR_UNSUPPORTED, "%s bound over %u", what, KT_GRAMMAR_MAX_REPEAT), false;
    if (*max > limit) note_relaxed(c, ptr, "%s maximum %ld not enforced (over %ld)", what, *max, limit), *max = -1;
    if (*min > limit) note_relaxed(c, ptr, "%s minimum %ld enforced as %ld", what, *min, limit), *min = limit;
    return true;
}

static bool emit_string(cx *c, const node *n_in, sbuf *b, bool *any) {
    node relaxed = *n_in;
    const node *n = &relaxed;
    const char *ptr = n->pattern_ptr ? n->pattern_ptr : n->format_ptr ? n->format_ptr : "";
    if (n->max_len >= 0 && n->max_len < n->min_len) return true;
    if (!relax_counts(c, n->len_ptr ? n->len_ptr : ptr, "string length", &relaxed.min_len, &relaxed.max_len))
        return false;
    bool lengths = n->min_len > 0 || n->max_len >= 0;
    if ((n->pattern || n->format) && lengths)
        return fail(c, ptr, KT_ERR_UNSUPPORTED, "'%s' together with minLength/maxLength is not supported",
                    n->pattern ? "pattern" : "format"), false;
    if (n->pattern && n->format)
        return fail(c, ptr, KT_ERR_UNSUPPORTED, "'pattern' together with 'format' is not supported"), false;
    sb_puts(b, *any ? " | " : "");
    *any = true;
    if (n->format) {
        for (size_t i = 0; i < sizeof FORMATS / sizeof FORMATS[0]; i++) {
            if (strcmp(FORMATS[i].name, n->format)) continue;
            c->used |= 1u << FORMATS[i].prelude;
            sb_printf(b, "fmt-%s", n->format);
            return true;
        }
        return fail(c, ptr, KT_ERR_UNSUPPORTED, "format '%.60s' is not supported", n->format), false;
    }
    c->used |= 1u << P_CHAR;
    if (n->pattern) {
        kt_error e = {0};
        char *g = kt_json_regex_gbnf(n->pattern, &e);
        if (!g) return fail(c, ptr, e.status, "%s", e.msg), false;
        sb_printf(b, "\"\\\"\" %s \"\\\"\"", g);
        free(g);
        return true;
    }
    if (!lengths) {
        c->used |= 1u << P_STRING;
        sb_puts(b, "string");
    } else if (n->max_len < 0) {
        sb_printf(b, "\"\\\"\" char{%ld,} \"\\\"\"", n->min_len);
    } else {
        sb_printf(b, "\"\\\"\" char{%ld,%ld} \"\\\"\"", n->min_len, n->max_len);
    }
    return true;
}

/* ---- compiling a conjunction to a rule -------------------------------------- */

static const char *compile(cx *c, clist *l);

/* Compiles the conjunction of (schema, ptr) pairs; NULL on error. */
static const char *compile_one(cx *c, const json_t *s, const char *ptr) {
    clist l = {0};
    const char *r = flat_add(c, &l, s, ptr, 0, 0) ? compile(c, &l) : NULL;
    free(l.v);
    return r;
}

/* ---- arrays ------------------------------------------------------------------- */

/* Where a conjunct keeps its tuple positions and its tail schema. */
static void tuple_of(const json_t *s, const json_t **prefix, const char **pkey, const json_t **tail, const char **tkey) {
    const json_t *pi = json_object_get(s, "prefixItems"), *it = json_object_get(s, "items");
    *prefix = NULL, *tail = NULL, *pkey = NULL, *tkey = NULL;
    if (json_is_array(pi)) {
        *prefix = pi, *pkey = "prefixItems";
        if (it) *tail = it, *tkey = "items";
    } else if (json_is_array(it)) {
        *prefix = it, *pkey = "items";
        const json_t *ai = json_object_get(s, "additionalItems");
        if (ai) *tail = ai, *tkey = "additionalItems";
    } else if (it) {
        *tail = it, *tkey = "items";
    }
}

/* The rule for position i (i < 0: the tail) of the arrays of l. */
static const char *array_pos(cx *c, const clist *l, long i) {
    clist sub = {0};
    const char *r = NULL;
    for (size_t k = 0; k < l->n; k++) {
        const json_t *pre, *tail;
        const char *pk, *tk;
        tuple_of(l->v[k].s, &pre, &pk, &tail, &tk);
        const json_t *s = NULL;
        char *p = NULL;
        if (i >= 0 && pre && (size_t)i < json_array_size(pre)) s = json_array_get(pre, (size_t)i), p = ptr_index(c, l->v[k].ptr, pk, (size_t)i);
        else if (tail) s = tail, p = ptr_join(c, l->v[k].ptr, tk);
        if (s && (!p || !flat_add(c, &sub, s, p, 0, 0))) goto out;
    }
    r = compile(c, &sub);
out:
    free(sub.v);
    return r;
}

static void put_reps(sbuf *b, long lo, long hi) {
    if (hi < 0) sb_printf(b, lo == 0 ? "*" : lo == 1 ? "+" : "{%ld,}", lo);
    else if (lo == 0 && hi == 1) sb_puts(b, "?");
    else if (lo != 1 || hi != 1) sb_printf(b, "{%ld,%ld}", lo, hi);
}

static bool emit_array(cx *c, const clist *l, const node *n, sbuf *b, bool *any) {
    size_t k = 0;
    for (size_t i = 0; i < l->n; i++) {
        const json_t *pre, *tail;
        const char *pk, *tk;
        tuple_of(l->v[i].s, &pre, &pk, &tail, &tk);
        if (pre && json_array_size(pre) > k) k = json_array_size(pre);
    }
    if (k > MAX_PREFIX) return fail(c, l->v[0].ptr, KT_ERR_UNSUPPORTED, "more than %u tuple positions", MAX_PREFIX), false;
    long max = n->max_items, min = n->min_items;
    const char *names[MAX_PREFIX];
    size_t reach = 0; /* positions that can be filled */
    for (; reach < k && (max < 0 || (long)reach < max); reach++) {
        names[reach] = array_pos(c, l, (long)reach);
        if (!names[reach]) return false;
        if (names[reach] == EMPTY) break;
    }
    const char *tail = NULL;
    if (reach == k && (max < 0 || (long)k < max)) {
        tail = array_pos(c, l, -1);
        if (!tail) return false;
        if (tail == EMPTY) tail = NULL;
    }
    long cap = tail ? max : (long)reach;
    if (cap >= 0 && min > cap) return true;
    if (!relax_counts(c, l->v[0].ptr, "item count", &min, &max)) return false;
    c->used |= 1u << P_WS;
    sb_printf(b, "%s\"[\" ws ", *any ? " | " : "");
    *any = true;
    size_t open = 0;
    for (size_t i = 0; i < reach; i++) {
        if ((long)i >= min) sb_puts(b, "( "), open++;
        sb_printf(b, "%s%s ws ", i ? "\",\" ws " : "", names[i]);
    }
    if (tail && reach == k) {
        long lo = min > (long)k ? min - (long)k : 0, hi = max < 0 ? -1 : max - (long)k;
        if (k > 0) {
            sb_printf(b, "( \",\" ws %s ws )", tail);
            put_reps(b, lo, hi);
        } else if (lo == 0) {
            sb_printf(b, "( %s ws ( \",\" ws %s ws )", tail, tail);
            put_reps(b, 0, hi < 0 ? -1 : hi - 1);
            sb_puts(b, " )?");
        } else {
            sb_printf(b, "%s ws ( \",\" ws %s ws )", tail, tail);
            put_reps(b, lo - 1, hi < 0 ? -1 : hi - 1);
        }
        sb_puts(b, " ");
    }
    for (; open; open--) sb_puts(b, ")? ");
    sb_puts(b, "\"]\"");
    return true;
}

/* ---- objects -------------------------------------------------------------------- */

typedef struct prop {
    const char *key;
    const char *rule; /* EMPTY: cannot appear */
    bool required;
} prop;

typedef struct obj {
    prop *p;
    size_t n, cap;
    const char *extra_key, *extra_val; /* additional properties; NULL: none */
} obj;

static prop *find_prop(obj *o, const char *key) {
    for (size_t i = 0; i < o->n; i++)
        if (!strcmp(o->p[i].key, key)) return &o->p[i];
    return NULL;
}

static bool add_prop(cx *c, obj *o, const char *key) {
    if (find_prop(o, key)) return true;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 8;
        prop *p = realloc(o->p, cap * sizeof *p);
        if (!p) return nomem(c), false;
        o->p = p;
        o->cap = cap;
    }
    o->p[o->n++] = (prop){key, NULL, false};
    return true;
}

/* The names in definition order, then required ones not defined. */
static bool collect_props(cx *c, const clist *l, obj *o) {
    for (size_t i = 0; i < l->n; i++) {
        const json_t *ps = json_object_get(l->v[i].s, "properties");
        if (ps && !json_is_object(ps)) return fail(c, l->v[i].ptr, KT_ERR_ARG, "'properties' must be an object"), false;
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)ps, k, v) if (!add_prop(c, o, k)) return false;
    }
    for (size_t i = 0; i < l->n; i++) {
        const json_t *rq = json_object_get(l->v[i].s, "required");
        if (!rq) continue;
        if (!json_is_array(rq)) return fail(c, l->v[i].ptr, KT_ERR_ARG, "'required' must be an array"), false;
        for (size_t j = 0; j < json_array_size(rq); j++) {
            const json_t *e = json_array_get(rq, j);
            if (!json_is_string(e)) return fail(c, l->v[i].ptr, KT_ERR_ARG, "'required' must list strings"), false;
            if (!add_prop(c, o, json_string_value(e))) return false;
            find_prop(o, json_string_value(e))->required = true;
        }
    }
    return true;
}

/* The schema of property `key` (NULL: the additional properties'). */
static const char *prop_rule(cx *c, const clist *l, const char *key) {
    clist sub = {0};
    const char *r = NULL;
    for (size_t i = 0; i < l->n; i++) {
        const json_t *ps = json_object_get(l->v[i].s, "properties");
        const json_t *s = key && ps ? json_object_get(ps, key) : NULL;
        char *p = NULL;
        if (s) {
            char *pp = ptr_join(c, l->v[i].ptr, "properties");
            p = pp ? ptr_join(c, pp, key) : NULL;
        } else if ((s = json_object_get(l->v[i].s, "additionalProperties"))) {
            p = ptr_join(c, l->v[i].ptr, "additionalProperties");
        }
        if (s && (!p || !flat_add(c, &sub, s, p, 0, 0))) goto out;
    }
    r = compile(c, &sub);
out:
    free(sub.v);
    return r;
}

/* Decodes one UTF-8 code point. */
static uint32_t utf8_next(const char **s) {
    const unsigned char *p = (const unsigned char *)*s;
    unsigned c = *p++;
    int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    uint32_t cp = extra == 3 ? c & 7 : extra == 2 ? c & 15 : extra == 1 ? c & 31 : c;
    for (int k = 0; k < extra && *p; k++) cp = (cp << 6) | (*p++ & 63);
    *s = (const char *)p;
    return cp;
}

/* A key character's one canonical spelling (see P_KCHAR) as a literal. */
static void put_kchar(sbuf *b, uint32_t cp, const char *raw, size_t n) {
    static const char shortf[] = {['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't'};
    if (cp == '"' || cp == '\\') sb_printf(b, "\"\\\\\\%c\"", (char)cp);
    else if (cp < sizeof shortf && shortf[cp]) sb_printf(b, "\"\\\\%c\"", shortf[cp]);
    else if (cp < 0x20) sb_printf(b, "\"\\\\u00%02X\"", cp);
    else sb_lit(b, raw, n);
}

typedef struct trie_ctx {
    const char **keys; /* sorted */
    size_t n;
} trie_ctx;

static int str_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* The key content (between quotes) of every string that is none of
 * keys[lo..hi) given that `depth` bytes of them have matched: at each
 * trie node a character no key continues with (then anything), or a
 * key's next character and the node below, or the end if no key ends
 * here. Written as a rule per node. */
static const char *trie_rule(cx *c, const trie_ctx *t, size_t lo, size_t hi, size_t depth) {
    if (++c->n_rules > MAX_RULES) return fail(c, "", KT_ERR_UNSUPPORTED, "more than %u rules", MAX_RULES);
    char name[32];
    snprintf(name, sizeof name, "key-%u", c->n_rules);
    char *nm = kstrdup(c, name);
    if (!nm) return NULL;
    sbuf b = {0}, cls = {0};
    bool terminal = false, esc_taken = false;
    sb_printf(&b, "%s ::= ", nm);
    size_t alts = 0;
    for (size_t i = lo; i < hi;) {
        const char *k = t->keys[i] + depth;
        if (!*k) {
            terminal = true;
            i++;
            continue;
        }
        const char *after = k;
        uint32_t cp = utf8_next(&after);
        size_t clen = (size_t)(after - k), j = i;
        while (j < hi && !strncmp(t->keys[j] + depth, k, clen)) j++;
        if (cp < 0x20 || cp == '"' || cp == '\\') esc_taken = true;
        else if (cp < 0x80) sb_printf(&cls, "\\x%02X", cp);
        else sb_printf(&cls, cp < 0x10000 ? "\\u%04X" : "\\U%08X", cp);
        const char *sub = trie_rule(c, t, i, j, depth + clen);
        if (!sub) {
            free(b.p), free(cls.p);
            return NULL;
        }
        sb_puts(&b, alts++ ? " | " : "");
        put_kchar(&b, cp, k, clen);
        sb_printf(&b, " %s", sub);
        i = j;
    }
    /* a character no key continues with; escapes of taken characters
     * are refused earlier, so kesc is excluded only when one is taken */
    sb_printf(&b, "%s[^%s\"\\\\\\x00-\\x1F] kchar*", alts++ ? " | " : "", cls.p ? cls.p : "");
    if (!esc_taken) sb_puts(&b, " | kesc kchar*");
    if (!terminal) sb_puts(&b, " | \"\"");
    sb_puts(&b, "\n");
    free(cls.p);
    c->used |= 1u << P_KCHAR;
    sb_puts(&c->rules, b.p ? b.p : "");
    if (b.oom) c->rules.oom = true;
    free(b.p);
    return nm;
}

/* The key of an additional property, quotes included: a JSON string that
 * is no named key. Its own rule, so the closing quote ends the key's
 * lexeme and the token masks share the key's classes whatever follows
 * (constraint.c splits a class after such fixed text). */
static const char *extra_key_rule(cx *c, const obj *o, const char *ptr) {
    if (!o->n) {
        c->used |= 1u << P_STRING;
        return "string";
    }
    const char **keys = malloc(o->n * sizeof *keys);
    if (!keys) return nomem(c);
    for (size_t i = 0; i < o->n; i++) {
        keys[i] = o->p[i].key;
        for (const unsigned char *q = (const unsigned char *)keys[i]; *q; q++)
            if (*q < 0x20 || *q == '"' || *q == '\\') {
                free(keys);
                return fail(c, ptr, KT_ERR_UNSUPPORTED,
                            "a property name with '\"', '\\' or a control character, beside additional properties, is not supported");
            }
    }
    qsort(keys, o->n, sizeof *keys, str_cmp);
    trie_ctx t = {keys, o->n};
    const char *content = trie_rule(c, &t, 0, o->n, 0);
    free(keys);
    if (!content) return NULL;
    if (++c->n_rules > MAX_RULES) return fail(c, "", KT_ERR_UNSUPPORTED, "more than %u rules", MAX_RULES);
    char name[32];
    snprintf(name, sizeof name, "xkey-%u", c->n_rules);
    char *nm = kstrdup(c, name);
    if (nm) sb_printf(&c->rules, "%s ::= \"\\\"\" %s \"\\\"\"\n", nm, content);
    return nm;
}

/* The text of "the members from property i on" (first: none written
 * yet); an optional property refers to rules for what follows, so the
 * text stays linear in the number of properties. */
static bool obj_seq(cx *c, const obj *o, size_t i, bool first, sbuf *b, const char **memo_rules);

static const char *obj_rule(cx *c, const obj *o, size_t i, bool first, const char **memo_rules) {
    const char **slot = &memo_rules[2 * i + first];
    if (*slot) return *slot;
    if (++c->n_rules > MAX_RULES) return fail(c, "", KT_ERR_UNSUPPORTED, "more than %u rules", MAX_RULES);
    char name[32];
    snprintf(name, sizeof name, "props-%u", c->n_rules);
    char *nm = kstrdup(c, name);
    if (!nm) return NULL;
    *slot = nm;
    sbuf b = {0};
    sb_printf(&b, "%s ::= ", nm);
    if (!obj_seq(c, o, i, first, &b, memo_rules)) {
        free(b.p);
        return NULL;
    }
    sb_puts(&b, "\n");
    sb_puts(&c->rules, b.p);
    if (b.oom) c->rules.oom = true;
    free(b.p);
    return nm;
}

static bool obj_seq(cx *c, const obj *o, size_t i, bool first, sbuf *b, const char **memo_rules) {
    const char *sep = first ? "" : "\",\" ws ";
    for (; i < o->n && o->p[i].rule == EMPTY; i++) {}
    if (i == o->n) {
        if (!o->extra_key) sb_puts(b, "\"\"");
        else if (first)
            sb_printf(b, "( %s ws \":\" ws %s ws ( \",\" ws %s ws \":\" ws %s ws )* )?",
                      o->extra_key, o->extra_val, o->extra_key, o->extra_val);
        else
            sb_printf(b, "( \",\" ws %s ws \":\" ws %s ws )*", o->extra_key, o->extra_val);
        return true;
    }
    json_t *js = json_string(o->p[i].key);
    char *lit = js ? kt_json_dumps(js, JSON_ENCODE_ANY) : NULL;
    json_decref(js);
    if (!lit) return nomem(c), false;
    sbuf kv = {0};
    sb_puts(&kv, sep);
    sb_lit(&kv, lit, strlen(lit));
    sb_printf(&kv, " ws \":\" ws %s ws ", o->p[i].rule);
    free(lit);
    if (kv.oom) { /* kv.p may be NULL */
        free(kv.p);
        return nomem(c), false;
    }
    bool ok = true;
    if (o->p[i].required) {
        sb_puts(b, kv.p);
        ok = ok && obj_seq(c, o, i + 1, false, b, memo_rules);
    } else {
        const char *with = obj_rule(c, o, i + 1, false, memo_rules);
        const char *without = with ? obj_rule(c, o, i + 1, first, memo_rules) : NULL;
        if (without) sb_printf(b, "( %s%s | %s )", kv.p, with, without);
        ok = ok && without;
    }
    free(kv.p);
    return ok || (nomem(c), false);
}

static bool emit_object(cx *c, const clist *l, sbuf *b, bool *any) {
    obj o = {0};
    bool ok = collect_props(c, l, &o);
    for (size_t i = 0; ok && i < o.n; i++) {
        o.p[i].rule = prop_rule(c, l, o.p[i].key);
        ok = o.p[i].rule != NULL;
        if (ok && o.p[i].rule == EMPTY && o.p[i].required) goto none;
    }
    if (ok) {
        const char *ev = prop_rule(c, l, NULL);
        ok = ev != NULL;
        if (ok && ev != EMPTY) {
            o.extra_val = ev;
            o.extra_key = extra_key_rule(c, &o, l->n ? l->v[0].ptr : "");
            ok = o.extra_key != NULL;
        }
    }
    if (ok) {
        const char **memo_rules = calloc(2 * (o.n + 1), sizeof *memo_rules);
        ok = memo_rules != NULL || (nomem(c), false);
        c->used |= 1u << P_WS;
        if (ok) {
            sb_printf(b, "%s\"{\" ws ", *any ? " | " : "");
            ok = obj_seq(c, &o, 0, true, b, memo_rules);
            sb_puts(b, " \"}\"");
            *any = true;
        }
        free(memo_rules);
    }
none:
    free(o.p);
    return ok;
}

/* ---- anyOf / oneOf ------------------------------------------------------------ */

/* The types and constant values a branch allows, for disjointness. */
typedef struct sig {
    unsigned types;
    const json_t *en; /* enum array or const value, or NULL */
    bool is_const;
    const clist *l;
} sig;

static bool value_in(const sig *s, const json_t *v) {
    if (s->is_const) return value_equal(s->en, v);
    for (size_t i = 0; i < json_array_size(s->en); i++)
        if (value_equal(json_array_get(s->en, i), v)) return true;
    return false;
}

static bool consts_disjoint(const sig *a, const sig *b) {
    if (!a->en || !b->en) return false;
    size_t n = a->is_const ? 1 : json_array_size(a->en);
    for (size_t i = 0; i < n; i++)
        if (value_in(b, a->is_const ? a->en : json_array_get(a->en, i))) return false;
    return true;
}

/* The constant set of a required property in a branch, or NULL. */
static bool prop_sig(const clist *l, const char *key, sig *out) {
    bool required = false;
    *out = (sig){0};
    for (size_t i = 0; i < l->n; i++) {
        const json_t *rq = json_object_get(l->v[i].s, "required");
        for (size_t j = 0; j < json_array_size(rq); j++)
            if (json_is_string(json_array_get(rq, j)) && !strcmp(json_string_value(json_array_get(rq, j)), key)) required = true;
        const json_t *ps = json_object_get(l->v[i].s, "properties");
        const json_t *s = ps ? json_object_get(ps, key) : NULL;
        if (!json_is_object(s) || out->en) continue;
        if (json_object_get(s, "const")) out->en = json_object_get(s, "const"), out->is_const = true;
        else if (json_is_array(json_object_get(s, "enum"))) out->en = json_object_get(s, "enum");
    }
    return required && out->en;
}

/* Two objects-only branches with a required property whose constants differ. */
static bool discriminated(const sig *a, const sig *b) {
    if ((a->types | b->types) & ~(unsigned)T_OBJ) return false;
    for (size_t i = 0; i < a->l->n; i++) {
        const json_t *ps = json_object_get(a->l->v[i].s, "properties");
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)ps, k, v) {
            sig pa, pb;
            (void)v;
            if (prop_sig(a->l, k, &pa) && prop_sig(b->l, k, &pb) && consts_disjoint(&pa, &pb)) return true;
        }
    }
    return false;
}

static bool make_sig(cx *c, const clist *l, sig *s) {
    node n;
    if (!merge(c, l, &n)) return false;
    *s = (sig){.types = n.types, .l = l};
    if (n.en) {
        const json_t *k = json_object_get(n.en->s, "const");
        s->en = k ? k : json_object_get(n.en->s, "enum");
        s->is_const = k != NULL;
        unsigned t = 0;
        size_t cnt = k ? 1 : json_array_size(s->en);
        for (size_t i = 0; i < cnt; i++) t |= value_type(k ? k : json_array_get(s->en, i));
        s->types &= t | (t & T_INT ? T_FRAC : 0);
    }
    return true;
}

/* Are the oneOf branches of cj pairwise disjoint, so oneOf = anyOf? */
static bool oneof_disjoint(cx *c, const conj *cj, const json_t *arr, bool *disjoint) {
    size_t n = json_array_size(arr);
    clist *ls = calloc(n, sizeof *ls);
    sig *sg = calloc(n, sizeof *sg);
    bool ok = ls && sg;
    if (!ok) nomem(c);
    for (size_t i = 0; ok && i < n; i++) {
        char *p = ptr_index(c, cj->ptr, "oneOf", i);
        ok = p && flat_add(c, &ls[i], json_array_get(arr, i), p, 0, 0) && make_sig(c, &ls[i], &sg[i]);
        if (ok && ls[i].empty) sg[i].types = 0;
    }
    *disjoint = ok;
    for (size_t i = 0; ok && *disjoint && i < n; i++)
        for (size_t j = i + 1; *disjoint && j < n; j++) {
            const sig *a = &sg[i], *b = &sg[j];
            bool types_apart = !(a->types & b->types);
            if (!types_apart && !consts_disjoint(a, b) && !discriminated(a, b)) *disjoint = false;
        }
    for (size_t i = 0; ls && i < n; i++) free(ls[i].v);
    free(ls);
    free(sg);
    return ok;
}

/* (the rest and (B1 or B2 ...)): one alternative per branch. */
static bool emit_branches(cx *c, const clist *l, size_t at, bool one, sbuf *b, bool *any) {
    const conj *cj = &l->v[at];
    const char *kw = one ? "oneOf" : "anyOf";
    const json_t *arr = json_object_get(cj->s, kw);
    if (!json_is_array(arr) || !json_array_size(arr))
        return fail(c, cj->ptr, KT_ERR_ARG, "%s must be a non-empty array", kw), false;
    if (json_array_size(arr) > MAX_ALTS)
        return fail(c, cj->ptr, KT_ERR_UNSUPPORTED, "%s of more than %u branches", kw, MAX_ALTS), false;
    if (one) {
        bool disjoint;
        if (!oneof_disjoint(c, cj, arr, &disjoint)) return false;
        if (!disjoint)
            return fail(c, cj->ptr, KT_ERR_UNSUPPORTED,
                        "keyword 'oneOf' is supported only with provably disjoint branches"), false;
    }
    for (size_t i = 0; i < json_array_size(arr); i++) {
        clist sub = {0};
        bool ok = true;
        for (size_t k = 0; ok && k < l->n; k++) {
            conj v = l->v[k];
            if (k == at) v.done |= one ? DONE_ONEOF : DONE_ANYOF;
            ok = cl_push(c, &sub, v);
        }
        char *p = ok ? ptr_index(c, cj->ptr, kw, i) : NULL;
        ok = p && flat_add(c, &sub, json_array_get(arr, i), p, 0, 0);
        const char *r = ok ? compile(c, &sub) : NULL;
        free(sub.v);
        if (!r) return false;
        if (r == EMPTY) continue;
        sb_printf(b, "%s%s", *any ? " | " : "", r);
        *any = true;
    }
    return true;
}

/* ---- one conjunction ------------------------------------------------------------ */

/* The body of the rule for l; *any false when nothing validates. */
static bool emit_body(cx *c, const clist *l, sbuf *b, bool *any) {
    for (size_t i = 0; i < l->n; i++) {
        const conj *cj = &l->v[i];
        if (!(cj->done & DONE_ANYOF) && json_object_get(cj->s, "anyOf")) return emit_branches(c, l, i, false, b, any);
        if (!(cj->done & DONE_ONEOF) && json_object_get(cj->s, "oneOf")) return emit_branches(c, l, i, true, b, any);
    }
    node n;
    if (!merge(c, l, &n)) return false;
    if (n.en) return emit_enum(c, l, &n, b, any);
    if ((n.types & T_OBJ) && !emit_object(c, l, b, any)) return false;
    if ((n.types & T_ARR) && !emit_array(c, l, &n, b, any)) return false;
    if ((n.types & T_STR) && !emit_string(c, &n, b, any)) return false;
    if ((n.types & T_NUM) == T_NUM && !emit_number(c, &n, b, any)) return false;
    if ((n.types & T_NUM) == T_INT && !emit_integer(c, &n, b, any)) return false;
    if (n.types & T_BOOL) sb_printf(b, "%s\"true\" | \"false\"", *any ? " | " : ""), *any = true;
    if (n.types & T_NULL) sb_printf(b, "%s\"null\"", *any ? " | " : ""), *any = true;
    return true;
}

/* Is l the unconstrained schema (only annotations, defs and no-ops)? */
static bool unconstrained(const clist *l) {
    static const char *const K[] = {"type", "enum", "const", "properties", "required", "additionalProperties",
                                    "items", "prefixItems", "additionalItems", "minItems", "maxItems", "anyOf",
                                    "oneOf", "minLength", "maxLength", "pattern", "format", "minimum",
                                    "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};
    return !has_any(l, K);
}

/* The rule for the conjunction l (flattened): its name, EMPTY when nothing
 * validates, NULL on error. */
static const char *compile(cx *c, clist *l) {
    if (c->failed) return NULL;
    if (l->empty) return EMPTY;
    if (unconstrained(l)) {
        c->used |= 1u << P_VALUE;
        return "value";
    }
    char *key = clist_key(c, l);
    if (!key) return NULL;
    memo *m = memo_find(c, key);
    if (m) return m->empty ? EMPTY : m->name;
    const char *ptr = l->v[l->n - 1].ptr;
    if (c->depth >= MAX_DEPTH) return fail(c, ptr, KT_ERR_UNSUPPORTED, "schema nested deeper than %u", MAX_DEPTH);
    if (++c->n_rules > MAX_RULES) return fail(c, ptr, KT_ERR_UNSUPPORTED, "more than %u rules", MAX_RULES);
    char *name = rule_name(c, ptr);
    if (!name || !memo_add(c, key, name)) return NULL;
    c->depth++;
    sbuf b = {0};
    bool any = false;
    bool ok = emit_body(c, l, &b, &any);
    c->depth--;
    if (ok && b.oom) ok = (nomem(c), false);
    if (ok && !any) memo_find(c, key)->empty = true;
    if (ok && any) {
        sb_printf(&c->rules, "%s ::= %s\n", name, b.p);
        if (c->rules.n > KT_GRAMMAR_MAX_TEXT)
            ok = (fail(c, ptr, KT_ERR_UNSUPPORTED, "the grammar would exceed %u bytes", KT_GRAMMAR_MAX_TEXT), false);
    }
    free(b.p);
    if (!ok) return NULL;
    return any ? name : EMPTY;
}

/* ---- entry points -------------------------------------------------------------- */

static char *assemble(cx *c, const char *root_rule) {
    sbuf out = {0};
    sb_printf(&out, "root ::= %s\n", root_rule);
    sb_puts(&out, c->rules.p ? c->rules.p : "");
    unsigned used = c->used;
    for (int pass = 0; pass < 4; pass++)
        for (int i = 0; i < P_N; i++)
            if (used & (1u << i)) used |= PRELUDE[i].deps;
    for (int i = 0; i < P_N; i++)
        if (used & (1u << i)) sb_puts(&out, PRELUDE[i].text);
    if (out.oom) {
        free(out.p);
        return nomem(c);
    }
    if (out.n > KT_GRAMMAR_MAX_TEXT) {
        free(out.p);
        return fail(c, "", KT_ERR_UNSUPPORTED, "the grammar would exceed %u bytes", KT_GRAMMAR_MAX_TEXT);
    }
    return out.p;
}

char *kt_json_schema_to_gbnf(const json_t *schema, kt_error *err) { return kt_json_schema_to_gbnf_ex(schema, NULL, err); }

char *kt_json_schema_to_gbnf_ex(const json_t *schema, const kt_schema_opts *opts, kt_error *err) {
    cx c = {.root = schema, .err = err, .opts = opts};
    char *result = NULL;
    if (!schema) {
        kt_error_set(err, KT_ERR_ARG, "no schema");
        return NULL;
    }
    const json_t *id = json_is_object(schema) ? json_object_get(schema, "$id") : NULL;
    if (json_is_string(id)) c.root_id = json_string_value(id);
    const char *root = compile_one(&c, schema, "");
    if (root == EMPTY) fail(&c, "", KT_ERR_UNSUPPORTED, "the schema allows no JSON value");
    else if (root) result = assemble(&c, root);
    for (size_t i = 0; i < c.n_arena; i++) free(c.arena[i]);
    free(c.arena);
    free(c.memo);
    free(c.rules.p);
    return result;
}

/* Every rule of a JSON value but root (kt_json_any_gbnf's two roots). */
#define JSON_ANY_RULES \
        "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n" \
        "object ::= \"{\" ws ( member ( \",\" ws member )* )? \"}\"\n" \
        "member ::= string ws \":\" ws value ws\n" \
        "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n" \
        "string ::= \"\\\"\" char* \"\\\"\"\n" \
        "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" uesc )\n" \
        "uesc ::= [0-9A-Ca-cE-Fe-f] hex{3} | [Dd] [0-7] hex{2} | [Dd] [89ABab] hex{2} \"\\\\u\" [Dd] [C-Fc-f] hex{2}\n" \
        "hex ::= [0-9A-Fa-f]\n" \
        "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n" \
        "ws ::= ( \" \" | \"\\n\"{1,2} [ \\t]{0,20} )?\n"

const char *kt_json_any_gbnf(bool object_only) {
    static const char *const any = "root ::= value\n" JSON_ANY_RULES;
    static const char *const obj = "root ::= object\n" JSON_ANY_RULES;
    return object_only ? obj : any;
}
