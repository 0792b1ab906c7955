/*
 * delta_run_impl.h - the body of kt_delta_rule_run_avx2 / _avx512 (see
 * ops.h), written once over attn_block_impl.h's vocabulary of vector
 * operations plus ab_fmadd (a * b + c, fused): ops_avx2.c includes it in
 * the same two places, for 8 lanes and for 16, before attn_block_impl.h
 * undefines the vocabulary.
 *
 * kt_delta_rule_ref's sums, DR_VECS vectors of columns at a time: that
 * slice of u (then of o) stays in registers while r walks down S, and the
 * slice of S (dk x 4 AB_W floats) stays in L1 while the run's tokens go
 * over it. Every lane does the reference's operations in its order, so
 * both widths give its bits.
 */

#define DR_VECS 4

AB_TARGET void AB_NAME(kt_delta_rule_run)(float *S, const float *S_in, const kt_delta_run *run, int dk, int dv) {
    for (int c0 = 0; c0 < dv; c0 += DR_VECS * AB_W) {
        const int nv = dv - c0 < DR_VECS * AB_W ? (dv - c0) / AB_W : DR_VECS;
        for (int t = 0; t < run->n; t++) {
            const float *in0 = t == 0 ? S_in : S, *k = run->k[t], *q = run->q[t], *v = run->v[t];
            const AB_F vdec = ab_set1(run->decay[t]), vbeta = ab_set1(run->beta[t]);
            AB_F acc[DR_VECS], out[DR_VECS];
            for (int i = 0; i < DR_VECS; i++) acc[i] = out[i] = ab_zero();
            for (int r = 0; r < dk; r++) {
                const float *row = in0 + (size_t)r * dv + c0;
                const AB_F kr = ab_set1(k[r]);
                for (int i = 0; i < nv; i++) acc[i] = ab_fmadd(ab_loadu(row + AB_W * i), kr, acc[i]);
            }
            for (int i = 0; i < nv; i++) /* u = (v - decay kv) beta */
                acc[i] = ab_mul(ab_sub(ab_loadu(v + c0 + AB_W * i), ab_mul(vdec, acc[i])), vbeta);
            for (int r = 0; r < dk; r++) {
                const float *in = in0 + (size_t)r * dv + c0;
                float *row = S + (size_t)r * dv + c0;
                const AB_F kr = ab_set1(k[r]), qr = ab_set1(q[r]);
                for (int i = 0; i < nv; i++) {
                    const AB_F s = ab_fmadd(kr, acc[i], ab_mul(ab_loadu(in + AB_W * i), vdec));
                    ab_storeu(row + AB_W * i, s);
                    out[i] = ab_fmadd(s, qr, out[i]);
                }
            }
            for (int i = 0; i < nv; i++) ab_storeu(run->o[t] + c0 + AB_W * i, out[i]);
        }
    }
}

#undef DR_VECS
