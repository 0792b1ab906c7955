/*
 * cmd_serve.c - `kettle serve`: the OpenAI-compatible HTTP server.
 *
 * Binds the HTTP server (src/server/) first, answering /health 503
 * "loading", then loads the model and starts the engine (one thread owning
 * the model and the paged KV cache), turns the server ready, prints one
 * line "kettle serve: listening on http://HOST:PORT" to stderr when
 * requests can be sent, and runs until SIGINT or SIGTERM. Then it drains
 * (--drain-s: /health 503 "draining" so a load balancer stops sending, new
 * generation requests 503, running ones finish; an idle server skips
 * this) and shuts down in order: engine stopped (what still runs ends as
 * "cancelled"), daemon stopped, model freed.
 *
 * SIGINT/SIGTERM are blocked before any thread starts and taken with
 * sigwait, so no thread is interrupted by them and no handler runs in a
 * signal context.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/huge.h"
#include "base/timing.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/model_store.h"
#include "cli/serve_classes.h"
#include "engine/engine.h"
#include "kettle.h"
#include "server/http.h"
#include "vision/vision.h"

#define MAX_ALIASES 32
#define MAX_NAME_LISTS 32 /* --allowed-host and --cors-origin flags, each a comma list */

typedef struct serve_opts {
    const char *model, *host, *api_key, *template_arg, *kv_type, *prefix_cache, *cache_dir;
    srv_log_format log_format;
    const char *aliases[MAX_ALIASES];
    int n_aliases;
    bool strict_model_names;
    int port, n_ctx, n_parallel, kv_mb, batch_tokens, n_threads, queue_max, http_threads, cache_disk_mb, state_cache_mb;
    int result_cache, drain_s, http_timeout_s, max_connections, sse_keepalive_ms;
    /* --allowed-host, --cors-origin: each flag's comma list, joined by the server config */
    const char *allowed_hosts[MAX_NAME_LISTS], *cors_origins[MAX_NAME_LISTS];
    int n_allowed_hosts, n_cors_origins;
    kt_load_mode load;
    float itl_stretch, max_stall_ms;
    bool has_stretch, has_max_stall, no_webui, strict_max_tokens;
    const char *embeddings; /* --embeddings [POOLING]: NULL off, "" the file's pooling or mean */
    const char *config;     /* --config FILE */
    const char *spec;       /* --spec off|ngram|draft|mtp|auto */
    const char *draft;      /* --draft PATH */
    const char *mmproj;     /* --mmproj PATH */
    int image_max_bytes, image_max_side, image_max_pixels; /* --image-max-*: 0 the defaults */
    bool allow_image_urls;  /* --allow-image-urls */
    int draft_max;          /* --draft-max K */
    bool spec_fixed;        /* --spec-fixed */
    serve_class classes[SERVE_MAX_CLASSES]; /* --model NAME=PATH,... and --config's, then -m's one */
    int n_classes;
    /* --fallback URL and its settings (server/fallback.h) */
    const char *fallback, *fallback_key_env, *fallback_on, *fallback_model;
    int fallback_timeout_s, fallback_max_s;
} serve_opts;

/* "Endpoints:", a line per method, from the server's own route table
 * (srv_route_at): a route added there is listed here too, and the test
 * checks the help against that table. */
static void print_endpoints(FILE *out) {
    fprintf(out, "Endpoints:\n");
    const char *path, *method, *p2, *m2;
    for (size_t i = 0; srv_route_at(i, &path, &method); i++) {
        bool seen = false; /* the method's line is printed at its first route */
        for (size_t k = 0; k < i && !seen; k++) seen = srv_route_at(k, &p2, &m2) && !strcmp(m2, method);
        if (seen) continue;
        int col = fprintf(out, "  %-4s", method);
        const char *sep = " ";
        for (size_t k = i; srv_route_at(k, &p2, &m2); k++) {
            if (strcmp(m2, method)) continue;
            if (col + (int)strlen(p2) + 2 > 90) { /* wrap under the first path */
                fprintf(out, ",\n");
                col = fprintf(out, "      "), sep = " ";
            }
            col += fprintf(out, "%s%s", sep, p2);
            sep = ", ";
        }
        fputc('\n', out);
    }
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: kettle serve -m MODEL [options]\n"
            "       kettle serve --model NAME=PATH[,key=value...] [--model ...] [options]\n"
            "       kettle serve --config FILE.json [options]\n"
            "  -m, --model FILE        GGUF model, or OWNER/REPO[:QUANT] pulled with kettle pull\n"
            "      --model NAME=PATH[,key=value...]\n"
            "                          serve several models (inference classes), each under NAME; a\n"
            "                          request's \"model\" picks one (none: the first). Keys: %s\n"
            "      --config FILE       the classes in a JSON file: {\"models\": [{\"name\", \"path\", the same\n"
            "                          keys, \"aliases\": [...]}]}; see the README\n"
            "      --host ADDR         address to bind (default 127.0.0.1: this machine only)\n"
            "      --port N            port (default 8080; 0: any free port, printed)\n"
            "  -c, --ctx N             positions per sequence, prompt + output (default: the model's training\n"
            "                          context, at most 32768)\n"
            "      --parallel N        sequences decoding at once; each choice counts (default 16)\n"
            "      --kv-mb N           KV cache budget in MiB (default: parallel x min(ctx, 4096)\n"
            "                          positions, at least one ctx; cut to the memory available)\n"
            "      --batch-tokens N    tokens per engine step, decode + prefill (default 256)\n"
            "      --queue N           requests waiting before 503 (default 64)\n"
            "      --itl-stretch X     beside decoding streams, size prefill so a step takes about\n"
            "                          X times a decode-only step (default 1.8; lower: smoother\n"
            "                          streams, slower first token of new prompts; 0: off)\n"
            "      --strict-max-tokens a max_tokens past the room the context leaves is a 400 (default:\n"
            "                          cut to that room, the reply ending at \"length\")\n"
            "      --max-stall-ms N    beside decoding streams, a prompt whose remaining tokens cost\n"
            "                          at most N ms goes in whole (an agent's next turn: first token\n"
            "                          at once); streams then wait up to N ms more than the stretch,\n"
            "                          still getting a token every step (default 5000; 0: only\n"
            "                          within the stretch)\n"
            "      --kv-type T         KV cache element type: f16 (default), q8_0 (half the\n"
            "                          memory; head size a multiple of 32) or f32\n"
            "      --prefix-cache on|off  reuse the KV of earlier prompts and replies that a\n"
            "                          request starts with (default on); cached KV lives in the\n"
            "                          --kv-mb budget and is given back whenever a request needs room\n"
            "      --cache-dir DIR     also keep cached KV on disk under DIR (per model), found again\n"
            "                          after a restart; without it nothing touches the disk\n"
            "      --cache-disk-mb N   at most N MiB of files in --cache-dir (default 10240); the\n"
            "                          least recently used go first\n"
            "      --state-cache-mb N  hybrid models (Qwen 3.5): N MiB for the prefix cache's copies of\n"
            "                          the recurrent state (default 1024, or an eighth of the memory\n"
            "                          if less; at least 8 copies)\n"
            "      --result-cache N    answer a repeated deterministic request (temperature 0 or an\n"
            "                          explicit seed, no logprobs) from the last N answers, without\n"
            "                          decoding; marked x-kettle-cache: hit (default 0: off)\n"
            "  -t, --threads N         forward-pass threads (default: all CPUs)\n"
            "      --http-threads N    HTTP worker threads (default 4)\n"
            "      --http-timeout S    a request must arrive whole (headers and body) within S seconds of\n"
            "                          its connection opening or the previous answer ending, else the\n"
            "                          connection is closed; idle keep-alive connections close after S\n"
            "                          seconds too (default 60). Answers themselves have no deadline\n"
            "      --http-max-connections N  open connections at once; more are refused (default 4096)\n"
            "      --sse-keepalive-ms N  a streamed reply that has sent nothing for N ms (queued, reading\n"
            "                          a long prompt, or between slow tokens) gets a keep-alive, so\n"
            "                          clients and proxies with an idle timeout keep it: a ping event\n"
            "                          on /v1/messages, an SSE comment (': keep-alive') on the other\n"
            "                          APIs (default 1000; 0: none)\n"
            "      --api-key KEY       require 'Authorization: Bearer KEY' (not for /health)\n"
            "      --allowed-host NAME[,NAME...]  answer requests whose Host is NAME (any port), besides\n"
            "                          localhost, 127.0.0.1 and [::1] (repeatable; '*': any). Bound to a\n"
            "                          loopback address, other names get 403 (DNS rebinding); bound\n"
            "                          elsewhere, the Host is only checked when names are given\n"
            "      --cors-origin ORIGIN[,ORIGIN...]  web pages from ORIGIN (e.g. http://localhost:3000)\n"
            "                          may call the API: CORS headers and preflight answers for them\n"
            "                          (repeatable; '*': any page). Without it a request carrying another\n"
            "                          page's Origin gets 403; the chat page at / is this server's own\n"
            "      --alias NAME        another name the model answers to and lists in /v1/models\n"
            "                          (repeatable; the file's name stays)\n"
            "      --strict-model-names  a request naming none of the model's names gets 404\n"
            "                          model_not_found (default: any name is this model)\n"
            "      --chat-template T   a Jinja file or a built-in name (chatml, llama2, llama3,\n"
            "                          mistral, phi3, gemma); default: the model's own\n"
            "      --load MODE         repack, copy, mmap or populate (default repack)\n"
            "      --log-format F      the request log on stderr, one line per request: text\n"
            "                          (default), json (one JSON object a line) or off; method,\n"
            "                          path, status, total ms and, for generation, model, prompt /\n"
            "                          cached / generated tokens and time to first token\n"
            "      --log-requests      the same as --log-format text (kept for old scripts)\n"
            "      --no-webui          no chat page at / (a 404 there; the API is unchanged)\n"
            "      --fallback URL      another OpenAI-compatible server (its base URL, e.g.\n"
            "                          http://127.0.0.1:9000/v1) that gets the generation requests\n"
            "                          kettle cannot serve; the answer says x-kettle-served-by: fallback\n"
            "      --fallback-key-env NAME  the environment variable holding its API key, sent as a\n"
            "                          Bearer token (default KETTLE_FALLBACK_API_KEY; unset: no key)\n"
            "      --fallback-on LIST  which refusals forward, a comma list of context (the prompt does\n"
            "                          not fit), busy (the queue is full), unknown-model (with\n"
            "                          --strict-model-names), error (the engine failed) (default: all)\n"
            "      --fallback-model NAME  the model to ask the upstream for (default: the request's)\n"
            "      --fallback-timeout-s N  connect, and a stream's first byte, within N s, else 504\n"
            "                          (default 10)\n"
            "      --fallback-max-s N  a whole forwarded request within N s (default 600)\n"
            "      --spec off|ngram|draft|mtp|auto  speculative decoding: ngram verifies, with each decode step,\n"
            "                          the tokens the request's context (or an earlier request's\n"
            "                          output) predicts next; the output is exactly plain\n"
            "                          decoding's; k adapts to the measured acceptance and cost,\n"
            "                          down to 0; draft: a smaller model of the same family\n"
            "                          (--draft PATH, the same vocabulary, checked) guesses them\n"
            "                          instead; mtp: the model's own multi-token-prediction block\n"
            "                          (Qwen 3.5 files carry one); auto (the default): draft with\n"
            "                          --draft, else mtp where the model has the block, else ngram\n"
            "      --draft PATH        the -m model's draft model (implies --spec draft; with several\n"
            "                          models a class gives its own: draft=PATH)\n"
            "      --draft-max K       most tokens proposed per sequence and step (default 8, at most 32)\n"
            "      --mmproj PATH       the -m model's vision projector (llama.cpp's mmproj GGUF: Qwen2-VL,\n"
            "                          Qwen2.5-VL, Qwen3-VL, Qwen 3.5): chat requests may carry images\n"
            "                          (image_url data: URLs); with several models a class gives mmproj=PATH\n"
            "      --image-max-bytes N, --image-max-side N, --image-max-pixels N\n"
            "                          what one image may be: encoded bytes (default 20 MiB), width and\n"
            "                          height (16384), decoded pixels (40 million); beyond, a 400 naming it\n"
            "      --allow-image-urls  fetch http(s) image URLs (at most --image-max-bytes, 10 s, 3\n"
            "                          redirects; default: only data: URLs are taken)\n"
            "      --spec-fixed        verify every proposal found (no adaptive k; for benchmarks)\n"
            "      --embeddings[=P]    answer /v1/embeddings with a generative model too: its last\n"
            "                          hidden states pooled by P, mean (default), last or cls. A file\n"
            "                          that declares a pooling (an embedding model) embeds without it\n"
            "      --drain-s N         on SIGTERM or SIGINT, drain: /health says 503 draining, new\n"
            "                          generation requests get 503, running ones have up to N s to\n"
            "                          finish (default 30; 0: cancel them at once); exits as soon as\n"
            "                          none runs; a second signal exits at once\n",
            serve_class_keys_help());
    print_endpoints(out);
    fprintf(out,
            "  GET  / is a chat page (built in, no API key needed to load it; its requests send the\n"
            "       key you give it; --no-webui: none)\n"
            "/health: 200 {\"status\":\"ok\",...} when ready; 503 {\"status\":\"loading\"} while the\n"
            "model loads (the port is bound first), 503 {\"status\":\"draining\"} while draining.\n"
            "GET /v1/responses/{id} is a 404 saying so: kettle stores no responses.\n");
}

typedef struct int_option {
    const char *name, *alias;
    long lo, hi;
    int *dst;
} int_option;

/* One more --allowed-host / --cors-origin value: 1, or 2 (reported). */
static int add_name_list(const char *flag, const char **lists, int *n, const char *v) {
    if (*n == MAX_NAME_LISTS) return cli_usage_error("serve", "at most %d %s flags (each takes a comma list)", MAX_NAME_LISTS, flag);
    if (!v[0]) return cli_usage_error("serve", "%s needs a value", flag);
    lists[(*n)++] = v;
    return 1;
}

/* The flags' values as one comma list (malloc'ed; NULL: none given, or out of memory). */
static char *join_lists(const char *const *lists, int n) {
    size_t len = 1;
    for (int k = 0; k < n; k++) len += strlen(lists[k]) + 1;
    char *out = n ? malloc(len) : NULL;
    if (!out) return NULL;
    out[0] = 0;
    for (int k = 0; k < n; k++) strcat(strcat(out, k ? "," : ""), lists[k]);
    return out;
}

/* One option at argv[*i]: 1 taken, 0 unknown, 2 usage error (reported). */
static int take_option(int argc, char **argv, int *i, serve_opts *o) {
    int_option ints[] = {{"--port", NULL, 0, 65535, &o->port},          {"--ctx", "-c", 0, 1 << 24, &o->n_ctx},
                         {"--parallel", NULL, 1, 1024, &o->n_parallel}, {"--kv-mb", NULL, 0, 1 << 24, &o->kv_mb},
                         {"--batch-tokens", NULL, 1, 1 << 20, &o->batch_tokens}, {"--threads", "-t", 1, 1024, &o->n_threads},
                         {"--queue", NULL, 1, 1 << 20, &o->queue_max},  {"--http-threads", NULL, 1, 256, &o->http_threads},
                         {"--cache-disk-mb", NULL, 1, 1 << 30, &o->cache_disk_mb},
                         {"--state-cache-mb", NULL, 1, 1 << 24, &o->state_cache_mb},
                         {"--result-cache", NULL, 0, 1 << 20, &o->result_cache},
                         {"--drain-s", NULL, 0, 86400, &o->drain_s},
                         {"--http-timeout", NULL, 1, 3600, &o->http_timeout_s},
                         {"--http-max-connections", NULL, 16, 1 << 16, &o->max_connections},
                         {"--sse-keepalive-ms", NULL, 0, 3600000, &o->sse_keepalive_ms},
                         {"--draft-max", NULL, 1, 32, &o->draft_max},
                         {"--image-max-bytes", NULL, 1024, 1 << 30, &o->image_max_bytes},
                         {"--image-max-side", NULL, 16, 1 << 16, &o->image_max_side},
                         {"--image-max-pixels", NULL, 256, 1 << 30, &o->image_max_pixels},

                         {"--fallback-timeout-s", NULL, 1, 3600, &o->fallback_timeout_s},
                         {"--fallback-max-s", NULL, 1, 86400, &o->fallback_max_s}};
    struct { const char *name, *alias; const char **dst; } strs[] = {
        {"--config", NULL, &o->config}, {"--spec", NULL, &o->spec}, {"--draft", NULL, &o->draft}, {"--mmproj", NULL, &o->mmproj}, {"--host", NULL, &o->host}, {"--api-key", NULL, &o->api_key},
        {"--chat-template", NULL, &o->template_arg}, {"--kv-type", NULL, &o->kv_type},
        {"--prefix-cache", NULL, &o->prefix_cache}, {"--cache-dir", NULL, &o->cache_dir},
        {"--fallback", NULL, &o->fallback}, {"--fallback-key-env", NULL, &o->fallback_key_env},
        {"--fallback-on", NULL, &o->fallback_on}, {"--fallback-model", NULL, &o->fallback_model}};
    const char *v = NULL;
    int r;
    if (!strcmp(argv[*i], "--log-requests")) return o->log_format = SRV_LOG_TEXT, 1;
    if ((r = cli_opt("serve", argc, argv, i, "--log-format", &v))) {
        if (r < 0) return 2;
        return srv_log_format_parse(v, &o->log_format) ? 1 : cli_usage_error("serve", "invalid --log-format '%s' (text, json, off)", v);
    }
    if (!strcmp(argv[*i], "--strict-model-names")) return o->strict_model_names = true, 1;
    if ((r = cli_opt("serve", argc, argv, i, "--model", &v)) || (r = cli_opt("serve", argc, argv, i, "-m", &v))) {
        if (r < 0) return 2;
        if (!serve_class_is_spec(v)) return o->model = v, 1;
        if (o->n_classes == SERVE_MAX_CLASSES) return cli_usage_error("serve", "at most %d models", SERVE_MAX_CLASSES);
        return serve_class_parse(v, &o->classes[o->n_classes++]) ? 2 : 1;
    }
    if ((r = cli_opt("serve", argc, argv, i, "--allowed-host", &v)))
        return r < 0 ? 2 : add_name_list("--allowed-host", o->allowed_hosts, &o->n_allowed_hosts, v);
    if ((r = cli_opt("serve", argc, argv, i, "--cors-origin", &v)))
        return r < 0 ? 2 : add_name_list("--cors-origin", o->cors_origins, &o->n_cors_origins, v);
    if (!strcmp(argv[*i], "--no-webui")) return o->no_webui = true, 1;
    if (!strcmp(argv[*i], "--strict-max-tokens")) return o->strict_max_tokens = true, 1;
    if (!strcmp(argv[*i], "--spec-fixed")) return o->spec_fixed = true, 1;
    if (!strcmp(argv[*i], "--allow-image-urls")) return o->allow_image_urls = true, 1;
    if (!strcmp(argv[*i], "--embeddings")) return o->embeddings = "", 1;
    if (!strncmp(argv[*i], "--embeddings=", 13)) {
        o->embeddings = argv[*i] + 13;
        if (strcmp(o->embeddings, "mean") && strcmp(o->embeddings, "last") && strcmp(o->embeddings, "cls"))
            return cli_usage_error("serve", "invalid --embeddings pooling '%s' (mean, last, cls)", o->embeddings);
        return 1;
    }
    if ((r = cli_opt("serve", argc, argv, i, "--alias", &v))) {
        if (r < 0) return 2;
        if (o->n_aliases == MAX_ALIASES) return cli_usage_error("serve", "at most %d --alias names", MAX_ALIASES);
        if (!v[0]) return cli_usage_error("serve", "--alias needs a non-empty name");
        o->aliases[o->n_aliases++] = v;
        return 1;
    }
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++)
        if ((r = cli_opt("serve", argc, argv, i, ints[k].name, &v)) ||
            (ints[k].alias && (r = cli_opt("serve", argc, argv, i, ints[k].alias, &v)))) {
            if (r < 0) return 2;
            return cli_parse_int(v, ints[k].lo, ints[k].hi, ints[k].dst)
                       ? 1
                       : cli_usage_error("serve", "invalid value '%s' for %s (%ld..%ld)", v, ints[k].name, ints[k].lo,
                                         ints[k].hi);
        }
    for (size_t k = 0; k < sizeof strs / sizeof strs[0]; k++)
        if ((r = cli_opt("serve", argc, argv, i, strs[k].name, strs[k].dst)) ||
            (strs[k].alias && (r = cli_opt("serve", argc, argv, i, strs[k].alias, strs[k].dst))))
            return r < 0 ? 2 : 1;
    if ((r = cli_opt("serve", argc, argv, i, "--itl-stretch", &v))) {
        if (r < 0) return 2;
        o->has_stretch = true;
        return cli_parse_float(v, 0.0f, 100.0f, &o->itl_stretch)
                   ? 1
                   : cli_usage_error("serve", "invalid --itl-stretch '%s' (0 = off, or a factor >= 1, e.g. 1.8)", v);
    }
    if ((r = cli_opt("serve", argc, argv, i, "--max-stall-ms", &v))) {
        if (r < 0) return 2;
        o->has_max_stall = true;
        return cli_parse_float(v, 0.0f, 60000.0f, &o->max_stall_ms)
                   ? 1
                   : cli_usage_error("serve", "invalid --max-stall-ms '%s' (0..60000, e.g. 1000)", v);
    }
    if ((r = cli_opt("serve", argc, argv, i, "--load", &v))) {
        if (r < 0) return 2;
        return cli_parse_load_mode(v, &o->load) ? 1 : cli_usage_error("serve", "invalid --load '%s' (mmap, populate, copy, repack)", v);
    }
    return 0;
}

/* Class c's own upstream: the command line's with its fallback= and
 * fallback-on= (url NULL: it has none of its own). 0 or a usage error. */
static int class_fallback(const serve_class *c, const srv_fallback *global, srv_fallback *out) {
    char msg[300];
    *out = (srv_fallback){0};
    if (!c->fallback && !c->fallback_on) return 0;
    *out = *global;
    if (c->fallback) out->url = c->fallback;
    if (!out->url) return cli_usage_error("serve", "model '%s': fallback-on= needs fallback=URL or --fallback", c->name);
    if (!srv_fb_check_url(out->url, msg, sizeof msg)) return cli_usage_error("serve", "model '%s': fallback: %s", c->name, msg);
    if (c->fallback_on && !srv_fb_parse_triggers(c->fallback_on, &out->triggers, msg, sizeof msg))
        return cli_usage_error("serve", "model '%s': fallback-on: %s", c->name, msg);
    return 0;
}

/* Each class's proposer: its spec= or --spec, auto when neither says; a
 * draft model is a class's draft= (--draft is the one -m model's); auto
 * is the draft where a class has one, else the MTP block where its model
 * has one (known once it is loaded: engine_params), else prompt lookup. Returns 0, or
 * 2 after a usage error. */
static int check_spec(serve_opts *o) {
    if (o->draft && o->spec && strcmp(o->spec, "draft") && strcmp(o->spec, "auto"))
        return cli_usage_error("serve", "--draft goes with --spec draft (or auto)");
    if (o->draft && o->n_classes > 1)
        return cli_usage_error("serve", "--draft names the one -m model's draft; with several models give each its "
                               "own draft=PATH");
    if (o->draft && !o->classes[0].draft) o->classes[0].draft = o->draft;
    if (o->mmproj && o->n_classes > 1)
        return cli_usage_error("serve", "--mmproj names the one -m model's projector; with several models give each "
                               "its own mmproj=PATH");
    if (o->mmproj && !o->classes[0].mmproj) o->classes[0].mmproj = o->mmproj;
    bool any_on = false;
    for (int i = 0; i < o->n_classes; i++) {
        serve_class *c = &o->classes[i];
        const char *spec = c->spec ? c->spec : o->spec;
        /* auto, the default: the best proposer at hand. Speculation is on
         * unless asked off because it changes no token (the same draws from
         * the same rows) and adaptive k keeps it at plain decoding's speed
         * where nothing is kept (docs/PERFORMANCE.md) */
        if (!spec || !strcmp(spec, "auto")) spec = c->draft ? "draft" : "auto";
        if (spec && !strcmp(spec, "draft") && !c->draft && !c->spec && o->n_classes == 1)
            return cli_usage_error("serve", "--spec draft needs --draft PATH");
        if (spec && !strcmp(spec, "draft") && !c->draft)
            return cli_usage_error("serve", "model '%s': %s needs draft=PATH", c->name, c->spec ? "spec=draft" : "--spec draft");
        if (c->draft && strcmp(spec, "draft"))
            return cli_usage_error("serve", "model '%s': a draft model goes with spec=draft (it has spec=%s)", c->name,
                                   spec);
        c->spec = spec;
        any_on = any_on || (spec && strcmp(spec, "off"));
    }
    if ((o->draft_max || o->spec_fixed) && !any_on)
        return cli_usage_error("serve", "--draft-max and --spec-fixed need --spec ngram, draft or mtp");
    return 0;
}

/* The --fallback options together; the key itself is only looked for,
 * never printed. */
static int check_fallback(const serve_opts *o, srv_fallback *fb) {
    char msg[300];
    bool any = o->fallback_key_env || o->fallback_on || o->fallback_model || o->fallback_timeout_s || o->fallback_max_s;
    if (!o->fallback) return any ? cli_usage_error("serve", "the --fallback-* options need --fallback URL") : 0;
    if (!srv_fb_check_url(o->fallback, msg, sizeof msg)) return cli_usage_error("serve", "--fallback: %s", msg);
    *fb = (srv_fallback){.url = o->fallback, .key_env = o->fallback_key_env, .model = o->fallback_model,
                         .timeout_s = o->fallback_timeout_s, .max_s = o->fallback_max_s};
    if (o->fallback_on && !srv_fb_parse_triggers(o->fallback_on, &fb->triggers, msg, sizeof msg))
        return cli_usage_error("serve", "--fallback-on: %s", msg);
    if (o->fallback_model && !o->fallback_model[0]) return cli_usage_error("serve", "--fallback-model must not be empty");
    if (o->fallback_key_env && !srv_fb_check_env_name(o->fallback_key_env))
        return cli_usage_error("serve", "--fallback-key-env '%s' is not an environment variable's name (letters, "
                               "digits, '_'); give the variable's name, not the key", o->fallback_key_env);
    const char *key = o->fallback_key_env ? getenv(o->fallback_key_env) : NULL;
    if (o->fallback_key_env && (!key || !key[0]))
        return cli_usage_error("serve", "--fallback-key-env %s: that environment variable is not set (or empty)",
                               o->fallback_key_env);
    return 0;
}

static int parse_opts(int argc, char **argv, serve_opts *o) {
    *o = (serve_opts){.host = "127.0.0.1", .port = 8080, .load = KT_LOAD_REPACK, .log_format = SRV_LOG_TEXT,
                      .drain_s = 30, .sse_keepalive_ms = 1000}; /* 1 s: a client with a 2 s idle timeout stays */
    for (int i = 1; i < argc; i++) {
        int r = take_option(argc, argv, &i, o);
        if (r == 2) return 2;
        if (r == 0) return cli_usage_error("serve", "unknown option '%s'", argv[i]);
    }
    if (o->config && serve_config_load(o->config, o->classes, SERVE_MAX_CLASSES, &o->n_classes)) return 2;
    if (!o->model && !o->n_classes) return cli_usage_error("serve", "need -m MODEL (or --model NAME=PATH, or --config FILE)");
    if (o->model && o->n_classes)
        return cli_usage_error("serve", "give one model with -m PATH, or classes with --model NAME=PATH / --config, not both");
    if (o->model) { /* one class: the file's name, the --alias names */
        serve_class *c = &o->classes[o->n_classes++];
        const char *base = strrchr(o->model, '/');
        *c = (serve_class){.name = base ? base + 1 : o->model, .path = o->model, .n_aliases = o->n_aliases};
        memcpy(c->aliases, o->aliases, sizeof(const char *) * (size_t)o->n_aliases);
    } else if (o->n_aliases) {
        return cli_usage_error("serve", "--alias names the one -m model; a class takes alias=NAME");
    }
    if (o->api_key && !o->api_key[0]) return cli_usage_error("serve", "--api-key must not be empty");
    if (o->kv_type && strcmp(o->kv_type, "f16") && strcmp(o->kv_type, "f32") && strcmp(o->kv_type, "q8_0"))
        return cli_usage_error("serve", "invalid --kv-type '%s' (f16, q8_0, f32)", o->kv_type);
    if (o->prefix_cache && strcmp(o->prefix_cache, "on") && strcmp(o->prefix_cache, "off"))
        return cli_usage_error("serve", "invalid --prefix-cache '%s' (on, off)", o->prefix_cache);
    if (o->spec && strcmp(o->spec, "off") && strcmp(o->spec, "ngram") && strcmp(o->spec, "draft") &&
        strcmp(o->spec, "mtp") && strcmp(o->spec, "auto"))
        return cli_usage_error("serve", "invalid --spec '%s' (off, ngram, draft, mtp, auto)", o->spec);
    return check_spec(o);
}

/* Where the fallback goes, which refusals forward and whether a key is
 * sent (the variable's name, never its value). */
static void print_fallback(const srv_fallback *fb, const char *class_name) {
    if (!fb->url) return;
    char on[80] = "";
    for (int r = 0; r < SRV_FB_N_REASONS; r++)
        if (!fb->triggers || (fb->triggers & (1u << r)))
            snprintf(on + strlen(on), sizeof on - strlen(on), "%s%s", on[0] ? ", " : "", srv_fb_reason_name(r));
    const char *env = fb->key_env ? fb->key_env : SRV_FB_DEFAULT_KEY_ENV, *key = getenv(env);
    fprintf(stderr, "kettle serve: %s%sfallback upstream %s on %s (%s $%s)\n", class_name ? class_name : "",
            class_name ? ": " : "", fb->url, on,
            key && key[0] ? "API key from" : "no API key: unset", env);
}

/* The engine of class c (model m, loaded: auto's choice of the MTP block
 * needs it): its own settings, else the command line's. */
static kt_engine_params engine_params(const serve_opts *o, const serve_class *c, const kt_model *m) {
    kt_engine_params p = kt_engine_defaults();
    const int n_ctx = c->n_ctx ? c->n_ctx : o->n_ctx, n_parallel = c->n_parallel ? c->n_parallel : o->n_parallel;
    const int kv_mb = c->kv_mb ? c->kv_mb : o->kv_mb;
    const char *kv_type = c->kv_type ? c->kv_type : o->kv_type;
    if (n_ctx) p.n_ctx = n_ctx;
    if (n_parallel) p.n_parallel = n_parallel;
    if (kv_mb) p.kv_bytes = (size_t)kv_mb << 20;
    if (o->batch_tokens) p.batch_tokens = o->batch_tokens;
    if (o->n_threads) p.n_threads = o->n_threads;
    if (o->queue_max) p.queue_max = o->queue_max;
    if (o->has_stretch) p.max_itl_stretch = o->itl_stretch;
    p.strict_max_tokens = o->strict_max_tokens;
    if (o->has_max_stall) p.max_stall_ms = o->max_stall_ms;
    if (o->prefix_cache) p.prefix_cache = strcmp(o->prefix_cache, "off") != 0;
    p.cache_dir = o->cache_dir;
    p.cache_disk_bytes = (size_t)o->cache_disk_mb << 20;
    p.state_cache_bytes = (size_t)o->state_cache_mb << 20;
    if (kv_type) p.kv_type = !strcmp(kv_type, "f32") ? KT_KV_F32 : !strcmp(kv_type, "q8_0") ? KT_KV_Q8_0 : KT_KV_F16;
    const char *spec = c->spec ? c->spec : o->spec;
    if (spec)
        p.spec = !strcmp(spec, "ngram") ? KT_SPEC_NGRAM : !strcmp(spec, "draft") ? KT_SPEC_DRAFT
               : !strcmp(spec, "mtp")   ? KT_SPEC_MTP
               : !strcmp(spec, "auto")  ? (kt_model_has_mtp(m) ? KT_SPEC_MTP : KT_SPEC_NGRAM)
                                        : KT_SPEC_OFF;
    if (o->draft_max) p.spec_k_max = o->draft_max;
    if (c->draft_max) p.spec_k_max = c->draft_max;
    p.spec_fixed_k = o->spec_fixed;
    return p;
}

static const char *signal_name(int sig) {
    return sig == SIGINT ? "interrupted" : "terminated";
}

/* Blocks until SIGINT or SIGTERM (blocked in every thread). */
static void wait_for_signal(const sigset_t *set) {
    int sig = 0;
    while (sigwait(set, &sig) != 0) {}
    fprintf(stderr, "kettle serve: %s, shutting down\n", signal_name(sig));
}

/* How /v1/embeddings pools: --embeddings' choice, else the file's
 * pooling_type (GGUF: 1 mean, 2 cls, 3 last), else mean with a bare
 * --embeddings; KT_POOL_NONE: the server does not embed. */
static kt_pooling embed_pooling(const kt_model *m, const serve_opts *o, const serve_class *c) {
    const char *p = c->embeddings ? c->embeddings : o->embeddings;
    if (p && !strcmp(p, "mean")) return KT_POOL_MEAN;
    if (p && !strcmp(p, "last")) return KT_POOL_LAST;
    if (p && !strcmp(p, "cls")) return KT_POOL_CLS;
    switch (m ? kt_model_describe(m)->pooling_type : 0) {
    case 1: return KT_POOL_MEAN;
    case 2: return KT_POOL_CLS;
    case 3: return KT_POOL_LAST;
    default: return p ? KT_POOL_MEAN : KT_POOL_NONE;
    }
}

/* The drain: health checks see 503 and stop sending, running requests go
 * on until none is left, drain_s seconds pass, or a second signal comes.
 * An idle server does not wait at all. */
static void drain(srv_server *srv, const sigset_t *set, int drain_s) {
    srv_drain(srv);
    int busy = srv_busy(srv);
    if (!busy || !drain_s) return;
    fprintf(stderr, "kettle serve: draining: %d request%s running, up to %d s (a second signal stops at once)\n", busy,
            busy == 1 ? "" : "s", drain_s);
    double deadline = kt_time_ms() + drain_s * 1000.0;
    while ((busy = srv_busy(srv)) > 0) {
        if (kt_time_ms() >= deadline) {
            fprintf(stderr, "kettle serve: drain deadline (--drain-s %d): cancelling %d request%s\n", drain_s, busy,
                    busy == 1 ? "" : "s");
            return;
        }
        struct timespec tick = {0, 20 * 1000000L};
        int sig = sigtimedwait(set, NULL, &tick);
        if (sig > 0) {
            fprintf(stderr, "kettle serve: %s again, stopping now (%d request%s cancelled)\n", signal_name(sig), busy,
                    busy == 1 ? "" : "s");
            return;
        }
    }
    fprintf(stderr, "kettle serve: drained\n");
}

static srv_config server_config(const serve_opts *o) {
    kt_image_limits lim;
    kt_image_limits_default(&lim);
    if (o->image_max_bytes) lim.max_bytes = (size_t)o->image_max_bytes;
    if (o->image_max_side) lim.max_side = o->image_max_side;
    if (o->image_max_pixels) lim.max_pixels = o->image_max_pixels;
    return (srv_config){.host = o->host, .port = o->port, .api_key = o->api_key, .image_limits = lim,
                        .allow_image_urls = o->allow_image_urls,
                        .strict_model_names = o->strict_model_names, .http_threads = o->http_threads,
                        .http_timeout_s = o->http_timeout_s, .max_connections = o->max_connections,
                        .sse_keepalive_ms = o->sse_keepalive_ms, .log_format = o->log_format, .no_webui = o->no_webui};
}

/* Who may drive the server besides local programs (origin.h), so an
 * operator sees what a web page can do. */
static void print_origin_rules(const srv_config *cfg) {
    if (cfg->allowed_hosts) fprintf(stderr, "kettle serve: also answers to the Host names %s\n", cfg->allowed_hosts);
    else if (strcmp(cfg->host, "127.0.0.1") && strcmp(cfg->host, "localhost") && strcmp(cfg->host, "::1"))
        fprintf(stderr, "kettle serve: bound to %s: the Host header is checked only for a loopback address (name the "
                        "hosts to accept with --allowed-host)\n", cfg->host);
    if (cfg->cors_origins) fprintf(stderr, "kettle serve: web pages may call the API from %s (CORS)\n", cfg->cors_origins);
    else fprintf(stderr, "kettle serve: web pages of other origins are refused (--cors-origin allows some)\n");
}

/* What a class holds until the server stops, and what loading it again
 * needs (the server's load callback). */
typedef struct loaded_class {
    kt_model *model; /* loaded at start; then the server's (it may unload and reload it) */
    kt_model *draft; /* its draft model, loaded with it; then its engine's (spec_draft_owned) */
    kt_vision *vision; /* its vision tower (mmproj=), loaded at start and kept until the server stops */
    char *tmpl;      /* its chat template text, or NULL: the model's own */
    const serve_opts *o;
    const serve_class *c;
} loaded_class;

static void print_banner(const srv_class_config *k, const kt_engine *engine, const serve_opts *o, int n_classes) {
    const kt_engine_params *ap = kt_engine_get_params(engine);
    kt_engine_stats st;
    kt_engine_get_stats((kt_engine *)engine, &st);
    fprintf(stderr, "kettle serve: model %s, ctx %d, parallel %d, batch %d tokens\n", k->name, ap->n_ctx,
            ap->n_parallel, ap->batch_tokens);
    for (int i = 0; i < k->n_aliases; i++) fprintf(stderr, "kettle serve: also answers to '%s'\n", k->aliases[i]);
    if (n_classes == 1)
        fprintf(stderr, "kettle serve: %s\n", o->strict_model_names ? "a request naming another model gets 404 (--strict-model-names)"
                                                                    : "a request naming another model is served by this one");
    fprintf(stderr, "kettle serve: KV cache %d blocks of %d positions (%.0f MiB, %d positions), prefix cache %s\n",
            st.kv_blocks_total, st.kv_block_tokens, (double)st.kv_pool_bytes / 1048576.0,
            st.kv_blocks_total * st.kv_block_tokens, ap->prefix_cache ? "on" : "off");
    if (st.state_slots)
        fprintf(stderr, "kettle serve: recurrent state (a hybrid model) %d x %.1f MiB, one per running sequence%s, in the "
                "KV cache's memory\n", st.state_slots * (st.state_spares ? 2 : 1), (double)st.state_slot_bytes / 1048576.0,
                st.state_spares ? " and a spare for its verify passes" : "");
    if (ap->spec != KT_SPEC_OFF)
        fprintf(stderr, "kettle serve: speculative decoding: %s, up to %d tokens a step, %s\n",
                ap->spec == KT_SPEC_DRAFT ? "a draft model"
                : ap->spec == KT_SPEC_MTP ? "the model's multi-token-prediction block"
                                          : "prompt lookup and earlier requests' outputs",
                ap->spec_k_max, ap->spec_fixed_k ? "all verified (--spec-fixed)" : "k adapting to acceptance and cost");
    if (st.kv_wanted_bytes)
        fprintf(stderr, "kettle serve: the default KV pool (%d x %d positions, at least one context) would take %.0f MiB, "
                "more than the memory available now: it holds %d positions (requests wait for room; --kv-mb, --ctx or "
                "--parallel set it)\n",
                ap->n_parallel, ap->n_ctx < KT_POOL_POSITIONS_PER_SEQ ? ap->n_ctx : KT_POOL_POSITIONS_PER_SEQ, (double)st.kv_wanted_bytes / 1048576.0,
                st.kv_blocks_total * st.kv_block_tokens);
    if (ap->n_ctx > kt_model_describe(k->model)->n_ctx_train)
        fprintf(stderr, "kettle serve: warning: --ctx %d is beyond the %d positions the model was trained on; its output "
                "past them may degrade\n", ap->n_ctx, kt_model_describe(k->model)->n_ctx_train);
    if (st.kv_window_slots_total > 0)
        fprintf(stderr, "kettle serve: the sliding-window layers keep %d block slots (%.0f MiB less than full "
                "caches)\n", st.kv_window_slots_total,
                ((double)st.kv_block_bytes * st.kv_blocks_total - (double)st.kv_pool_bytes) / 1048576.0);
    static const char *const POOLS[] = {"", "mean", "cls", "last"};
    if (k->embed_pooling != KT_POOL_NONE)
        fprintf(stderr, "kettle serve: %s: /v1/embeddings by %s pooling of the last hidden states\n", k->name,
                POOLS[k->embed_pooling]);
}

/* A class's draft model (draft=, or --draft for the one model); NULL
 * with err naming the file. Its vocabulary is checked by the engine. */
static kt_model *load_draft(const serve_class *c, kt_load_mode load, kt_error *err) {
    kt_model *d = cli_load_model(c->draft, load, err);
    if (!d) kt_error_wrap(err, "draft model %s", c->draft);
    return d;
}

/* A class's vision tower (mmproj=, or --mmproj for the one model); NULL
 * with err naming the file. Its width is checked against the model's by
 * the engine. */
static kt_vision *load_vision(const serve_class *c, kt_error *err) {
    kt_vision *v = kt_vision_load(c->mmproj, err);
    if (!v) {
        kt_error_wrap(err, "vision projector %s", c->mmproj);
        return NULL;
    }
    const kt_vision_info *vi = kt_vision_get_info(v);
    fprintf(stderr, "kettle serve: %s: vision tower %s (%d blocks, width %d, %.0fM parameters%s) from %s\n", c->name,
            vi->projector, vi->n_layers, vi->width, (double)vi->n_params / 1e6,
            kt_vision_uses_amx(v) ? ", on AMX tiles" : "", c->mmproj);
    return v;
}

/* Loads every class's model and template (the server answers "loading"
 * meanwhile). Returns 0, or 1 after saying which class failed. */
static int load_classes(serve_opts *o, loaded_class *lc) {
    kt_error err = {0};
    for (int i = 0; i < o->n_classes; i++) {
        serve_class *c = &o->classes[i];
        const char *t = c->template_arg ? c->template_arg : o->template_arg;
        lc[i].o = o, lc[i].c = c;
        if (c->mmproj && !(lc[i].vision = load_vision(c, &err))) {
            if (o->n_classes > 1) kt_error_wrap(&err, "model '%s'", c->name);
            return cli_fail("serve", &err);
        }
        if (c->lazy) { /* checked now, loaded on its first request */
            if (t && !(lc[i].tmpl = cli_load_template(t, &err))) return cli_fail("serve", &err);
            for (int k = 0; k < 1 + (c->draft != NULL); k++) {
                const char *path = k ? c->draft : c->path;
                FILE *f = fopen(path, "rb");
                if (!f) return cli_usage_error("serve", "model '%s': cannot open %s", c->name, path), 1;
                fclose(f);
            }
            continue;
        }
        if ((t && !(lc[i].tmpl = cli_load_template(t, &err))) || !(lc[i].model = cli_load_model(c->path, o->load, &err)) ||
            (c->draft && !(lc[i].draft = load_draft(c, o->load, &err)))) {
            if (o->n_classes > 1) kt_error_wrap(&err, "model '%s'", c->name);
            return cli_fail("serve", &err);
        }
        if (!lc[i].tmpl && !kt_model_chat_template(lc[i].model))
            fprintf(stderr, "kettle serve: %s has no chat template: /v1/chat/completions will fail for '%s' "
                            "(name one with --chat-template, or chat-template= for a class)\n", c->path, c->name);
    }
    return 0;
}

/* The server's load callback: a class's model and engine again (or for
 * the first time, for a lazy one), its KV pool within kv_limit. */
static kt_status load_one(void *ctx, size_t kv_limit, kt_model **model, kt_engine **engine, kt_error *err) {
    const loaded_class *lc = ctx;
    if (!(*model = cli_load_model(lc->c->path, lc->o->load, err))) return err->status;
    kt_engine_params p = engine_params(lc->o, lc->c, *model);
    p.mem_limit = kv_limit;
    kt_model *draft = lc->c->draft ? load_draft(lc->c, lc->o->load, err) : NULL;
    p.spec_draft = draft, p.spec_draft_owned = draft != NULL;
    p.vision = lc->vision;
    if ((lc->c->draft && !draft) || !(*engine = kt_engine_new(*model, &p, err))) {
        kt_model_free(draft);
        kt_model_free(*model), *model = NULL;
        return err->status;
    }
    return KT_OK;
}

/* What loading a class takes besides its KV cache: its file's size (the
 * weights, copied into memory by --load copy and repack). */
static size_t file_bytes(const char *path) {
    FILE *f = fopen(path, "rb");
    long n = f && !fseek(f, 0, SEEK_END) ? ftell(f) : 0;
    if (f) fclose(f);
    return n > 0 ? (size_t)n : 0;
}

/* The engines, one per class loaded at start, sharing the memory: each
 * class's KV pool is fitted to what the classes before it left
 * (kt_mem_budget once every such model is in memory), so together they
 * never ask for more than the machine has; lazy classes load later within
 * what is left (cfg->mem_budget). Returns 0, or 1 after naming the class
 * that does not fit. */
static int make_engines(const serve_opts *o, loaded_class *lc, srv_class_config *k, srv_config *cfg) {
    size_t left = kt_mem_budget(), weights = 0;
    for (int i = 0; i < o->n_classes; i++) {
        const serve_class *c = &o->classes[i];
        k[i] = (srv_class_config){.name = c->name, .aliases = c->aliases, .n_aliases = c->n_aliases,
                                  .template_text = lc[i].tmpl, .defaults = c->defaults, .result_cache = o->result_cache,
                                  .load = load_one, .load_ctx = &lc[i], .lazy = c->lazy,
                                  .keep_alive_s = c->keep_alive_set ? c->keep_alive_s : -1,
                                  .load_bytes = file_bytes(c->path) + (c->draft ? file_bytes(c->draft) : 0),
                                  .kv_bytes = (size_t)(c->kv_mb ? c->kv_mb : o->kv_mb) << 20, .fallback = c->fb,
                                  .vision = lc[i].vision};
        if (c->lazy) { /* its file's pooling is not known before it loads: embeddings= says it */
            k[i].embed_pooling = embed_pooling(NULL, o, c);
            continue;
        }
        weights += k[i].load_bytes;
        kt_engine_params p = engine_params(o, c, lc[i].model);
        p.mem_limit = left ? left : 1; /* nothing left: every pool is refused, naming the flag */
        p.spec_draft = lc[i].draft, p.spec_draft_owned = lc[i].draft != NULL;
        p.vision = lc[i].vision;
        kt_error err = {0};
        kt_engine *e = kt_engine_new(lc[i].model, &p, &err);
        if (!e) {
            for (int j = 0; j < i; j++) kt_engine_free(k[j].engine), kt_model_free(k[j].model);
            if (o->n_classes > 1)
                fprintf(stderr, "kettle serve: %d model%s loaded before '%s' took %zu MiB of the memory for KV caches\n",
                        i, i == 1 ? "" : "s", c->name, (kt_mem_budget() - left) >> 20);
            if (o->n_classes > 1) kt_error_wrap(&err, "model '%s'", c->name);
            return cli_fail("serve", &err);
        }
        kt_engine_stats st;
        kt_engine_get_stats(e, &st);
        left = left > st.kv_pool_bytes ? left - st.kv_pool_bytes : 0;
        k[i].model = lc[i].model, k[i].engine = e, k[i].embed_pooling = embed_pooling(lc[i].model, o, c);
        lc[i].model = NULL, lc[i].draft = NULL; /* the server's and its engine's now */
    }
    /* the budget as if no model were loaded: an unloaded class gives its weights back */
    cfg->mem_budget = kt_mem_budget() + weights;
    return 0;
}

/* The models are loaded and the server bound (answering "loading"):
 * makes the engines, turns the server ready, serves until a signal,
 * drains. */
static int serve(srv_server *srv, loaded_class *lc, const serve_opts *o, srv_config *cfg, const sigset_t *set) {
    srv_class_config k[SERVE_MAX_CLASSES];
    if (make_engines(o, lc, k, cfg)) return 1;
    srv_set_mem_budget(srv, cfg->mem_budget);
    kt_error err = {0};
    if (!srv_ready_classes(srv, k, o->n_classes, &err)) return cli_fail("serve", &err);
    for (int i = 0; i < o->n_classes; i++) {
        if (k[i].engine) print_banner(&k[i], k[i].engine, o, o->n_classes);
        else fprintf(stderr, "kettle serve: model %s: loaded on its first request (lazy)\n", k[i].name);
        if (k[i].keep_alive_s >= 0)
            fprintf(stderr, "kettle serve: %s: unloaded after %d s without requests (keep-alive)\n", k[i].name,
                    k[i].keep_alive_s);
    }
    if (o->n_classes > 1)
        fprintf(stderr, "kettle serve: %d models; a request's \"model\" picks one (none: '%s'), another name is a 404\n",
                o->n_classes, k[0].name);
    print_origin_rules(cfg);
    print_fallback(&cfg->fallback, NULL);
    for (int i = 0; i < o->n_classes; i++) print_fallback(&k[i].fallback, k[i].name);
    if (!o->no_webui) fprintf(stderr, "kettle serve: a chat page at / (--no-webui turns it off)\n");
    bool v6 = strchr(o->host, ':') != NULL; /* an IPv6 address goes in brackets */
    fprintf(stderr, "kettle serve: listening on http://%s%s%s:%d\n", v6 ? "[" : "", o->host, v6 ? "]" : "", srv_port(srv));
    wait_for_signal(set);
    drain(srv, set, o->drain_s);
    return 0;
}

int cmd_serve(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    static serve_opts o; /* 16 classes' path buffers: not on the stack */
    srv_fallback fb = {0};
    int rc = parse_opts(argc, argv, &o);
    if (!rc) rc = check_fallback(&o, &fb);
    for (int i = 0; !rc && i < o.n_classes; i++) rc = class_fallback(&o.classes[i], &fb, &o.classes[i].fb);
    for (int i = 0; !rc && i < o.n_classes; i++) /* OWNER/REPO:QUANT: the pulled file */
        if (ms_resolve_opt("serve", &o.classes[i].path, o.classes[i].path_buf, sizeof o.classes[i].path_buf)) rc = 1;
    if (rc) {
        for (int i = 0; i < o.n_classes; i++) serve_class_free(&o.classes[i]);
        return rc;
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    kt_error err = {0};
    srv_config cfg = server_config(&o);
    cfg.fallback = fb;
    char *hosts = join_lists(o.allowed_hosts, o.n_allowed_hosts), *origins = join_lists(o.cors_origins, o.n_cors_origins);
    cfg.allowed_hosts = hosts, cfg.cors_origins = origins;
    if ((o.n_allowed_hosts && !hosts) || (o.n_cors_origins && !origins)) {
        free(hosts), free(origins);
        return kt_error_set(&err, KT_ERR_NOMEM, "out of memory"), cli_fail("serve", &err);
    }
    /* bound before the load: a port in use fails at once, and a health
     * check sees "loading" (503) rather than a refused connection */
    srv_server *srv = srv_open(&cfg, &err);
    loaded_class lc[SERVE_MAX_CLASSES] = {{0}};
    rc = srv ? load_classes(&o, lc) : cli_fail("serve", &err);
    if (!rc) rc = serve(srv, lc, &o, &cfg, &set);
    srv_stop(srv); /* frees the engines too */
    free(hosts), free(origins);
    for (int i = 0; i < o.n_classes; i++) {
        kt_model_free(lc[i].model);
        kt_model_free(lc[i].draft);
        kt_vision_free(lc[i].vision); /* after srv_stop: no engine reads it any more */
        free(lc[i].tmpl);
        serve_class_free(&o.classes[i]);
    }
    return rc;
}
