/*
 * cuda_launch.h - what the .cu files export to the C side (cuda_host.c).
 *
 * Why a second header: the .cu files are compiled by nvcc as C++ and must
 * not depend on the C library's error helpers (kettle_cuda is a separate
 * static library, linked after kettle_lib). So each function here only
 * calls the runtime or launches a kernel and returns the cudaError_t as
 * an int (0: success); the C side checks arguments before and writes the
 * messages after. Arguments are trusted: kt_cuda.h's wrappers checked them.
 */
#ifndef KT_CUDA_CUDA_LAUNCH_H
#define KT_CUDA_CUDA_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* the runtime (cu_runtime.cu) */
const char *kt_cu_error_name(int e);
const char *kt_cu_error_string(int e);
int kt_cu_runtime_version(int *v);
int kt_cu_driver_version(int *v);
int kt_cu_device_count(int *n);
/* name (cap bytes), compute capability, multiprocessors, total memory */
int kt_cu_device_props(int dev, char *name, size_t cap, int *major, int *minor, int *n_sm, size_t *total);
/* makes dev current and reads its free memory */
int kt_cu_device_mem(int dev, size_t *free_bytes, size_t *total_bytes);
/* 0 when this binary holds code (SASS or PTX) that runs on dev */
int kt_cu_kernel_image(int dev);
int kt_cu_malloc(void **p, size_t bytes);
int kt_cu_free(void *p);
int kt_cu_to_device(void *dst, const void *src, size_t bytes);
int kt_cu_to_host(void *dst, const void *src, size_t bytes);
int kt_cu_sync(void);

/* the kernels: launched on the default stream; the result is the launch's */
int kt_cu_matmul(float *out, const void *w, int wtype, const float *x, int n_in, int n_out, int n_tokens);
int kt_cu_rmsnorm(float *out, const float *x, const float *w, int n, int n_rows, float eps);
int kt_cu_rope(float *x, int n_tokens, size_t row_stride, int n_heads, int head_dim, int n_pairs,
               const int32_t *pos, float theta_scale, int neox);
int kt_cu_swiglu(float *out, const float *gate, const float *up, int n);
int kt_cu_attn_decode(float *out, const float *q, const void *k_plane, const void *v_plane, const int32_t *meta,
                      int n_tokens, int n_entries, int n_head, int n_head_kv, int head_dim, int block_tokens,
                      size_t q_stride, size_t out_stride, size_t row_bytes, size_t block_bytes);

#ifdef __cplusplus
}
#endif

#endif
