/*
 * session_spec.c - what speculative decoding needs of a kt_session
 * (spec/spec_session.c uses it): a verify pass that can be cut back on
 * any model, hybrid ones included, and the MTP block's guesses.
 *
 * Why here: a hybrid model's recurrent state cannot be truncated, so a
 * rejected proposal would leave it wrong; the engine solves that with
 * engine/rewind.c (the pass moves the state on in a spare, the state
 * before it kept, each token's recurrent inputs logged, the kept tokens
 * replayed), and a session is
 * one sequence of the same pool kind, so it uses the same rollback with
 * one slot. The replay runs the same operations on the same inputs as the
 * pass did, so the state has plain decoding's bits.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "engine/model_internal.h"
#include "model/mtp.h"
#include "spec/policy.h"

/* A verify pass holds the pending token and at most SPEC_K_MAX proposals:
 * the logs are sized for that (Qwen 3.5 4B: ~0.8 MB of log a token). */
#define VERIFY_MAX (SPEC_K_MAX + 1)

kt_status kt_session_spec_eval(kt_session *s, const int32_t *tokens, int n, float *logits, kt_error *err) {
    if (n < 1 || n > VERIFY_MAX) return kt_error_set(err, KT_ERR_ARG, "a verify pass of %d tokens (1..%d)", n, VERIFY_MAX);
    if (n > s->n_ctx - s->seq->len)
        return kt_error_set(err, KT_ERR_CONTEXT, "%d tokens do not fit: %d of the %d-token context are used", n,
                            s->seq->len, s->n_ctx);
    eng_rewind *rw = NULL;
    if (llm_state_bytes(s->model->llm)) { /* a hybrid model: the state before the pass, the tokens' logs */
        if (!s->rw) {
            if (!(s->rw = calloc(1, sizeof *s->rw))) return kt_error_set(err, KT_ERR_NOMEM, "out of memory");
            if (eng_rewind_init(s->rw, s->model->llm, s->kv, 1, VERIFY_MAX, VERIFY_MAX, err) != KT_OK) {
                free(s->rw), s->rw = NULL;
                return err->status;
            }
        }
        eng_rewind_begin(s->rw, VERIFY_MAX);
        if (!eng_rewind_plan(s->rw, s->seq, 0, n))
            return kt_error_set(err, KT_ERR_INTERNAL, "speculation: a verify pass of %d tokens cannot be planned", n);
        rw = s->rw;
    }
    s->spec_len0 = s->seq->len, s->spec_n = n;
    kt_status st = kt_session_forward(s, tokens, NULL, n, logits, true, rw, err);
    if (st) s->spec_n = 0;
    return st;
}

kt_status kt_session_spec_keep(kt_session *s, int keep, kt_error *err) {
    const int n = s->spec_n, len = s->spec_len0 + keep;
    if (keep < 1 || keep > n) return kt_error_set(err, KT_ERR_ARG, "keeping %d of a verify pass of %d tokens", keep, n);
    s->spec_n = 0;
    if (keep == n) return KT_OK;
    if (s->rw && s->rw->llm) { /* a hybrid model: the state from before the pass, the kept tokens replayed */
        if (eng_rewind_apply(s->rw, s->work, s->pool, s->seq, len, keep, err) != KT_OK) return err->status;
        kt_session_mtp_cut(s, len);
        return KT_OK;
    }
    kt_session_truncate(s, len);
    return KT_OK;
}

int kt_session_mtp_draft(kt_session *s, int32_t pending, int k, int32_t *out, kt_error *err) {
    if (!s->mtp) return kt_error_set(err, KT_ERR_ARG, "the session was made without mtp"), -1;
    const llm_model *m = s->model->llm;
    const int len = s->seq->len, E = m->cfg.n_embd, nv = m->cfg.n_vocab;
    if (k > s->n_ctx - len) k = s->n_ctx - len;
    if (k <= 0) return 0;
    float *logits = malloc(sizeof(float) * (size_t)nv), *h = malloc(sizeof(float) * 2 * (size_t)E);
    if (!logits || !h) return free(logits), free(h), kt_error_set(err, KT_ERR_NOMEM, "out of memory"), -1;
    if (kv_seq_append(s->seq, k, err) != KT_OK) return free(logits), free(h), -1;
    memcpy(h, s->mtp_h, sizeof(float) * (size_t)E);
    int32_t tok = pending;
    kv_seq *seq = s->seq;
    kt_status st = KT_OK;
    for (int i = 0; i < k && st == KT_OK; i++) {
        const int pos = len + i;
        llm_batch b = {.n_tokens = 1, .tokens = &tok, .pos = &pos, .seq = &seq};
        st = llm_mtp_forward(m, s->work, s->pool, &b, h, logits, h + E, err);
        memcpy(h, h + E, sizeof(float) * (size_t)E); /* a chained guess reads the MTP's own hidden state */
        int32_t best = 0;
        for (int v = 1; v < nv; v++)
            if (logits[v] > logits[best]) best = v;
        out[i] = tok = best;
    }
    /* the recurrent state was not touched: only the MTP's KV rows past len were written */
    kt_status st2 = kv_seq_truncate_rewound(s->seq, len, st ? NULL : err);
    free(logits), free(h);
    return st || st2 ? -1 : k;
}
