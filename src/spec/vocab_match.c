/*
 * vocab_match.c - a draft's vocabulary against the target's (see
 * vocab_match.h).
 */
#include "spec/vocab_match.h"

#include <string.h>

#include "base/error.h"

kt_status spec_same_vocab(const kt_model *target, const kt_model *draft, kt_error *err) {
    const int nt = kt_model_describe(target)->n_vocab, nd = kt_model_describe(draft)->n_vocab;
    if (nt != nd)
        return kt_error_set(err, KT_ERR_ARG, "the draft model has %d tokens and the model %d: a draft needs the same "
                            "vocabulary (a smaller model of the same family)", nd, nt);
    char a[256], b[256];
    for (int i = 0; i < nt; i++) {
        int la = kt_token_text(target, i, a, sizeof a), lb = kt_token_text(draft, i, b, sizeof b);
        if (la != lb || strcmp(a, b))
            return kt_error_set(err, KT_ERR_ARG, "the draft model's token %d is '%.40s' where the model's is '%.40s': a "
                                "draft needs the same vocabulary", i, b, a);
    }
    return KT_OK;
}
