/*
 * ngram.c - prompt lookup (see ngram.h): a backwards scan for the
 * context's suffix. The scan is O(n x max_match) per proposal; at the
 * context lengths kettle serves this is microseconds beside a forward
 * pass, so no index is kept (nothing to reset between requests, nothing
 * to go stale).
 */
#include "spec/ngram.h"

#include <string.h>

/* The latest start p < n - m of ctx[n-m..n) earlier in ctx, or -1. */
static int latest_match(const int32_t *ctx, int n, int m) {
    const int32_t *suffix = ctx + n - m;
    for (int p = n - m - 1; p >= 0; p--)
        if (ctx[p] == suffix[0] && !memcmp(ctx + p, suffix, sizeof *ctx * (size_t)m)) return p;
    return -1;
}

int spec_ngram_propose(const int32_t *ctx, int n, int min_match, int max_match, int k, int32_t *out) {
    if (k <= 0 || min_match < 1) return 0;
    for (int m = max_match < n - 1 ? max_match : n - 1; m >= min_match; m--) {
        int p = latest_match(ctx, n, m);
        if (p < 0) continue;
        int from = p + m, got = n - from < k ? n - from : k; /* what followed, up to k, all known */
        memcpy(out, ctx + from, sizeof *out * (size_t)got);
        return got;
    }
    return 0;
}
