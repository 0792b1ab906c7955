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
#include <unistd.h>

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

/* The label of class i: empty with one class, {model="NAME"} (or
 * ,model="NAME" inside other labels) with several. */
static void label(char *out, size_t cap, const srv_class_stats *cs, int n, int i, bool inner) {
    if (n == 1) out[0] = 0;
    else snprintf(out, cap, inner ? ",model=\"%.100s\"" : "{model=\"%.100s\"}", cs[i].name);
}

/* One gauge or counter: a line per class. */
typedef struct scalar_def {
    const char *name, *type, *help;
    double (*get)(const srv_class_stats *c);
} scalar_def;

static bool scalars(srv_buf *b, const scalar_def *d, const srv_class_stats *cs, int n) {
    bool ok = family(b, d->name, d->type, d->help);
    char lab[128];
    for (int i = 0; ok && i < n; i++) {
        label(lab, sizeof lab, cs, n, i, false);
        ok = put(b, "%s%s %.17g\n", d->name, lab, d->get(&cs[i]));
    }
    return ok;
}

static bool histogram(srv_buf *b, const char *name, const char *help, const srv_class_stats *cs, int n, bool ttft) {
    bool ok = family(b, name, "histogram", help);
    char in[128], out[128];
    for (int c = 0; ok && c < n; c++) {
        const kt_latency_hist *h = ttft ? &cs[c].engine.ttft : &cs[c].engine.itl;
        label(in, sizeof in, cs, n, c, true), label(out, sizeof out, cs, n, c, false);
        uint64_t cum = 0;
        for (int i = 0; ok && i < KT_LAT_N_BUCKETS - 1; i++) {
            cum += h->counts[i];
            ok = put(b, "%s_bucket{le=\"%g\"%s} %llu\n", name, kt_lat_bucket_ms[i] / 1e3, in, (unsigned long long)cum);
        }
        cum += h->counts[KT_LAT_N_BUCKETS - 1];
        ok = ok && put(b, "%s_bucket{le=\"+Inf\"%s} %llu\n", name, in, (unsigned long long)cum) &&
             put(b, "%s_sum%s %.9g\n%s_count%s %llu\n", name, out, h->sum_ms / 1e3, name, out, (unsigned long long)h->n);
    }
    return ok;
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

static bool finished(srv_buf *b, const srv_class_stats *cs, int n) {
    bool ok = family(b, "kettle_requests_finished_total", "counter", "generation choices finished, by reason");
    char lab[128];
    for (int c = 0; c < n; c++) {
        label(lab, sizeof lab, cs, n, c, true);
        for (int f = KT_FINISH_STOP; ok && f <= KT_FINISH_ERROR; f++)
            ok = put(b, "kettle_requests_finished_total{reason=\"%s\"%s} %llu\n", kt_finish_name((kt_finish)f), lab,
                     (unsigned long long)cs[c].engine.requests_finished[f]);
    }
    return ok;
}

#define GET(field) \
    static double get_##field(const srv_class_stats *c) { return (double)c->engine.field; }
GET(prompt_tokens) GET(cached_prompt_tokens) GET(generated_tokens) GET(steps) GET(queue_depth) GET(running)
GET(kv_blocks_used) GET(kv_blocks_free) GET(kv_blocks_total) GET(kv_window_slots_used) GET(kv_window_slots_total)
GET(kv_block_tokens) GET(kv_blocks_cached) GET(cache_evicted_blocks) GET(disk_cached_prompt_tokens) GET(disk_files)
GET(disk_bytes) GET(disk_writes) GET(disk_reads) GET(disk_rejected) GET(disk_removed)
GET(spec_proposed) GET(spec_accepted) GET(spec_passes) GET(spec_lookup_proposed) GET(spec_lookup_accepted)
GET(mtp_rows) GET(mtp_rows_blind) GET(mtp_rows_skipped)
GET(state_snapshots) GET(state_snapshots_max) GET(state_snapshots_taken) GET(state_snapshots_evicted)
GET(state_snapshot_hits) GET(image_encodes) GET(image_cache_hits) GET(image_disk_hits) GET(image_cache_bytes) GET(image_cache_entries)
#undef GET

static double get_image_encode_seconds(const srv_class_stats *c) { return c->engine.image_encode_ms / 1e3; }
static double get_image_decodes(const srv_class_stats *c) { return (double)c->image_decodes; }
static double get_image_decodes_skipped(const srv_class_stats *c) { return (double)c->image_decodes_skipped; }

static const scalar_def SCALARS[] = {
    {"kettle_prompt_tokens_total", "counter", "prompt tokens prefilled (computed)", get_prompt_tokens},
    {"kettle_cache_hit_tokens_total", "counter", "prompt tokens served from the prefix cache", get_cached_prompt_tokens},
    {"kettle_generated_tokens_total", "counter", "tokens generated", get_generated_tokens},
    {"kettle_engine_steps_total", "counter", "engine steps run", get_steps},
    {"kettle_spec_proposed_tokens_total", "counter", "speculative decoding: proposed tokens verified",
     get_spec_proposed},
    {"kettle_spec_accepted_tokens_total", "counter", "speculative decoding: proposed tokens kept", get_spec_accepted},
    {"kettle_spec_passes_total", "counter", "speculative decoding: choices' steps that verified proposals",
     get_spec_passes},
    {"kettle_spec_lookup_proposed_tokens_total", "counter",
     "speculative decoding with the MTP block: of the proposed tokens, prompt lookup's", get_spec_lookup_proposed},
    {"kettle_spec_lookup_accepted_tokens_total", "counter",
     "speculative decoding with the MTP block: of the kept tokens, prompt lookup's", get_spec_lookup_accepted},
    {"kettle_mtp_rows_total", "counter", "MTP block rows run (one per token of every step, --spec mtp)", get_mtp_rows},
    {"kettle_mtp_rows_skipped_total", "counter",
     "tokens that made no MTP row: a request with images', prompts' while the block's guesses go unused",
     get_mtp_rows_skipped},
    {"kettle_mtp_rows_blind_total", "counter",
     "MTP rows run without the target's hidden state before them (first positions, after cache hits)",
     get_mtp_rows_blind},
    {"kettle_image_encodes_total", "counter", "images run through the vision tower", get_image_encodes},
    {"kettle_image_encode_seconds_total", "counter", "time the vision tower took", get_image_encode_seconds},
    {"kettle_image_decodes_total", "counter", "request images decoded (their bytes not seen before)",
     get_image_decodes},
    {"kettle_image_decodes_skipped_total", "counter",
     "request images not decoded: the same bytes were seen before (their pixels made only if the caches miss)",
     get_image_decodes_skipped},
    {"kettle_image_cache_hits_total", "counter", "images whose embeddings the encoder cache had", get_image_cache_hits},
    {"kettle_image_disk_hits_total", "counter", "images whose embeddings the encoder cache's disk tier had",
     get_image_disk_hits},
};
static const scalar_def GAUGES[] = {
    {"kettle_queue_depth", "gauge", "requests waiting for admission", get_queue_depth},
    {"kettle_running_sequences", "gauge", "sequences prefilling or decoding", get_running},
    {"kettle_kv_blocks_used", "gauge", "KV cache blocks in use", get_kv_blocks_used},
    {"kettle_kv_blocks_free", "gauge", "KV cache blocks free", get_kv_blocks_free},
    {"kettle_kv_blocks_total", "gauge", "KV cache blocks in the pool", get_kv_blocks_total},
    {"kettle_kv_window_slots_used", "gauge", "sliding-window layers' block slots in use", get_kv_window_slots_used},
    {"kettle_kv_window_slots_total", "gauge", "sliding-window layers' block slots in the pool", get_kv_window_slots_total},
    {"kettle_kv_block_tokens", "gauge", "positions per KV block", get_kv_block_tokens},
    {"kettle_cache_blocks", "gauge", "KV blocks the prefix cache indexes (in use or idle)", get_kv_blocks_cached},
    {"kettle_cache_evicted_blocks_total", "counter", "idle cached KV blocks taken back for running requests",
     get_cache_evicted_blocks},
    {"kettle_cache_state_snapshots", "gauge", "hybrid models: recurrent-state snapshots the prefix cache holds",
     get_state_snapshots},
    {"kettle_cache_state_snapshots_max", "gauge", "hybrid models: snapshots --state-cache-mb holds",
     get_state_snapshots_max},
    {"kettle_cache_state_snapshots_taken_total", "counter", "hybrid models: snapshots taken and kept",
     get_state_snapshots_taken},
    {"kettle_cache_state_snapshots_evicted_total", "counter", "hybrid models: snapshots evicted for newer ones",
     get_state_snapshots_evicted},
    {"kettle_cache_state_hits_total", "counter", "hybrid models: requests resumed from a snapshot",
     get_state_snapshot_hits},
    {"kettle_cache_disk_hit_tokens_total", "counter", "prompt tokens read back from the disk tier",
     get_disk_cached_prompt_tokens},
    {"kettle_cache_disk_files", "gauge", "KV block files in --cache-dir", get_disk_files},
    {"kettle_cache_disk_bytes", "gauge", "bytes of KV block files in --cache-dir", get_disk_bytes},
    {"kettle_cache_disk_writes_total", "counter", "KV blocks written to disk", get_disk_writes},
    {"kettle_cache_disk_reads_total", "counter", "KV blocks read back from disk", get_disk_reads},
    {"kettle_cache_disk_rejected_total", "counter", "files skipped and removed: another model, truncated, corrupt",
     get_disk_rejected},
    {"kettle_cache_disk_removed_total", "counter", "files removed to stay under --cache-disk-mb", get_disk_removed},
    {"kettle_image_cache_bytes", "gauge", "bytes of image embeddings the encoder cache holds", get_image_cache_bytes},
    {"kettle_image_cache_entries", "gauge", "images the encoder cache holds", get_image_cache_entries},
};

static double get_loaded(const srv_class_stats *c) { return c->loaded; }

/* The result cache's hits, for the classes that keep one. */
static bool result_hits(srv_buf *b, const srv_class_stats *cs, int n) {
    bool any = false, ok = true;
    char lab[128];
    for (int i = 0; i < n; i++) any |= cs[i].has_results;
    if (any) ok = family(b, "kettle_result_cache_hits_total", "counter", "requests answered from --result-cache");
    for (int i = 0; ok && i < n; i++) {
        if (!cs[i].has_results) continue;
        label(lab, sizeof lab, cs, n, i, false);
        ok = put(b, "kettle_result_cache_hits_total%s %llu\n", lab, cs[i].result_hits);
    }
    return ok;
}

/* The process's resident memory, Prometheus's standard process metric, so
 * that whoever watches a server it did not start (`kettle bench soak
 * --url`) sees it grow or stay flat: /proc/self/statm's second field, in
 * pages. Left out where /proc cannot be read. */
static bool process_rss(srv_buf *b) {
    FILE *f = fopen("/proc/self/statm", "r");
    long long size_pages, rss_pages;
    bool have = f && fscanf(f, "%lld %lld", &size_pages, &rss_pages) == 2;
    if (f) fclose(f);
    long page_bytes = sysconf(_SC_PAGESIZE);
    if (!have || page_bytes <= 0) return true;
    return family(b, "process_resident_memory_bytes", "gauge", "resident memory size in bytes") &&
           put(b, "process_resident_memory_bytes %lld\n", rss_pages * page_bytes);
}

char *srv_metrics_text(srv_metrics *m, const srv_class_stats *cs, int n) {
    srv_buf b = {0};
    bool ok = http_requests(&b, m) && fallback(&b, m) && finished(&b, cs, n);
    for (size_t i = 0; ok && i < sizeof SCALARS / sizeof SCALARS[0]; i++) ok = scalars(&b, &SCALARS[i], cs, n);
    ok = ok && histogram(&b, "kettle_time_to_first_token_seconds", "submit to first token", cs, n, true) &&
         histogram(&b, "kettle_inter_token_latency_seconds", "time between tokens of one choice", cs, n, false);
    for (size_t i = 0; ok && i < sizeof GAUGES / sizeof GAUGES[0]; i++) ok = scalars(&b, &GAUGES[i], cs, n);
    static const scalar_def LOADED = {"kettle_model_loaded", "gauge", "1 while the model is in memory (classes load "
                                      "on first use and unload when idle)", get_loaded};
    ok = ok && result_hits(&b, cs, n) && scalars(&b, &LOADED, cs, n) && process_rss(&b);
    if (!ok) srv_buf_free(&b);
    return ok ? b.data : NULL;
}
