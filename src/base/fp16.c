/*
 * fp16.c - scalar half/bfloat16 conversions; see fp16.h.
 */
#include "base/fp16.h"

#include <string.h>

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float kt_fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) /* inf / nan */
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign);
        /* subnormal: value = mant * 2^-24 exactly */
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t kt_fp32_to_fp16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u) /* inf or nan (nan stays quiet nan) */
        return sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 | ((abs >> 13) & 0x3ff) : 0);
    if (abs >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return sign | 0x7c00;
    if (abs < 0x38800000u) { /* below the smallest normal half (2^-14) */
        if (abs < 0x33000000u) return sign; /* < 2^-25 rounds to zero */
        /* subnormal half: shift the full mantissa, round to nearest even */
        uint32_t exp = abs >> 23;
        uint32_t mant = (abs & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - exp; /* 14 + 23 - 10 - (exp - 127) + ... */
        uint32_t q = mant >> (shift - 0);
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return sign | (uint16_t)q;
    }
    /* normal: rebias exponent, round mantissa 23 -> 10 bits, nearest even */
    uint32_t r = abs + 0xfffu + ((abs >> 13) & 1);
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

float kt_bf16_to_fp32(uint16_t h) {
    return bits_f32((uint32_t)h << 16);
}

uint16_t kt_fp32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* nan: keep it a (quiet) nan */
        return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}
