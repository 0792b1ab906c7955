/*
 * bench_screens.c - the synthetic desktop screenshots of `kettle bench
 * agent --screenshots`, and their PNG encoding (libpng, written to memory).
 * See bench_screens.h.
 *
 * Everything is drawn with filled rectangles on a w x h RGB canvas, sized
 * from the screen's height so 320x200 and 1920x1080 show the same desktop:
 * a wallpaper, desktop icons, one application window (title bar, menu bar,
 * a row of buttons, rows of text-like dark blocks), a taskbar with a clock
 * and the pointer. What a step changes is chosen by its own generator, what
 * stays (the words of a row, the colours) by the session's, so a row of
 * text looks the same in every step that shows it.
 */
#include <png.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_screens.h"

#define N_BUTTONS 5
#define FIRST_ROWS 3 /* rows of text on the first screen; one more each step */

typedef struct canvas {
    uint8_t *p;
    int w, h;
    int unit; /* the size of the smallest detail: ~h/120, at least 1 pixel */
} canvas;

typedef struct rgb {
    uint8_t r, g, b;
} rgb;

/* splitmix64: small, good enough for layout, the same everywhere. */
static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int next_in(uint64_t *s, int lo, int hi) { /* lo .. hi inclusive */
    return lo + (int)(next_u64(s) % (uint64_t)(hi - lo + 1));
}

static uint64_t stream_of(uint64_t seed, uint64_t what, uint64_t index) {
    uint64_t s = seed ^ (what * 0xD1B54A32D192ED03ull) ^ (index * 0x8CB92BA72F3D8DD7ull);
    next_u64(&s);
    return s;
}

/* Clipped to the canvas: parts of the desktop may run off a small screen. */
static void fill(canvas *c, int x, int y, int w, int h, rgb col) {
    int x0 = x < 0 ? 0 : x, y0 = y < 0 ? 0 : y;
    int x1 = x + w > c->w ? c->w : x + w, y1 = y + h > c->h ? c->h : y + h;
    for (int yy = y0; yy < y1; yy++)
        for (int xx = x0; xx < x1; xx++) {
            uint8_t *px = c->p + ((size_t)yy * (size_t)c->w + (size_t)xx) * 3;
            px[0] = col.r, px[1] = col.g, px[2] = col.b;
        }
}

static void frame(canvas *c, int x, int y, int w, int h, rgb col) {
    fill(c, x, y, w, 1, col), fill(c, x, y + h - 1, w, 1, col);
    fill(c, x, y, 1, h, col), fill(c, x + w - 1, y, 1, h, col);
}

/* A vertical gradient between two colours of the session. */
static void wallpaper(canvas *c, uint64_t *rs) {
    rgb a = {(uint8_t)next_in(rs, 20, 90), (uint8_t)next_in(rs, 60, 130), (uint8_t)next_in(rs, 110, 190)};
    rgb b = {(uint8_t)(a.r / 3), (uint8_t)(a.g / 3), (uint8_t)(a.b / 2)};
    for (int y = 0; y < c->h; y++) {
        int t = c->h > 1 ? y * 255 / (c->h - 1) : 0;
        rgb col = {(uint8_t)((a.r * (255 - t) + b.r * t) / 255), (uint8_t)((a.g * (255 - t) + b.g * t) / 255),
                   (uint8_t)((a.b * (255 - t) + b.b * t) / 255)};
        fill(c, 0, y, c->w, 1, col);
    }
}

/* Dark blocks the size of words from x to x + width, one line high. */
static void text_line(canvas *c, int x, int y, int width, int height, rgb ink, uint64_t *rs) {
    for (int at = x; at < x + width;) {
        int word = next_in(rs, 2, 9) * c->unit;
        if (at + word > x + width) break;
        fill(c, at, y, word, height, ink);
        at += word + c->unit + c->unit / 2 + 1;
    }
}

static void desktop_icons(canvas *c) {
    int s = 6 * c->unit;
    for (int i = 0; i < 4; i++) {
        int y = 3 * c->unit + i * (s + 5 * c->unit);
        fill(c, 3 * c->unit, y, s, s, (rgb){230, 200, 90});
        fill(c, 3 * c->unit, y + s + c->unit, s, c->unit, (rgb){240, 240, 240});
    }
}

/* Bottom strip: start button, open applications, a clock that ticks each step. */
static void taskbar(canvas *c, int step) {
    int th = 8 * c->unit, y = c->h - th;
    fill(c, 0, y, c->w, th, (rgb){32, 34, 40});
    fill(c, c->unit, y + c->unit, th - 2 * c->unit, th - 2 * c->unit, (rgb){0, 120, 215});
    for (int i = 0; i < 4; i++)
        fill(c, th + c->unit * (2 + 8 * i), y + 2 * c->unit, 6 * c->unit, th - 4 * c->unit,
             i == 1 ? (rgb){90, 150, 230} : (rgb){110, 110, 120});
    for (int d = 0; d < 4; d++) { /* four "digits": their heights spell the step */
        int digit = (step / (d == 3 ? 1 : d == 2 ? 10 : d == 1 ? 100 : 1000)) % 10;
        int hgt = (1 + digit) * (th - 4 * c->unit) / 10 + 1;
        fill(c, c->w - (5 - d) * 3 * c->unit, y + th - 2 * c->unit - hgt, 2 * c->unit, hgt, (rgb){230, 230, 230});
    }
}

typedef struct window_box {
    int x, y, w, h, title_h, menu_h, bar_h;
} window_box;

static window_box window_layout(const canvas *c) {
    window_box b = {.x = c->w * 18 / 100, .y = c->h * 6 / 100, .title_h = 5 * c->unit, .menu_h = 4 * c->unit,
                    .bar_h = 7 * c->unit};
    b.w = c->w * 92 / 100 - b.x;
    b.h = c->h - 8 * c->unit - 2 * c->unit - b.y;
    return b;
}

static void window_chrome(canvas *c, const window_box *b, uint64_t *rs) {
    fill(c, b->x + c->unit, b->y + c->unit, b->w, b->h, (rgb){20, 20, 30}); /* shadow */
    fill(c, b->x, b->y, b->w, b->h, (rgb){250, 250, 250});
    fill(c, b->x, b->y, b->w, b->title_h, (rgb){45, 85, 160});
    text_line(c, b->x + 2 * c->unit, b->y + c->unit + c->unit / 2, b->w / 3, 2 * c->unit, (rgb){235, 240, 250}, rs);
    static const rgb CTRL[3] = {{200, 200, 210}, {200, 200, 210}, {220, 60, 50}};
    for (int i = 0; i < 3; i++)
        fill(c, b->x + b->w - (3 - i) * 5 * c->unit, b->y + c->unit, 4 * c->unit, b->title_h - 2 * c->unit, CTRL[i]);
    int my = b->y + b->title_h;
    fill(c, b->x, my, b->w, b->menu_h, (rgb){236, 236, 236});
    for (int i = 0, x = b->x + 2 * c->unit; i < 5; i++) {
        int word = next_in(rs, 3, 6) * c->unit;
        fill(c, x, my + c->unit + c->unit / 2, word, c->unit + 1, (rgb){50, 50, 50});
        x += word + 3 * c->unit;
    }
}

/* The toolbar: one button highlighted, another each step. */
static void buttons(canvas *c, const window_box *b, int step) {
    int y = b->y + b->title_h + b->menu_h + c->unit, bw = 14 * c->unit, bh = b->bar_h - 2 * c->unit;
    for (int i = 0; i < N_BUTTONS; i++) {
        int x = b->x + 2 * c->unit + i * (bw + 2 * c->unit);
        bool lit = i == step % N_BUTTONS;
        fill(c, x, y, bw, bh, lit ? (rgb){0, 120, 215} : (rgb){225, 225, 228});
        frame(c, x, y, bw, bh, lit ? (rgb){0, 70, 140} : (rgb){160, 160, 165});
        fill(c, x + 3 * c->unit, y + bh / 2 - c->unit / 2, bw - 6 * c->unit, c->unit + 1,
             lit ? (rgb){255, 255, 255} : (rgb){60, 60, 60});
    }
}

/* FIRST_ROWS + step rows of text, each row's words its own (seed, row). */
static void text_rows(canvas *c, const window_box *b, uint64_t seed, int step) {
    int top = b->y + b->title_h + b->menu_h + b->bar_h + 2 * c->unit, row_h = 4 * c->unit;
    int fit = (b->y + b->h - 2 * c->unit - top) / row_h;
    int rows = FIRST_ROWS + step < fit ? FIRST_ROWS + step : fit;
    for (int r = 0; r < rows; r++) {
        uint64_t rs = stream_of(seed, 2, (uint64_t)r);
        int width = (b->w - 6 * c->unit) * next_in(&rs, 55, 100) / 100;
        rgb ink = r % 7 == 0 ? (rgb){20, 60, 150} : (rgb){40, 40, 45}; /* a heading now and then */
        text_line(c, b->x + 3 * c->unit, top + r * row_h, width, 2 * c->unit, ink, &rs);
    }
}

/* An arrow: a right triangle, black with a white edge, tip at (x, y). */
static void pointer(canvas *c, int x, int y) {
    int n = 5 * c->unit + 4;
    for (int i = 0; i < n; i++) {
        fill(c, x, y + i, i / 2 + 2, 1, (rgb){255, 255, 255});
        if (i > 1 && i < n - 1) fill(c, x + 1, y + i, i / 2, 1, (rgb){0, 0, 0});
    }
}

uint8_t *ba_screen_pixels(uint64_t seed, int step, int w, int h) {
    canvas c = {.p = malloc((size_t)w * (size_t)h * 3), .w = w, .h = h, .unit = h / 120 > 1 ? h / 120 : 1};
    if (!c.p) return NULL;
    uint64_t session = stream_of(seed, 1, 0), moment = stream_of(seed, 3, (uint64_t)step);
    wallpaper(&c, &session);
    desktop_icons(&c);
    window_box b = window_layout(&c);
    window_chrome(&c, &b, &session);
    buttons(&c, &b, step);
    text_rows(&c, &b, seed, step);
    taskbar(&c, step);
    pointer(&c, next_in(&moment, 0, w - 1), next_in(&moment, 0, h - 1));
    return c.p;
}

/* ---- PNG ---- */

typedef struct png_out {
    uint8_t *p;
    size_t len, cap;
    bool nomem;
} png_out;

static void on_write(png_structp png, png_bytep data, size_t n) {
    png_out *o = png_get_io_ptr(png);
    if (o->len + n > o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 65536;
        while (cap < o->len + n) cap *= 2;
        uint8_t *p = realloc(o->p, cap);
        if (!p) {
            o->nomem = true;
            png_error(png, "out of memory"); /* longjmps to write_png */
        }
        o->p = p, o->cap = cap;
    }
    memcpy(o->p + o->len, data, n);
    o->len += n;
}

static void on_flush(png_structp png) {
    (void)png;
}

/* libpng reports errors by longjmp: kept to this one function. */
static bool write_png(const uint8_t *rgb, int w, int h, png_out *o, char *err, size_t cap) {
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_write_struct(&png, NULL);
        snprintf(err, cap, "libpng: cannot create a writer (out of memory)");
        return false;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        snprintf(err, cap, "libpng failed to encode a %dx%d screenshot", w, h);
        return false;
    }
    png_set_write_fn(png, o, on_write, on_flush);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < h; y++) png_write_row(png, (png_const_bytep)(rgb + (size_t)y * (size_t)w * 3));
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    return true;
}

bool ba_screen_png(uint64_t seed, int step, int w, int h, uint8_t **png, size_t *n_bytes, char *err, size_t cap) {
    *png = NULL, *n_bytes = 0;
    uint8_t *rgb = ba_screen_pixels(seed, step, w, h);
    png_out o = {0};
    bool ok = rgb && write_png(rgb, w, h, &o, err, cap);
    if (!rgb || o.nomem) snprintf(err, cap, "out of memory making a %dx%d screenshot", w, h), ok = false;
    free(rgb);
    if (!ok) {
        free(o.p);
        return false;
    }
    *png = o.p, *n_bytes = o.len;
    return true;
}

/* ---- base64 ---- */

char *ba_base64(const uint8_t *bytes, size_t n) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
    if (!out) return NULL;
    size_t i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t)bytes[i] << 16 | (uint32_t)bytes[i + 1] << 8 | bytes[i + 2];
        *o++ = A[v >> 18], *o++ = A[(v >> 12) & 63], *o++ = A[(v >> 6) & 63], *o++ = A[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)bytes[i] << 16 | (i + 1 < n ? (uint32_t)bytes[i + 1] << 8 : 0);
        *o++ = A[v >> 18], *o++ = A[(v >> 12) & 63];
        *o++ = i + 1 < n ? A[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    *o = '\0';
    return out;
}
