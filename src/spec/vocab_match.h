/*
 * vocab_match.h - whether a draft model's guesses mean what the target
 * reads: the same number of tokens, each with the same text. Checked
 * token by token when a draft is given (kettle serve --draft, kettle run
 * --draft), so a draft of another family is refused at start, naming the
 * first token that differs, rather than proposing tokens the target
 * would almost never keep.
 */
#ifndef KT_SPEC_VOCAB_MATCH_H
#define KT_SPEC_VOCAB_MATCH_H

#include "kettle.h"

/* KT_OK, or KT_ERR_ARG with err naming the first difference. */
kt_status spec_same_vocab(const kt_model *target, const kt_model *draft, kt_error *err);

#endif
