/*
 * vocab_impl.h - the inside of kt_vocab, shared by vocab.c (loading,
 * lookup, decoding, writing) and spm.c (encoding). Not part of the API.
 */
#ifndef KT_TEXT_VOCAB_IMPL_H
#define KT_TEXT_VOCAB_IMPL_H

#include "text/vocab.h"

struct kt_vocab {
    int n;                 /* tokens; ids are 0..n-1 */
    char *arena;           /* every piece, each followed by a NUL */
    size_t *off;           /* piece i starts at arena + off[i] */
    uint32_t *len;         /* its length in bytes (without the NUL) */
    float *score;
    uint8_t *type;         /* kt_token_type values, all in 0..6 */
    int32_t bos, eos, unk, pad;  /* -1 if none; else in [0, n) */
    bool add_bos, add_eos, add_space_prefix;

    /* Piece -> id: open addressing with linear probing over a power-of-two
     * table at most half full, so every probe sequence meets an empty slot.
     * A piece stored twice maps to its last id (as in llama.cpp). */
    int32_t *slot;         /* id, or -1 for an empty slot */
    uint64_t mask;         /* table size - 1 */
    uint32_t max_len;      /* longest piece, to skip hopeless lookups */

    int32_t byte_token[256]; /* id standing for each byte (<0xNN>), -1 if none */
    int32_t *user;         /* user-defined token ids, longest piece first */
    int n_user;

    /* Every pair of adjacent UTF-8 characters found inside a token that
     * merges may produce (see spm.c), packed as (char << 32 | char); open
     * addressing, at most half full, KT_SPM_NO_PAIR marks empty slots. */
    uint64_t *pairs;
    uint64_t pair_mask;
};

#define KT_SPM_NO_PAIR UINT64_MAX

/* Builds v->pairs once the pieces and types are final (spm.c). */
bool kt_spm_prepare(kt_vocab *v);

#endif
