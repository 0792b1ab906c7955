/*
 * bench_agent_shots.c - the conversation of `kettle bench agent
 * --screenshots` (a computer-use agent's history of screenshots and
 * actions, the older screenshots dropped as agents drop them), the check
 * of an action, and the figures from the per-step records. Percentiles
 * are bench serve's nearest-rank ones: every figure was observed. See
 * bench_agent_shots.h.
 */
#include <stdlib.h>
#include <string.h>

#include "cli/bench_agent_shots.h"

#define ACTION_TEXT_MAX_CHARS 40

static const char SYSTEM[] =
    "You are a computer-use agent operating a desktop. Each user message shows the screen after your last action. "
    "Reply with exactly one action as a JSON object: {\"action\": \"click\" | \"type\" | \"key\" | \"scroll\" | "
    "\"done\", \"x\": pixel column, \"y\": pixel row, \"text\": what to type or the key to press}. Reply with the "
    "JSON only.";
static const char TASK[] = "Task: open the report in the editor, add a line at the end saying it was checked, save "
                           "it, and close the window.";

json_t *ba_shots_response_format(int w, int h) {
    return json_pack("{s:s, s:{s:s, s:b, s:{s:s, s:{s:{s:s, s:[s,s,s,s,s]}, s:{s:s, s:i, s:i}, s:{s:s, s:i, s:i}, "
                     "s:{s:s, s:i}}, s:[s,s,s], s:b}}}",
                     "type", "json_schema", "json_schema", "name", "action", "strict", 1, "schema", "type", "object",
                     "properties", "action", "type", "string", "enum", "click", "type", "key", "scroll", "done", "x",
                     "type", "integer", "minimum", 0, "maximum", w - 1, "y", "type", "integer", "minimum", 0,
                     "maximum", h - 1, "text", "type", "string", "maxLength", ACTION_TEXT_MAX_CHARS, "required",
                     "action", "x", "y", "additionalProperties", 0);
}

json_t *ba_shots_history_new(void) {
    return json_pack("[{s:s, s:s}]", "role", "system", "content", SYSTEM);
}

bool ba_shots_add_screen(json_t *history, int step, const char *data_url) {
    char text[512];
    if (step == 0) snprintf(text, sizeof text, "%s\nStep 1. The screen:", TASK);
    else snprintf(text, sizeof text, "Step %d. The screen after your action:", step + 1);
    json_t *m = json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}}]}", "role", "user", "content", "type", "text", "text",
                          text, "type", "image_url", "image_url", "url", data_url);
    return m && !json_array_append_new(history, m);
}

bool ba_shots_add_reply(json_t *history, const char *text) {
    json_t *m = json_pack("{s:s, s:s}", "role", "assistant", "content", text ? text : "");
    return m && !json_array_append_new(history, m);
}

static bool is_image_part(const json_t *part) {
    const char *type = json_string_value(json_object_get(part, "type"));
    return type && !strcmp(type, "image_url");
}

static int images_in(const json_t *msg) {
    const json_t *content = json_object_get(msg, "content");
    size_t i;
    json_t *p;
    int n = 0;
    json_array_foreach(content, i, p) n += is_image_part(p);
    return n;
}

/* A copy of msg with its image parts replaced by the omitted text. */
static json_t *without_images(const json_t *msg) {
    json_t *copy = json_deep_copy(msg), *content = json_object_get(copy, "content");
    for (size_t i = 0; copy && i < json_array_size(content); i++) {
        if (!is_image_part(json_array_get(content, i))) continue;
        json_t *omitted = json_pack("{s:s, s:s}", "type", "text", "text", BA_SHOT_OMITTED);
        if (!omitted || json_array_set_new(content, i, omitted)) json_decref(copy), copy = NULL;
    }
    return copy;
}

json_t *ba_shots_messages(json_t *history, int keep, int coming, int *n_images) {
    int total = coming;
    size_t i;
    json_t *m;
    json_array_foreach(history, i, m) total += images_in(m);
    int drop = keep > 0 && total > keep ? total - keep : 0, seen = 0;
    json_t *out = json_array();
    *n_images = 0;
    json_array_foreach(history, i, m) {
        if (!out) break;
        int n = images_in(m);
        bool dropped = n && seen < drop; /* a step's message holds one screenshot */
        seen += n;
        if (!dropped) *n_images += n;
        json_t *v = dropped ? without_images(m) : json_incref(m);
        if (!v || json_array_append_new(out, v)) json_decref(out), out = NULL;
    }
    return out;
}

/* Characters of UTF-8 text (continuation bytes not counted), as JSON
 * Schema's maxLength counts them. */
static size_t utf8_chars(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static bool in_range(const json_t *v, int hi) {
    return json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= hi;
}

void ba_reply_start(char *dst, size_t cap, const char *text) {
    size_t n = strlen(text);
    if (n >= cap) { /* back to the start of the character the cut falls in, if it does */
        n = cap - 1;
        size_t lead = n;
        while (lead > 0 && ((unsigned char)text[lead] & 0xC0) == 0x80) lead--;
        n = lead;
    }
    memcpy(dst, text, n);
    dst[n] = 0;
}

bool ba_action_valid(const char *text, int w, int h) {
    static const char *const ACTIONS[] = {"click", "type", "key", "scroll", "done"};
    json_t *a = text ? json_loads(text, 0, NULL) : NULL;
    const char *act = json_string_value(json_object_get(a, "action"));
    bool ok = json_is_object(a) && act && in_range(json_object_get(a, "x"), w - 1) &&
              in_range(json_object_get(a, "y"), h - 1);
    bool known = false;
    for (size_t i = 0; ok && i < sizeof ACTIONS / sizeof ACTIONS[0]; i++) known |= !strcmp(act, ACTIONS[i]);
    const json_t *t = json_object_get(a, "text");
    ok = ok && known && (!t || (json_is_string(t) && utf8_chars(json_string_value(t)) <= ACTION_TEXT_MAX_CHARS));
    ok = ok && json_object_size(a) == (t ? 4u : 3u); /* additionalProperties false */
    json_decref(a);
    return ok;
}

/* ---- records ---- */

bool ba_shots_result_init(ba_shots_result *r, const char *target, bool prepare, int sessions, int steps) {
    *r = (ba_shots_result){.target = target, .prepare = prepare, .n_sess = sessions};
    if (!(r->sess = calloc((size_t)sessions, sizeof *r->sess))) return false;
    for (int k = 0; k < sessions; k++) {
        r->sess[k] = (ba_shots_sess){.session = k + 1, .n_steps = steps};
        if (!(r->sess[k].steps = calloc((size_t)steps, sizeof *r->sess[k].steps))) return ba_shots_result_free(r), false;
    }
    return true;
}

void ba_shots_result_free(ba_shots_result *r) {
    for (int k = 0; r->sess && k < r->n_sess; k++) free(r->sess[k].steps);
    free(r->sess);
    r->sess = NULL, r->n_sess = 0;
}

/* ---- the figures ---- */

static int most_steps(const ba_shots_result *r) {
    int n = 0;
    for (int k = 0; k < r->n_sess; k++)
        if (r->sess[k].n_steps > n) n = r->sess[k].n_steps;
    return n;
}

/* Step index t (0-based) over the sessions; a and b hold n_sess doubles. */
static void per_step(const ba_shots_result *r, int t, double *a, double *b, ba_step_stats *st) {
    double images = 0, prompt = 0, cached = 0, enc_ms = 0, encodes = 0;
    *st = (ba_step_stats){0};
    for (int k = 0; k < r->n_sess; k++) {
        const ba_step_rec *x = t < r->sess[k].n_steps ? &r->sess[k].steps[t] : NULL;
        if (!x || !x->done) continue;
        a[st->n] = x->ttft_ms, b[st->n] = x->action_ms;
        st->n++;
        images += x->images, prompt += x->prompt_tokens > 0 ? x->prompt_tokens : 0;
        if (x->cached_tokens >= 0) cached += x->cached_tokens, st->n_cached++;
        if (x->encode_ms >= 0 && x->encodes >= 0) enc_ms += x->encode_ms, encodes += x->encodes, st->n_encode++;
    }
    st->ttft_ms = bs_pcts_of(a, st->n), st->action_ms = bs_pcts_of(b, st->n);
    st->images_mean = st->n ? images / st->n : 0, st->prompt_mean = st->n ? prompt / st->n : 0;
    st->cached_mean = st->n_cached ? cached / st->n_cached : 0;
    st->encode_ms_mean = st->n_encode ? enc_ms / st->n_encode : 0;
    st->encodes_mean = st->n_encode ? encodes / st->n_encode : 0;
}

/* Sample arrays for the whole-run figures, one slot per step measured. */
typedef struct samples {
    double *action, *ttft, *later, *encode, *prep, *task;
    int n_action, n_later, n_encode, n_prep, n_task;
} samples;

static void take_step(const ba_step_rec *x, int t, samples *v, ba_shots_summary *s) {
    v->action[v->n_action] = x->action_ms, v->ttft[v->n_action++] = x->ttft_ms;
    if (t > 0) v->later[v->n_later++] = x->ttft_ms;
    if (x->encode_ms >= 0) v->encode[v->n_encode++] = x->encode_ms;
    if (x->prepared) v->prep[v->n_prep++] = x->prep_ms, s->n_prep_waits += x->prep_wait_ms > 0;
    s->n_steps_done++, s->n_valid += x->action_valid;
    s->prompt_tokens += x->prompt_tokens > 0 ? x->prompt_tokens : 0;
    if (x->cached_tokens >= 0) s->cached_tokens += x->cached_tokens, s->n_cached++;
}

static bool whole_run(const ba_shots_result *r, ba_shots_summary *s) {
    size_t n = 1;
    for (int k = 0; k < r->n_sess; k++) n += (size_t)r->sess[k].n_steps;
    samples v = {.action = malloc(n * sizeof(double)), .ttft = malloc(n * sizeof(double)),
                 .later = malloc(n * sizeof(double)), .encode = malloc(n * sizeof(double)),
                 .prep = malloc(n * sizeof(double)), .task = malloc(n * sizeof(double))};
    bool ok = v.action && v.ttft && v.later && v.encode && v.prep && v.task;
    for (int k = 0; ok && k < r->n_sess; k++) {
        const ba_shots_sess *ss = &r->sess[k];
        for (int t = 0; t < ss->n_steps; t++)
            if (ss->steps[t].done) take_step(&ss->steps[t], t, &v, s);
        if (ss->task_ms > 0) v.task[v.n_task++] = ss->task_ms;
    }
    if (ok) {
        s->action_ms = bs_pcts_of(v.action, v.n_action), s->ttft_ms = bs_pcts_of(v.ttft, v.n_action);
        s->ttft_later_ms = bs_pcts_of(v.later, v.n_later), s->encode_ms = bs_pcts_of(v.encode, v.n_encode);
        s->prep_ms = bs_pcts_of(v.prep, v.n_prep), s->task_ms = bs_pcts_of(v.task, v.n_task);
    }
    free(v.action), free(v.ttft), free(v.later), free(v.encode), free(v.prep), free(v.task);
    return ok;
}

bool ba_shots_summarize(const ba_shots_result *r, ba_shots_summary *s) {
    *s = (ba_shots_summary){.n_steps = most_steps(r)};
    s->per_step = calloc((size_t)(s->n_steps ? s->n_steps : 1), sizeof *s->per_step);
    double *a = malloc(sizeof(double) * (size_t)(r->n_sess + 1)), *b = malloc(sizeof(double) * (size_t)(r->n_sess + 1));
    bool ok = s->per_step && a && b;
    for (int t = 0; ok && t < s->n_steps; t++) per_step(r, t, a, b, &s->per_step[t]);
    free(a), free(b);
    ok = ok && whole_run(r, s);
    if (!ok) ba_shots_summary_free(s);
    return ok;
}

void ba_shots_summary_free(ba_shots_summary *s) {
    free(s->per_step);
    s->per_step = NULL, s->n_steps = 0;
}

static double ratio(double b, double a) {
    return a > 0 && b > 0 ? b / a : 0;
}

void ba_shots_ratios(const ba_shots_report *r, int i, double *action_p50, double *ttft_later_p50, double *task_p50) {
    const ba_shots_summary *a = &r->sums[0], *b = &r->sums[i];
    *action_p50 = ratio(b->action_ms.p50, a->action_ms.p50);
    *ttft_later_p50 = ratio(b->ttft_later_ms.p50, a->ttft_later_ms.p50);
    *task_p50 = ratio(b->task_ms.p50, a->task_ms.p50);
}
