/*
 * fp16.h - IEEE half and bfloat16 conversions (scalar, exact).
 *
 * These are the reference conversions every SIMD path is checked against:
 * fp32 -> fp16 rounds to nearest even (what F16C's vcvtps2ph with rounding
 * mode 0 does), fp32 -> bf16 keeps the top 16 bits rounded to nearest even
 * and keeps NaN a NaN.
 */
#ifndef KT_BASE_FP16_H
#define KT_BASE_FP16_H

#include <stdint.h>

float kt_fp16_to_fp32(uint16_t h);
uint16_t kt_fp32_to_fp16(float f);
float kt_bf16_to_fp32(uint16_t h);
uint16_t kt_fp32_to_bf16(float f);

#endif
