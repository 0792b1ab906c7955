/*
 * vocab.h - a model's vocabulary and its tokenizer (text <-> token ids).
 *
 * Loaded from GGUF `tokenizer.ggml.*` metadata or from a llama2.c
 * `tokenizer.bin`. This layer implements SentencePiece-style BPE
 * (`tokenizer.ggml.model` = "llama"): score-driven merges, byte fallback
 * (`<0xNN>` pieces), the leading-space prefix ("▁"), user-defined and
 * control tokens. Other tokenizer models load with KT_ERR_UNSUPPORTED.
 */
#ifndef KT_TEXT_VOCAB_H
#define KT_TEXT_VOCAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "kettle.h"

/* tokenizer.ggml.token_type values (GGUF / sentencepiece). */
typedef enum kt_token_type {
    KT_TOKEN_UNDEFINED = 0,
    KT_TOKEN_NORMAL = 1,
    KT_TOKEN_UNKNOWN = 2,
    KT_TOKEN_CONTROL = 3,
    KT_TOKEN_USER_DEFINED = 4,
    KT_TOKEN_UNUSED = 5,
    KT_TOKEN_BYTE = 6
} kt_token_type;

typedef struct kt_vocab kt_vocab;

/* Reads and validates tokenizer.ggml.* (token count, scores, types, ids in
 * range, pieces valid UTF-8 except byte tokens). */
kt_vocab *kt_vocab_from_gguf(const gguf_file *f, kt_error *err);
/* llama2.c tokenizer.bin: int32 max_token_length, then n_vocab times
 * {float score, int32 len, bytes}. llama2.c's convention: 0 = <unk>,
 * 1 = <s> (BOS), 2 = </s> (EOS), 3..258 = <0x00>..<0xFF>.
 * Pieces are stored back in SentencePiece form (" " -> "▁", "\n<s>\n" ->
 * "<s>"), so the vocabulary equals the GGUF copy of the same model's.
 * The file must hold exactly n_vocab tokens; n_vocab <= 0 reads every
 * token up to the end of the file. */
kt_vocab *kt_vocab_from_llama2c(const char *path, int n_vocab, kt_error *err);
void kt_vocab_free(kt_vocab *v);

int kt_vocab_size(const kt_vocab *v);
int kt_vocab_bos(const kt_vocab *v); /* -1 if none */
int kt_vocab_eos(const kt_vocab *v); /* -1 if none */
bool kt_vocab_add_bos(const kt_vocab *v); /* the model's default */
int kt_vocab_unk(const kt_vocab *v); /* -1 if none */
int kt_vocab_pad(const kt_vocab *v); /* -1 if none */
/* The model's rule for appending EOS (kt_vocab_encode never does: a caller
 * that wants it appends kt_vocab_eos()). */
bool kt_vocab_add_eos(const kt_vocab *v);
/* Whether text is prefixed with "▁" before encoding (default true). */
bool kt_vocab_add_space_prefix(const kt_vocab *v);
/* The id whose stored piece is exactly s[0..len) (any type), or -1. */
int32_t kt_vocab_find(const kt_vocab *v, const char *s, size_t len);
/* The raw piece as stored (e.g. "▁the", "<0x0A>"), not NUL-terminated
 * (though a NUL does follow it); NULL and *len 0 for an invalid id. */
const char *kt_vocab_piece(const kt_vocab *v, int32_t id, size_t *len);
float kt_vocab_score(const kt_vocab *v, int32_t id);
kt_token_type kt_vocab_type(const kt_vocab *v, int32_t id);

/* Encodes UTF-8 text. Writes at most cap ids; returns the number of ids the
 * text needs (call again with a bigger buffer if > cap), or -1 with err set
 * (e.g. invalid UTF-8). Control tokens written in the text ("<s>") are NOT
 * matched: they are tokenized as plain text, so user text cannot inject
 * them.
 *
 * The algorithm is llama.cpp's llm_tokenizer_spm: user-defined tokens are
 * split out of the text first (longest first, leftmost); each remaining
 * fragment gets a "▁" prefix when add_space_prefix and it is the first
 * fragment or follows a user-defined token, has ' ' replaced by "▁", and is
 * merged pairwise from UTF-8 characters, always the adjacent pair whose
 * concatenation is a token with the highest score (ties: leftmost).
 * Control, unknown and byte tokens never take part in merges. A leftover
 * piece that is not a token becomes its bytes' <0xNN> tokens, or one unk
 * if some byte has no token (-1 with err set if there is no unk either).
 * add_bos on a vocabulary without BOS is KT_ERR_ARG. Thread-safe: the
 * vocabulary is only read. */
int kt_vocab_encode(const kt_vocab *v, const char *text, size_t len,
                    bool add_bos, int32_t *ids, int cap, kt_error *err);

/* The bytes token id stands for in decoded text: "▁" becomes " ", byte
 * tokens become their byte, control tokens become "" . Writes at most cap
 * bytes into buf and returns the length the piece needs. Unknown and
 * user-defined tokens give their piece as is; unused and undefined ones,
 * like control tokens, give "" (as llama.cpp); an invalid id gives 0. buf
 * is not NUL-terminated. */
int kt_vocab_decode_piece(const kt_vocab *v, int32_t id, char *buf, int cap);

/* Writes the vocabulary into a GGUF writer as tokenizer.ggml.* keys (used by
 * convert and gen-model): model "llama", tokens, scores, token_type, the
 * bos/eos/unknown/padding ids that exist, add_bos_token, add_eos_token and
 * add_space_prefix. */
kt_status kt_vocab_write_gguf(const kt_vocab *v, gguf_writer *w, kt_error *err);

#endif
