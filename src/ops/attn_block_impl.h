/*
 * attn_block_impl.h - the body of kt_attention_block_avx2 / _avx512 (see
 * "prefill: blocks of query tokens" in ops_avx2.c), written once over a
 * vocabulary of vector operations. ops_avx2.c includes it twice, after
 * defining that vocabulary for 8 lanes (AVX2) and for 16 (AVX-512):
 *   AB_W lanes, AB_TARGET (function attribute), AB_NAME(x) (suffixed name),
 *   AB_F float vector, AB_D vector of AB_W / 2 doubles,
 *   ab_set1 ab_zero ab_load ab_loadu ab_store ab_storeu ab_add ab_sub
 *   ab_mul ab_exp (exp256 / exp512, the same per lane),
 *   AB_HB heads a scores or values tile (2 or more), AB_PB positions a
 *   scores tile (divides 8), AB_DT dims a values tile (hd a multiple),
 *   AB_M lane mask,
 *   ab_live(lo, np, p): lanes that attend position p, lo <= p < np (lo, np:
 *   AB_W int32 each; lo is 0 but under a sliding window),
 *   ab_max_live(acc, m, v), ab_keep(m, v) (dead lanes 0),
 *   ab_add_live(acc, m, v) (dead lanes: acc unchanged),
 *   ab_transpose(r) (AB_W vectors r[0 .. AB_W), as an AB_W x AB_W matrix),
 *   ab_dzero ab_dlo ab_dhi ab_dadd (halves widened to double, summed),
 *   ab_inv(lo, hi): lanes of (float)(1.0 / sum).
 * Not a header to include anywhere else; it undefines the vocabulary at
 * the end so the next width can define it again.
 */

/* S[h + b][p + j] for b < HB heads and j < AB_PB positions: one load of
 * each k_p element, broadcast, serves the HB heads (the heads of a group
 * read the same K), so a tile of HB x AB_PB sums costs HB + AB_PB loads a
 * step where one head at a time cost 1 + AB_PB (load-bound). Each lane's
 * dot is summed over the elements in order, then times scale. */
AB_TARGET INL void AB_NAME(scores_tile)(const float *qt, int hd, const float *const *k, float scale, float *S,
                                        int np_pad, const int32_t *lo, const int32_t *np, AB_F *vmax, int h, int p,
                                        const int HB) {
    AB_F acc[AB_HB][AB_PB];
#pragma GCC unroll 4
    for (int b = 0; b < HB; b++)
#pragma GCC unroll 8
        for (int j = 0; j < AB_PB; j++) acc[b][j] = ab_zero();
    for (int e = 0; e < hd; e++) {
        AB_F qv[AB_HB];
#pragma GCC unroll 4
        for (int b = 0; b < HB; b++) qv[b] = ab_load(qt + ((size_t)(h + b) * hd + e) * AB_W);
#pragma GCC unroll 8
        for (int j = 0; j < AB_PB; j++) {
            const AB_F kv = ab_set1(k[j][e]);
#pragma GCC unroll 4
            for (int b = 0; b < HB; b++) acc[b][j] = ab_add(acc[b][j], ab_mul(qv[b], kv));
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < AB_PB; j++) {
        const AB_M live = ab_live(lo, np, p + j);
#pragma GCC unroll 4
        for (int b = 0; b < HB; b++) {
            const AB_F sv = ab_mul(acc[b][j], ab_set1(scale));
            ab_store(S + ((size_t)(h + b) * np_pad + p + j) * AB_W, sv);
            vmax[h + b] = ab_max_live(vmax[h + b], live, sv);
        }
    }
}

/* S[h][p] for p in [0, np_pad): lane i is token i's dot with k_p; and
 * vmax[h], lane i: the max of its live scores (p < the lane's n_pos; max
 * is exact in any order). K rows are widened 8 at a time, then every
 * head's tiles run over them. */
AB_TARGET static void AB_NAME(block_scores)(const float *qt, int nh, int hd, const kv_view *kv, int np_pad,
                                            const int32_t *lo, const int32_t *np, float scale, float *kbuf, float *S,
                                            AB_F *vmax) {
    const int row_bytes = (int)kt_dtype_row_bytes(kv->type, hd);
    for (int p = 0; p < np_pad; p += 8) {
        const float *k[8];
        for (int j = 0; j < 8; j++) {
            if (p + j + KV_PREFETCH < np_pad) kv_prefetch(kv->k[p + j + KV_PREFETCH], row_bytes);
            k[j] = kv_row_f32(kv->k[p + j], kv->type, hd, kbuf + (size_t)j * hd);
        }
        for (int j = 0; j < 8; j += AB_PB)
            for (int h = 0; h < nh;) {
                const int left = nh - h;
                if (left >= AB_HB)
                    AB_NAME(scores_tile)(qt, hd, k + j, scale, S, np_pad, lo, np, vmax, h, p + j, AB_HB), h += AB_HB;
                else if (left >= 2)
                    AB_NAME(scores_tile)(qt, hd, k + j, scale, S, np_pad, lo, np, vmax, h, p + j, 2), h += 2;
                else AB_NAME(scores_tile)(qt, hd, k + j, scale, S, np_pad, lo, np, vmax, h, p + j, 1), h += 1;
            }
    }
}

/* In place over S[h + b][c0 .. c1) for b < HB heads: the exps
 * exp(s - vmax) (0 where p >= the lane's n_pos), added to the heads'
 * sums in double (lo, hi: the low and high lanes), in position order:
 * one chain per head and half, so HB heads run side by side. Called
 * chunk by chunk just before the chunk's values, while its scores are in
 * L1 (a pass over all of S, MBs at long contexts, went through L3). */
AB_TARGET INL void AB_NAME(exps_tile)(float *S, int np_pad, int c0, int c1, const int32_t *p_lo, const int32_t *np,
                                      const AB_F *vmax, AB_D *lo, AB_D *hi, int h, const int HB) {
    float *s[AB_HB];
    AB_D l[AB_HB], u[AB_HB];
#pragma GCC unroll 4
    for (int b = 0; b < HB; b++) s[b] = S + (size_t)(h + b) * np_pad * AB_W, l[b] = lo[h + b], u[b] = hi[h + b];
    for (int p = c0; p < c1; p++) {
        const AB_M live = ab_live(p_lo, np, p);
#pragma GCC unroll 4
        for (int b = 0; b < HB; b++) {
            float *sp = s[b] + (size_t)p * AB_W;
            const AB_F e = ab_keep(live, ab_exp(ab_sub(ab_load(sp), vmax[h + b])));
            ab_store(sp, e);
            l[b] = ab_dadd(l[b], ab_dlo(e));
            u[b] = ab_dadd(u[b], ab_dhi(e));
        }
    }
#pragma GCC unroll 4
    for (int b = 0; b < HB; b++) lo[h + b] = l[b], hi[h + b] = u[b];
}

AB_TARGET static void AB_NAME(block_exps)(float *S, int nh, int np_pad, int c0, int c1, const int32_t *p_lo,
                                          const int32_t *np, const AB_F *vmax, AB_D *lo, AB_D *hi) {
    for (int h = 0; h < nh;) {
        const int hb = nh - h >= AB_HB ? AB_HB : nh - h >= 2 ? 2 : 1;
        if (hb == AB_HB) AB_NAME(exps_tile)(S, np_pad, c0, c1, p_lo, np, vmax, lo, hi, h, AB_HB);
        else if (hb == 2) AB_NAME(exps_tile)(S, np_pad, c0, c1, p_lo, np, vmax, lo, hi, h, 2);
        else AB_NAME(exps_tile)(S, np_pad, c0, c1, p_lo, np, vmax, lo, hi, h, 1);
        h += hb;
    }
}

/* acc[((h + b) * hd + d0 + j) * AB_W + i] += sum over p in [p0, p1) of
 * lane i of S[h + b][p] times v_p[d0 + j], for b < HB heads and j < AB_DT
 * dims, in position order: the tokens in the lanes, as in the scores, so
 * a position costs HB loads of S and one broadcast per dim, shared by the
 * HB heads (they read the same V). masked: lanes that do not attend p
 * take nothing (their S is 0, but 0 x an infinite v would not be). */
AB_TARGET INL void AB_NAME(values_run)(const float *S, int np_pad, int hd, int h, int d0, int c0, int p0, int p1,
                                       const bool masked, const int32_t *lo, const int32_t *np, const float *vb,
                                       AB_F (*a)[AB_DT], const int HB) {
    AB_F sp[AB_HB];
    for (int p = p0; p < p1; p++) {
#pragma GCC unroll 4
        for (int b = 0; b < HB; b++) sp[b] = ab_load(S + ((size_t)(h + b) * np_pad + p) * AB_W);
        const AB_M live = masked ? ab_live(lo, np, p) : (AB_M){0};
        const float *vp = vb + (size_t)(p - c0) * hd + d0;
#pragma GCC unroll 16
        for (int j = 0; j < AB_DT; j++) {
            const AB_F v = ab_set1(vp[j]);
#pragma GCC unroll 4
            for (int b = 0; b < HB; b++)
                a[b][j] = masked ? ab_add_live(a[b][j], live, ab_mul(sp[b], v)) : ab_add(a[b][j], ab_mul(sp[b], v));
        }
    }
}

/* The positions [c0, c1) of a tile: every lane attends [m0, m1), so only
 * the positions outside it are masked. */
AB_TARGET INL void AB_NAME(values_tile)(const float *S, int np_pad, int hd, int h, int d0, int c0, int m0, int m1,
                                        int c1, const int32_t *lo, const int32_t *np, const float *vb, float *acc,
                                        const int HB) {
    AB_F a[AB_HB][AB_DT];
#pragma GCC unroll 4
    for (int b = 0; b < HB; b++)
#pragma GCC unroll 16
        for (int j = 0; j < AB_DT; j++) a[b][j] = ab_load(acc + ((size_t)(h + b) * hd + d0 + j) * AB_W);
    AB_NAME(values_run)(S, np_pad, hd, h, d0, c0, c0, m0, true, lo, np, vb, a, HB);
    AB_NAME(values_run)(S, np_pad, hd, h, d0, c0, m0, m1, false, lo, np, vb, a, HB);
    AB_NAME(values_run)(S, np_pad, hd, h, d0, c0, m1, c1, true, lo, np, vb, a, HB);
#pragma GCC unroll 4
    for (int b = 0; b < HB; b++)
#pragma GCC unroll 16
        for (int j = 0; j < AB_DT; j++) ab_store(acc + ((size_t)(h + b) * hd + d0 + j) * AB_W, a[b][j]);
}

/* The values of positions [c0, c1) (rows of vb), every head and dim;
 * [live_lo, live_hi): the positions every lane attends. */
AB_TARGET static void AB_NAME(block_values)(const float *S, int np_pad, int hd, int nh, int c0, int c1, int live_lo,
                                            int live_hi, const int32_t *lo, const int32_t *np, const float *vb,
                                            float *acc) {
    const int m1 = live_hi < c0 ? c0 : live_hi > c1 ? c1 : live_hi;
    const int m0 = live_lo < c0 ? c0 : live_lo > m1 ? m1 : live_lo;
    for (int h = 0; h < nh;) {
        const int hb = nh - h >= AB_HB ? AB_HB : nh - h >= 2 ? 2 : 1;
        for (int d0 = 0; d0 < hd; d0 += AB_DT) {
            if (hb == AB_HB) AB_NAME(values_tile)(S, np_pad, hd, h, d0, c0, m0, m1, c1, lo, np, vb, acc, AB_HB);
            else if (hb == 2) AB_NAME(values_tile)(S, np_pad, hd, h, d0, c0, m0, m1, c1, lo, np, vb, acc, 2);
            else AB_NAME(values_tile)(S, np_pad, hd, h, d0, c0, m0, m1, c1, lo, np, vb, acc, 1);
        }
        h += hb;
    }
}

/* Gemma 2's cap on the scores S (kt_softcap_row: the reference's tanhf,
 * so its bits), then each head's max lanes again over the capped live
 * scores. */
AB_TARGET static void AB_NAME(cap_scores)(float *S, int nh, int np_pad, const int32_t *lo, const int32_t *np,
                                          float cap, AB_F *vmax) {
    float m[AB_W];
    for (int h = 0; h < nh; h++) {
        for (int i = 0; i < AB_W; i++) m[i] = -INFINITY;
        for (int p = 0; p < np_pad; p++) {
            float *sp = S + ((size_t)h * np_pad + p) * AB_W;
            for (int i = 0; i < AB_W; i++)
                if (p >= lo[i] && p < np[i]) {
                    kt_softcap_row(sp + i, 1, cap);
                    m[i] = sp[i] > m[i] ? sp[i] : m[i];
                }
        }
        vmax[h] = ab_loadu(m);
    }
}

/* The lanes of one call: lane i's q for head h of the batch at q + i *
 * q_lane + h * hd, its output likewise in out; n_lanes of the AB_W used,
 * nh heads each, attending positions [lo[i], np[i]) (0, 0 past n_lanes)
 * of the view of KV head kvh's rows that token t_kv's positions start
 * (kt_attn_row: its first attended position is the view's 0). */
typedef struct AB_NAME(lanes) {
    const float *q;
    float *out;
    size_t q_lane, out_lane;
    int n_lanes, nh, t_kv, kvh;
    int32_t lo[AB_W], np[AB_W];
    /* the heads' sinks (kt_attn_args.sinks from the first head), or NULL;
     * sink_by_lane: lane i's head is the i-th (one token's heads in the
     * lanes), else head h's is the h-th (tokens in the lanes) */
    const float *sink;
    bool sink_by_lane;
} AB_NAME(lanes);

/* The sinks into each head's lane maxima (vmax), and their exps against
 * the new maxima into e (AB_W floats a head), computed with the
 * reference's expf, so each lane's sum gets the reference's term. */
AB_TARGET static void AB_NAME(sink_lanes)(const AB_NAME(lanes) *L, AB_F *vmax, float *e) {
    for (int h = 0; h < L->nh; h++) {
        float m[AB_W];
        ab_storeu(m, vmax[h]);
        for (int i = 0; i < AB_W; i++) {
            /* lanes past n_lanes are written nowhere: any finite sink will do */
            const float s = L->sink_by_lane ? (i < L->n_lanes ? L->sink[i] : 0.0f) : L->sink[h];
            m[i] = s > m[i] ? s : m[i];
            e[(size_t)h * AB_W + i] = expf(s - m[i]);
        }
        vmax[h] = ab_loadu(m);
    }
}

AB_TARGET static void AB_NAME(attend_lanes)(const kt_attn_args *a, const AB_NAME(lanes) *L, float *scratch) {
    const int hd = a->head_dim, nh = L->nh, nt = L->n_lanes;
    const int32_t *np = L->np, *lo = L->lo;
    int np_max = 0, live_lo = 0, live_hi = INT_MAX; /* positions in [live_lo, live_hi): every lane's */
    for (int i = 0; i < AB_W; i++) {
        np_max = np[i] > np_max ? np[i] : np_max;
        live_hi = np[i] < live_hi ? np[i] : live_hi;
        live_lo = lo[i] > live_lo ? lo[i] : live_lo;
    }
    const int np_pad = (np_max + 7) / 8 * 8, row_bytes = (int)kt_dtype_row_bytes(a->kv_type, hd);
    /* scratch (64-byte aligned): Qt, acc, S, K/V widened, row addresses */
    float *qt = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *acc = qt + (size_t)nh * hd * AB_W;
    float *S = acc + (size_t)nh * hd * AB_W;
    float *kbuf = S + (size_t)nh * np_pad * AB_W, *vbuf = kbuf + (size_t)8 * hd;
    kv_view kv = {(const char **)(vbuf + (size_t)AB_CHUNK * hd), NULL, a->kv_type};
    kv.v = kv.k + np_pad;
    kv_view_build(&kv, a, L->t_kv, L->kvh, np_max);
    for (int p = np_max; p < np_pad; p++) kv.k[p] = kv.k[np_max - 1], kv.v[p] = kv.v[np_max - 1];

    /* Qt[h][e] = lane i: lane i's q (0 past nt), AB_W elements at a time */
    for (int h = 0; h < nh; h++)
        for (int e0 = 0; e0 < hd; e0 += AB_W) {
            AB_F r[AB_W];
#pragma GCC unroll 16
            for (int i = 0; i < AB_W; i++)
                r[i] = i < nt ? ab_loadu(L->q + (size_t)i * L->q_lane + (size_t)h * hd + e0) : ab_zero();
            ab_transpose(r);
#pragma GCC unroll 16
            for (int k = 0; k < AB_W; k++) ab_store(qt + ((size_t)h * hd + e0 + k) * AB_W, r[k]);
        }
    memset(acc, 0, sizeof(float) * (size_t)nh * hd * AB_W);

    AB_F vmax[ATTN_MAX_GROUP];
    AB_D sum_lo[ATTN_MAX_GROUP], sum_hi[ATTN_MAX_GROUP];
    for (int h = 0; h < nh; h++) vmax[h] = ab_set1(-INFINITY), sum_lo[h] = sum_hi[h] = ab_dzero();
    AB_NAME(block_scores)(qt, nh, hd, &kv, np_pad, lo, np, 1.0f / sqrtf((float)hd), kbuf, S, vmax);
    if (a->softcap > 0) AB_NAME(cap_scores)(S, nh, np_pad, lo, np, a->softcap, vmax);
    float sink_e[ATTN_MAX_GROUP * AB_W];
    if (L->sink) AB_NAME(sink_lanes)(L, vmax, sink_e);

    for (int c0 = 0; c0 < np_max; c0 += AB_CHUNK) {
        const int c1 = c0 + AB_CHUNK < np_max ? c0 + AB_CHUNK : np_max;
        for (int p = c0; p < c1; p++) {
            if (p + KV_PREFETCH < np_max) kv_prefetch(kv.v[p + KV_PREFETCH], row_bytes);
            kv_row_widen(kv.v[p], kv.type, hd, vbuf + (size_t)(p - c0) * hd);
        }
        AB_NAME(block_exps)(S, nh, np_pad, c0, c1, lo, np, vmax, sum_lo, sum_hi);
        AB_NAME(block_values)(S, np_pad, hd, nh, c0, c1, live_lo, live_hi, lo, np, vbuf, acc);
    }
    float inv[ATTN_MAX_GROUP * AB_W];
    if (L->sink) /* after the positions', as the reference adds it */
        for (int h = 0; h < nh; h++) {
            const AB_F e = ab_loadu(sink_e + (size_t)h * AB_W);
            sum_lo[h] = ab_dadd(sum_lo[h], ab_dlo(e)), sum_hi[h] = ab_dadd(sum_hi[h], ab_dhi(e));
        }
    for (int h = 0; h < nh; h++) ab_storeu(inv + (size_t)h * AB_W, ab_inv(sum_lo[h], sum_hi[h]));
    /* out = acc x inv, the lanes back into their rows */
    for (int h = 0; h < nh; h++) {
        const AB_F s = ab_loadu(inv + h * AB_W);
        for (int d0 = 0; d0 < hd; d0 += AB_W) {
            AB_F r[AB_W];
#pragma GCC unroll 16
            for (int k = 0; k < AB_W; k++) r[k] = ab_mul(ab_load(acc + ((size_t)h * hd + d0 + k) * AB_W), s);
            ab_transpose(r);
#pragma GCC unroll 16
            for (int i = 0; i < AB_W; i++)
                if (i < nt) ab_storeu(L->out + (size_t)i * L->out_lane + (size_t)h * hd + d0, r[i]);
        }
    }
}

/* Prefill: the lanes are tokens t0 .. t0 + nt - 1, each with heads h0 ..
 * h0 + nh - 1. */
AB_TARGET void AB_NAME(kt_attention_block)(const kt_attn_args *a, int t0, int nt, int h0, int nh, float *scratch) {
    AB_NAME(lanes) L = {a->q + (size_t)t0 * a->q_stride + (size_t)h0 * a->head_dim,
                        a->out + (size_t)t0 * a->out_stride + (size_t)h0 * a->head_dim,
                        a->q_stride, a->out_stride, nt, nh, t0, /* one sequence: one block table */
                        (int)((long)h0 * a->n_head_kv / a->n_head), {0}, {0}, a->sinks ? a->sinks + h0 : NULL, false};
    /* the view starts at t0's first position, the earliest of the block's
     * (its tokens are consecutive positions: later ones' windows start
     * later) */
    const int first0 = kt_attn_first(a, t0);
    for (int i = 0; i < nt; i++) {
        L.lo[i] = kt_attn_first(a, t0 + i) - first0;
        L.np[i] = L.lo[i] + kt_attn_n_pos(a, t0 + i);
    }
    AB_NAME(attend_lanes)(a, &L, scratch);
}

/* One token: the lanes are its heads h0 .. h0 + nh - 1 (nh <= AB_W) of
 * one KV group, which read the same K and V rows. */
AB_TARGET void AB_NAME(kt_attention_heads)(const kt_attn_args *a, int t, int h0, int nh, float *scratch) {
    AB_NAME(lanes) L = {a->q + (size_t)t * a->q_stride + (size_t)h0 * a->head_dim,
                        a->out + (size_t)t * a->out_stride + (size_t)h0 * a->head_dim,
                        (size_t)a->head_dim, (size_t)a->head_dim, nh, 1, t,
                        (int)((long)h0 * a->n_head_kv / a->n_head), {0}, {0}, a->sinks ? a->sinks + h0 : NULL, true};
    for (int i = 0; i < nh; i++) L.np[i] = kt_attn_n_pos(a, t);
    AB_NAME(attend_lanes)(a, &L, scratch);
}

#undef AB_W
#undef AB_TARGET
#undef AB_NAME
#undef AB_F
#undef AB_D
#undef ab_set1
#undef ab_zero
#undef ab_load
#undef ab_loadu
#undef ab_store
#undef ab_storeu
#undef ab_add
#undef ab_sub
#undef ab_mul
#undef ab_exp
#undef ab_live
#undef ab_max_live
#undef ab_keep
#undef ab_add_live
#undef ab_transpose
#undef AB_M
#undef AB_DT
#undef AB_HB
#undef AB_PB
#undef ab_dzero
#undef ab_dlo
#undef ab_dhi
#undef ab_dadd
#undef ab_inv
