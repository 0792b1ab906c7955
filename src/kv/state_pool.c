/*
 * state_pool.c - per-sequence recurrent state slots (see state_pool.h).
 */
#include "kv/state_pool.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/huge.h"

struct kv_state_pool {
    int n_slots, n_free;
    size_t slot_bytes;
    uint8_t *mem;
    size_t mem_bytes;
    int *free_stack; /* n_free of them */
    uint8_t *used;   /* per slot */
    /* spares (kv_state_make_spares): per slot two buffers, buf[2 slot] in
     * mem and buf[2 slot + 1] in spare_mem; cur[slot] says which is the
     * slot's state. Without spares buf is NULL and a slot's state is in mem. */
    uint8_t *spare_mem;
    size_t spare_mem_bytes;
    uint8_t **buf;
    uint8_t *cur;
};

/* The slot's state, or with which = 1 its spare. */
static uint8_t *slot_buf(const kv_state_pool *sp, int slot, int which) {
    if (!sp->buf) return which ? NULL : sp->mem + sp->slot_bytes * (size_t)slot;
    return sp->buf[2 * (size_t)slot + (sp->cur[slot] ^ which)];
}

kv_state_pool *kv_state_pool_new(int n_slots, size_t slot_bytes, kt_error *err) {
    if (n_slots < 1 || slot_bytes == 0 || slot_bytes % sizeof(float)) {
        kt_error_set(err, KT_ERR_ARG, "state pool: %d slots of %zu bytes (give >= 1 slot of whole floats)", n_slots,
                     slot_bytes);
        return NULL;
    }
    if (slot_bytes > SIZE_MAX / (size_t)n_slots) {
        kt_error_set(err, KT_ERR_ARG, "state pool: %d slots of %zu bytes overflow the address space", n_slots, slot_bytes);
        return NULL;
    }
    kv_state_pool *sp = calloc(1, sizeof *sp);
    if (!sp) {
        kt_error_set(err, KT_ERR_NOMEM, "state pool: out of memory");
        return NULL;
    }
    sp->n_slots = sp->n_free = n_slots;
    sp->slot_bytes = slot_bytes;
    sp->mem = kt_huge_alloc(slot_bytes * (size_t)n_slots, &sp->mem_bytes);
    sp->free_stack = malloc(sizeof *sp->free_stack * (size_t)n_slots);
    sp->used = calloc((size_t)n_slots, 1);
    if (!sp->mem || !sp->free_stack || !sp->used) {
        kt_error_set(err, KT_ERR_NOMEM,
                     "the recurrent state of %d sequences needs %.1f MiB (%.2f MiB each) and that memory is not "
                     "there: lower --parallel",
                     n_slots, (double)slot_bytes * n_slots / 1048576.0, (double)slot_bytes / 1048576.0);
        kv_state_pool_free(sp);
        return NULL;
    }
    for (int i = 0; i < n_slots; i++) sp->free_stack[i] = n_slots - 1 - i; /* slot 0 first */
    return sp;
}

void kv_state_pool_free(kv_state_pool *sp) {
    if (!sp) return;
    if (sp->mem) kt_huge_free(sp->mem, sp->mem_bytes);
    if (sp->spare_mem) kt_huge_free(sp->spare_mem, sp->spare_mem_bytes);
    free(sp->buf), free(sp->cur);
    free(sp->free_stack);
    free(sp->used);
    free(sp);
}

int kv_state_n_slots(const kv_state_pool *sp) { return sp->n_slots; }
int kv_state_n_free(const kv_state_pool *sp) { return sp->n_free; }
size_t kv_state_slot_bytes(const kv_state_pool *sp) { return sp->slot_bytes; }

int kv_state_alloc(kv_state_pool *sp, kt_error *err) {
    if (sp->n_free == 0) {
        kt_error_set(err, KT_ERR_NOMEM,
                     "no recurrent-state slot is free: all %d are held by running sequences (the pool was made for "
                     "%d sequences at once: raise --parallel)", sp->n_slots, sp->n_slots);
        return -1;
    }
    const int s = sp->free_stack[--sp->n_free];
    sp->used[s] = 1;
    kv_state_zero(sp, s);
    return s;
}

void kv_state_release(kv_state_pool *sp, int slot) {
    if (slot < 0 || slot >= sp->n_slots || !sp->used[slot]) return;
    sp->used[slot] = 0;
    sp->free_stack[sp->n_free++] = slot;
}

float *kv_state_data(const kv_state_pool *sp, int slot) { return (float *)(void *)slot_buf(sp, slot, 0); }

void kv_state_zero(kv_state_pool *sp, int slot) { memset(slot_buf(sp, slot, 0), 0, sp->slot_bytes); }

void kv_state_copy(kv_state_pool *sp, int dst, int src) {
    if (dst != src) memcpy(slot_buf(sp, dst, 0), slot_buf(sp, src, 0), sp->slot_bytes);
}

kt_status kv_state_make_spares(kv_state_pool *sp, kt_error *err) {
    if (sp->buf) return KT_OK;
    const size_t n = (size_t)sp->n_slots;
    sp->spare_mem = kt_huge_alloc(sp->slot_bytes * n, &sp->spare_mem_bytes);
    sp->buf = malloc(sizeof *sp->buf * 2 * n);
    sp->cur = calloc(n, 1);
    if (!sp->spare_mem || !sp->buf || !sp->cur) {
        if (sp->spare_mem) kt_huge_free(sp->spare_mem, sp->spare_mem_bytes);
        free(sp->buf), free(sp->cur);
        sp->spare_mem = NULL, sp->buf = NULL, sp->cur = NULL;
        return kt_error_set(err, KT_ERR_NOMEM,
                            "speculation on a hybrid model keeps a second recurrent state per sequence: %.1f MiB "
                            "for %d sequences is not there (lower --parallel or turn --spec off)",
                            (double)sp->slot_bytes * (double)n / 1048576.0, sp->n_slots);
    }
    /* faulted in now: a first verify pass must not pay for its pages */
    memset(sp->spare_mem, 0, sp->slot_bytes * n);
    for (size_t i = 0; i < n; i++) {
        sp->buf[2 * i] = sp->mem + sp->slot_bytes * i;
        sp->buf[2 * i + 1] = sp->spare_mem + sp->slot_bytes * i;
    }
    return KT_OK;
}

float *kv_state_spare(const kv_state_pool *sp, int slot) { return (float *)(void *)slot_buf(sp, slot, 1); }

void kv_state_flip(kv_state_pool *sp, int slot) {
    if (sp->buf) sp->cur[slot] ^= 1;
}
