/*
 * resize.h - Pillow-compatible bicubic resampling of 8-bit RGB (resize.c).
 */
#ifndef KT_IMAGE_RESIZE_H
#define KT_IMAGE_RESIZE_H

#include <stdint.h>

#include "kettle.h"

/* src (src_w x src_h, RGB) resized to dst (dst_w x dst_h, RGB, the
 * caller's buffer) as Pillow's Image.resize(..., BICUBIC) does it, bit for
 * bit. KT_ERR_NOMEM if the filter tables cannot be allocated. */
kt_status kt_image_resize_bicubic(const uint8_t *src, int src_w, int src_h, uint8_t *dst, int dst_w, int dst_h,
                                  kt_error *err);

#endif
