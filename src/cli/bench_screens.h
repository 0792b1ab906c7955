/*
 * bench_screens.h - the synthetic screenshots of `kettle bench agent
 * --screenshots`: a desktop-like picture made in C and encoded as PNG,
 * the same bytes for the same seed and step on every run.
 *
 * A computer-use agent sends a new screenshot every step, and consecutive
 * screens differ a little: a line of text appears, a button lights up,
 * the pointer moves. That is what a vision encoder cache and a prefix
 * cache see in real use (every new screen is a miss, every old one in the
 * history should be a hit), so the pictures change the same way: step k
 * shows the window of step k-1 with one more row of "text" (dark blocks),
 * another button highlighted and the pointer elsewhere. Flat colours and
 * sharp edges, as real screenshots, so the PNG is of a realistic size.
 */
#ifndef KT_CLI_BENCH_SCREENS_H
#define KT_CLI_BENCH_SCREENS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The sizes --screen takes: wider or taller screens than 4K are not what
 * agents send, and below 160x120 nothing of the desktop fits. */
#define BA_SCREEN_MIN_W 160
#define BA_SCREEN_MIN_H 120
#define BA_SCREEN_MAX_W 3840
#define BA_SCREEN_MAX_H 2160

/* Step `step` (0-based) of the session seeded by `seed`: w x h RGB, row
 * major (w * h * 3 bytes, malloc'd). NULL if out of memory. */
uint8_t *ba_screen_pixels(uint64_t seed, int step, int w, int h);

/* The same picture as a PNG file in memory (*png malloc'd, *n_bytes its
 * size). False with err set if libpng fails or memory runs out. */
bool ba_screen_png(uint64_t seed, int step, int w, int h, uint8_t **png, size_t *n_bytes, char *err, size_t cap);

/* bytes as base64 (RFC 4648, with padding), NUL-terminated, malloc'd;
 * NULL if out of memory. The image_url parts' data: URLs carry it. */
char *ba_base64(const uint8_t *bytes, size_t n);

#endif
