/*
 * vocab.h - a model's vocabulary and its tokenizer (text <-> token ids).
 *
 * Loaded from GGUF `tokenizer.ggml.*` metadata or from a llama2.c
 * `tokenizer.bin`. Four tokenizer models are implemented:
 * - SentencePiece-style BPE (`tokenizer.ggml.model` = "llama"): score-driven
 *   merges, byte fallback (`<0xNN>` pieces), the leading-space prefix
 *   ("▁"), user-defined and control tokens (spm.c);
 * - byte-level BPE (`tokenizer.ggml.model` = "gpt2"): regex pre-tokenizer
 *   named by `tokenizer.ggml.pre` (pretok.c), GPT-2's byte-to-unicode
 *   mapping, rank-ordered merges from `tokenizer.ggml.merges` (bpe.c).
 * - Gemma 4's (`tokenizer.ggml.model` = "gemma4"): the same rank-ordered
 *   merges, but over the UTF-8 characters of the text with " " written
 *   "▁" (SentencePiece's pieces), lines and runs of newlines as the only
 *   pre-split, and `<0xNN>` byte fallback (bpe.c).
 * - WordPiece (`tokenizer.ggml.model` = "bert"): llama.cpp's preprocessing
 *   (accents stripped, lowercase, punctuation split) and greedy
 *   longest-match (wpm.c).
 * Other tokenizer models load with KT_ERR_UNSUPPORTED.
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

typedef enum kt_vocab_kind {
    KT_VOCAB_SPM = 0, /* "llama": SentencePiece-style BPE */
    KT_VOCAB_BPE = 1, /* "gpt2": byte-level BPE */
    KT_VOCAB_WPM = 2, /* "bert": WordPiece */
    KT_VOCAB_GEMMA4 = 3 /* "gemma4": BPE merges over SentencePiece-style pieces */
} kt_vocab_kind;

/* Reads and validates tokenizer.ggml.* (token count, scores, types, ids in
 * range, pieces valid UTF-8 except byte tokens; for "gpt2" also the
 * pre-tokenizer name and the merges, each "left right" with both sides
 * tokens). Defaults as llama.cpp: for "llama" unk 0, bos 1, eos 2,
 * add_bos true, add_space_prefix true; for "gpt2" bos = eos = 11, no unk,
 * add_bos false (true for the llama3 pre-tokenizer), no space prefix, and
 * pre-tokenizer "default" when tokenizer.ggml.pre is absent; for "bert"
 * BOS is [CLS] (cls_token_id, default 101), EOS is [SEP]
 * (seperator_token_id, default 102), unk 100, pad 0, add_bos and add_eos
 * true (BERT input is [CLS] text [SEP]), no space prefix; for "gemma4"
 * the merges as for "gpt2" (tokenizer.ggml.pre is not read: the model
 * has one pre-tokenizer), no bos/eos/unk/pad unless the keys name them,
 * add_bos always true (llama.cpp overrides a false key: Gemma 4 needs
 * BOS), no space prefix. */
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

kt_vocab_kind kt_vocab_get_kind(const kt_vocab *v);
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
 * them (kt_vocab_encode_ex can match them).
 *
 * User-defined tokens are split out of the text first (longest first,
 * leftmost) and emitted as themselves, whatever the model. For "llama"
 * the algorithm is llama.cpp's llm_tokenizer_spm: each remaining
 * fragment gets a "▁" prefix when add_space_prefix and it is the first
 * fragment or follows a user-defined token, has ' ' replaced by "▁", and is
 * merged pairwise from UTF-8 characters, always the adjacent pair whose
 * concatenation is a token with the highest score (ties: leftmost).
 * Control, unknown and byte tokens never take part in merges. A leftover
 * piece that is not a token becomes its bytes' <0xNN> tokens, or one unk
 * if some byte has no token (-1 with err set if there is no unk either).
 * For "gpt2" it is llama.cpp's llm_tokenizer_bpe: each fragment is split
 * into words by the pre-tokenizer's regexes, each word's bytes become
 * GPT-2 characters and are merged pairwise, always the adjacent pair of
 * lowest merge rank (ties: leftmost); a final piece that is not a token
 * becomes the tokens of its single bytes where they exist. For "bert" it
 * is llama.cpp's llm_tokenizer_wpm (see wpm.c). For "gemma4" it is
 * llama.cpp's llm_tokenizer_bpe as it runs for Gemma 4: each fragment is
 * cut into lines and runs of newlines; a run of newlines that is a token
 * is taken whole; otherwise ' ' becomes "▁" and the UTF-8 characters are
 * merged by rank as for "gpt2"; a final piece that is not a token becomes
 * the <0xNN> tokens of its bytes where they exist. No "▁" prefix is
 * added, whatever add_space_prefix says (as llama.cpp's BPE).
 * add_bos on a vocabulary without BOS is KT_ERR_ARG. Thread-safe: the
 * vocabulary is only read. */
int kt_vocab_encode(const kt_vocab *v, const char *text, size_t len,
                    bool add_bos, int32_t *ids, int cap, kt_error *err);

/* kt_vocab_encode, and with parse_specials also control and unknown tokens
 * written in the text ("<s>", "<|im_start|>") are matched and emitted as
 * their ids, like user-defined ones (all specials longest first); the text
 * between them is encoded as usual. For text built from trusted templates
 * (chat templates), never for raw user input. */
int kt_vocab_encode_ex(const kt_vocab *v, const char *text, size_t len, bool add_bos,
                       bool parse_specials, int32_t *ids, int cap, kt_error *err);

/* The bytes token id stands for in decoded text: "▁" becomes " " ("llama",
 * "bert" and "gemma4" models) or each GPT-2 character becomes its byte
 * ("gpt2" models; a character outside the table is copied as is), byte
 * tokens become their byte, control tokens become "" . Writes at most cap
 * bytes into buf and returns the length the piece needs. Unknown and
 * user-defined tokens give their piece as is; unused and undefined ones,
 * like control tokens, give "" (as llama.cpp); an invalid id gives 0. buf
 * is not NUL-terminated. */
int kt_vocab_decode_piece(const kt_vocab *v, int32_t id, char *buf, int cap);

/* Writes the vocabulary into a GGUF writer as tokenizer.ggml.* keys (used by
 * convert and gen-model): model "llama", tokens, scores, token_type, the
 * bos/eos/unknown/padding ids that exist, add_bos_token, add_eos_token and
 * add_space_prefix. Only for "llama" vocabularies (KT_ERR_UNSUPPORTED for
 * others). */
kt_status kt_vocab_write_gguf(const kt_vocab *v, gguf_writer *w, kt_error *err);

#endif
