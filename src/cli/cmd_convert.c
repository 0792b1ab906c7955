/*
 * cmd_convert.c - `kettle convert llama2c CHECKPOINT TOKENIZER -o OUT.gguf`:
 * turns a llama2.c checkpoint (version 0, float32) and its tokenizer.bin
 * into a GGUF model of architecture "llama".
 *
 * A v0 checkpoint is a header of 7 int32 (dim, hidden_dim, n_layers,
 * n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size means the
 * classifier is not shared with the embedding and is stored last) followed
 * by float32 arrays in run.c's order. Each array is [rows][cols] row-major,
 * which is exactly GGUF's [cols, rows] with dims[0] contiguous, and llama2.c
 * rotates adjacent pairs just like GGUF's llama, so every tensor is a plain
 * byte copy with no Q/K permutation (checked against llama.cpp's own
 * conversion of stories260K in tests/test_tools.c). The checkpoint is
 * mapped, validated against its exact expected size, and streamed tensor by
 * tensor into the writer, so memory stays small for any model size.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/timing.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "gguf/gguf.h"
#include "text/vocab.h"

#define CMD "convert"
#define L2C_HEADER_BYTES 28
#define L2C_RMS_EPS 1e-5f     /* llama2.c's run.c */
#define L2C_ROPE_BASE 10000.0f

static void usage(FILE *out) {
    fprintf(out,
            "usage: kettle convert llama2c CHECKPOINT.bin TOKENIZER.bin -o OUT.gguf [--name NAME]\n"
            "\n"
            "Converts a llama2.c checkpoint (version 0, float32 weights) and its\n"
            "tokenizer.bin into a GGUF model (architecture llama, F32 weights, the\n"
            "tensor and key names llama.cpp uses).\n"
            "\n"
            "  -o, --output OUT.gguf  the file to write\n"
            "  --name NAME            general.name (default: the checkpoint's file name)\n");
}

/* ---- the checkpoint ---- */

typedef struct l2c_config {
    int64_t dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len;
    int64_t head_size, kv_dim;
    bool shared; /* classifier = token embedding */
} l2c_config;

/* Byte offsets of each array in the file (per-layer arrays: layer 0). */
typedef struct l2c_layout {
    uint64_t emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, wcls;
    uint64_t end; /* expected file size */
} l2c_layout;

typedef struct l2c_file {
    const char *path;
    const unsigned char *map;
    size_t size;
    l2c_config cfg;
    l2c_layout lay;
} l2c_file;

static int32_t read_i32(const unsigned char *p) {
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    int32_t v;
    memcpy(&v, &u, 4);
    return v;
}

static kt_status check_header(const l2c_file *c, l2c_config *k, kt_error *err) {
    const char *p = c->path;
    if (k->dim <= 0 || k->hidden <= 0 || k->n_layers <= 0 || k->n_heads <= 0 ||
        k->n_kv_heads <= 0 || k->vocab == 0 || k->seq_len <= 0)
        return kt_error_set(err, KT_ERR_FORMAT,
                            "%s: not a llama2.c v0 checkpoint: header has a zero or "
                            "negative size (dim %" PRId64 ", hidden_dim %" PRId64
                            ", n_layers %" PRId64 ", n_heads %" PRId64 ", n_kv_heads %" PRId64
                            ", vocab_size %" PRId64 ", seq_len %" PRId64 ")",
                            p, k->dim, k->hidden, k->n_layers, k->n_heads, k->n_kv_heads,
                            k->vocab, k->seq_len);
    if (k->dim % k->n_heads)
        return kt_error_set(err, KT_ERR_FORMAT, "%s: n_heads %" PRId64
                            " does not divide dim %" PRId64, p, k->n_heads, k->dim);
    if (k->n_kv_heads > k->n_heads || k->n_heads % k->n_kv_heads)
        return kt_error_set(err, KT_ERR_FORMAT, "%s: n_kv_heads %" PRId64
                            " does not divide n_heads %" PRId64, p, k->n_kv_heads, k->n_heads);
    k->head_size = k->dim / k->n_heads;
    if (k->head_size % 2)
        return kt_error_set(err, KT_ERR_FORMAT, "%s: head size %" PRId64
                            " is odd (RoPE rotates pairs)", p, k->head_size);
    k->kv_dim = k->head_size * k->n_kv_heads;
    k->shared = k->vocab > 0;
    if (k->vocab < 0) k->vocab = -k->vocab;
    if (k->vocab > INT32_MAX)
        return kt_error_set(err, KT_ERR_FORMAT, "%s: vocab_size %" PRId64 " is out of range",
                            p, k->vocab);
    return KT_OK;
}

/* acc += a * b * c floats (as bytes); false on overflow. */
static bool add_floats(uint64_t *acc, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t n;
    if (__builtin_mul_overflow(a, b, &n) || __builtin_mul_overflow(n, c, &n) ||
        __builtin_mul_overflow(n, (uint64_t)sizeof(float), &n) ||
        __builtin_add_overflow(*acc, n, acc))
        return false;
    return true;
}

/* Places each array; sets *at to the array's start then advances. */
static bool place(uint64_t *pos, uint64_t *at, uint64_t a, uint64_t b, uint64_t c) {
    *at = *pos;
    return add_floats(pos, a, b, c);
}

static kt_status compute_layout(const l2c_file *c, const l2c_config *k, l2c_layout *l,
                                kt_error *err) {
    uint64_t pos = L2C_HEADER_BYTES, skip;
    uint64_t L = (uint64_t)k->n_layers, D = (uint64_t)k->dim, H = (uint64_t)k->hidden;
    uint64_t KV = (uint64_t)k->kv_dim, V = (uint64_t)k->vocab;
    bool ok = place(&pos, &l->emb, V, D, 1) && place(&pos, &l->rms_att, L, D, 1) &&
              place(&pos, &l->wq, L, D, D) && place(&pos, &l->wk, L, KV, D) &&
              place(&pos, &l->wv, L, KV, D) && place(&pos, &l->wo, L, D, D) &&
              place(&pos, &l->rms_ffn, L, D, 1) && place(&pos, &l->w1, L, H, D) &&
              place(&pos, &l->w2, L, D, H) && place(&pos, &l->w3, L, H, D) &&
              place(&pos, &l->rms_final, D, 1, 1) &&
              /* freq_cis_real and freq_cis_imag: [seq_len][head_size / 2] each */
              place(&pos, &skip, 2, (uint64_t)k->seq_len, (uint64_t)k->head_size / 2) &&
              place(&pos, &l->wcls, k->shared ? 0 : V, D, 1);
    if (!ok)
        return kt_error_set(err, KT_ERR_FORMAT,
                            "%s: not a llama2.c v0 checkpoint: the sizes in its header "
                            "overflow", c->path);
    l->end = pos;
    if (k->shared) l->wcls = l->emb;
    return KT_OK;
}

static kt_status check_size(const l2c_file *c, kt_error *err) {
    const l2c_config *k = &c->cfg;
    if ((uint64_t)c->size == c->lay.end) return KT_OK;
    return kt_error_set(err, KT_ERR_FORMAT,
                        "%s: file is %zu bytes but its header (dim %" PRId64
                        ", hidden_dim %" PRId64 ", %" PRId64 " layers, %" PRId64 " heads, %" PRId64
                        " kv heads, vocab %" PRId64 " %s, seq_len %" PRId64 ") implies %" PRIu64
                        " bytes: %s", c->path, c->size, k->dim, k->hidden, k->n_layers,
                        k->n_heads, k->n_kv_heads, k->vocab,
                        k->shared ? "shared" : "unshared", k->seq_len, c->lay.end,
                        (uint64_t)c->size >= c->lay.end ? "trailing data, or not a llama2.c "
                        "v0 float checkpoint" : k->shared ? "truncated" : "truncated (a "
                        "negative vocab_size means an unshared classifier follows the "
                        "weights)");
}

static kt_status map_file(l2c_file *c, kt_error *err) {
    int fd = open(c->path, O_RDONLY);
    if (fd < 0)
        return kt_error_set(err, KT_ERR_IO, "%s: cannot open: %s", c->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return kt_error_set(err, KT_ERR_IO, "%s: not a regular file", c->path);
    }
    c->size = (size_t)st.st_size;
    if (c->size < L2C_HEADER_BYTES) {
        close(fd);
        return kt_error_set(err, KT_ERR_FORMAT, "%s: %zu bytes is too short for a llama2.c "
                            "checkpoint header (28 bytes)", c->path, c->size);
    }
    void *m = mmap(NULL, c->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return kt_error_set(err, KT_ERR_IO, "%s: cannot map: %s", c->path, strerror(errno));
    c->map = m;
    return KT_OK;
}

static void l2c_close(l2c_file *c) {
    if (c->map) munmap((void *)c->map, c->size);
    c->map = NULL;
}

static kt_status l2c_open(l2c_file *c, const char *path, kt_error *err) {
    memset(c, 0, sizeof *c);
    c->path = path;
    kt_status st = map_file(c, err);
    if (st != KT_OK) return st;
    int64_t *h[7] = {&c->cfg.dim, &c->cfg.hidden, &c->cfg.n_layers, &c->cfg.n_heads,
                     &c->cfg.n_kv_heads, &c->cfg.vocab, &c->cfg.seq_len};
    for (int i = 0; i < 7; i++) *h[i] = read_i32(c->map + 4 * i);
    if ((st = check_header(c, &c->cfg, err)) == KT_OK &&
        (st = compute_layout(c, &c->cfg, &c->lay, err)) == KT_OK)
        st = check_size(c, err);
    if (st != KT_OK) l2c_close(c);
    return st;
}

/* ---- the tensor plan ---- */

typedef struct plan_tensor {
    char name[48];
    uint32_t n_dims;
    int64_t dims[2];
    uint64_t offset; /* in the checkpoint */
} plan_tensor;

typedef struct plan {
    plan_tensor *t;
    int64_t n, cap;
} plan;

static void plan_add(plan *p, const char *name, int64_t d0, int64_t d1, uint64_t offset) {
    plan_tensor *t = &p->t[p->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = d1 ? 2 : 1;
    t->dims[0] = d0;
    t->dims[1] = d1 ? d1 : 1;
    t->offset = offset;
}

static void plan_layer(plan *p, const l2c_file *c, int64_t i) {
    const l2c_config *k = &c->cfg;
    const l2c_layout *l = &c->lay;
    uint64_t D = (uint64_t)k->dim, H = (uint64_t)k->hidden, KV = (uint64_t)k->kv_dim;
    uint64_t I = (uint64_t)i, F = sizeof(float);
    char n[48];
#define LAYER(suffix, d0, d1, off)                                   \
    do {                                                             \
        snprintf(n, sizeof n, "blk.%" PRId64 "." suffix, i);         \
        plan_add(p, n, (int64_t)(d0), (int64_t)(d1), (off));         \
    } while (0)
    LAYER("attn_norm.weight", D, 0, l->rms_att + I * D * F);
    LAYER("attn_q.weight", D, D, l->wq + I * D * D * F);
    LAYER("attn_k.weight", D, KV, l->wk + I * KV * D * F);
    LAYER("attn_v.weight", D, KV, l->wv + I * KV * D * F);
    LAYER("attn_output.weight", D, D, l->wo + I * D * D * F);
    LAYER("ffn_norm.weight", D, 0, l->rms_ffn + I * D * F);
    LAYER("ffn_gate.weight", D, H, l->w1 + I * H * D * F);
    LAYER("ffn_down.weight", H, D, l->w2 + I * D * H * F);
    LAYER("ffn_up.weight", D, H, l->w3 + I * H * D * F);
#undef LAYER
}

static kt_status make_plan(plan *p, const l2c_file *c, kt_error *err) {
    const l2c_config *k = &c->cfg;
    p->cap = 2 + 9 * k->n_layers + 1;
    p->n = 0;
    p->t = calloc((size_t)p->cap, sizeof *p->t);
    if (!p->t) return kt_error_set(err, KT_ERR_NOMEM, "out of memory planning tensors");
    plan_add(p, "token_embd.weight", k->dim, k->vocab, c->lay.emb);
    for (int64_t i = 0; i < k->n_layers; i++) plan_layer(p, c, i);
    plan_add(p, "output_norm.weight", k->dim, 0, c->lay.rms_final);
    if (!k->shared) plan_add(p, "output.weight", k->dim, k->vocab, c->lay.wcls);
    return KT_OK;
}

static uint64_t plan_bytes(const plan_tensor *t) {
    return (uint64_t)t->dims[0] * (uint64_t)t->dims[1] * sizeof(float);
}

/* ---- writing ---- */

static kt_status set_metadata(gguf_writer *w, const l2c_config *k, const char *name,
                              kt_error *err) {
    kt_status st;
#define TRY(call) do { if ((st = (call)) != KT_OK) return st; } while (0)
    TRY(gguf_writer_set_str(w, "general.architecture", "llama", err));
    TRY(gguf_writer_set_str(w, "general.name", name, err));
    TRY(gguf_writer_set_u32(w, "general.file_type", cli_llama_ftype(KT_F32), err));
    TRY(gguf_writer_set_u32(w, "llama.context_length", (uint32_t)k->seq_len, err));
    TRY(gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)k->dim, err));
    TRY(gguf_writer_set_u32(w, "llama.block_count", (uint32_t)k->n_layers, err));
    TRY(gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)k->hidden, err));
    TRY(gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)k->n_heads, err));
    TRY(gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)k->n_kv_heads, err));
    TRY(gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)k->head_size, err));
    TRY(gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", L2C_RMS_EPS, err));
    TRY(gguf_writer_set_f32(w, "llama.rope.freq_base", L2C_ROPE_BASE, err));
    TRY(gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)k->vocab, err));
#undef TRY
    return KT_OK;
}

static kt_status declare_tensors(gguf_writer *w, const plan *p, kt_error *err) {
    for (int64_t i = 0; i < p->n; i++) {
        const plan_tensor *t = &p->t[i];
        kt_status st = gguf_writer_add_tensor(w, t->name, KT_F32, t->n_dims, t->dims, err);
        if (st != KT_OK) return st;
    }
    return KT_OK;
}

static kt_status write_tensors(gguf_writer *w, const plan *p, const l2c_file *c,
                               kt_error *err) {
    cli_progress prog;
    uint64_t total = 0;
    for (int64_t i = 0; i < p->n; i++) total += plan_bytes(&p->t[i]);
    cli_progress_start(&prog, total);
    for (int64_t i = 0; i < p->n; i++) {
        const plan_tensor *t = &p->t[i];
        kt_status st = gguf_writer_write_tensor(w, c->map + t->offset, plan_bytes(t), err);
        if (st != KT_OK) {
            cli_progress_end(&prog);
            return st;
        }
        cli_progress_add(&prog, plan_bytes(t), t->name);
    }
    cli_progress_end(&prog);
    return KT_OK;
}

static kt_status write_gguf(const l2c_file *c, const kt_vocab *v, const char *name,
                            const char *out, kt_error *err) {
    plan p = {0};
    gguf_writer *w = gguf_writer_new(err);
    if (!w) return err ? err->status : KT_ERR_NOMEM;
    kt_status st = set_metadata(w, &c->cfg, name, err);
    if (st == KT_OK) st = kt_vocab_write_gguf(v, w, err);
    if (st == KT_OK) st = make_plan(&p, c, err);
    if (st == KT_OK) st = declare_tensors(w, &p, err);
    if (st == KT_OK) st = gguf_writer_begin(w, out, err);
    if (st == KT_OK) st = write_tensors(w, &p, c, err);
    if (st == KT_OK) st = gguf_writer_finish(w, err);
    gguf_writer_free(w);
    free(p.t);
    return st;
}

/* ---- the command ---- */

typedef struct convert_args {
    const char *checkpoint, *tokenizer, *out, *name;
} convert_args;

static int parse_args(int argc, char **argv, convert_args *a) {
    const char *pos[3] = {NULL, NULL, NULL};
    int n_pos = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_opt(CMD, argc, argv, &i, "-o", &a->out)) ||
            (r = cli_opt(CMD, argc, argv, &i, "--output", &a->out)) ||
            (r = cli_opt(CMD, argc, argv, &i, "--name", &a->name))) {
            if (r < 0) return 2;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error(CMD, "unknown option '%s'", argv[i]);
        } else if (n_pos < 3) {
            pos[n_pos++] = argv[i];
        } else {
            return cli_usage_error(CMD, "unexpected argument '%s'", argv[i]);
        }
    }
    if (n_pos < 1) return cli_usage_error(CMD, "missing the source format (llama2c)");
    if (strcmp(pos[0], "llama2c") != 0)
        return cli_usage_error(CMD, "unknown source format '%s' (supported: llama2c)", pos[0]);
    if (n_pos < 3) return cli_usage_error(CMD, "expected CHECKPOINT and TOKENIZER files");
    if (!a->out) return cli_usage_error(CMD, "missing -o OUT.gguf");
    a->checkpoint = pos[1];
    a->tokenizer = pos[2];
    return 0;
}

/* general.name default: the checkpoint's file name without directory and
 * extension ("stories260K"). */
static void default_name(const char *path, char *buf, size_t cap) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(buf, cap, "%s", base);
    char *dot = strrchr(buf, '.');
    if (dot && dot != buf) *dot = 0;
}

static bool host_little_endian(void) {
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

static kt_status run_convert(const convert_args *a, kt_error *err) {
    char name[256];
    l2c_file c;
    if (!host_little_endian())
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "big-endian hosts are not supported");
    kt_status st = l2c_open(&c, a->checkpoint, err);
    if (st != KT_OK) return st;
    kt_vocab *v = kt_vocab_from_llama2c(a->tokenizer, (int)c.cfg.vocab, err);
    if (!v) {
        l2c_close(&c);
        return err ? err->status : KT_ERR_FORMAT;
    }
    default_name(a->checkpoint, name, sizeof name);
    st = write_gguf(&c, v, a->name ? a->name : name, a->out, err);
    kt_vocab_free(v);
    l2c_close(&c);
    return st;
}

int cmd_convert(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    convert_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc;
    kt_error err = {0};
    double t0 = kt_time_ms();
    if (run_convert(&a, &err) != KT_OK) return cli_fail(CMD, &err);
    fprintf(stderr, "kettle convert: wrote %s in %.1f s\n", a.out, (kt_time_ms() - t0) / 1e3);
    return 0;
}
