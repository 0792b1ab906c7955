/*
 * cuda_none.c - the launch functions of cuda_launch.h for a build without
 * CUDA (nvcc not found, -DKETTLE_CUDA=OFF, the sanitizer builds): each
 * fails with -1, which cuda_host.c reports as "built without the CUDA
 * backend". With CUDA the .cu files define them and this file is empty.
 */
#include "cuda/cuda_launch.h"

#ifndef KT_HAVE_CUDA
#define KT_NOT_BUILT -1

const char *kt_cu_error_name(int e) { return e == KT_NOT_BUILT ? "no CUDA in this build" : "?"; }
const char *kt_cu_error_string(int e) { return kt_cu_error_name(e); }
int kt_cu_runtime_version(int *v) { *v = 0; return KT_NOT_BUILT; }
int kt_cu_driver_version(int *v) { *v = 0; return KT_NOT_BUILT; }
int kt_cu_device_count(int *n) { *n = 0; return KT_NOT_BUILT; }
int kt_cu_device_props(int dev, char *name, size_t cap, int *major, int *minor, int *n_sm, size_t *total) {
    (void)dev, (void)name, (void)cap, (void)major, (void)minor, (void)n_sm, (void)total;
    return KT_NOT_BUILT;
}
int kt_cu_device_mem(int dev, size_t *free_bytes, size_t *total_bytes) {
    (void)dev, (void)free_bytes, (void)total_bytes;
    return KT_NOT_BUILT;
}
int kt_cu_kernel_image(int dev) { (void)dev; return KT_NOT_BUILT; }
int kt_cu_malloc(void **p, size_t bytes) { (void)bytes; *p = NULL; return KT_NOT_BUILT; }
int kt_cu_free(void *p) { (void)p; return KT_NOT_BUILT; }
int kt_cu_to_device(void *dst, const void *src, size_t bytes) { (void)dst, (void)src, (void)bytes; return KT_NOT_BUILT; }
int kt_cu_to_host(void *dst, const void *src, size_t bytes) { (void)dst, (void)src, (void)bytes; return KT_NOT_BUILT; }
int kt_cu_sync(void) { return KT_NOT_BUILT; }
int kt_cu_matmul(float *out, const void *w, int wtype, const float *x, int n_in, int n_out, int n_tokens) {
    (void)out, (void)w, (void)wtype, (void)x, (void)n_in, (void)n_out, (void)n_tokens;
    return KT_NOT_BUILT;
}
int kt_cu_rmsnorm(float *out, const float *x, const float *w, int n, int n_rows, float eps) {
    (void)out, (void)x, (void)w, (void)n, (void)n_rows, (void)eps;
    return KT_NOT_BUILT;
}
int kt_cu_rope(float *x, int n_tokens, size_t row_stride, int n_heads, int head_dim, int n_pairs,
               const int32_t *pos, float theta_scale, int neox) {
    (void)x, (void)n_tokens, (void)row_stride, (void)n_heads, (void)head_dim, (void)n_pairs, (void)pos,
        (void)theta_scale, (void)neox;
    return KT_NOT_BUILT;
}
int kt_cu_swiglu(float *out, const float *gate, const float *up, int n) {
    (void)out, (void)gate, (void)up, (void)n;
    return KT_NOT_BUILT;
}
int kt_cu_attn_decode(float *out, const float *q, const void *k_plane, const void *v_plane, const int32_t *meta,
                      int n_tokens, int n_entries, int n_head, int n_head_kv, int head_dim, int block_tokens,
                      size_t q_stride, size_t out_stride, size_t row_bytes, size_t block_bytes) {
    (void)out, (void)q, (void)k_plane, (void)v_plane, (void)meta, (void)n_tokens, (void)n_entries, (void)n_head,
        (void)n_head_kv, (void)head_dim, (void)block_tokens, (void)q_stride, (void)out_stride, (void)row_bytes,
        (void)block_bytes;
    return KT_NOT_BUILT;
}
#else
typedef int kt_cuda_none_empty; /* an empty file is not a translation unit in ISO C */
#endif
