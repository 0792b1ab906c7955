/*
 * jinja_parse.c - the Jinja parser: tokens to an AST (see jinja_int.h).
 *
 * A recursive-descent parser with jinja2's grammar and precedence:
 * conditional < or < and < not < comparisons (in, not in, ==, ...) < + - <
 * ~ < * / // % < ** < unary - + < postfix (.attr, [i], (call)) < filters and
 * tests. Statements: if/elif/else, for (tuple targets, inline `if`, else),
 * set (name, ns.attr, tuples, block set), macro, break/continue, filter,
 * with, generation (transformers' AssistantTracker tag, rendered as is).
 * Errors name the line and what was expected.
 */
#include <stdio.h>
#include <string.h>

#include "text/jinja_int.h"

#define MAX_DEPTH 200

typedef struct parser {
    jtemplate *t;
    const jtok *tok;
    size_t n, pos;
    kt_error *err;
    bool failed;
    int depth;
    int loops; /* for loops around the current point (break/continue) */
} parser;

static const jtok *cur(parser *P) { return &P->tok[P->pos]; }
static const jtok *peek(parser *P, size_t k) {
    size_t i = P->pos + k;
    return &P->tok[i < P->n ? i : P->n - 1];
}
static void advance(parser *P) { if (P->pos + 1 < P->n) P->pos++; }

static void *pfail(parser *P, const char *fmt, const char *arg) {
    if (P->failed) return NULL;
    P->failed = true;
    char msg[300];
    snprintf(msg, sizeof msg, fmt, arg);
    kt_error_set(P->err, KT_ERR_FORMAT, "template line %d: %s", cur(P)->line, msg);
    return NULL;
}

static void *pnomem(parser *P) {
    if (!P->failed) kt_error_set(P->err, KT_ERR_NOMEM, "template: out of memory");
    P->failed = true;
    return NULL;
}

static bool is_op(const jtok *t, const char *op) {
    return t->kind == JT_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n);
}

static bool is_name(const jtok *t, const char *name) {
    return t->kind == JT_NAME && t->n == strlen(name) && !memcmp(t->s, name, t->n);
}

static const char *tok_desc(const jtok *t, char *buf, size_t cap) {
    switch (t->kind) {
    case JT_EOF: return "end of template";
    case JT_BLOCK_END: return "end of statement block";
    case JT_VAR_END: return "end of print statement";
    case JT_STRING: return "string literal";
    case JT_DATA: return "template data";
    default:
        snprintf(buf, cap, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s ? t->s : "");
        return buf;
    }
}

static bool expect_op(parser *P, const char *op) {
    if (is_op(cur(P), op)) { advance(P); return true; }
    char b[64], want[16];
    snprintf(want, sizeof want, "'%s'", op);
    char msg[160];
    snprintf(msg, sizeof msg, "expected %s, got %s", want, tok_desc(cur(P), b, sizeof b));
    pfail(P, "%s", msg);
    return false;
}

static jnode *node(parser *P, jn_kind k) {
    jnode *n = ja_alloc(&P->t->arena, sizeof *n);
    if (!n) return pnomem(P);
    n->kind = k;
    n->line = cur(P)->line;
    return n;
}

bool jlist_push(ja_arena *a, jlist *l, jnode *n) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        jnode **p = ja_alloc(a, nc * sizeof *p);
        if (!p) return false;
        if (l->n) memcpy(p, l->v, l->n * sizeof *p);
        l->v = p;
        l->cap = nc;
    }
    l->v[l->n++] = n;
    return true;
}

static bool push(parser *P, jlist *l, jnode *n) {
    if (!jlist_push(&P->t->arena, l, n)) { pnomem(P); return false; }
    return true;
}

static const char *tok_str(parser *P, const jtok *t) {
    char *s = ja_strndup(&P->t->arena, t->s, t->n);
    if (!s) pnomem(P);
    return s;
}

static jnode *parse_expr(parser *P);
static jnode *parse_unary(parser *P, bool with_filter);

/* ---- literals and primaries ----------------------------------------- */

static jnode *lit(parser *P, jv_kind k) {
    jnode *n = node(P, E_LIT);
    if (!n) return NULL;
    n->lit = ja_alloc(&P->t->arena, sizeof *n->lit);
    if (!n->lit) return pnomem(P);
    n->lit->kind = k;
    return n;
}

static jnode *parse_string(parser *P) {
    /* adjacent string literals concatenate */
    size_t total = 0, k = P->pos;
    while (P->tok[k].kind == JT_STRING) total += P->tok[k++].n;
    jnode *n = lit(P, JV_STR);
    char *s = n ? ja_alloc(&P->t->arena, total + 1) : NULL;
    if (!s) return pnomem(P);
    size_t o = 0;
    while (cur(P)->kind == JT_STRING) {
        memcpy(s + o, cur(P)->s, cur(P)->n);
        o += cur(P)->n;
        advance(P);
    }
    n->lit->u.str.s = s;
    n->lit->u.str.n = total;
    return n;
}

static jnode *parse_name_primary(parser *P) {
    const jtok *t = cur(P);
    jnode *n;
    if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") || is_name(t, "False")) {
        if ((n = lit(P, JV_BOOL))) n->lit->u.b = t->s[0] == 't' || t->s[0] == 'T';
    } else if (is_name(t, "none") || is_name(t, "None")) {
        n = lit(P, JV_NONE);
    } else if ((n = node(P, E_NAME))) {
        n->name = tok_str(P, t);
    }
    advance(P);
    return n;
}

/* items up to `close`, separated by commas (trailing comma allowed) */
static bool parse_seq(parser *P, jnode *n, const char *close, bool dict) {
    while (!is_op(cur(P), close)) {
        if (n->args.n && !expect_op(P, ",")) return false;
        if (is_op(cur(P), close)) break;
        jnode *k = parse_expr(P);
        if (!k || !push(P, &n->args, k)) return false;
        if (dict) {
            if (!expect_op(P, ":")) return false;
            jnode *v = parse_expr(P);
            if (!v || !push(P, &n->kwvals, v)) return false;
        }
    }
    advance(P);
    return true;
}

static jnode *parse_paren(parser *P) {
    advance(P);
    jnode *t = node(P, E_TUPLE);
    if (!t) return NULL;
    if (is_op(cur(P), ")")) { advance(P); return t; }
    jnode *e = parse_expr(P);
    if (!e) return NULL;
    if (is_op(cur(P), ")")) { advance(P); return e; }
    if (!push(P, &t->args, e)) return NULL;
    while (is_op(cur(P), ",")) {
        advance(P);
        if (is_op(cur(P), ")")) break;
        if (!(e = parse_expr(P)) || !push(P, &t->args, e)) return NULL;
    }
    return expect_op(P, ")") ? t : NULL;
}

static jnode *parse_primary(parser *P) {
    const jtok *t = cur(P);
    jnode *n = NULL;
    char b[64];
    switch (t->kind) {
    case JT_NAME: return parse_name_primary(P);
    case JT_STRING: return parse_string(P);
    case JT_INT:
        if ((n = lit(P, JV_INT))) n->lit->u.i = t->i;
        advance(P);
        return n;
    case JT_FLOAT:
        if ((n = lit(P, JV_FLOAT))) n->lit->u.f = t->f;
        advance(P);
        return n;
    case JT_OP:
        if (is_op(t, "(")) return parse_paren(P);
        if (is_op(t, "[") || is_op(t, "{")) {
            bool dict = is_op(t, "{");
            advance(P);
            n = node(P, dict ? E_DICT : E_LIST);
            return n && parse_seq(P, n, dict ? "}" : "]", dict) ? n : NULL;
        }
        break;
    default: break;
    }
    return pfail(P, "unexpected %s", tok_desc(t, b, sizeof b));
}

/* ---- calls, subscripts, filters, tests ------------------------------ */

static bool parse_call_args(parser *P, jnode *n) {
    advance(P); /* ( */
    size_t nkw = 0, cap = 0;
    while (!is_op(cur(P), ")")) {
        if (n->args.n + nkw && !expect_op(P, ",")) return false;
        if (is_op(cur(P), ")")) break;
        if (cur(P)->kind == JT_NAME && is_op(peek(P, 1), "=")) {
            if (nkw == cap) {
                cap = cap ? cap * 2 : 4;
                const char **nn = ja_alloc(&P->t->arena, cap * sizeof *nn);
                if (!nn) return pnomem(P), false;
                if (nkw) memcpy(nn, n->kwnames, nkw * sizeof *nn);
                n->kwnames = nn;
            }
            n->kwnames[nkw++] = tok_str(P, cur(P));
            advance(P);
            advance(P);
            jnode *v = parse_expr(P);
            if (!v || !push(P, &n->kwvals, v)) return false;
        } else {
            if (nkw) return pfail(P, "positional argument follows keyword argument%s", ""), false;
            if (is_op(cur(P), "*")) return pfail(P, "*args calls are not supported%s", ""), false;
            jnode *v = parse_expr(P);
            if (!v || !push(P, &n->args, v)) return false;
        }
    }
    advance(P);
    return true;
}

static jnode *parse_subscript(parser *P, jnode *obj) {
    advance(P); /* [ */
    jnode *parts[3] = {0};
    int k = 0;
    bool slice = false;
    for (;;) {
        if (!is_op(cur(P), ":") && !is_op(cur(P), "]")) {
            if (!(parts[k] = parse_expr(P))) return NULL;
        }
        if (is_op(cur(P), ":") && k < 2) { slice = true; k++; advance(P); continue; }
        break;
    }
    if (!expect_op(P, "]")) return NULL;
    jnode *n = node(P, slice ? E_SLICE : E_GETITEM);
    if (!n) return NULL;
    n->a = obj;
    if (!slice && !parts[0]) return pfail(P, "expected an index%s", "");
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    return n;
}

static jnode *parse_postfix(parser *P, jnode *n) {
    while (n) {
        const jtok *t = cur(P);
        if (is_op(t, ".")) {
            advance(P);
            jnode *g = node(P, E_GETATTR);
            if (!g) return NULL;
            g->a = n;
            if (cur(P)->kind == JT_NAME) g->name = tok_str(P, cur(P));
            else if (cur(P)->kind == JT_INT) {
                g->kind = E_GETITEM;
                if (!(g->b = lit(P, JV_INT))) return NULL;
                g->b->lit->u.i = cur(P)->i;
            } else return pfail(P, "expected an attribute name after '.'%s", "");
            advance(P);
            n = g;
        } else if (is_op(t, "[")) {
            n = parse_subscript(P, n);
        } else if (is_op(t, "(")) {
            jnode *c = node(P, E_CALL);
            if (!c) return NULL;
            c->a = n;
            if (!parse_call_args(P, c)) return NULL;
            n = c;
        } else break;
    }
    return n;
}

static jnode *parse_filter(parser *P, jnode *operand) {
    advance(P); /* | */
    if (cur(P)->kind != JT_NAME) return pfail(P, "expected a filter name after '|'%s", "");
    jnode *f = node(P, E_FILTER);
    if (!f) return NULL;
    f->a = operand;
    f->name = tok_str(P, cur(P));
    advance(P);
    while (is_op(cur(P), ".") && peek(P, 1)->kind == JT_NAME) advance(P), advance(P);
    if (!jb_has_filter(f->name)) return pfail(P, "unknown filter '%s'", f->name);
    if (is_op(cur(P), "(") && !parse_call_args(P, f)) return NULL;
    return f;
}

static bool starts_test_arg(const jtok *t) {
    if (t->kind == JT_NAME)
        return !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and");
    return t->kind == JT_STRING || t->kind == JT_INT || t->kind == JT_FLOAT ||
           is_op(t, "(") || is_op(t, "[") || is_op(t, "{");
}

static jnode *parse_test(parser *P, jnode *operand) {
    advance(P); /* is */
    jnode *t = node(P, E_TEST);
    if (!t) return NULL;
    t->a = operand;
    if (is_name(cur(P), "not")) { t->neg = true; advance(P); }
    if (cur(P)->kind != JT_NAME) return pfail(P, "expected a test name after 'is'%s", "");
    t->name = tok_str(P, cur(P));
    advance(P);
    if (!jb_has_test(t->name)) return pfail(P, "unknown test '%s'", t->name);
    if (is_op(cur(P), "(")) {
        if (!parse_call_args(P, t)) return NULL;
    } else if (starts_test_arg(cur(P))) {
        if (is_name(cur(P), "is")) return pfail(P, "you cannot chain multiple tests with is%s", "");
        jnode *arg = parse_postfix(P, parse_primary(P));
        if (!arg || !push(P, &t->args, arg)) return NULL;
    }
    return t;
}

static jnode *parse_filter_expr(parser *P, jnode *n) {
    while (n) {
        if (is_op(cur(P), "|")) n = parse_filter(P, n);
        else if (is_name(cur(P), "is")) n = parse_test(P, n);
        else if (is_op(cur(P), "(")) {
            jnode *c = node(P, E_CALL);
            if (!c) return NULL;
            c->a = n;
            if (!parse_call_args(P, c)) return NULL;
            n = c;
        } else break;
    }
    return n;
}

/* ---- operators ------------------------------------------------------- */

static jnode *binop(parser *P, jn_kind k, const char *op, jnode *a, jnode *b) {
    if (!a || !b) return NULL;
    jnode *n = node(P, k);
    if (!n) return NULL;
    n->name = op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_unary(parser *P, bool with_filter) {
    if (++P->depth > MAX_DEPTH) return pfail(P, "expression nested too deeply%s", "");
    jnode *n;
    if (is_op(cur(P), "-") || is_op(cur(P), "+")) {
        jn_kind k = is_op(cur(P), "-") ? E_NEG : E_POS;
        advance(P);
        n = node(P, k);
        if (n && !(n->a = parse_unary(P, false))) n = NULL;
    } else {
        n = parse_primary(P);
    }
    n = parse_postfix(P, n);
    if (with_filter) n = parse_filter_expr(P, n);
    P->depth--;
    return n;
}

static jnode *parse_pow(parser *P) {
    jnode *n = parse_unary(P, true);
    while (n && is_op(cur(P), "**")) {
        advance(P);
        n = binop(P, E_BINOP, "**", n, parse_unary(P, true));
    }
    return n;
}

static jnode *parse_math2(parser *P) {
    jnode *n = parse_pow(P);
    static const char *ops[] = {"*", "/", "//", "%"};
    for (;;) {
        int k = -1;
        for (int i = 0; i < 4; i++) if (is_op(cur(P), ops[i])) k = i;
        if (k < 0 || !n) return n;
        advance(P);
        n = binop(P, E_BINOP, ops[k], n, parse_pow(P));
    }
}

static jnode *parse_concat(parser *P) {
    jnode *n = parse_math2(P);
    while (n && is_op(cur(P), "~")) {
        advance(P);
        n = binop(P, E_BINOP, "~", n, parse_math2(P));
    }
    return n;
}

static jnode *parse_math1(parser *P) {
    jnode *n = parse_concat(P);
    while (n && (is_op(cur(P), "+") || is_op(cur(P), "-"))) {
        const char *op = is_op(cur(P), "+") ? "+" : "-";
        advance(P);
        n = binop(P, E_BINOP, op, n, parse_concat(P));
    }
    return n;
}

static const char *cmp_op(parser *P) {
    static const char *ops[] = {"==", "!=", "<", "<=", ">", ">="};
    for (int i = 0; i < 6; i++)
        if (is_op(cur(P), ops[i])) return ops[i];
    if (is_name(cur(P), "in")) return "in";
    if (is_name(cur(P), "not") && is_name(peek(P, 1), "in")) return "notin";
    return NULL;
}

static jnode *parse_compare(parser *P) {
    jnode *n = parse_math1(P), *prev = n, *chain = NULL;
    const char *op;
    while (n && (op = cmp_op(P))) {
        advance(P);
        if (!strcmp(op, "notin")) advance(P);
        jnode *rhs = parse_math1(P);
        jnode *c = binop(P, E_CMP, op, prev, rhs);
        if (!c) return NULL;
        chain = chain ? binop(P, E_AND, "and", chain, c) : c;
        prev = rhs;
    }
    return chain ? chain : n;
}

static jnode *parse_not(parser *P) {
    if (is_name(cur(P), "not")) {
        if (++P->depth > MAX_DEPTH) return pfail(P, "expression nested too deeply%s", "");
        advance(P);
        jnode *n = node(P, E_NOT);
        if (n && !(n->a = parse_not(P))) n = NULL;
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

static jnode *parse_and(parser *P) {
    jnode *n = parse_not(P);
    while (n && is_name(cur(P), "and")) {
        advance(P);
        n = binop(P, E_AND, "and", n, parse_not(P));
    }
    return n;
}

static jnode *parse_or(parser *P) {
    jnode *n = parse_and(P);
    while (n && is_name(cur(P), "or")) {
        advance(P);
        n = binop(P, E_OR, "or", n, parse_and(P));
    }
    return n;
}

static jnode *parse_expr(parser *P) {
    if (++P->depth > MAX_DEPTH) return pfail(P, "expression nested too deeply%s", "");
    jnode *n = parse_or(P);
    while (n && is_name(cur(P), "if")) {
        advance(P);
        jnode *c = node(P, E_COND);
        if (!c) return NULL;
        c->a = n;
        if (!(c->b = parse_or(P))) return NULL;
        if (is_name(cur(P), "else")) {
            advance(P);
            if (!(c->c = parse_expr(P))) return NULL;
        }
        n = c;
    }
    P->depth--;
    return n;
}

/* an expression, or a bare tuple `a, b` */
static jnode *parse_tuple_expr(parser *P) {
    jnode *e = parse_expr(P);
    if (!e || !is_op(cur(P), ",")) return e;
    jnode *t = node(P, E_TUPLE);
    if (!t || !push(P, &t->args, e)) return NULL;
    while (is_op(cur(P), ",")) {
        advance(P);
        if (cur(P)->kind == JT_BLOCK_END || cur(P)->kind == JT_VAR_END) break;
        if (!(e = parse_expr(P)) || !push(P, &t->args, e)) return NULL;
    }
    return t;
}

/* ---- statements ------------------------------------------------------ */

static bool parse_body(parser *P, jlist *body, const char *const *ends);

static bool expect_block_end(parser *P) {
    if (cur(P)->kind == JT_BLOCK_END) { advance(P); return true; }
    char b[64];
    pfail(P, "expected end of statement block, got %s", tok_desc(cur(P), b, sizeof b));
    return false;
}

/* Target names: `a` or `a, b` (parenthesized allowed). */
static bool parse_targets(parser *P, jnode *n) {
    const char *names[16];
    size_t k = 0;
    bool paren = is_op(cur(P), "(");
    if (paren) advance(P);
    for (;;) {
        if (cur(P)->kind != JT_NAME) return pfail(P, "expected a variable name%s", ""), false;
        if (k == 16) return pfail(P, "too many names to unpack%s", ""), false;
        names[k++] = tok_str(P, cur(P));
        advance(P);
        if (!is_op(cur(P), ",")) break;
        advance(P);
    }
    if (paren && !expect_op(P, ")")) return false;
    n->names = ja_alloc(&P->t->arena, k * sizeof *names);
    if (!n->names) return pnomem(P), false;
    memcpy(n->names, names, k * sizeof *names);
    n->nnames = k;
    n->neg = k > 1 || paren; /* unpack */
    return true;
}

/* The body up to {% end %} into body, then that closing tag: n, or NULL. */
static jnode *body_then_end(parser *P, jnode *n, jlist *body, const char *end) {
    const char *const ends[] = {end, NULL};
    if (!parse_body(P, body, ends)) return NULL;
    advance(P);
    return expect_block_end(P) ? n : NULL;
}

/* After an if's or a for's body: an {% else %} body up to {% end %} (into
 * n->kwvals), then the closing tag. */
static jnode *else_then_end(parser *P, jnode *n, const char *end) {
    if (!is_name(cur(P), "else")) {
        advance(P); /* end */
        return expect_block_end(P) ? n : NULL;
    }
    advance(P);
    if (!expect_block_end(P)) return NULL;
    return body_then_end(P, n, &n->kwvals, end);
}

static jnode *parse_if(parser *P) {
    jnode *n = node(P, S_IF);
    if (!n) return NULL;
    advance(P);
    if (!(n->a = parse_tuple_expr(P)) || !expect_block_end(P)) return NULL;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    if (!parse_body(P, &n->args, ends)) return NULL;
    if (is_name(cur(P), "elif")) {
        jnode *e = parse_if(P);
        return e && push(P, &n->kwvals, e) ? n : NULL;
    }
    return else_then_end(P, n, "endif");
}

static jnode *parse_for(parser *P) {
    jnode *n = node(P, S_FOR);
    if (!n) return NULL;
    advance(P);
    if (!parse_targets(P, n)) return NULL;
    if (!is_name(cur(P), "in")) return pfail(P, "expected 'in' in for loop%s", "");
    advance(P);
    /* the iterable cannot contain a bare conditional (its `if` filters) */
    if (!(n->a = parse_or(P))) return NULL;
    if (is_name(cur(P), "if")) {
        advance(P);
        if (!(n->b = parse_expr(P))) return NULL;
    }
    if (is_name(cur(P), "recursive")) return pfail(P, "recursive for loops are not supported%s", "");
    if (!expect_block_end(P)) return NULL;
    static const char *const ends[] = {"else", "endfor", NULL};
    P->loops++;
    bool ok = parse_body(P, &n->args, ends);
    P->loops--;
    return ok ? else_then_end(P, n, "endfor") : NULL;
}

static jnode *parse_set(parser *P) {
    jnode *n = node(P, S_SET);
    if (!n) return NULL;
    advance(P);
    if (cur(P)->kind == JT_NAME && is_op(peek(P, 1), ".") && peek(P, 2)->kind == JT_NAME) {
        n->name = tok_str(P, cur(P)); /* ns.attr = */
        advance(P);
        advance(P);
        const char **nm = ja_alloc(&P->t->arena, sizeof *nm);
        if (!nm) return pnomem(P);
        nm[0] = tok_str(P, cur(P));
        n->names = nm;
        n->nnames = 1;
        advance(P);
    } else if (!parse_targets(P, n)) return NULL;
    if (is_op(cur(P), "=")) {
        advance(P);
        if (!(n->a = parse_tuple_expr(P))) return NULL;
        return expect_block_end(P) ? n : NULL;
    }
    if (n->name || n->nnames != 1) return pfail(P, "expected '=' in set%s", "");
    n->kind = S_SETBLOCK; /* {% set x %}...{% endset %}, maybe |filters */
    jnode *f = NULL;
    while (is_op(cur(P), "|")) if (!(f = parse_filter(P, f))) return NULL;
    n->b = f;
    if (!expect_block_end(P)) return NULL;
    return body_then_end(P, n, &n->args, "endset");
}

static jnode *parse_macro(parser *P) {
    jnode *n = node(P, S_MACRO);
    if (!n) return NULL;
    advance(P);
    if (cur(P)->kind != JT_NAME) return pfail(P, "expected a macro name%s", "");
    n->name = tok_str(P, cur(P));
    advance(P);
    if (!is_op(cur(P), "(")) return pfail(P, "expected '(' after the macro name%s", "");
    jnode tmp = {0};
    if (!parse_call_args(P, &tmp)) return NULL;
    /* params: positional names (no default) then name=default */
    size_t np = tmp.args.n + tmp.kwvals.n;
    n->names = ja_alloc(&P->t->arena, (np + 1) * sizeof *n->names);
    if (!n->names) return pnomem(P);
    for (size_t i = 0; i < tmp.args.n; i++) {
        if (tmp.args.v[i]->kind != E_NAME) return pfail(P, "macro parameters must be names%s", "");
        n->names[i] = tmp.args.v[i]->name;
        if (!push(P, &n->kwvals, NULL)) return NULL;
    }
    for (size_t i = 0; i < tmp.kwvals.n; i++) {
        n->names[tmp.args.n + i] = tmp.kwnames[i];
        if (!push(P, &n->kwvals, tmp.kwvals.v[i])) return NULL;
    }
    n->nnames = np;
    if (!expect_block_end(P)) return NULL;
    static const char *const ends[] = {"endmacro", NULL};
    int loops = P->loops;
    P->loops = 0;
    bool ok = parse_body(P, &n->args, ends);
    P->loops = loops;
    if (!ok) return NULL;
    advance(P);
    if (cur(P)->kind == JT_NAME) advance(P); /* {% endmacro name %} */
    return expect_block_end(P) ? n : NULL;
}

static jnode *parse_simple_block(parser *P, jn_kind k, const char *end) {
    jnode *n = node(P, k);
    if (!n) return NULL;
    advance(P);
    if (k == S_FILTERBLOCK) {
        jnode *f = NULL;
        do {
            P->pos--; /* parse_filter skips a '|' */
            if (!(f = parse_filter(P, f))) return NULL;
        } while (is_op(cur(P), "|") && (advance(P), true));
        n->b = f;
    } else if (k == S_WITH) {
        while (cur(P)->kind == JT_NAME && is_op(peek(P, 1), "=")) {
            jnode *s = node(P, S_SET);
            if (!s || !parse_targets(P, s)) return NULL;
            advance(P);
            if (!(s->a = parse_expr(P)) || !push(P, &n->kwvals, s)) return NULL;
            if (is_op(cur(P), ",")) advance(P);
        }
    }
    if (!expect_block_end(P)) return NULL;
    return body_then_end(P, n, &n->args, end);
}

static jnode *parse_statement(parser *P) {
    advance(P); /* {% */
    const jtok *t = cur(P);
    if (t->kind != JT_NAME) return pfail(P, "expected a statement name after '{%%'%s", "");
    if (is_name(t, "if")) return parse_if(P);
    if (is_name(t, "for")) return parse_for(P);
    if (is_name(t, "set")) return parse_set(P);
    if (is_name(t, "macro")) return parse_macro(P);
    if (is_name(t, "filter")) return parse_simple_block(P, S_FILTERBLOCK, "endfilter");
    if (is_name(t, "with")) return parse_simple_block(P, S_WITH, "endwith");
    if (is_name(t, "generation")) return parse_simple_block(P, S_GROUP, "endgeneration");
    if (is_name(t, "break") || is_name(t, "continue")) {
        if (!P->loops) return pfail(P, "'%s' outside loop", is_name(t, "break") ? "break" : "continue");
        jnode *n = node(P, is_name(t, "break") ? S_BREAK : S_CONTINUE);
        advance(P);
        return n && expect_block_end(P) ? n : NULL;
    }
    char name[48];
    snprintf(name, sizeof name, "%.*s", (int)(t->n > 40 ? 40 : t->n), t->s);
    if (!strncmp(name, "end", 3) || !strcmp(name, "elif") || !strcmp(name, "else"))
        return pfail(P, "unexpected '%s': no open block it could close here", name);
    return pfail(P, "unknown or unsupported statement '%s'", name);
}

static bool at_end_tag(parser *P, const char *const *ends) {
    if (cur(P)->kind != JT_BLOCK_BEGIN) return false;
    const jtok *t = peek(P, 1);
    for (int i = 0; ends && ends[i]; i++)
        if (is_name(t, ends[i])) return true;
    return false;
}

static bool parse_body(parser *P, jlist *body, const char *const *ends) {
    if (++P->depth > MAX_DEPTH) return pfail(P, "blocks nested too deeply%s", ""), false;
    int saved = P->depth;
    int line = cur(P)->line;
    for (;;) {
        const jtok *t = cur(P);
        jnode *n = NULL;
        if (t->kind == JT_EOF) {
            if (!ends) break;
            char msg[120];
            snprintf(msg, sizeof msg, "unexpected end of template: missing "
                     "'{%% %s %%}' for the block opened on line %d", ends[ends[1] && ends[2] ? 2 : ends[1] ? 1 : 0], line);
            return pfail(P, "%s", msg), false;
        }
        if (at_end_tag(P, ends)) { advance(P); break; }
        if (t->kind == JT_DATA) {
            if ((n = node(P, S_TEXT))) { n->name = t->s; n->nnames = t->n; }
            advance(P);
        } else if (t->kind == JT_VAR_BEGIN) {
            advance(P);
            P->depth = saved;
            if ((n = node(P, S_OUTPUT)) && (n->a = parse_tuple_expr(P))) {
                if (cur(P)->kind != JT_VAR_END) {
                    char b[64];
                    return pfail(P, "expected end of print statement, got %s", tok_desc(cur(P), b, sizeof b)), false;
                }
                advance(P);
            } else n = NULL;
        } else if (t->kind == JT_BLOCK_BEGIN) {
            P->depth = saved;
            n = parse_statement(P);
        } else {
            char b[64];
            return pfail(P, "unexpected %s", tok_desc(t, b, sizeof b)), false;
        }
        if (!n || !push(P, body, n)) return false;
        P->depth = saved;
    }
    P->depth = saved - 1;
    return true;
}

bool jparse(jtemplate *t, const jtok *toks, size_t ntok, kt_error *err) {
    parser P = {.t = t, .tok = toks, .n = ntok, .err = err};
    if (!parse_body(&P, &t->body, NULL)) return false;
    if (P.failed) return false;
    return true;
}
