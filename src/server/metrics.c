/*
 * metrics.c - Prometheus text format (version 0.0.4) for /metrics (see
 * metrics.h). Latencies are exposed in seconds, as Prometheus advises;
 * the engine's millisecond buckets become cumulative `le` buckets ending
 * in +Inf, with _sum and _count.
 */
#include "server/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/openai.h"

bool srv_metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    return pthread_mutex_init(&m->mu, NULL) == 0;
}

void srv_metrics_destroy(srv_metrics *m) {
    pthread_mutex_destroy(&m->mu);
}

void srv_metrics_count(srv_metrics *m, const char *endpoint, int status) {
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_rows && !(m->rows[i].status == status && !strcmp(m->rows[i].endpoint, endpoint))) i++;
    if (i == m->n_rows && m->n_rows < SRV_METRICS_MAX) {
        m->rows[i].endpoint = endpoint, m->rows[i].status = status, m->rows[i].count = 0;
        m->n_rows++;
    }
    if (i < m->n_rows) m->rows[i].count++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_fallback(srv_metrics *m, srv_fb_reason r) {
    if (r < 0 || r >= SRV_FB_N_REASONS) return;
    pthread_mutex_lock(&m->mu);
    m->fallback_requests[r]++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_fallback_failure(srv_metrics *m, srv_fb_failure f) {
    if (f < 0 || f >= SRV_FB_N_FAILURES) return;
    pthread_mutex_lock(&m->mu);
    m->fallback_failures[f]++;
    pthread_mutex_unlock(&m->mu);
}

static bool put(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool put(srv_buf *b, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < sizeof line && srv_buf_append(b, line, (size_t)n);
}

static bool family(srv_buf *b, const char *name, const char *type, const char *help) {
    return put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static bool scalar(srv_buf *b, const char *name, const char *type, const char *help, double v) {
    return family(b, name, type, help) && put(b, "%s %.17g\n", name, v);
}

static bool histogram(srv_buf *b, const char *name, const char *help, const kt_latency_hist *h) {
    bool ok = family(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; ok && i < KT_LAT_N_BUCKETS - 1; i++) {
        cum += h->counts[i];
        ok = put(b, "%s_bucket{le=\"%g\"} %llu\n", name, kt_lat_bucket_ms[i] / 1e3, (unsigned long long)cum);
    }
    cum += h->counts[KT_LAT_N_BUCKETS - 1];
    return ok && put(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum) &&
           put(b, "%s_sum %.9g\n%s_count %llu\n", name, h->sum_ms / 1e3, name, (unsigned long long)h->n);
}

static bool http_requests(srv_buf *b, srv_metrics *m) {
    bool ok = family(b, "kettle_http_requests_total", "counter", "HTTP requests answered, by endpoint and status");
    pthread_mutex_lock(&m->mu);
    for (int i = 0; ok && i < m->n_rows; i++)
        ok = put(b, "kettle_http_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", m->rows[i].endpoint,
                 m->rows[i].status, m->rows[i].count);
    pthread_mutex_unlock(&m->mu);
    return ok;
}

/* Always every label, zeros too, so rate() works from the first scrape. */
static bool fallback(srv_buf *b, srv_metrics *m) {
    bool ok = family(b, "kettle_fallback_requests_total", "counter",
                     "generation requests forwarded to the fallback upstream, by reason");
    pthread_mutex_lock(&m->mu);
    for (int r = 0; ok && r < SRV_FB_N_REASONS; r++)
        ok = put(b, "kettle_fallback_requests_total{reason=\"%s\"} %llu\n", srv_fb_reason_name((srv_fb_reason)r),
                 m->fallback_requests[r]);
    ok = ok && family(b, "kettle_fallback_failures_total", "counter",
                      "forwarded requests the fallback upstream failed: connect (unreachable or broken), timeout, "
                      "status (an error status passed on)");
    for (int f = 0; ok && f < SRV_FB_N_FAILURES; f++)
        ok = put(b, "kettle_fallback_failures_total{kind=\"%s\"} %llu\n", srv_fb_failure_name((srv_fb_failure)f),
                 m->fallback_failures[f]);
    pthread_mutex_unlock(&m->mu);
    return ok;
}

static bool finished(srv_buf *b, const kt_engine_stats *st) {
    bool ok = family(b, "kettle_requests_finished_total", "counter", "generation choices finished, by reason");
    for (int f = KT_FINISH_STOP; ok && f <= KT_FINISH_ERROR; f++)
        ok = put(b, "kettle_requests_finished_total{reason=\"%s\"} %llu\n", kt_finish_name((kt_finish)f),
                 (unsigned long long)st->requests_finished[f]);
    return ok;
}

char *srv_metrics_text(srv_metrics *m, const kt_engine_stats *st) {
    srv_buf b = {0};
    bool ok = http_requests(&b, m) && fallback(&b, m) && finished(&b, st) &&
              scalar(&b, "kettle_prompt_tokens_total", "counter", "prompt tokens prefilled (computed)",
                     (double)st->prompt_tokens) &&
              scalar(&b, "kettle_cache_hit_tokens_total", "counter", "prompt tokens served from the prefix cache",
                     (double)st->cached_prompt_tokens) &&
              scalar(&b, "kettle_generated_tokens_total", "counter", "tokens generated", (double)st->generated_tokens) &&
              scalar(&b, "kettle_engine_steps_total", "counter", "engine steps run", (double)st->steps) &&
              histogram(&b, "kettle_time_to_first_token_seconds", "submit to first token", &st->ttft) &&
              histogram(&b, "kettle_inter_token_latency_seconds", "time between tokens of one choice", &st->itl) &&
              scalar(&b, "kettle_queue_depth", "gauge", "requests waiting for admission", st->queue_depth) &&
              scalar(&b, "kettle_running_sequences", "gauge", "sequences prefilling or decoding", st->running) &&
              scalar(&b, "kettle_kv_blocks_used", "gauge", "KV cache blocks in use", st->kv_blocks_used) &&
              scalar(&b, "kettle_kv_blocks_free", "gauge", "KV cache blocks free", st->kv_blocks_free) &&
              scalar(&b, "kettle_kv_blocks_total", "gauge", "KV cache blocks in the pool", st->kv_blocks_total) &&
              scalar(&b, "kettle_kv_window_slots_used", "gauge", "sliding-window layers' block slots in use",
                     st->kv_window_slots_used) &&
              scalar(&b, "kettle_kv_window_slots_total", "gauge", "sliding-window layers' block slots in the pool",
                     st->kv_window_slots_total) &&
              scalar(&b, "kettle_kv_block_tokens", "gauge", "positions per KV block", st->kv_block_tokens) &&
              scalar(&b, "kettle_cache_blocks", "gauge", "KV blocks the prefix cache indexes (in use or idle)",
                     st->kv_blocks_cached) &&
              scalar(&b, "kettle_cache_evicted_blocks_total", "counter",
                     "idle cached KV blocks taken back for running requests", (double)st->cache_evicted_blocks) &&
              scalar(&b, "kettle_cache_disk_hit_tokens_total", "counter", "prompt tokens read back from the disk tier",
                     (double)st->disk_cached_prompt_tokens) &&
              scalar(&b, "kettle_cache_disk_files", "gauge", "KV block files in --cache-dir", (double)st->disk_files) &&
              scalar(&b, "kettle_cache_disk_bytes", "gauge", "bytes of KV block files in --cache-dir",
                     (double)st->disk_bytes) &&
              scalar(&b, "kettle_cache_disk_writes_total", "counter", "KV blocks written to disk", (double)st->disk_writes) &&
              scalar(&b, "kettle_cache_disk_reads_total", "counter", "KV blocks read back from disk", (double)st->disk_reads) &&
              scalar(&b, "kettle_cache_disk_rejected_total", "counter",
                     "files skipped and removed: another model, truncated, corrupt", (double)st->disk_rejected) &&
              scalar(&b, "kettle_cache_disk_removed_total", "counter", "files removed to stay under --cache-disk-mb",
                     (double)st->disk_removed);
    if (!ok) srv_buf_free(&b);
    return ok ? b.data : NULL;
}
