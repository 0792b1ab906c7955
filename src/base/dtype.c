/*
 * dtype.c - the element type table; see dtype.h.
 */
#include "base/dtype.h"

#include <strings.h>

static const kt_dtype_info DTYPES[KT_DTYPE_COUNT] = {
    [KT_F32] = {"F32", 1, 4},
    [KT_F16] = {"F16", 1, 2},
    [KT_Q4_0] = {"Q4_0", 32, 18},
    [KT_Q4_1] = {"Q4_1", 32, 20},
    [KT_Q5_0] = {"Q5_0", 32, 22},
    [KT_Q5_1] = {"Q5_1", 32, 24},
    [KT_Q8_0] = {"Q8_0", 32, 34},
    [KT_Q8_1] = {"Q8_1", 32, 36},
    [KT_Q2_K] = {"Q2_K", 256, 84},
    [KT_Q3_K] = {"Q3_K", 256, 110},
    [KT_Q4_K] = {"Q4_K", 256, 144},
    [KT_Q5_K] = {"Q5_K", 256, 176},
    [KT_Q6_K] = {"Q6_K", 256, 210},
    [KT_Q8_K] = {"Q8_K", 256, 292},
    [KT_IQ4_NL] = {"IQ4_NL", 32, 18},
    [KT_IQ4_XS] = {"IQ4_XS", 256, 136},
    [KT_I8] = {"I8", 1, 1},
    [KT_I16] = {"I16", 1, 2},
    [KT_I32] = {"I32", 1, 4},
    [KT_I64] = {"I64", 1, 8},
    [KT_F64] = {"F64", 1, 8},
    [KT_BF16] = {"BF16", 1, 2},
    [KT_MXFP4] = {"MXFP4", 32, 17},
};

static const kt_dtype_info UNKNOWN = {NULL, 0, 0};
static const kt_dtype_info Q4_0_X8 = {"Q4_0x8", 32, 18}; /* per row: Q4_0's bytes */
static const kt_dtype_info Q4_K_X8 = {"Q4_Kx8", 256, 144}; /* per row: Q4_K's */
static const kt_dtype_info Q5_K_X8 = {"Q5_Kx8", 256, 176}; /* per row: Q5_K's */
static const kt_dtype_info Q6_K_X8 = {"Q6_Kx8", 256, 210}; /* per row: Q6_K's */
static const kt_dtype_info Q5_0_X8 = {"Q5_0x8", 32, 22}; /* per row: Q5_0's */
static const kt_dtype_info Q4_1_X8 = {"Q4_1x8", 32, 20}; /* per row: Q4_1's */
static const kt_dtype_info Q5_1_X8 = {"Q5_1x8", 32, 24}; /* per row: Q5_1's */
static const kt_dtype_info IQ4_NL_X8 = {"IQ4_NLx8", 32, 18}; /* per row: IQ4_NL's */
static const kt_dtype_info Q2_K_X8 = {"Q2_Kx8", 256, 84}; /* per row: Q2_K's */
static const kt_dtype_info Q3_K_X8 = {"Q3_Kx8", 256, 110}; /* per row: Q3_K's */
static const kt_dtype_info IQ4_XS_X8 = {"IQ4_XSx8", 256, 136}; /* per row: IQ4_XS's */
static const kt_dtype_info MXFP4_X8 = {"MXFP4x8", 32, 17}; /* per row: MXFP4's */
static const kt_dtype_info Q8_0_X8 = {"Q8_0x8", 32, 34}; /* per row: Q8_0's */
static const kt_dtype_info F32_X16 = {"F32x16", 1, 4};
static const kt_dtype_info F16_X16 = {"F16x16", 1, 2};
static const kt_dtype_info BF16_X16 = {"BF16x16", 1, 2};

bool kt_dtype_known(uint32_t id) {
    return id < KT_DTYPE_COUNT && DTYPES[id].name != NULL;
}

const kt_dtype_info *kt_dtype_get(uint32_t id) {
    if (id == KT_Q4_0_X8) return &Q4_0_X8;
    if (id == KT_Q4_K_X8) return &Q4_K_X8;
    if (id == KT_Q5_K_X8) return &Q5_K_X8;
    if (id == KT_Q6_K_X8) return &Q6_K_X8;
    if (id == KT_Q5_0_X8) return &Q5_0_X8;
    if (id == KT_Q4_1_X8) return &Q4_1_X8;
    if (id == KT_Q5_1_X8) return &Q5_1_X8;
    if (id == KT_IQ4_NL_X8) return &IQ4_NL_X8;
    if (id == KT_Q2_K_X8) return &Q2_K_X8;
    if (id == KT_Q3_K_X8) return &Q3_K_X8;
    if (id == KT_IQ4_XS_X8) return &IQ4_XS_X8;
    if (id == KT_MXFP4_X8) return &MXFP4_X8;
    if (id == KT_Q8_0_X8) return &Q8_0_X8;
    if (id == KT_F32_X16) return &F32_X16;
    if (id == KT_F16_X16) return &F16_X16;
    if (id == KT_BF16_X16) return &BF16_X16;
    return kt_dtype_known(id) ? &DTYPES[id] : &UNKNOWN;
}

const char *kt_dtype_name(uint32_t id) {
    const kt_dtype_info *d = kt_dtype_get(id);
    return d->name ? d->name : "unknown";
}

int kt_dtype_parse(const char *name) {
    for (int i = 0; i < KT_DTYPE_COUNT; i++)
        if (DTYPES[i].name && strcasecmp(DTYPES[i].name, name) == 0) return i;
    return -1;
}

size_t kt_dtype_row_bytes(kt_dtype t, int64_t n) {
    const kt_dtype_info *d = kt_dtype_get(t);
    if (!d->name || n < 0 || n % d->block_size) return 0;
    return (size_t)(n / d->block_size) * (size_t)d->block_bytes;
}
