/*
 * vocab_impl.h - the inside of kt_vocab, shared by vocab.c (loading,
 * lookup, decoding, writing), encode.c (the entry point and special-token
 * splitting), spm.c, bpe.c ("gpt2" and "gemma4") and wpm.c (the encoders).
 * Not part of the API.
 */
#ifndef KT_TEXT_VOCAB_IMPL_H
#define KT_TEXT_VOCAB_IMPL_H

#include "text/pretok.h"
#include "text/vocab.h"

/* A byte-level BPE merge "left right": its rank (index in
 * tokenizer.ggml.merges) and the token of left+right (-1 if none). */
typedef struct kt_bpe_merge {
    uint64_t key;          /* left id << 32 | right id; KT_BPE_NO_MERGE: empty */
    int32_t rank, id;
} kt_bpe_merge;

#define KT_BPE_NO_MERGE UINT64_MAX

struct kt_vocab {
    kt_vocab_kind kind;
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
    /* Tokens matched in text as a whole (llama.cpp's special token cache):
     * user-defined ones always, control and unknown ones only when the
     * caller asks to parse specials. Longest piece first. */
    int32_t *special;
    int n_special;

    /* SPM: every pair of adjacent UTF-8 characters found inside a token
     * that merges may produce (see spm.c), packed as (char << 32 | char);
     * open addressing, at most half full, KT_SPM_NO_PAIR marks empty. */
    uint64_t *pairs;
    uint64_t pair_mask;

    /* Byte-level BPE and Gemma 4's (bpe.c). */
    kt_pretok *pretok;       /* "gpt2" only; "gemma4" splits at newlines */
    bool ignore_merges;      /* a word that is a token is taken whole */
    kt_bpe_merge *merges;    /* open addressing, at most half full */
    uint64_t merge_mask;
    /* The token byte b starts a word as: "gpt2" the token of its GPT-2
     * character; "gemma4" (ASCII b only) the token of b, "▁" for ' '.
     * -1 if none. */
    int32_t bpe_char_tok[256];
    /* The token byte b falls back to: "gpt2" the token whose piece is b
     * itself, "gemma4" "<0xNN>". -1 if none (the byte is dropped). */
    int32_t bpe_raw_tok[256];
};

#define KT_SPM_NO_PAIR UINT64_MAX

/* Builds v->pairs once the pieces and types are final (spm.c). */
bool kt_spm_prepare(kt_vocab *v);

/* Builds the merge table from tokenizer.ggml.merges (index idx) once the
 * pieces and the piece table are final (bpe.c). */
kt_status kt_bpe_prepare(kt_vocab *v, const gguf_file *f, int64_t idx, kt_error *err);

/* GPT-2's byte <-> character table: writes the UTF-8 of the character
 * byte b stands for into out (1 or 2 bytes, returned); the byte a code
 * point stands for, or -1 if none. */
int kt_bpe_byte_char(uint8_t b, char out[2]);
int kt_bpe_char_byte(uint32_t cp);

/* ---- encoding (encode.c drives, spm.c / bpe.c encode raw text) ---------- */

/* A piece of the input: raw text to encode, or a token matched whole. */
typedef struct kt_frag {
    size_t off, len;
    int32_t id; /* -1: raw text */
} kt_frag;

/* Where ids go: the first cap are stored, all are counted. */
typedef struct kt_ids_out {
    int32_t *ids;
    int cap;
    size_t n;
} kt_ids_out;

static inline void kt_ids_emit(kt_ids_out *o, int32_t id) {
    if (o->n < (size_t)o->cap) o->ids[o->n] = id;
    o->n++;
}

kt_status kt_spm_encode_frags(const kt_vocab *v, const char *text, const kt_frag *fr,
                              size_t n_frag, kt_ids_out *o, kt_error *err);
kt_status kt_bpe_encode_frags(const kt_vocab *v, const char *text, const kt_frag *fr,
                              size_t n_frag, kt_ids_out *o, kt_error *err);
kt_status kt_wpm_encode_frags(const kt_vocab *v, const char *text, const kt_frag *fr,
                              size_t n_frag, kt_ids_out *o, kt_error *err);

#endif
