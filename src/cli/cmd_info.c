/*
 * cmd_info.c - `kettle info MODEL`: prints what a GGUF file holds.
 *
 * The header facts (version, alignment, where the data starts), every
 * metadata key with its type and value, the tensor table and totals per
 * element type. Everything comes from the validating reader, so a file
 * `info` accepts is one the loader can at least parse. Values are printed
 * one per line: strings are escaped (control bytes and invalid UTF-8 become
 * \n or \xNN) and long ones cut with "...", arrays show their length and
 * first few elements, so the output stays readable for a 150k-token
 * vocabulary or a chat template.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/model_store.h"
#include "gguf/gguf.h"
#include "vision/vision.h"

#define STR_MAX_CHARS 64   /* scalar strings: characters shown */
#define ELEM_STR_CHARS 24  /* strings inside arrays */
#define ARR_SHOW 6         /* array elements shown */
#define VALUE_CAP 1024     /* formatted value buffer */

static void usage(FILE *out) {
    fprintf(out,
            "usage: kettle info (MODEL.gguf | OWNER/REPO[:QUANT])\n"
            "\n"
            "Prints a GGUF file's header, every metadata key with its type and value\n"
            "(arrays: length and first elements), the tensor table (name, type, dims,\n"
            "bytes, offset in the data section) and totals per element type.\n");
}

/* ---- a small appending buffer ---- */

typedef struct sbuf {
    char *p;
    size_t cap, len;
} sbuf;

static void sb_putc(sbuf *b, char c) {
    if (b->len + 1 < b->cap) b->p[b->len++] = c;
    b->p[b->len] = 0;
}

static void sb_puts(sbuf *b, const char *s) {
    while (*s) sb_putc(b, *s++);
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sb_puts(b, tmp);
}

/* ---- strings ---- */

/* Length of the valid UTF-8 sequence at p (n bytes available), or 0. */
static size_t utf8_len(const unsigned char *p, size_t n) {
    size_t len = p[0] < 0x80 ? 1 : (p[0] & 0xe0) == 0xc0 ? 2
               : (p[0] & 0xf0) == 0xe0 ? 3 : (p[0] & 0xf8) == 0xf0 ? 4 : 0;
    if (len == 0 || len > n || (len == 2 && p[0] < 0xc2)) return 0;
    for (size_t i = 1; i < len; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    return len;
}

/* Appends one escaped character of s at *pos; advances *pos. */
static void put_escaped_char(sbuf *b, const unsigned char *s, size_t n, size_t *pos) {
    unsigned char c = s[*pos];
    size_t len = utf8_len(s + *pos, n - *pos);
    if (c == '\n') sb_puts(b, "\\n");
    else if (c == '\t') sb_puts(b, "\\t");
    else if (c == '\r') sb_puts(b, "\\r");
    else if (c == '"') sb_puts(b, "\\\"");
    else if (c == '\\') sb_puts(b, "\\\\");
    else if (len == 0 || c < 0x20 || c == 0x7f) sb_printf(b, "\\x%02x", c);
    else {
        for (size_t i = 0; i < len; i++) sb_putc(b, (char)s[*pos + i]);
        *pos += len;
        return;
    }
    *pos += 1;
}

/* Appends s quoted and escaped, cut after max_chars characters. */
static void put_str(sbuf *b, gguf_str s, size_t max_chars) {
    const unsigned char *p = (const unsigned char *)s.ptr;
    size_t pos = 0, chars = 0;
    sb_putc(b, '"');
    while (pos < s.len && chars < max_chars) {
        put_escaped_char(b, p, s.len, &pos);
        chars++;
    }
    sb_putc(b, '"');
    if (pos < s.len) sb_printf(b, "... (%" PRIu64 " bytes)", s.len);
}

/* ---- values ---- */

/* Appends one numeric element stored little-endian at p. */
static void put_raw_scalar(sbuf *b, gguf_type t, const unsigned char *p) {
    uint64_t u = 0;
    for (size_t i = gguf_type_size(t); i-- > 0;) u = (u << 8) | p[i];
    switch (t) {
    case GGUF_U8: case GGUF_U16: case GGUF_U32: case GGUF_U64:
        sb_printf(b, "%" PRIu64, u); break;
    case GGUF_I8: sb_printf(b, "%d", (int)(int8_t)u); break;
    case GGUF_I16: sb_printf(b, "%d", (int)(int16_t)u); break;
    case GGUF_I32: sb_printf(b, "%" PRId32, (int32_t)u); break;
    case GGUF_I64: sb_printf(b, "%" PRId64, (int64_t)u); break;
    case GGUF_BOOL: sb_puts(b, u ? "true" : "false"); break;
    case GGUF_F32: { uint32_t v = (uint32_t)u; float f; memcpy(&f, &v, 4);
                     sb_printf(b, "%.9g", (double)f); break; }
    case GGUF_F64: { double d; memcpy(&d, &u, 8); sb_printf(b, "%.17g", d); break; }
    default: sb_puts(b, "?"); break;
    }
}

static void put_array(sbuf *b, const gguf_file *f, int64_t i) {
    gguf_type et = gguf_kv_arr_type(f, i);
    uint64_t n = gguf_kv_arr_n(f, i);
    const unsigned char *data = gguf_kv_arr_data(f, i);
    uint64_t show = n < ARR_SHOW ? n : ARR_SHOW;
    sb_putc(b, '[');
    for (uint64_t j = 0; j < show; j++) {
        if (j) sb_puts(b, ", ");
        if (et == GGUF_STRING) put_str(b, gguf_kv_arr_str(f, i, j), ELEM_STR_CHARS);
        else if (data && gguf_type_size(et)) put_raw_scalar(b, et, data + j * gguf_type_size(et));
        else sb_puts(b, "...");
    }
    if (show < n) sb_puts(b, ", ...");
    sb_putc(b, ']');
}

static void put_scalar(sbuf *b, const gguf_file *f, int64_t i, gguf_type t) {
    gguf_str sv;
    const void *raw;
    uint64_t n;
    if (t == GGUF_STRING && gguf_kv_get_str(f, i, &sv)) put_str(b, sv, STR_MAX_CHARS);
    else if (gguf_type_size(t) && gguf_kv_raw(f, i, &raw, &n) && n >= gguf_type_size(t))
        put_raw_scalar(b, t, raw);
    else sb_puts(b, "?");
}

/* "u32", "string", "array[f32] x 512" into buf. */
static void fmt_type(const gguf_file *f, int64_t i, char *buf, size_t cap) {
    gguf_type t = gguf_kv_type(f, i);
    if (t == GGUF_ARRAY)
        snprintf(buf, cap, "%s[%s] x %" PRIu64, gguf_type_name(t),
                 gguf_type_name(gguf_kv_arr_type(f, i)), gguf_kv_arr_n(f, i));
    else
        snprintf(buf, cap, "%s", gguf_type_name(t));
}

/* The key, escaped and cut to fit buf. */
static void fmt_key(const gguf_file *f, int64_t i, char *buf, size_t cap) {
    sbuf b = {buf, cap, 0};
    gguf_str key = gguf_kv_key(f, i);
    buf[0] = 0;
    for (size_t pos = 0; pos < key.len && b.len + 8 < cap;)
        put_escaped_char(&b, (const unsigned char *)key.ptr, key.len, &pos);
}

/* ---- sections ---- */

static int key_width(const gguf_file *f) {
    char key[160];
    int w = 3;
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        fmt_key(f, i, key, sizeof key);
        int len = (int)strlen(key);
        if (len > w) w = len > 48 ? 48 : len;
    }
    return w;
}

static void print_header(const gguf_file *f, const char *path) {
    char hb[32];
    printf("file        %s\n", path);
    printf("size        %" PRIu64 " bytes (%s)\n", gguf_file_size(f),
           cli_human_bytes(gguf_file_size(f), hb, sizeof hb));
    printf("version     %" PRIu32 "\n", gguf_version(f));
    printf("alignment   %" PRIu64 "\n", gguf_alignment(f));
    printf("data at     %" PRIu64 "\n", gguf_data_offset(f));
}

static void print_metadata(const gguf_file *f) {
    int kw = key_width(f);
    char value[VALUE_CAP], type[64], key[160];
    printf("\nmetadata: %" PRId64 " keys\n", gguf_n_kv(f));
    printf("  %-*s  %-24s  %s\n", kw, "KEY", "TYPE", "VALUE");
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        sbuf b = {value, sizeof value, 0};
        value[0] = 0;
        gguf_type t = gguf_kv_type(f, i);
        if (t == GGUF_ARRAY) put_array(&b, f, i);
        else put_scalar(&b, f, i, t);
        fmt_type(f, i, type, sizeof type);
        fmt_key(f, i, key, sizeof key);
        printf("  %-*s  %-24s  %s\n", kw, key, type, value);
    }
}

static void fmt_dims(const gguf_tensor *t, char *buf, size_t cap) {
    sbuf b = {buf, cap, 0};
    buf[0] = 0;
    for (uint32_t d = 0; d < t->n_dims; d++)
        sb_printf(&b, d ? " x %" PRId64 : "%" PRId64, t->dims[d]);
    if (t->n_dims == 0) sb_puts(&b, "scalar");
}

static void fmt_name(const gguf_tensor *t, char *buf, size_t cap) {
    sbuf b = {buf, cap, 0};
    buf[0] = 0;
    for (size_t pos = 0; pos < t->name.len && b.len + 8 < cap;)
        put_escaped_char(&b, (const unsigned char *)t->name.ptr, t->name.len, &pos);
}

static void tensor_widths(const gguf_file *f, int *nw, int *dw) {
    char buf[256];
    *nw = 4;
    *dw = 4;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        fmt_name(t, buf, sizeof buf);
        if ((int)strlen(buf) > *nw) *nw = (int)strlen(buf);
        fmt_dims(t, buf, sizeof buf);
        if ((int)strlen(buf) > *dw) *dw = (int)strlen(buf);
    }
}

static void print_tensors(const gguf_file *f) {
    int nw, dw;
    char name[256], dims[256];
    tensor_widths(f, &nw, &dw);
    printf("\ntensors: %" PRId64 "\n", gguf_n_tensors(f));
    printf("  %-*s  %-5s  %-*s  %12s  %12s\n", nw, "NAME", "TYPE", dw, "DIMS", "BYTES",
           "OFFSET");
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        fmt_name(t, name, sizeof name);
        fmt_dims(t, dims, sizeof dims);
        printf("  %-*s  %-5s  %-*s  %12" PRIu64 "  %12" PRIu64 "\n", nw, name,
               kt_dtype_name(t->type), dw, dims, t->n_bytes, t->offset);
    }
}

static void print_totals(const gguf_file *f) {
    uint64_t count[KT_DTYPE_COUNT] = {0}, bytes[KT_DTYPE_COUNT] = {0}, total = 0;
    char hb[32];
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if ((unsigned)t->type >= KT_DTYPE_COUNT) continue;
        count[t->type]++;
        bytes[t->type] += t->n_bytes;
        total += t->n_bytes;
    }
    printf("\ntotals: %" PRId64 " tensors, %" PRIu64 " bytes (%s)\n", gguf_n_tensors(f),
           total, cli_human_bytes(total, hb, sizeof hb));
    for (int d = 0; d < KT_DTYPE_COUNT; d++) {
        if (!count[d]) continue;
        printf("  %-5s  %6" PRIu64 " tensors  %14" PRIu64 " bytes  (%s)\n",
               kt_dtype_name((uint32_t)d), count[d], bytes[d],
               cli_human_bytes(bytes[d], hb, sizeof hb));
    }
}

/* An mmproj file (arch clip): what the vision tower loader makes of it,
 * or why it refuses it (the command still succeeds: the file is readable). */
static void print_vision(const gguf_file *f, const char *path) {
    char arch[32] = "";
    if (!gguf_get_str(f, "general.architecture", arch, sizeof arch) || strcmp(arch, "clip") != 0) return;
    kt_error err = {0};
    kt_vision *v = kt_vision_load(path, &err);
    if (!v) {
        printf("\nvision tower: not loadable: %s\n", err.msg);
        return;
    }
    const kt_vision_info *in = kt_vision_get_info(v);
    kt_image_prep_params pp;
    kt_vision_prep_params(v, &pp);
    printf("\nvision tower: %s, %d blocks, width %d, %d heads, %" PRId64 " params\n", in->projector, in->n_layers,
           in->width, in->n_heads, in->n_params);
    printf("  output      %d per image token (x %d with %d DeepStack outputs)\n", in->n_embd, 1 + in->n_deepstack,
           in->n_deepstack);
    printf("  patches     %d px, merged %dx%d; %" PRId64 " to %" PRId64 " pixels (%" PRId64 " to %" PRId64
           " tokens)\n",
           pp.patch_size, pp.merge_size, pp.merge_size, pp.min_pixels, pp.max_pixels,
           pp.min_pixels / ((int64_t)pp.patch_size * pp.patch_size * pp.merge_size * pp.merge_size),
           pp.max_pixels / ((int64_t)pp.patch_size * pp.patch_size * pp.merge_size * pp.merge_size));
    kt_vision_free(v);
}

int cmd_info(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    if (argc != 2) return cli_usage_error("info", "expected one MODEL argument");
    if (argv[1][0] == '-' && argv[1][1])
        return cli_usage_error("info", "unknown option '%s'", argv[1]);
    const char *model = argv[1];
    char model_path[MS_PATH_MAX]; /* OWNER/REPO:QUANT: the pulled file */
    if (ms_resolve_opt("info", &model, model_path, sizeof model_path)) return 1;
    kt_error err = {0};
    gguf_file *f = gguf_open(model, &err);
    if (!f) return cli_fail("info", &err);
    print_header(f, model);
    print_metadata(f);
    print_tensors(f);
    print_totals(f);
    print_vision(f, model);
    gguf_close(f);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        kt_error_set(&err, KT_ERR_IO, "writing the output failed");
        return cli_fail("info", &err);
    }
    return 0;
}
