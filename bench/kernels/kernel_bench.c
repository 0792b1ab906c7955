/*
 * kernel_bench.c - one-thread kt_matmul timings of the 4-bit table types
 * (MXFP4, IQ4_NL, Q4_0) on a 2880 x 2880 matrix (gpt-oss-20b's expert
 * width), plain and repacked (the x8 layout `--load repack` writes), for
 * 1 token (best of 200) and 64 tokens (best of 6). Random weights and
 * activations, seeded. docs/PERFORMANCE.md quotes it:
 *
 *   cc -O2 -std=c11 -Iinclude -Isrc bench/kernels/kernel_bench.c build/libkettle.a -lm -lpthread -o kernel_bench
 *   ./kernel_bench [MXFP4|IQ4_NL|Q4_0]
 */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ops/matmul.h"
#include "ops/quant.h"
#include "ops/repack.h"
static double now_ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
int main(int argc, char **argv) {
    const int n_in = 2880, n_out = 2880;
    const int nts[] = {1, 64};
    const kt_dtype types[] = {KT_MXFP4, KT_IQ4_NL, KT_Q4_0};
    float *row = malloc(sizeof(float) * n_in), *x = malloc(sizeof(float) * 64 * n_in), *out = malloc(sizeof(float) * 64 * n_out);
    srand(1);
    for (int i = 0; i < 64 * n_in; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int ti = 0; ti < 3; ti++) {
        if (argc > 1 && strcmp(argv[1], kt_dtype_name(types[ti]))) continue;
        size_t rb = kt_dtype_row_bytes(types[ti], n_in);
        char *w = malloc(rb * n_out), *p = malloc(rb * n_out), *tmp = malloc(kt_repack_tmp_bytes(types[ti], n_in));
        for (int r = 0; r < n_out; r++) {
            for (int i = 0; i < n_in; i++) row[i] = ((float)rand() / RAND_MAX - 0.5f) * 0.1f;
            kt_quantize_row(types[ti], row, w + rb * r, n_in);
        }
        memcpy(p, w, rb * n_out);
        kt_repack(p, types[ti], n_in, n_out, tmp);
        kt_dtype pt = kt_repack_type(types[ti], n_in, n_out);
        for (int k = 0; k < 2; k++) {
            int nt = nts[k], reps = nt == 1 ? 200 : 6;
            for (int packed = 0; packed < 2; packed++) {
                double best = 1e30;
                for (int rep = 0; rep < reps; rep++) {
                    double t0 = now_ms();
                    kt_matmul(NULL, out, packed ? p : w, packed ? pt : types[ti], x, n_in, n_out, nt);
                    double dt = now_ms() - t0;
                    best = dt < best ? dt : best;
                }
                printf("%-9s %2d tok: best %.3f ms  %.1f GB/s  %.1f GFLOP/s\n", kt_dtype_name(packed ? pt : types[ti]), nt, best,
                       rb * n_out / best / 1e6, 2.0 * n_in * n_out * nt / best / 1e6);
            }
        }
        free(w), free(p), free(tmp);
    }
    free(row), free(x), free(out);
    return 0;
}
