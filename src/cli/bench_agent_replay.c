/*
 * bench_agent_replay.c - `kettle bench agent --replay FILE.jsonl`: reads
 * recorded agent conversations and turns them into sessions whose turns
 * are their assistant messages. See bench_agent.h.
 *
 * Each line is one JSON object: "messages" (OpenAI chat messages, as in
 * shared/agent/swe_agent) or, failing that, "messages_display" (a
 * transcript of "user: ...", "assistant: ...", "tool: ..." lines, as in
 * tau-bench's few-shot files, where a message runs until the next line
 * starting with a role; "assistant: None" is a turn whose tool call the
 * transcript does not record). "tools" is an array of tool schemas or the
 * name of a JSON file beside the JSONL (tau-bench's trajectories do that).
 *
 * Turn k sends every message before the k-th assistant message, as the
 * agent sent it then. Not every chat template takes role "tool" or
 * assistant tool_calls, so by default (text form) they are rewritten into
 * what every template takes: an assistant's tool calls become text after
 * its content, "<tool_call>{"name": ..., "arguments": ...}</tool_call>",
 * and a tool result becomes a user message "Tool result: ..." (merged
 * with a user message right after it, for templates that want roles to
 * alternate). With native, messages go as recorded; transcripts have no
 * tool-call ids, so they always go in text form.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_agent.h"

#define UNRECORDED_CALL "<tool_call>(not recorded)</tool_call>"

typedef struct reader {
    const ba_replay_opts *o;
    int line_no;
    char *err;
    size_t cap;
} reader;

static bool fail(reader *r, const char *fmt, const char *detail) {
    char what[400];
    snprintf(what, sizeof what, fmt, detail);
    snprintf(r->err, r->cap, "%s:%d: %s", r->o->path, r->line_no, what);
    return false;
}

/* ---- text form ---- */

/* A message's content as text: a string, text parts joined, or "". */
static bool content_text(json_t *c, char **out) {
    size_t n = 1, i;
    json_t *p;
    if (json_is_string(c)) return (*out = strdup(json_string_value(c))) != NULL;
    json_array_foreach(c, i, p) n += json_string_length(json_object_get(p, "text"));
    if (!(*out = malloc(n))) return false;
    (*out)[0] = 0;
    json_array_foreach(c, i, p) {
        const char *t = json_string_value(json_object_get(p, "text"));
        if (t) strcat(*out, t);
    }
    return true;
}

/* Appends to a malloc'ed string (reallocating); false if out of memory. */
static bool append(char **s, const char *a, const char *b) {
    size_t n = strlen(*s) + strlen(a) + strlen(b) + 1;
    char *q = realloc(*s, n);
    if (!q) return false;
    strcat(strcat(q, a), b);
    *s = q;
    return true;
}

/* One tool call as "<tool_call>{"name": N, "arguments": A}</tool_call>",
 * appended to *s (after a newline if *s has text). */
static bool append_call(char **s, json_t *call) {
    json_t *fn = json_object_get(call, "function"), *args = json_object_get(fn, "arguments");
    const char *nm = json_string_value(json_object_get(fn, "name"));
    json_t *name = json_string(nm ? nm : "");
    char *a = json_is_string(args) ? strdup(json_string_value(args))
              : args               ? json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY)
                                   : strdup("{}");
    char *n = name ? json_dumps(name, JSON_ENCODE_ANY) : NULL;
    bool ok = a && n && append(s, **s ? "\n<tool_call>{\"name\": " : "<tool_call>{\"name\": ", n) &&
              append(s, ", \"arguments\": ", a) && append(s, "}", "</tool_call>");
    free(a), free(n), json_decref(name);
    return ok;
}

/* The content text followed by each tool call. */
static char *assistant_text(json_t *msg) {
    char *s = NULL;
    if (!content_text(json_object_get(msg, "content"), &s)) return NULL;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(msg, "tool_calls"), i, c) if (!append_call(&s, c)) return free(s), NULL;
    return s;
}

/* Adds {role, content: text} to out, merging a user message into a user
 * message just before it. */
static bool add_text_message(json_t *out, const char *role, const char *text) {
    json_t *last = json_array_get(out, json_array_size(out) - 1);
    if (!strcmp(role, "user") && last && !strcmp(json_string_value(json_object_get(last, "role")), "user")) {
        char *joined = strdup(json_string_value(json_object_get(last, "content")));
        bool ok = joined && append(&joined, "\n\n", text) &&
                  !json_object_set_new(last, "content", json_string(joined));
        free(joined);
        return ok;
    }
    return !json_array_append_new(out, json_pack("{s:s, s:s}", "role", role, "content", text));
}

/* One recorded message in text form. */
static bool to_text(json_t *out, json_t *msg) {
    const char *role = json_string_value(json_object_get(msg, "role"));
    char *text = NULL;
    bool ok;
    if (!strcmp(role, "assistant")) {
        ok = (text = assistant_text(msg)) &&
             !json_array_append_new(out, json_pack("{s:s, s:s}", "role", role, "content", text));
    } else if (!strcmp(role, "tool") || !strcmp(role, "function")) {
        ok = content_text(json_object_get(msg, "content"), &text);
        char *u = ok ? strdup("Tool result: ") : NULL;
        ok = u && append(&u, text, "") && add_text_message(out, "user", u);
        free(u);
    } else {
        ok = content_text(json_object_get(msg, "content"), &text) && add_text_message(out, role, text);
    }
    free(text);
    return ok;
}

/* ---- reading one conversation ---- */

static bool check_messages(reader *r, json_t *msgs) {
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        json_t *c = json_object_get(m, "content");
        char at[32];
        snprintf(at, sizeof at, "%zu", i);
        if (!json_is_string(json_object_get(m, "role")))
            return fail(r, "messages[%s] has no \"role\" string", at);
        if (c && !json_is_string(c) && !json_is_array(c) && !json_is_null(c))
            return fail(r, "messages[%s].content is not a string, text parts or null", at);
    }
    return true;
}

/* The role a transcript line starts with ("user: ..."), or NULL. */
static const char *line_role(const char *line, size_t len) {
    static const char *const ROLES[] = {"system", "user", "assistant", "tool"};
    for (size_t k = 0; k < sizeof ROLES / sizeof ROLES[0]; k++) {
        size_t n = strlen(ROLES[k]);
        if (len > n && !strncmp(line, ROLES[k], n) && line[n] == ':' && (len == n + 1 || line[n + 1] == ' '))
            return ROLES[k];
    }
    return NULL;
}

static bool push_message(json_t *out, const char *role, const char *content) {
    return !json_array_append_new(out, json_pack("{s:s, s:s}", "role", role, "content", content));
}

/* A "role: text" transcript as messages; NULL (error set) if it is not
 * one. Lines that start no message continue the one before, blank lines
 * included. */
static json_t *parse_display(reader *r, const char *text) {
    json_t *out = json_array();
    char *cur = NULL;
    const char *cur_role = NULL;
    bool ok = out != NULL;
    for (const char *line = text; ok && *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        const char *role = line_role(line, len);
        if (role) {
            ok = !cur || push_message(out, cur_role, cur);
            free(cur);
            size_t skip = strlen(role) + (len > strlen(role) + 1 ? 2 : 1);
            cur = strndup(line + skip, len - skip), cur_role = role;
            ok = ok && cur;
        } else if (!cur) {
            ok = fail(r, "messages_display does not start with a 'user: ', 'assistant: ', 'tool: ' or 'system: ' "
                         "line: %.60s", line);
        } else {
            char *piece = strndup(line, len);
            ok = piece && append(&cur, "\n", piece);
            free(piece);
        }
        line += len + (nl ? 1 : 0);
    }
    if (ok && cur) ok = push_message(out, cur_role, cur);
    if (!ok && !r->err[0]) fail(r, "out of memory%s", "");
    free(cur);
    if (!ok) json_decref(out);
    return ok ? out : NULL;
}

/* "None" is how the transcript writes an assistant message that was a tool call. */
static void mark_unrecorded_calls(json_t *msgs) {
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *c = json_string_value(json_object_get(m, "content"));
        if (!strcmp(json_string_value(json_object_get(m, "role")), "assistant") && c && !strcmp(c, "None"))
            json_object_set_new(m, "content", json_string(UNRECORDED_CALL));
    }
}

/* The conversation's messages as they will be sent; NULL (error set). */
static json_t *messages_of(reader *r, json_t *doc) {
    json_t *msgs = json_object_get(doc, "messages"), *disp = json_object_get(doc, "messages_display");
    bool native = r->o->native;
    if (json_is_array(msgs)) {
        if (!check_messages(r, msgs)) return NULL;
        msgs = json_incref(msgs);
    } else if (json_is_string(disp)) {
        if (!(msgs = parse_display(r, json_string_value(disp)))) return NULL;
        mark_unrecorded_calls(msgs);
        native = false; /* no tool-call ids to send role "tool" with */
    } else {
        return fail(r, "no \"messages\" array (nor a \"messages_display\" transcript)%s", ""), NULL;
    }
    if (native) return msgs;
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) if (out && !to_text(out, m)) json_decref(out), out = NULL;
    json_decref(msgs);
    if (!out) fail(r, "out of memory%s", "");
    return out;
}

/* "tools": an array, or a file name relative to the JSONL's folder; *out
 * NULL if there are none. False (error set) if they cannot be read. */
static bool tools_of(reader *r, json_t *doc, json_t **out) {
    json_t *t = json_object_get(doc, "tools");
    *out = NULL;
    if (!t) return *out = r->o->tools ? json_incref(r->o->tools) : NULL, true;
    if (json_is_array(t)) return *out = json_array_size(t) ? json_incref(t) : NULL, true;
    if (!json_is_string(t)) return fail(r, "\"tools\" is neither an array nor a file name%s", "");
    char path[4096];
    const char *slash = strrchr(r->o->path, '/');
    snprintf(path, sizeof path, "%.*s%s", slash ? (int)(slash - r->o->path + 1) : 0, r->o->path, json_string_value(t));
    json_error_t jerr;
    json_t *a = json_load_file(path, 0, &jerr);
    if (!json_is_array(a)) {
        json_decref(a);
        char detail[300];
        snprintf(detail, sizeof detail, "%.200s (%.80s)", path, jerr.text);
        return fail(r, "\"tools\" names %s, which is not a JSON array of tools", detail);
    }
    *out = a;
    return true;
}

/* Turns: every assistant message after at least one non-system message. */
static bool find_turns(reader *r, ba_session *s) {
    size_t n = json_array_size(s->base), i;
    json_t *m;
    bool seen_input = false;
    if (!(s->turn_end = malloc(sizeof(int) * (n ? n : 1)))) return fail(r, "out of memory%s", "");
    json_array_foreach(s->base, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        bool is_asst = !strcmp(role, "assistant");
        bool room = !r->o->max_turns || s->n_turns < r->o->max_turns;
        if (is_asst && seen_input && room) s->turn_end[s->n_turns++] = (int)i;
        seen_input |= strcmp(role, "system") != 0;
    }
    return s->n_turns ? true : fail(r, "no assistant message to replay (one after a user message)%s", "");
}

static void name_session(reader *r, json_t *doc, ba_session *s) {
    const char *base = strrchr(r->o->path, '/');
    const char *id = json_string_value(json_object_get(doc, "id"));
    json_t *task = json_object_get(doc, "task_id");
    char tid[32] = "";
    if (!id && json_is_integer(task)) snprintf(tid, sizeof tid, "task %lld", (long long)json_integer_value(task));
    snprintf(s->name, sizeof s->name, "%s:%d%s%.80s%s", base ? base + 1 : r->o->path, r->line_no,
             id || tid[0] ? " (" : "", id ? id : tid, id || tid[0] ? ")" : "");
}

static bool read_conversation(reader *r, const char *line, ba_session *s) {
    json_error_t jerr;
    json_t *doc = json_loads(line, 0, &jerr);
    if (!json_is_object(doc)) {
        json_decref(doc);
        return fail(r, "not a JSON object (%.100s)", jerr.text);
    }
    name_session(r, doc, s);
    s->base = messages_of(r, doc);
    bool ok = s->base && tools_of(r, doc, &s->tools) && find_turns(r, s);
    json_decref(doc);
    return ok;
}

/* ---- the file ---- */

static bool blank(const char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n') s++;
    return !*s;
}

static bool grow(ba_workload *w, int *cap) {
    if (w->n < *cap) return true;
    int c = *cap ? 2 * *cap : 16;
    ba_session *p = realloc(w->s, sizeof *p * (size_t)c);
    if (!p) return false;
    w->s = p, *cap = c;
    return true;
}

static bool read_lines(reader *r, FILE *f, ba_workload *w) {
    char *line = NULL;
    size_t lcap = 0;
    int cap = 0;
    bool ok = true;
    while (ok && (!r->o->limit || w->n < r->o->limit) && getline(&line, &lcap, f) >= 0) {
        r->line_no++;
        if (blank(line)) continue;
        if (!grow(w, &cap)) {
            ok = fail(r, "out of memory%s", "");
            break;
        }
        ba_session *s = &w->s[w->n++];
        *s = (ba_session){0};
        ok = read_conversation(r, line, s);
    }
    if (ok && ferror(f)) ok = fail(r, "read error: %s", strerror(errno));
    free(line);
    return ok;
}

static void describe(const ba_replay_opts *o, ba_workload *w) {
    int turns = 0, most = 0;
    for (int i = 0; i < w->n; i++) {
        turns += w->s[i].n_turns;
        if (w->s[i].n_turns > most) most = w->s[i].n_turns;
    }
    snprintf(w->desc, sizeof w->desc, "replay of %.300s: %d conversations, %d turns (at most %d in one); tool "
             "calls and results sent %s", o->path, w->n, turns, most,
             o->native ? "as recorded (role \"tool\"; messages_display transcripts as text)"
                       : "as text (tool results as user messages)");
}

bool ba_replay_load(const ba_replay_opts *o, ba_workload *w, char *err, size_t cap) {
    *w = (ba_workload){0};
    err[0] = 0;
    reader r = {.o = o, .err = err, .cap = cap};
    FILE *f = fopen(o->path, "r");
    if (!f) return snprintf(err, cap, "cannot read %s: %s", o->path, strerror(errno)), false;
    bool ok = read_lines(&r, f, w);
    fclose(f);
    if (ok && !w->n) ok = snprintf(err, cap, "%s holds no conversation", o->path) < 0;
    if (ok) describe(o, w);
    else ba_workload_free(w);
    return ok;
}
