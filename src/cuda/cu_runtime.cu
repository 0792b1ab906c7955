/*
 * cu_runtime.cu - the CUDA runtime calls the C side needs: versions,
 * devices, memory, synchronization (cuda_launch.h). Each returns the
 * cudaError_t as an int; cuda_host.c turns it into a message.
 */
#include <cuda_runtime.h>
#include <string.h>

#include "cuda/cuda_launch.h"

/* a kernel whose image tells whether this binary runs on a device */
__global__ void kt_k_probe(int *p) {
    if (p) *p = 1;
}

const char *kt_cu_error_name(int e) { return cudaGetErrorName((cudaError_t)e); }
const char *kt_cu_error_string(int e) { return cudaGetErrorString((cudaError_t)e); }

int kt_cu_runtime_version(int *v) { return (int)cudaRuntimeGetVersion(v); }
int kt_cu_driver_version(int *v) { return (int)cudaDriverGetVersion(v); }
int kt_cu_device_count(int *n) { return (int)cudaGetDeviceCount(n); }

int kt_cu_device_props(int dev, char *name, size_t cap, int *major, int *minor, int *n_sm, size_t *total) {
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, dev);
    if (e != cudaSuccess) return (int)e;
    if (cap) {
        strncpy(name, p.name, cap - 1);
        name[cap - 1] = '\0';
    }
    *major = p.major;
    *minor = p.minor;
    *n_sm = p.multiProcessorCount;
    *total = p.totalGlobalMem;
    return 0;
}

/* Both below look at device dev and leave the current device as it was,
 * so the probe of a machine with several GPUs leaves GPU 0 current. */
int kt_cu_device_mem(int dev, size_t *free_bytes, size_t *total_bytes) {
    int prev = 0;
    cudaError_t e = cudaGetDevice(&prev);
    if (e == cudaSuccess) e = cudaSetDevice(dev);
    if (e != cudaSuccess) return (int)e;
    e = cudaMemGetInfo(free_bytes, total_bytes);
    cudaSetDevice(prev);
    return (int)e;
}

int kt_cu_kernel_image(int dev) {
    int prev = 0;
    cudaError_t e = cudaGetDevice(&prev);
    if (e == cudaSuccess) e = cudaSetDevice(dev);
    if (e != cudaSuccess) return (int)e;
    cudaFuncAttributes a;
    e = cudaFuncGetAttributes(&a, kt_k_probe);
    cudaSetDevice(prev);
    return (int)e;
}

int kt_cu_malloc(void **p, size_t bytes) { return (int)cudaMalloc(p, bytes); }
int kt_cu_free(void *p) { return (int)cudaFree(p); }
int kt_cu_to_device(void *dst, const void *src, size_t bytes) {
    return (int)cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
}
int kt_cu_to_host(void *dst, const void *src, size_t bytes) {
    return (int)cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
}
int kt_cu_sync(void) { return (int)cudaDeviceSynchronize(); }
