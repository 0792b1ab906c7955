/*
 * cuda_host.c - the C side of kt_cuda.h: the device probe, device memory
 * and the kernels' wrappers. Every argument is checked here, before a
 * launch, and every CUDA error becomes a kt_status with a message that
 * says what failed and what to do; the .cu files only launch
 * (cuda_launch.h). Without CUDA in the build (cuda_none.c's stubs) every
 * call fails with KT_ERR_UNSUPPORTED saying how to get it.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "cuda/cuda_launch.h"
#include "cuda/kt_cuda.h"

/* cudaError_t values (part of the runtime's ABI) the messages tell apart */
enum {
    CU_OOM = 2,              /* cudaErrorMemoryAllocation */
    CU_OLD_DRIVER = 35,      /* cudaErrorInsufficientDriver */
    CU_NO_DEVICE = 100,      /* cudaErrorNoDevice */
    CU_NO_IMAGE = 209,       /* cudaErrorNoKernelImageForDevice */
    CU_NOT_BUILT = -1        /* cuda_none.c: this build has no CUDA */
};

#ifdef KT_HAVE_CUDA
static const bool kt_cuda_in_build = true;
static const char *const kt_cuda_archs = KT_CUDA_ARCHS;
static const int kt_cuda_arch_min = KT_CUDA_ARCH_MIN; /* 0: unknown (native, all) */
#else
static const bool kt_cuda_in_build = false;
static const char *const kt_cuda_archs = "";
static const int kt_cuda_arch_min = 0;
#endif

#define KT_NO_CUDA_MSG                                                                                           \
    "this kettle was built without the CUDA backend (nvcc was not found when it was configured, or "          \
    "-DKETTLE_CUDA=OFF): install the CUDA toolkit and rebuild (README, \"Building with CUDA\")"

static kt_status no_cuda(kt_error *err) { return kt_error_set(err, KT_ERR_UNSUPPORTED, KT_NO_CUDA_MSG); }

/* A failed CUDA call: what, the runtime's name and text for e, a hint. */
static kt_status cu_fail(kt_error *err, int e, const char *what) {
    if (e == CU_NOT_BUILT) return no_cuda(err);
    const char *hint = "";
    kt_status st = KT_ERR_INTERNAL;
    if (e == CU_OOM) {
        hint = ": the GPU's memory is full; free it (nvidia-smi shows who holds it) or put less on the GPU";
        st = KT_ERR_NOMEM;
    } else if (e == CU_NO_IMAGE) {
        hint = ": this build has no code for the GPU; rebuild with -DCMAKE_CUDA_ARCHITECTURES set to its "
               "compute capability (kettle devices shows it)";
        st = KT_ERR_UNSUPPORTED;
    }
    return kt_error_set(err, st, "CUDA: %s failed: %s (%s)%s", what, kt_cu_error_name(e), kt_cu_error_string(e),
                        hint);
}

/* ---- the probe ------------------------------------------------------ */

/* A probe that fails says "no usable GPU" whatever the CUDA error was. */
static kt_status probe_fail(kt_error *err, int e, const char *what) {
    cu_fail(err, e, what);
    if (err) err->status = KT_ERR_UNSUPPORTED;
    return KT_ERR_UNSUPPORTED;
}

static void version_str(char *buf, size_t cap, int v) { snprintf(buf, cap, "%d.%d", v / 1000, (v % 1000) / 10); }

kt_status kt_cuda_probe(kt_cuda_info *info, kt_error *err) {
    memset(info, 0, sizeof *info);
    info->archs = kt_cuda_archs;
    if (!kt_cuda_in_build) return no_cuda(err);
    info->built = true;
    kt_cu_runtime_version(&info->runtime_version);
    char rt[16];
    version_str(rt, sizeof rt, info->runtime_version);
    /* the static runtime loads the driver library at its first call; look
     * first, so its absence is named as such */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        return kt_error_set(err, KT_ERR_UNSUPPORTED,
                            "no NVIDIA driver: libcuda.so.1 could not be loaded (%s). Install the NVIDIA driver "
                            "(this build's CUDA %s runtime needs one for CUDA %s or newer); in a container, start "
                            "it with the GPU passed through (docker run --gpus all)",
                            why ? why : "not found", rt, rt);
    }
    dlclose(h);
    kt_cu_driver_version(&info->driver_version);
    char drv[16];
    version_str(drv, sizeof drv, info->driver_version);
    int n = 0;
    const int e = kt_cu_device_count(&n);
    if (e == CU_OLD_DRIVER)
        return kt_error_set(err, KT_ERR_UNSUPPORTED,
                            "the NVIDIA driver is too old: it supports CUDA %s, this build's runtime is CUDA %s "
                            "(cudaErrorInsufficientDriver); update the driver",
                            drv, rt);
    if (e == CU_NO_DEVICE || (e == 0 && n == 0)) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        return kt_error_set(err, KT_ERR_UNSUPPORTED,
                            "no CUDA device: the NVIDIA driver (CUDA %s) is loaded but sees no GPU; check "
                            "nvidia-smi%s%s%s",
                            drv, vis ? " and CUDA_VISIBLE_DEVICES (now '" : "", vis ? vis : "", vis ? "')" : "");
    }
    if (e != 0) return probe_fail(err, e, "listing the devices (cudaGetDeviceCount)");
    info->n_devices = n;
    for (int i = 0; i < n && i < KT_CUDA_MAX_DEVICES; i++) {
        kt_cuda_device *d = &info->dev[i];
        int pe = kt_cu_device_props(i, d->name, sizeof d->name, &d->cc_major, &d->cc_minor, &d->n_sm,
                                    &d->mem_total_bytes);
        if (pe != 0) {
            char what[64];
            snprintf(what, sizeof what, "reading GPU %d's properties", i);
            return probe_fail(err, pe, what);
        }
        size_t total = 0;
        if (kt_cu_device_mem(i, &d->mem_free_bytes, &total) != 0) d->mem_free_bytes = 0;
        const int cc = d->cc_major * 10 + d->cc_minor;
        d->usable = cc >= kt_cuda_arch_min && kt_cu_kernel_image(i) == 0;
    }
    const kt_cuda_device *d0 = &info->dev[0];
    if (!d0->usable) {
        const int cc = d0->cc_major * 10 + d0->cc_minor;
        return kt_error_set(err, KT_ERR_UNSUPPORTED,
                            "GPU 0 (%s) is compute capability %d.%d and this build has code for CUDA "
                            "architectures %s only%s: rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d",
                            d0->name, d0->cc_major, d0->cc_minor, kt_cuda_archs,
                            cc < kt_cuda_arch_min ? ", which are newer" : "", cc);
    }
    return KT_OK;
}

/* ---- memory --------------------------------------------------------- */

kt_status kt_cuda_alloc(kt_cuda_buf *b, size_t bytes, const char *what, kt_error *err) {
    b->ptr = NULL;
    b->bytes = 0;
    if (bytes == 0) return kt_error_set(err, KT_ERR_ARG, "CUDA: allocating 0 bytes for %s", what);
    const int e = kt_cu_malloc(&b->ptr, bytes);
    if (e != 0) {
        b->ptr = NULL;
        char msg[160];
        snprintf(msg, sizeof msg, "allocating %zu bytes (%.1f MiB) of GPU memory for %s", bytes,
                 (double)bytes / (1024.0 * 1024.0), what);
        return cu_fail(err, e, msg);
    }
    b->bytes = bytes;
    return KT_OK;
}

void kt_cuda_free(kt_cuda_buf *b) {
    if (b && b->ptr) kt_cu_free(b->ptr); /* an error here can only be a sticky one, reported by the next call */
    if (b) {
        b->ptr = NULL;
        b->bytes = 0;
    }
}

kt_status kt_cuda_to_device(kt_cuda_buf *b, size_t off_bytes, const void *host, size_t bytes, kt_error *err) {
    if (!b->ptr || off_bytes > b->bytes || bytes > b->bytes - off_bytes)
        return kt_error_set(err, KT_ERR_ARG, "CUDA: copying %zu bytes to offset %zu of a %zu-byte buffer", bytes,
                            off_bytes, b->bytes);
    const int e = kt_cu_to_device((char *)b->ptr + off_bytes, host, bytes);
    return e ? cu_fail(err, e, "copying to the GPU (cudaMemcpy)") : KT_OK;
}

kt_status kt_cuda_to_host(void *host, const kt_cuda_buf *b, size_t off_bytes, size_t bytes, kt_error *err) {
    if (!b->ptr || off_bytes > b->bytes || bytes > b->bytes - off_bytes)
        return kt_error_set(err, KT_ERR_ARG, "CUDA: copying %zu bytes from offset %zu of a %zu-byte buffer", bytes,
                            off_bytes, b->bytes);
    const int e = kt_cu_to_host(host, (const char *)b->ptr + off_bytes, bytes);
    return e ? cu_fail(err, e, "copying from the GPU (cudaMemcpy)") : KT_OK;
}

bool kt_cuda_matmul_supported(kt_dtype wtype) {
    return wtype == KT_Q4_0 || wtype == KT_Q8_0 || wtype == KT_Q4_K || wtype == KT_Q5_K || wtype == KT_Q6_K ||
           wtype == KT_F16 || wtype == KT_BF16;
}

kt_status kt_cuda_upload_weight(kt_cuda_buf *b, const void *host, kt_dtype wtype, int n_in, int n_out,
                                const char *name, kt_error *err) {
    b->ptr = NULL;
    b->bytes = 0;
    if (!kt_cuda_matmul_supported(wtype))
        return kt_error_set(err, KT_ERR_UNSUPPORTED,
                            "tensor %s is %s: the CUDA backend reads Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, F16 and BF16 weights",
                            name,
                            kt_dtype_name(wtype) ? kt_dtype_name(wtype) : "an unknown type");
    const size_t row = n_in > 0 ? kt_dtype_row_bytes(wtype, n_in) : 0;
    if (row == 0 || n_out <= 0)
        return kt_error_set(err, KT_ERR_ARG, "tensor %s: %d x %d is not a whole number of %s blocks", name, n_out,
                            n_in, kt_dtype_name(wtype));
    if ((size_t)n_out > SIZE_MAX / row) return kt_error_set(err, KT_ERR_ARG, "tensor %s: size overflows", name);
    char what[160];
    snprintf(what, sizeof what, "tensor %s (%s, %d x %d)", name, kt_dtype_name(wtype), n_out, n_in);
    kt_status st = kt_cuda_alloc(b, row * (size_t)n_out, what, err);
    if (st != KT_OK) return st;
    st = kt_cuda_to_device(b, 0, host, b->bytes, err);
    if (st != KT_OK) {
        kt_cuda_free(b);
        return kt_error_wrap(err, "uploading %s", what);
    }
    return KT_OK;
}

kt_status kt_cuda_sync(kt_error *err) {
    const int e = kt_cu_sync();
    return e ? cu_fail(err, e, "a GPU kernel (found at cudaDeviceSynchronize)") : KT_OK;
}

/* ---- kernels -------------------------------------------------------- */

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

kt_status kt_cuda_matmul(float *out, const void *w, kt_dtype wtype, const float *x, int n_in, int n_out,
                         int n_tokens, kt_error *err) {
    if (!kt_cuda_in_build) return no_cuda(err);
    if (!kt_cuda_matmul_supported(wtype))
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "CUDA matmul: weights of type %s are not supported (Q4_0, "
                            "Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16 are)", kt_dtype_name(wtype) ? kt_dtype_name(wtype) : "?");
    const bool kquant = wtype == KT_Q4_K || wtype == KT_Q5_K || wtype == KT_Q6_K;
    const int block = wtype == KT_F16 || wtype == KT_BF16 ? 1 : kquant ? 256 : 32;
    if (!out || !w || !x || n_out <= 0 || n_in <= 0 || n_tokens < 1 || n_tokens > KT_CUDA_MAX_TOKENS ||
        n_in % block != 0 || !aligned16(x))
        return kt_error_set(err, KT_ERR_ARG,
                            "CUDA matmul: bad arguments (n_in %d, n_out %d, n_tokens %d: tokens 1..%d, n_in a "
                            "multiple of 32 for Q4_0 / Q8_0, of 256 for the K-quants, x 16-byte aligned)",
                            n_in, n_out, n_tokens, KT_CUDA_MAX_TOKENS);
    const int e = kt_cu_matmul(out, w, (int)wtype, x, n_in, n_out, n_tokens);
    return e ? cu_fail(err, e, "launching the matmul kernel") : KT_OK;
}

kt_status kt_cuda_rmsnorm(float *out, const float *x, const float *w, int n, int n_rows, float eps, kt_error *err) {
    if (!kt_cuda_in_build) return no_cuda(err);
    if (!out || !x || !w || n <= 0 || n_rows <= 0)
        return kt_error_set(err, KT_ERR_ARG, "CUDA rmsnorm: bad arguments (n %d, rows %d)", n, n_rows);
    const int e = kt_cu_rmsnorm(out, x, w, n, n_rows, eps);
    return e ? cu_fail(err, e, "launching the rmsnorm kernel") : KT_OK;
}

kt_status kt_cuda_rope(float *x, int n_tokens, size_t row_stride, int n_heads, int head_dim, int rope_dim,
                       const int32_t *pos, float freq_base, kt_rope_style style, kt_error *err) {
    if (!kt_cuda_in_build) return no_cuda(err);
    if (!x || !pos || n_tokens <= 0 || n_heads <= 0 || head_dim <= 0 || rope_dim < 0 ||
        row_stride < (size_t)n_heads * head_dim)
        return kt_error_set(err, KT_ERR_ARG, "CUDA rope: bad arguments (tokens %d, heads %d of %d, stride %zu)",
                            n_tokens, n_heads, head_dim, row_stride);
    const int n_pairs = kt_rope_pairs(head_dim, rope_dim);
    if (n_pairs == 0) return KT_OK;
    /* ops.c's rope_theta_scale, the same powf, so the angles are its bits */
    const float theta_scale = powf(freq_base, -2.0f / (float)(2 * n_pairs));
    const int e = kt_cu_rope(x, n_tokens, row_stride, n_heads, head_dim, n_pairs, pos, theta_scale,
                             style == KT_ROPE_NEOX);
    return e ? cu_fail(err, e, "launching the rope kernel") : KT_OK;
}

kt_status kt_cuda_swiglu(float *out, const float *gate, const float *up, int n, kt_error *err) {
    if (!kt_cuda_in_build) return no_cuda(err);
    if (!out || !gate || !up || n <= 0) return kt_error_set(err, KT_ERR_ARG, "CUDA swiglu: bad arguments (n %d)", n);
    const int e = kt_cu_swiglu(out, gate, up, n);
    return e ? cu_fail(err, e, "launching the swiglu kernel") : KT_OK;
}

kt_status kt_cuda_attn_decode(const kt_cuda_attn_args *a, kt_error *err) {
    if (!kt_cuda_in_build) return no_cuda(err);
    if (a->head_dim != 64 && a->head_dim != 128 && a->head_dim != 256)
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "CUDA attention: head_dim %d (64, 128 and 256 are supported)",
                            a->head_dim);
    if (a->n_head_kv <= 0 || a->n_head <= 0 || a->n_head % a->n_head_kv != 0 || a->n_head / a->n_head_kv > 8)
        return kt_error_set(err, KT_ERR_UNSUPPORTED,
                            "CUDA attention: %d query heads over %d KV heads (a whole group of at most 8 per KV "
                            "head is supported)",
                            a->n_head, a->n_head_kv);
    const size_t row_need = (size_t)a->n_head_kv * a->head_dim * 2;
    if (!a->out || !a->q || !a->k_plane || !a->v_plane || !a->meta_dev || a->n_tokens <= 0 || a->n_entries <= 0 ||
        a->block_tokens <= 0 || a->row_bytes < row_need || a->row_bytes % 16 || a->block_bytes % 16 ||
        a->block_bytes < a->row_bytes * (size_t)a->block_tokens || !aligned16(a->k_plane) ||
        !aligned16(a->v_plane) || a->q_stride < (size_t)a->n_head * a->head_dim ||
        a->out_stride < (size_t)a->n_head * a->head_dim)
        return kt_error_set(err, KT_ERR_ARG,
                            "CUDA attention: bad arguments (tokens %d, table entries %d, block of %d positions, "
                            "rows of %zu bytes in blocks of %zu: both multiples of 16, planes 16-byte aligned)",
                            a->n_tokens, a->n_entries, a->block_tokens, a->row_bytes, a->block_bytes);
    const int e = kt_cu_attn_decode(a->out, a->q, a->k_plane, a->v_plane, a->meta_dev, a->n_tokens, a->n_entries,
                                    a->n_head, a->n_head_kv, a->head_dim, a->block_tokens, a->q_stride,
                                    a->out_stride, a->row_bytes, a->block_bytes);
    return e ? cu_fail(err, e, "launching the decode attention kernel") : KT_OK;
}
