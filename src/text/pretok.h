/*
 * pretok.h - the pre-tokenizer of byte-level BPE vocabularies: splits text
 * into words with a list of regexes, as llama.cpp's unicode_regex_split.
 *
 * `tokenizer.ggml.pre` names a family (llama.cpp's names: "gpt-2",
 * "llama-bpe", "qwen2", "deepseek-coder", "starcoder", ...); each family is
 * a list of regexes applied in sequence: regex k splits every piece made
 * by regex k-1 into its matches and the gaps between them (both kept), so
 * the pieces always tile the text. Regexes are PCRE2 (UTF + UCP), compiled
 * once per vocabulary and JIT-compiled where the library supports it.
 * Gemma 4's pre-split is no family: it only cuts at newlines
 * (kt_pretok_split_lines).
 */
#ifndef KT_TEXT_PRETOK_H
#define KT_TEXT_PRETOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kettle.h"

typedef struct kt_pretok kt_pretok;

/* A piece of the text: bytes [off, off + len). */
typedef struct kt_span {
    uint32_t off, len;
} kt_span;

/* A growable list of spans; reused across calls. */
typedef struct kt_span_list {
    kt_span *s;
    size_t n, cap;
} kt_span_list;

/* The pre-tokenizer the family `name` (name_len bytes) stands for. An
 * unknown name is KT_ERR_UNSUPPORTED. *ignore_merges (if not NULL) gets
 * whether the family takes a word that is a whole token as is, before any
 * merge (llama.cpp's ignore_merges, true for llama3); *add_bos gets
 * llama.cpp's default add_bos for the family. */
kt_pretok *kt_pretok_new(const char *name, size_t name_len, bool *ignore_merges,
                         bool *add_bos, kt_error *err);
void kt_pretok_free(kt_pretok *p);

/* Splits text[0..len) (valid UTF-8, len < 2^32) into `out` (emptied
 * first); `tmp` is scratch. Thread-safe: p is only read. */
kt_status kt_pretok_split(const kt_pretok *p, const char *text, size_t len,
                          kt_span_list *out, kt_span_list *tmp, kt_error *err);

/* Gemma 4's only pre-split (llama.cpp's "[^\n]+|[\n]+", no regex needed):
 * text[0..len) (len < 2^32) into lines and runs of newlines, in order. */
kt_status kt_pretok_split_lines(const char *text, size_t len, kt_span_list *out,
                                kt_error *err);

void kt_span_list_free(kt_span_list *l);

#endif
