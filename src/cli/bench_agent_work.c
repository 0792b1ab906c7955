/*
 * bench_agent_work.c - the synthetic agent workload of `kettle bench
 * agent`, and how a session's history grows as it runs. See bench_agent.h.
 *
 * What an agent loop sends, turn after turn: a long system prompt with
 * tool schemas (the same for every session: a prefix cache can share it),
 * a first user message carrying a document and a task (the session's
 * own), then per turn the model's reply and a tool result, the whole
 * history re-sent every time. Texts are drawn from a seeded generator, so
 * every run sends the same bytes; the replies are whatever the server
 * returned, fed back verbatim, as a real agent would.
 *
 * Sizes are approximate by design: the words are one token each in the
 * Llama (SentencePiece and BPE), GPT-2 and Qwen2 vocabularies, and the
 * driver measures tokens per word with the server's /tokenize when it has
 * one; the reports give the prompt tokens the server counted.
 */
#include <stdlib.h>
#include <string.h>

#include "cli/bench_agent.h"

/* Checked with `kettle tokenize` against shared/vocab: " word" is one token
 * in ggml-vocab-{llama-spm,llama-bpe,qwen2,gpt-2}. */
static const char *const WORDS[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "at", "by",
    "this", "have", "from", "or", "one", "had", "not", "but", "what", "all", "were", "when", "we", "there",
    "can", "an", "your", "which", "their", "said", "if", "do", "will", "each", "about", "how", "up", "out",
    "them", "then", "she", "many", "some", "so", "these", "would", "other", "into", "has", "more", "her",
    "two", "like", "him", "see", "time", "could", "no", "make", "than", "first", "been", "its", "who", "now",
    "people", "my", "made", "over", "did", "down", "only", "way", "find", "use", "may", "water", "long",
    "little", "very", "after", "words", "called", "just", "where", "most", "know", "get", "through", "back",
    "much", "before", "go", "good", "new", "write", "our", "used", "me", "man", "too", "any", "day", "same",
    "right", "look", "think", "also", "around", "another", "came", "come", "work", "three", "must",
    "because", "does", "part", "even", "place", "well", "such", "here", "take", "why", "help", "put",
    "different", "away", "again", "off", "went", "old", "number", "great", "tell", "men", "say", "small",
    "every", "found", "still", "between", "name", "should", "home", "big", "give", "air", "line", "set",
    "own", "under", "read", "last", "never", "us", "left", "end", "along", "while", "might", "next", "sound",
    "below", "saw", "something", "thought", "both", "few", "those", "always", "show", "large", "often",
    "together", "asked", "house", "world", "going", "want", "school", "important", "until", "form", "food",
    "keep", "children", "land", "side", "without", "once", "life", "enough", "took", "four", "head", "above",
    "kind", "began", "almost", "live", "page", "got", "need", "far", "hand", "high", "year", "mother",
    "light", "country", "father", "let", "night", "picture", "being", "study", "second", "soon", "story",
    "since", "white", "ever", "paper", "hard", "near", "better", "best", "across", "during", "today",
    "however", "sure", "knew", "try", "told", "young", "sun", "thing", "whole", "hear", "example", "heard",
    "several", "change", "answer", "room", "sea", "against", "top", "turned", "learn", "point", "city",
    "play", "toward", "five", "himself", "usually", "money", "seen", "car", "morning", "body", "upon",
    "family", "later", "turn", "move", "face", "door", "cut", "done", "group", "true", "half", "red", "fish",
    "plants", "living", "black", "eat", "short", "run", "book", "gave", "order", "open", "ground", "cold",
    "really", "table", "remember", "tree", "course", "front", "known", "island", "file", "code", "test",
    "error", "function", "value", "return", "data", "user", "list", "type", "string", "path", "class",
    "method", "result", "output", "input", "call", "server", "request", "response", "status", "check",
    "update", "build", "version", "search", "query", "edit", "source", "config", "branch", "commit",
    "issue", "field", "key", "option"};
#define N_WORDS (sizeof WORDS / sizeof WORDS[0])

/* Realistic tool schemas, as an agent framework sends them. */
static const char *const TOOL_SCHEMAS[] = {
    "{\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"description\":\"Read a text file of the "
    "workspace and return its lines with line numbers. Use start_line and end_line to read part of a long "
    "file.\",\"parameters\":{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\",\"description\":"
    "\"Path of the file, relative to the workspace root.\"},\"start_line\":{\"type\":\"integer\",\"description\":"
    "\"First line to return, 1-based.\"},\"end_line\":{\"type\":\"integer\",\"description\":\"Last line to "
    "return, inclusive.\"}},\"required\":[\"path\"]}}}",
    "{\"type\":\"function\",\"function\":{\"name\":\"search_code\",\"description\":\"Search the workspace for "
    "a regular expression and return the matching lines as path:line: text.\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"query\":{\"type\":\"string\",\"description\":\"A regular expression.\"},"
    "\"path\":{\"type\":\"string\",\"description\":\"Directory or file to search; the whole workspace if "
    "omitted.\"},\"max_results\":{\"type\":\"integer\",\"description\":\"Stop after this many matches.\","
    "\"default\":50}},\"required\":[\"query\"]}}}",
    "{\"type\":\"function\",\"function\":{\"name\":\"run_command\",\"description\":\"Run a shell command in "
    "the workspace and return its exit status, standard output and standard error.\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"command\":{\"type\":\"string\",\"description\":\"The command "
    "line, run with bash -c.\"},\"timeout_s\":{\"type\":\"integer\",\"description\":\"Kill the command after "
    "this many seconds.\",\"default\":60}},\"required\":[\"command\"]}}}",
    "{\"type\":\"function\",\"function\":{\"name\":\"edit_file\",\"description\":\"Replace one exact "
    "occurrence of old_text in a file with new_text. Fails if old_text is missing or occurs more than "
    "once.\",\"parameters\":{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\",\"description\":"
    "\"Path of the file to change.\"},\"old_text\":{\"type\":\"string\",\"description\":\"The text to "
    "replace, with enough context to be unique.\"},\"new_text\":{\"type\":\"string\",\"description\":"
    "\"The replacement.\"}},\"required\":[\"path\",\"old_text\",\"new_text\"]}}}"};

static const char SYSTEM_HEAD[] =
    "You are an agent that works on documents and code for a user. Use the tools when they help, one call at "
    "a time, and answer briefly.\n\nGuidelines:";
static const char DOC_HEAD[] = "I need help with the document below. Read it, then use the tools to check "
                               "the details and report what you find.\n\nDOCUMENT\n";

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A seed for one piece of text: (run seed, what, session, turn). */
static uint64_t seed_of(uint64_t seed, int what, int session, int turn) {
    uint64_t s = seed ^ ((uint64_t)what << 56) ^ ((uint64_t)(uint32_t)session << 24) ^ (uint64_t)(uint32_t)turn;
    splitmix64(&s);
    return s;
}

char *ba_words(uint64_t seed, int n_words) {
    size_t cap = 16 + (size_t)(n_words > 0 ? n_words : 0) * 12, len = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[0] = 0;
    int left_in_sentence = 0;
    for (int i = 0; i < n_words; i++) {
        if (!left_in_sentence) left_in_sentence = 8 + (int)(splitmix64(&seed) % 9); /* 8..16 words */
        const char *w = WORDS[splitmix64(&seed) % N_WORDS];
        bool last = --left_in_sentence == 0 || i == n_words - 1;
        len += (size_t)snprintf(s + len, cap - len, "%s%s%s", i ? " " : "", w, last ? "." : "");
        if (last) left_in_sentence = 0;
    }
    return s;
}

/* Words in a fixed text (runs of non-spaces), for sizing around it. */
static int count_words(const char *s) {
    int n = 0;
    for (bool in = false; *s; s++) {
        bool sp = *s == ' ' || *s == '\n';
        if (!sp && !in) n++;
        in = !sp;
    }
    return n;
}

/* Words needed for `tokens` tokens beside `fixed_tokens` others (at least 1). */
static int words_for(int tokens, double fixed_tokens, const ba_sizing *sz) {
    double w = (tokens - fixed_tokens) / sz->tokens_per_word;
    return w >= 1 ? (int)(w + 0.5) : 1;
}

static double tool_tokens(json_t *tool, const ba_sizing *sz) {
    char *text = json_dumps(tool, JSON_COMPACT);
    double t = text ? (double)strlen(text) * sz->json_tokens_per_byte : 0;
    free(text);
    return t;
}

json_t *ba_synth_tools(int system_tokens, const ba_sizing *sz) {
    json_t *tools = json_array();
    double used = 0;
    for (size_t i = 0; tools && i < sizeof TOOL_SCHEMAS / sizeof TOOL_SCHEMAS[0]; i++) {
        json_t *t = json_loads(TOOL_SCHEMAS[i], 0, NULL);
        double n = t ? tool_tokens(t, sz) : 0;
        if (!t || used + n > system_tokens * 0.6) {
            json_decref(t);
            if (!t) json_decref(tools), tools = NULL; /* out of memory */
            break;
        }
        used += n;
        json_array_append_new(tools, t);
    }
    return tools;
}

/* "HEAD words..." as a new JSON string, or NULL. */
static json_t *text_of(const char *head, const char *sep, uint64_t seed, int n_words, const char *tail) {
    char *words = ba_words(seed, n_words);
    size_t n = words ? strlen(head) + strlen(sep) + strlen(words) + strlen(tail) + 1 : 0;
    char *s = words ? malloc(n) : NULL;
    json_t *j = NULL;
    if (s) {
        snprintf(s, n, "%s%s%s%s", head, sep, words, tail);
        j = json_string(s);
    }
    free(words), free(s);
    return j;
}

static json_t *system_message(const ba_synth_opts *o, json_t *tools) {
    double fixed = count_words(SYSTEM_HEAD) * o->sz.tokens_per_word;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) fixed += tool_tokens(t, &o->sz);
    int words = words_for(o->system_tokens, fixed, &o->sz);
    char *schemas = o->tools_in_system && json_array_size(tools) ? json_dumps(tools, JSON_COMPACT) : NULL;
    char *tail = NULL;
    if (schemas && asprintf(&tail, "\n\nTools (JSON schemas): %s", schemas) < 0) tail = NULL;
    free(schemas);
    json_t *content = text_of(SYSTEM_HEAD, " ", seed_of(o->seed, 1, 0, 0), words, tail ? tail : "");
    free(tail);
    return content ? json_pack("{s:s, s:o}", "role", "system", "content", content) : NULL;
}

static json_t *doc_message(const ba_synth_opts *o, int session) {
    uint64_t seed = seed_of(o->seed, 2, session, 0);
    char tail[256], head[512];
    const char *a = WORDS[splitmix64(&seed) % N_WORDS], *b = WORDS[splitmix64(&seed) % N_WORDS];
    snprintf(head, sizeof head, "Session %d. %s", session + 1, DOC_HEAD);
    snprintf(tail, sizeof tail, "\n\nTASK: find every part of the document about %s and %s, check it with the "
             "tools, and summarize it in a few lines.", a, b);
    double fixed = (count_words(head) + count_words(tail)) * o->sz.tokens_per_word;
    json_t *content = text_of(head, "", seed, words_for(o->doc_tokens, fixed, &o->sz), tail);
    return content ? json_pack("{s:s, s:o}", "role", "user", "content", content) : NULL;
}

/* The tool results of a session: one per turn but the last. */
static json_t *tool_texts(const ba_synth_opts *o, int session) {
    json_t *a = json_array();
    for (int k = 0; a && k + 1 < o->turns; k++) {
        char head[96];
        snprintf(head, sizeof head, "exit status 0, call %d of session %d:\n", k + 1, session + 1);
        double fixed = (count_words(head) + 3) * o->sz.tokens_per_word; /* + "Tool result:" */
        json_t *t = text_of(head, "", seed_of(o->seed, 3, session, k), words_for(o->tool_tokens, fixed, &o->sz), "");
        if (!t || json_array_append_new(a, t)) json_decref(a), a = NULL;
    }
    return a;
}

static bool synth_session(const ba_synth_opts *o, int i, json_t *tools, ba_session *s) {
    snprintf(s->name, sizeof s->name, "session %d", i + 1);
    s->n_turns = o->turns;
    s->tools = json_array_size(tools) && !o->tools_in_system ? json_incref(tools) : NULL;
    json_t *sys = system_message(o, tools), *doc = doc_message(o, i);
    s->base = sys && doc ? json_pack("[O, O]", sys, doc) : NULL;
    json_decref(sys), json_decref(doc);
    s->tool_texts = tool_texts(o, i);
    return s->base && s->tool_texts;
}

bool ba_synth_build(const ba_synth_opts *o, ba_workload *w, char *err, size_t cap) {
    *w = (ba_workload){.synthetic = true, .s = calloc((size_t)o->sessions, sizeof *w->s)};
    json_t *tools = ba_synth_tools(o->system_tokens, &o->sz);
    bool ok = w->s && tools;
    for (int i = 0; ok && i < o->sessions; i++, w->n++) ok = synth_session(o, i, tools, &w->s[i]);
    size_t n_tools = json_array_size(tools);
    if (ok)
        snprintf(w->desc, sizeof w->desc,
                 "synthetic: %d sessions x %d turns; system ~%d tokens (%zu tool schema%s), document ~%d, "
                 "tool results ~%d%s",
                 o->sessions, o->turns, o->system_tokens, n_tools, n_tools == 1 ? "" : "s", o->doc_tokens,
                 o->tool_tokens,
                 o->sz.calibrated ? " (sized with /tokenize)" : " (sized at ~1 token per word: no /tokenize)");
    json_decref(tools);
    if (!ok) {
        snprintf(err, cap, "out of memory building the workload");
        ba_workload_free(w);
    }
    return ok;
}

void ba_workload_free(ba_workload *w) {
    for (int i = 0; w->s && i < w->n; i++) {
        json_decref(w->s[i].tools);
        json_decref(w->s[i].base);
        json_decref(w->s[i].tool_texts);
        free(w->s[i].turn_end);
    }
    free(w->s);
    w->s = NULL, w->n = 0;
}

/* ---- a session's history ---- */

/* "(round N)\n" before the first message's text (a string, text parts or null). */
static bool mark_round(json_t *msg, int round) {
    char mark[32];
    snprintf(mark, sizeof mark, "(round %d)\n", round);
    json_t *c = json_object_get(msg, "content");
    if (json_is_array(c)) return !json_array_insert_new(c, 0, json_pack("{s:s, s:s}", "type", "text", "text", mark));
    size_t n = strlen(mark) + json_string_length(c) + 1;
    char *s = malloc(n);
    if (!s) return false;
    snprintf(s, n, "%s%s", mark, json_is_string(c) ? json_string_value(c) : "");
    bool ok = !json_object_set_new(msg, "content", json_string(s));
    free(s);
    return ok;
}

json_t *ba_history_new(const ba_session *s, int round) {
    json_t *h = json_deep_copy(s->base);
    if (h && round > 1 && json_array_size(h) && !mark_round(json_array_get(h, 0), round)) json_decref(h), h = NULL;
    return h;
}

json_t *ba_turn_messages(const ba_session *s, json_t *history, int turn) {
    if (!s->turn_end) return json_incref(history);
    json_t *m = json_array();
    for (int i = 0; m && i < s->turn_end[turn]; i++)
        if (json_array_append(m, json_array_get(history, (size_t)i))) json_decref(m), m = NULL;
    return m;
}

/* The assistant message and tool result of a reply that made tool calls. */
static bool feed_tool_calls(json_t *history, const char *text, json_t *calls, const char *result) {
    json_t *id = json_object_get(json_array_get(calls, 0), "id");
    json_t *a = json_pack("{s:s, s:s?, s:O}", "role", "assistant", "content", text && *text ? text : NULL,
                          "tool_calls", calls);
    const char *id_text = json_string_value(id) ? json_string_value(id) : "";
    json_t *t = json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id", id_text, "content", result);
    bool ok = a && t && !json_array_append(history, a) && !json_array_append(history, t);
    json_decref(a), json_decref(t);
    return ok;
}

bool ba_feed_reply(const ba_session *s, json_t *history, int turn, const char *text, json_t *tool_calls) {
    if (s->turn_end || turn + 1 >= s->n_turns) return true; /* replay, or the last turn */
    const char *result = json_string_value(json_array_get(s->tool_texts, (size_t)turn));
    if (!result) return false;
    if (json_array_size(tool_calls)) return feed_tool_calls(history, text, tool_calls, result);
    /* kettle's server returns plain text: the result goes back as a user message */
    size_t n = strlen(result) + 16;
    char *u = malloc(n);
    if (!u) return false;
    snprintf(u, n, "Tool result: %s", result);
    json_t *a = json_pack("{s:s, s:s}", "role", "assistant", "content", text ? text : "");
    json_t *t = json_pack("{s:s, s:s}", "role", "user", "content", u);
    bool ok = a && t && !json_array_append(history, a) && !json_array_append(history, t);
    json_decref(a), json_decref(t), free(u);
    return ok;
}
