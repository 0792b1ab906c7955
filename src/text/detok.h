/*
 * detok.h - incremental detokenization that never splits a UTF-8 sequence.
 *
 * Tokens arrive one at a time; their bytes may end mid-character (byte
 * fallback tokens carry one byte each). The detokenizer holds back the
 * incomplete tail until it is complete, and turns bytes that can never
 * become valid UTF-8 into U+FFFD, so every string it returns is valid
 * UTF-8 and the concatenation of all of them is the decoded text.
 */
#ifndef KT_TEXT_DETOK_H
#define KT_TEXT_DETOK_H

#include "text/vocab.h"

typedef struct kt_text_detok kt_text_detok;

/* strip_leading_space: drop one leading " " from the very first piece, as
 * SentencePiece does for text that starts with a word. "First" means the
 * first piece with any bytes: a BOS or other control token before it
 * decodes to nothing and does not count. (llama.cpp's detokenizer drops it
 * likewise from a continuation's first token: its golden gen_text is
 * gen_ids decoded this way.) NULL if v is NULL or out of memory.
 * The vocabulary must outlive the detokenizer. */
kt_text_detok *kt_text_detok_new(const kt_vocab *v, bool strip_leading_space);
/* Returns valid UTF-8 (NUL-terminated, possibly ""), valid until the next
 * call. Invalid ids decode to nothing; a decoded NUL byte (<0x00>) ends
 * the C string early. Out of memory drops the piece (returns ""). */
const char *kt_text_detok_push(kt_text_detok *d, int32_t id);
/* Control tokens (which decode to nothing) give their vocabulary text
 * instead: tool-call markers a parser must see. */
void kt_text_detok_show_control(kt_text_detok *d, bool on);
/* Returns what is held back (an incomplete sequence as U+FFFD, else "");
 * the detokenizer can go on being used after it. */
const char *kt_text_detok_flush(kt_text_detok *d);
void kt_text_detok_free(kt_text_detok *d);

#endif
