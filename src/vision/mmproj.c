/*
 * mmproj.c - loading a vision tower from an mmproj GGUF (llama.cpp's clip
 * format: arch `clip`, `clip.vision.*` keys, `v.*` and `mm.*` tensors).
 *
 * Reads what llama.cpp's clip.cpp reads for the Qwen-VL projectors
 * (qwen2vl_merger, qwen2.5vl_merger, qwen3vl_merger) and checks all of it
 * once, so the encoder does no validation: every tensor the graph uses
 * exists with the shape the hyper-parameters imply and a type the kernels
 * take (matrices: what kt_matmul multiplies; norms, biases and the
 * position embedding: F32). Anything else is refused naming the key or
 * tensor at fault. The tensors stay in the mapping; only the patch
 * embedding is copied (to F16, see vision_internal.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/fp16.h"
#include "ops/amx.h"
#include "ops/cpu.h"
#include "ops/matmul.h"
#include "ops/repack.h"
#include "vision/vision_internal.h"

/* ---- keys ---- */

/* Integer key in [lo, hi]; absent: def, or an error when def < 0. */
static kt_status read_int(const gguf_file *f, const char *key, int64_t def, int64_t lo, int64_t hi, int *out,
                          kt_error *err) {
    int64_t i = gguf_find_key(f, key), v = def;
    if (i < 0) {
        if (def < 0) return kt_error_set(err, KT_ERR_FORMAT, "missing metadata key '%s'", key);
    } else if (!gguf_kv_get_i64(f, i, &v)) {
        return kt_error_set(err, KT_ERR_FORMAT, "metadata key '%s' is a %s, expected an integer", key,
                            gguf_type_name(gguf_kv_type(f, i)));
    }
    if (v < lo || v > hi)
        return kt_error_set(err, KT_ERR_FORMAT, "metadata key '%s' = %lld is out of range [%lld, %lld]", key,
                            (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return KT_OK;
}

static kt_status read_bool(const gguf_file *f, const char *key, bool *out, kt_error *err) {
    int64_t i = gguf_find_key(f, key);
    *out = false;
    if (i >= 0 && !gguf_kv_get_bool(f, i, out))
        return kt_error_set(err, KT_ERR_FORMAT, "metadata key '%s' is a %s, expected a bool", key,
                            gguf_type_name(gguf_kv_type(f, i)));
    return KT_OK;
}

/* image_mean / image_std: at least 3 F32 values (clip.cpp reads the first 3) */
static kt_status read_rgb(const gguf_file *f, const char *key, bool positive, float out[3], kt_error *err) {
    int64_t i = gguf_find_key(f, key);
    if (i < 0) return kt_error_set(err, KT_ERR_FORMAT, "missing metadata key '%s'", key);
    if (gguf_kv_type(f, i) != GGUF_ARRAY || gguf_kv_arr_type(f, i) != GGUF_F32 || gguf_kv_arr_n(f, i) < 3)
        return kt_error_set(err, KT_ERR_FORMAT, "metadata key '%s' must be an array of 3 f32", key);
    const uint8_t *p = gguf_kv_arr_data(f, i);
    for (int c = 0; c < 3; c++) {
        memcpy(&out[c], p + 4 * c, 4);
        if (!isfinite(out[c]) || (positive && !(out[c] > 0)))
            return kt_error_set(err, KT_ERR_FORMAT, "metadata key '%s' has value %g at %d", key, (double)out[c], c);
    }
    return KT_OK;
}

/* ---- tensors ---- */

/* Binds tensor `name` as a matrix [n_in, n_out] kt_matmul takes, or with
 * n_out 0 an F32 vector of n_in; absent and optional: data NULL. */
static kt_status bind(const gguf_file *f, const char *name, int n_in, int n_out, bool optional, vt_weight *t,
                      kt_error *err) {
    memset(t, 0, sizeof *t);
    const gguf_tensor *g = gguf_tensor_find(f, name);
    if (!g) return optional ? KT_OK : kt_error_set(err, KT_ERR_FORMAT, "missing tensor '%s'", name);
    bool vector = n_out == 0;
    bool shape_ok = g->dims[0] == n_in && (vector ? g->n_dims == 1 : g->n_dims == 2 && g->dims[1] == n_out);
    if (!shape_ok)
        return kt_error_set(
            err, KT_ERR_FORMAT, "tensor '%s' has shape [%lld, %lld] (%u dims), expected [%d, %d] (%d dims)", name,
            (long long)g->dims[0], (long long)g->dims[1], g->n_dims, n_in, vector ? 1 : n_out, vector ? 1 : 2);
    if (vector ? g->type != KT_F32 : !kt_matmul_supported(g->type))
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "tensor '%s' has type %s, which kettle cannot %s", name,
                            kt_dtype_name(g->type), vector ? "use for a norm or bias (needs F32)" : "multiply");
    t->data = g->data;
    t->type = g->type;
    t->n_in = n_in;
    t->n_out = vector ? 1 : n_out;
    return KT_OK;
}

/* Output width of matrix `name` (its dims[1]), checking its input width
 * first; the merger's and DeepStack's hidden widths come from the file. */
static kt_status out_width(const gguf_file *f, const char *name, int n_in, int *n_out, kt_error *err) {
    const gguf_tensor *g = gguf_tensor_find(f, name);
    if (!g) return kt_error_set(err, KT_ERR_FORMAT, "missing tensor '%s'", name);
    if (g->n_dims != 2 || g->dims[0] != n_in || g->dims[1] > (1 << 20))
        return kt_error_set(err, KT_ERR_FORMAT,
                            "tensor '%s' has shape [%lld, %lld] (%u dims), expected [%d, N] (2 dims)", name,
                            (long long)g->dims[0], (long long)g->dims[1], g->n_dims, n_in);
    *n_out = (int)g->dims[1];
    return KT_OK;
}

/* One slice of the Conv3d patch embedding, [p, p, 3, width], to F16 rows
 * of 3 p p (channel, row, column: the im2col order). */
static kt_status bind_patch(kt_vision *v, const char *name, uint16_t **out, kt_error *err) {
    const gguf_tensor *g = gguf_tensor_find(v->file, name);
    if (!g) return kt_error_set(err, KT_ERR_FORMAT, "missing tensor '%s'", name);
    int p = v->patch;
    if (g->n_dims != 4 || g->dims[0] != p || g->dims[1] != p || g->dims[2] != 3 || g->dims[3] != v->width)
        return kt_error_set(
            err, KT_ERR_FORMAT,
            "tensor '%s' has shape [%lld, %lld, %lld, %lld] (%u dims), expected [%d, %d, 3, %d] (4 dims)", name,
            (long long)g->dims[0], (long long)g->dims[1], (long long)g->dims[2], (long long)g->dims[3], g->n_dims, p, p,
            v->width);
    if (g->type != KT_F32 && g->type != KT_F16)
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "tensor '%s' has type %s (the patch embedding must be F32 or F16)",
                            name, kt_dtype_name(g->type));
    size_t n = (size_t)3 * p * p * v->width;
    *out = malloc(n * sizeof **out);
    if (!*out) return kt_error_set(err, KT_ERR_NOMEM, "out of memory for tensor '%s'", name);
    if (g->type == KT_F16) {
        memcpy(*out, g->data, n * sizeof **out);
    } else {
        const float *src = g->data;
        for (size_t i = 0; i < n; i++) (*out)[i] = kt_fp32_to_fp16(src[i]);
    }
    return KT_OK;
}

static kt_status bind_pos_embd(kt_vision *v, kt_error *err) {
    const char *name = "v.position_embd.weight";
    const gguf_tensor *g = gguf_tensor_find(v->file, name);
    if (!g) return kt_error_set(err, KT_ERR_FORMAT, "missing tensor '%s'", name);
    int side = (int)sqrt((double)g->dims[1]);
    if (g->n_dims != 2 || g->dims[0] != v->width || (int64_t)side * side != g->dims[1] || side < 1)
        return kt_error_set(err, KT_ERR_FORMAT, "tensor '%s' has shape [%lld, %lld], expected [%d, N * N]", name,
                            (long long)g->dims[0], (long long)g->dims[1], v->width);
    if (g->type != KT_F32)
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "tensor '%s' has type %s (must be F32)", name,
                            kt_dtype_name(g->type));
    v->pos_embd = (vt_weight){g->data, g->type, v->width, (int)g->dims[1], NULL};
    v->pos_side = side;
    return KT_OK;
}

/* ---- one block ---- */

#define BIND(field, suffix, n_in, n_out, optional)                                                                     \
    do {                                                                                                               \
        snprintf(name, sizeof name, "v.blk.%d.%s", il, suffix);                                                        \
        if ((st = bind(f, name, n_in, n_out, optional, &l->field, err))) return st;                                    \
    } while (0)

static kt_status load_attention(kt_vision *v, int il, vt_layer *l, kt_error *err) {
    const gguf_file *f = v->file;
    char name[96];
    kt_status st;
    int w = v->width;
    if (v->proj == VT_QWEN3VL) {
        BIND(qkv_w, "attn_qkv.weight", w, 3 * w, false);
        BIND(qkv_b, "attn_qkv.bias", 3 * w, 0, false);
    } else {
        BIND(q_w, "attn_q.weight", w, w, false);
        BIND(q_b, "attn_q.bias", w, 0, false);
        BIND(k_w, "attn_k.weight", w, w, false);
        BIND(k_b, "attn_k.bias", w, 0, false);
        BIND(v_w, "attn_v.weight", w, w, false);
        BIND(v_b, "attn_v.bias", w, 0, false);
    }
    BIND(o_w, "attn_out.weight", w, w, false);
    BIND(o_b, "attn_out.bias", w, 0, true);
    bool layer_norm = v->norm == VT_NORM_LAYER;
    BIND(ln1_w, "ln1.weight", w, 0, false);
    BIND(ln1_b, "ln1.bias", w, 0, !layer_norm);
    BIND(ln2_w, "ln2.weight", w, 0, false);
    BIND(ln2_b, "ln2.bias", w, 0, !layer_norm);
    return KT_OK;
}

/* The MLP: up (and gate) [w, n_ff], down [n_ff, w], biases optional as
 * in clip.cpp's build_ffn. clip.cpp swaps ffn_up and ffn_down of
 * qwen2vl / qwen2.5vl files whose ffn_down has ne[0] == width (a fix for
 * old conversions); done here alike, so a file with n_ff == width is read
 * as llama.cpp reads it. */
static kt_status load_mlp(kt_vision *v, int il, vt_layer *l, kt_error *err) {
    const gguf_file *f = v->file;
    char name[96];
    kt_status st;
    int w = v->width;
    const char *up = "ffn_up", *down = "ffn_down";
    snprintf(name, sizeof name, "v.blk.%d.ffn_down.weight", il);
    const gguf_tensor *gd = gguf_tensor_find(f, name);
    if (v->proj != VT_QWEN3VL && gd && gd->dims[0] == w) {
        up = "ffn_down";
        down = "ffn_up";
    }
    char suffix[48];
    snprintf(suffix, sizeof suffix, "%s.weight", up);
    snprintf(name, sizeof name, "v.blk.%d.%s", il, suffix);
    int n_ff;
    if ((st = out_width(f, name, w, &n_ff, err))) return st;
    if (n_ff > v->n_ff) v->n_ff = n_ff; /* the widest block's (the key may be 0 in old conversions) */
    BIND(up_w, suffix, w, n_ff, false);
    snprintf(suffix, sizeof suffix, "%s.bias", up);
    BIND(up_b, suffix, n_ff, 0, true);
    BIND(gate_w, "ffn_gate.weight", w, n_ff, true);
    BIND(gate_b, "ffn_gate.bias", n_ff, 0, true);
    snprintf(suffix, sizeof suffix, "%s.weight", down);
    BIND(down_w, suffix, n_ff, w, false);
    snprintf(suffix, sizeof suffix, "%s.bias", down);
    BIND(down_b, suffix, w, 0, true);
    return KT_OK;
}

#undef BIND

/* qwen3vl DeepStack after block il (clip.cpp: present when fc1.weight is):
 * LayerNorm over the 4 patches of a merge group, fc1 -> GELU -> fc2 to the
 * text model's width. */
static kt_status load_deepstack(kt_vision *v, int il, vt_layer *l, kt_error *err) {
    const gguf_file *f = v->file;
    char name[96];
    kt_status st;
    snprintf(name, sizeof name, "v.deepstack.%d.fc1.weight", il);
    if (!gguf_tensor_find(f, name)) return KT_OK;
    int w4 = 4 * v->width, hidden;
    if ((st = out_width(f, name, w4, &hidden, err))) return st;
    l->deepstack = true;
    const struct {
        vt_weight *t;
        const char *suffix;
        int n_in, n_out;
    } parts[] = {
        {&l->ds_norm_w, "norm.weight", w4, 0},
        {&l->ds_norm_b, "norm.bias", w4, 0},
        {&l->ds_fc1_w, "fc1.weight", w4, hidden},
        {&l->ds_fc1_b, "fc1.bias", hidden, 0},
        {&l->ds_fc2_w, "fc2.weight", hidden, v->proj_dim},
        {&l->ds_fc2_b, "fc2.bias", v->proj_dim, 0},
    };
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        snprintf(name, sizeof name, "v.deepstack.%d.%s", il, parts[i].suffix);
        if ((st = bind(f, name, parts[i].n_in, parts[i].n_out, false, parts[i].t, err))) return st;
    }
    return KT_OK;
}

/* ---- the file ---- */

static kt_status read_projector(kt_vision *v, kt_error *err) {
    const gguf_file *f = v->file;
    char arch[64] = "", type[64] = "", proj[64] = "";
    if (!gguf_get_str(f, "general.architecture", arch, sizeof arch))
        return kt_error_set(err, KT_ERR_FORMAT, "missing metadata key 'general.architecture'");
    if (strcmp(arch, "clip") != 0)
        return kt_error_set(err, KT_ERR_FORMAT, "general.architecture is '%s', expected 'clip' (an mmproj file)", arch);
    /* older converters wrote no general.type; when present it must say mmproj */
    if (gguf_find_key(f, "general.type") >= 0 &&
        (!gguf_get_str(f, "general.type", type, sizeof type) || strcmp(type, "mmproj") != 0))
        return kt_error_set(err, KT_ERR_FORMAT, "general.type is '%s', expected 'mmproj'", type);
    /* clip.cpp: the default key, then the vision one of mixed-modality files */
    const char *key = "clip.projector_type";
    if (!gguf_get_str(f, key, proj, sizeof proj)) {
        key = "clip.vision.projector_type";
        if (!gguf_get_str(f, key, proj, sizeof proj))
            return kt_error_set(err, KT_ERR_FORMAT,
                                "missing metadata key 'clip.projector_type' (or 'clip.vision.projector_type')");
    }
    static const struct {
        const char *name;
        vt_projector proj;
    } known[] = {{"qwen2vl_merger", VT_QWEN2VL}, {"qwen2.5vl_merger", VT_QWEN25VL}, {"qwen3vl_merger", VT_QWEN3VL}};
    size_t k = 0;
    while (k < 3 && strcmp(proj, known[k].name) != 0) k++;
    if (k == 3)
        return kt_error_set(err, KT_ERR_UNSUPPORTED,
                            "projector type '%s' (%s) is not supported: kettle runs qwen3vl_merger, "
                            "qwen2.5vl_merger and qwen2vl_merger",
                            proj, key);
    v->proj = known[k].proj;
    memcpy(v->info.projector, known[k].name, strlen(known[k].name) + 1); /* each < 32 bytes */
    bool has_vision = true;
    int64_t i = gguf_find_key(f, "clip.has_vision_encoder");
    if (i >= 0 && (!gguf_kv_get_bool(f, i, &has_vision) || !has_vision))
        return kt_error_set(err, KT_ERR_FORMAT, "clip.has_vision_encoder is not true: the file has no vision tower");
    return KT_OK;
}

static kt_status read_hparams(kt_vision *v, kt_error *err) {
    const gguf_file *f = v->file;
    kt_status st;
    if ((st = read_int(f, "clip.vision.embedding_length", -1, 4, 16384, &v->width, err)) ||
        (st = read_int(f, "clip.vision.attention.head_count", -1, 1, 1024, &v->n_heads, err)) ||
        (st = read_int(f, "clip.vision.feed_forward_length", -1, 0, 1 << 20, &v->n_ff, err)) ||
        (st = read_int(f, "clip.vision.block_count", -1, 1, 1024, &v->n_layers, err)) ||
        (st = read_int(f, "clip.vision.projection_dim", -1, 1, 1 << 20, &v->proj_dim, err)) ||
        (st = read_int(f, "clip.vision.image_size", -1, 0, 8192, &v->image_size, err)) ||
        (st = read_int(f, "clip.vision.patch_size", -1, 1, 1024, &v->patch, err)) ||
        (st = read_int(f, "clip.vision.spatial_merge_size", 2, 1, 65535, &v->merge, err)) ||
        (st =
             read_int(f, "clip.vision.attention.head_dim", v->width / v->n_heads, 4, VT_MAX_HEAD_DIM, &v->d_head, err)))
        return st;
    if (v->d_head * v->n_heads != v->width || v->d_head % 4 != 0)
        return kt_error_set(err, KT_ERR_FORMAT,
                            "head dim %d x %d heads must be the embedding length %d, the head dim a multiple of 4",
                            v->d_head, v->n_heads, v->width);
    /* the Qwen graphs hard-code 2x2 merge groups (clip.cpp's positions and reshapes) */
    if (v->merge != 2)
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "clip.vision.spatial_merge_size = %d (only 2 is supported)",
                            v->merge);
    double eps;
    const char *eps_key = "clip.vision.attention.layer_norm_epsilon";
    if (gguf_find_key(f, eps_key) < 0) return kt_error_set(err, KT_ERR_FORMAT, "missing metadata key '%s'", eps_key);
    if (!gguf_get_f64(f, eps_key, 0, &eps) || !(eps >= 0 && eps < 1))
        return kt_error_set(err, KT_ERR_FORMAT, "metadata key '%s' is not a number in [0, 1)", eps_key);
    v->eps = (float)eps;
    if ((st = read_rgb(f, "clip.vision.image_mean", false, v->mean, err)) ||
        (st = read_rgb(f, "clip.vision.image_std", true, v->std, err)))
        return st;
    /* clip.cpp: clip.use_gelu -> GELU, clip.use_silu -> SiLU, else quick GELU */
    bool use_gelu, use_silu;
    if ((st = read_bool(f, "clip.use_gelu", &use_gelu, err)) || (st = read_bool(f, "clip.use_silu", &use_silu, err)))
        return st;
    if (use_gelu && use_silu) return kt_error_set(err, KT_ERR_FORMAT, "clip.use_gelu and clip.use_silu are both true");
    v->act = use_gelu ? VT_ACT_GELU : use_silu ? VT_ACT_SILU : VT_ACT_GELU_QUICK;
    v->norm = v->proj == VT_QWEN25VL ? VT_NORM_RMS : VT_NORM_LAYER;
    /* window attention is qwen2.5vl's alone; clip.cpp requires the key there
     * and uses a 112-pixel window (attn_window_size is not read for it) */
    int n_wa = 0;
    if (v->proj == VT_QWEN25VL && (st = read_int(f, "clip.vision.n_wa_pattern", -1, 0, 1024, &n_wa, err))) return st;
    v->window_px = 112;
    if (n_wa > 0 && v->window_px / v->patch / v->merge < 1)
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "patch size %d is too large for the 112-pixel attention window",
                            v->patch);
    v->layers = calloc((size_t)v->n_layers, sizeof *v->layers);
    if (!v->layers) return kt_error_set(err, KT_ERR_NOMEM, "out of memory for %d vision blocks", v->n_layers);
    for (int il = 0; il < v->n_layers; il++) v->layers[il].full_attn = n_wa > 0 ? (il + 1) % n_wa == 0 : true;
    return KT_OK;
}

static kt_status load_tensors(kt_vision *v, kt_error *err) {
    const gguf_file *f = v->file;
    kt_status st;
    int w = v->width, hidden;
    bool layer_norm = v->norm == VT_NORM_LAYER;
    if ((st = bind_patch(v, "v.patch_embd.weight", &v->patch_w16[0], err)) ||
        (st = bind_patch(v, "v.patch_embd.weight.1", &v->patch_w16[1], err)))
        return st;
    if (v->proj == VT_QWEN3VL) { /* qwen3vl.cpp asserts both */
        if ((st = bind(f, "v.patch_embd.bias", w, 0, false, &v->patch_b, err)) || (st = bind_pos_embd(v, err)))
            return st;
    } else if (gguf_tensor_find(f, "v.patch_embd.bias")) {
        return kt_error_set(err, KT_ERR_FORMAT,
                            "tensor 'v.patch_embd.bias' is unexpected in a %s file (qwen2vl.cpp has no patch bias)",
                            v->info.projector);
    }
    if ((st = bind(f, "v.pre_ln.weight", w, 0, true, &v->pre_ln_w, err)) ||
        (st = bind(f, "v.pre_ln.bias", w, 0, true, &v->pre_ln_b, err)) ||
        (st = bind(f, "v.post_ln.weight", w, 0, false, &v->post_ln_w, err)) ||
        (st = bind(f, "v.post_ln.bias", w, 0, !layer_norm, &v->post_ln_b, err)))
        return st;
    for (int il = 0; il < v->n_layers; il++) {
        vt_layer *l = &v->layers[il];
        if ((st = load_attention(v, il, l, err)) || (st = load_mlp(v, il, l, err))) return st;
        if (v->proj == VT_QWEN3VL && (st = load_deepstack(v, il, l, err))) return st;
        if (l->deepstack) v->info.n_deepstack++;
    }
    if ((st = out_width(f, "mm.0.weight", 4 * w, &hidden, err)) ||
        (st = bind(f, "mm.0.weight", 4 * w, hidden, false, &v->mm0_w, err)) ||
        (st = bind(f, "mm.0.bias", hidden, 0, false, &v->mm0_b, err)) ||
        (st = bind(f, "mm.2.weight", hidden, v->proj_dim, false, &v->mm2_w, err)) ||
        (st = bind(f, "mm.2.bias", v->proj_dim, 0, false, &v->mm2_b, err)))
        return st;
    return KT_OK;
}

/* ---- repacking ---- */

/* The matrices of the tower (absent ones have data NULL): n_slots at most. */
static int list_matrices(kt_vision *v, vt_weight **out) {
    int n = 0;
    for (int il = 0; il < v->n_layers; il++) {
        vt_layer *l = &v->layers[il];
        vt_weight *m[] = {&l->qkv_w, &l->q_w,  &l->k_w,    &l->v_w,      &l->o_w,
                          &l->up_w,  &l->gate_w, &l->down_w, &l->ds_fc1_w, &l->ds_fc2_w};
        for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
            if (m[i]->data) out[n++] = m[i];
    }
    if (v->mm0_w.data) out[n++] = &v->mm0_w;
    if (v->mm2_w.data) out[n++] = &v->mm2_w;
    return n;
}

/* Where the CPU has AMX (ops/amx.h), every F16 matrix is packed for its
 * tiles instead: bf16 hi + lo pairs, 4 bytes a weight (twice the F16
 * file's), the GEMMs ~2.9x the F16x16 kernel's speed on machine C. The
 * choice is made here, once: a tower loaded with AMX runs on it. */
static bool use_amx(const vt_weight *w) {
    return kt_repack_plain(w->type) == KT_F16 && w->type == KT_F16 && kt_cpu_has_amx_bf16();
}

/* Every matrix the GEMM has a faster layout for (ops/repack.h: F16 ->
 * F16x16, F32 -> F32x16, Q8_0 -> Q8_0x8 ...; F16 -> AMX tiles above) is
 * copied out of the read-only mapping into one owned block, in that
 * layout, as the text model's loader does by default: the float x16 GEMM
 * runs near the FMA peak, the plain one at about 60% of it
 * (matmul_x16_avx2.c). The x16 and AMX kernels sum in other orders:
 * results move in the last bits. */
static kt_status repack_matrices(kt_vision *v, kt_error *err) {
    vt_weight **m = malloc(((size_t)v->n_layers * 10 + 2) * sizeof *m);
    if (!m) return kt_error_set(err, KT_ERR_NOMEM, "out of memory repacking the vision tower");
    int n = list_matrices(v, m);
    const int patch_in = 3 * v->patch * v->patch;
    const bool patch_amx = kt_cpu_has_amx_bf16();
    size_t total = 0, tmp_bytes = 0;
    for (int i = 0; i < n; i++) {
        if (use_amx(m[i])) {
            total += (kt_amx_packed_bytes(m[i]->n_in, m[i]->n_out) + 63) / 64 * 64;
            continue;
        }
        if (!kt_repack_supported(m[i]->type, m[i]->n_in, m[i]->n_out)) continue;
        total += (kt_dtype_row_bytes(m[i]->type, m[i]->n_in) * (size_t)m[i]->n_out + 63) / 64 * 64;
        size_t t = kt_repack_tmp_bytes(m[i]->type, m[i]->n_in);
        if (t > tmp_bytes) tmp_bytes = t;
    }
    if (patch_amx) total += 2 * ((kt_amx_packed_bytes(patch_in, v->width) + 63) / 64 * 64);
    size_t t_patch = kt_repack_tmp_bytes(KT_F16, patch_in); /* the owned patch embedding */
    if (t_patch > tmp_bytes) tmp_bytes = t_patch;
    void *tmp = malloc(tmp_bytes);
    v->packed = total ? aligned_alloc(64, total) : NULL;
    if (!tmp || (total && !v->packed)) {
        free(tmp);
        free(m);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory repacking the vision tower (%zu bytes)", total);
    }
    char *at = v->packed;
    for (int i = 0; i < n; i++) {
        vt_weight *w = m[i];
        if (use_amx(w)) {
            kt_amx_pack_f16((uint16_t *)at, w->data, w->n_in, w->n_out);
            w->amx = (const uint16_t *)at;
            if (w->n_in > v->amx_k_max) v->amx_k_max = w->n_in;
            at += (kt_amx_packed_bytes(w->n_in, w->n_out) + 63) / 64 * 64;
            continue;
        }
        if (!kt_repack_supported(w->type, w->n_in, w->n_out)) continue;
        size_t bytes = kt_dtype_row_bytes(w->type, w->n_in) * (size_t)w->n_out;
        memcpy(at, w->data, bytes);
        kt_repack(at, w->type, w->n_in, w->n_out, tmp);
        w->type = kt_repack_type(w->type, w->n_in, w->n_out);
        w->data = at;
        at += (bytes + 63) / 64 * 64;
    }
    for (int k = 0; k < 2 && patch_amx; k++) {
        kt_amx_pack_f16((uint16_t *)at, v->patch_w16[k], patch_in, v->width);
        v->patch_amx[k] = (const uint16_t *)at;
        at += (kt_amx_packed_bytes(patch_in, v->width) + 63) / 64 * 64;
    }
    if (patch_amx && patch_in > v->amx_k_max) v->amx_k_max = patch_in;
    v->patch_type = kt_repack_type(KT_F16, patch_in, v->width);
    for (int k = 0; k < 2 && v->patch_type != KT_F16; k++)
        kt_repack(v->patch_w16[k], KT_F16, patch_in, v->width, tmp);
    free(tmp);
    free(m);
    return KT_OK;
}

static void fill_info(kt_vision *v) {
    v->info.n_embd = v->proj_dim;
    v->info.n_layers = v->n_layers;
    v->info.width = v->width;
    v->info.n_heads = v->n_heads;
    int64_t n = 0;
    for (int64_t i = 0; i < gguf_n_tensors(v->file); i++) {
        const gguf_tensor *t = gguf_tensor_at(v->file, i);
        int64_t e = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) e *= t->dims[d];
        n += e;
    }
    v->info.n_params = n;
}

kt_vision *kt_vision_load(const char *mmproj_path, kt_error *err) {
    kt_vision *v = calloc(1, sizeof *v);
    if (!v) {
        kt_error_set(err, KT_ERR_NOMEM, "out of memory loading %s", mmproj_path);
        return NULL;
    }
    v->file = gguf_open(mmproj_path, err);
    if (!v->file) {
        free(v);
        return NULL;
    }
    kt_status st;
    if ((st = read_projector(v, err)) || (st = read_hparams(v, err)) || (st = load_tensors(v, err)) ||
        (st = repack_matrices(v, err))) {
        kt_error_wrap(err, "%s", mmproj_path);
        kt_vision_free(v);
        return NULL;
    }
    fill_info(v);
    return v;
}

void kt_vision_free(kt_vision *v) {
    if (!v) return;
    free(v->patch_w16[0]);
    free(v->patch_w16[1]);
    free(v->layers);
    free(v->packed);
    gguf_close(v->file);
    free(v);
}

const kt_vision_info *kt_vision_get_info(const kt_vision *v) { return &v->info; }

bool kt_vision_uses_amx(const kt_vision *v) { return v->amx_k_max > 0; }

kt_status kt_vision_check_text(const kt_vision_info *vi, const char *arch, int n_embd, int n_deepstack,
                               kt_error *err) {
    if (vi->n_embd != n_embd)
        return kt_error_set(err, KT_ERR_ARG, "the vision tower's images are %d wide and the model's embeddings %d: "
                            "the projector is for another model", vi->n_embd, n_embd);
    if (vi->n_deepstack && strncmp(arch, "qwen3vl", 7))
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "the vision tower has %d DeepStack outputs (Qwen3-VL's), which "
                            "only a qwen3vl or qwen3vlmoe text model takes; the model is %s: the projector is for "
                            "another model", vi->n_deepstack, arch);
    if (vi->n_deepstack != n_deepstack)
        return kt_error_set(err, KT_ERR_ARG, "the vision tower has %d DeepStack outputs and the model (%s) has %d "
                            "DeepStack layers (%s.n_deepstack_layers): the projector is for another model",
                            vi->n_deepstack, arch, n_deepstack, arch);
    return KT_OK;
}

/* clip.cpp's set_limit_image_tokens(8, 4096) for the Qwen-VL projectors:
 * 8 to 4096 merged tokens, each (patch x merge)^2 pixels. */
void kt_vision_prep_params(const kt_vision *v, kt_image_prep_params *p) {
    memset(p, 0, sizeof *p);
    p->patch_size = v->patch;
    p->merge_size = v->merge;
    int64_t area = (int64_t)v->patch * v->patch * v->merge * v->merge;
    p->min_pixels = 8 * area;
    p->max_pixels = 4096 * area;
    for (int c = 0; c < 3; c++) {
        p->mean[c] = v->mean[c];
        p->std[c] = v->std[c];
    }
}
