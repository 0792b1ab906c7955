/*
 * metrics.h - the server's counters and the Prometheus text of /metrics.
 *
 * HTTP requests are counted here by endpoint and status (any thread); the
 * engine's figures (tokens, latency histograms, queue, KV blocks) come
 * from one kt_engine_get_stats snapshot per scrape, so a scrape never
 * waits on the engine thread.
 */
#ifndef KT_SERVER_METRICS_H
#define KT_SERVER_METRICS_H

#include <pthread.h>
#include <stdbool.h>

#include "engine/engine.h"
#include "server/fallback.h"

#define SRV_METRICS_MAX 96

typedef struct srv_metrics {
    pthread_mutex_t mu;
    struct {
        const char *endpoint; /* a static string */
        int status;
        unsigned long long count;
    } rows[SRV_METRICS_MAX];
    int n_rows;
    unsigned long long fallback_requests[SRV_FB_N_REASONS]; /* forwarded, by reason */
    unsigned long long fallback_failures[SRV_FB_N_FAILURES]; /* forwarded and failed, by kind */
} srv_metrics;

bool srv_metrics_init(srv_metrics *m);
void srv_metrics_destroy(srv_metrics *m);
/* Counts one finished HTTP request; `endpoint` must be a static string. */
void srv_metrics_count(srv_metrics *m, const char *endpoint, int status);
/* Counts a request forwarded to the fallback upstream, and one that failed there. */
void srv_metrics_fallback(srv_metrics *m, srv_fb_reason r);
void srv_metrics_fallback_failure(srv_metrics *m, srv_fb_failure f);
/* One class's figures for a scrape. */
typedef struct srv_class_stats {
    const char *name;        /* the class's name: the `model` label */
    bool loaded;             /* its model is in memory (engine figures are zero otherwise) */
    kt_engine_stats engine;  /* one snapshot of its engine */
    bool has_results;        /* it keeps a result cache */
    unsigned long long result_hits;
    /* images the server decoded, and those it knew from their bytes (server/image_memo.h) */
    uint64_t image_decodes, image_decodes_skipped;
} srv_class_stats;

/* The Prometheus text exposition (malloc'ed), or NULL when out of memory.
 * With one class the engine's series carry no label (as before there
 * were classes); with several, each carries model="NAME". */
char *srv_metrics_text(srv_metrics *m, const srv_class_stats *cs, int n);

#endif
