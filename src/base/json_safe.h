/*
 * json_safe.h - jansson's parse and dump, whole or nothing when memory
 * runs out.
 *
 * Why: two of jansson's paths drop bytes silently when an allocation
 * fails (2.14, and upstream since): its lexer's buffer of the text being
 * scanned (a request's "Once upon a time" parsed as "Once upon a tie")
 * and the key of an object being dumped (text that is not JSON, or lacks
 * the key). kettle parses and dumps through these instead: a parse during
 * which any of jansson's allocations failed is refused as out of memory,
 * and a dump goes through a buffer of ours that fails whole.
 *
 * The parse check needs jansson's allocator wrapped: the first call here
 * wraps whatever json_get_alloc_funcs gives (an embedder's own included),
 * noting a failed allocation per thread. Values made before or after
 * stay valid: the free function is unchanged.
 */
#ifndef KT_BASE_JSON_SAFE_H
#define KT_BASE_JSON_SAFE_H

#include <jansson.h>

/* As json_dumps (flags JSON_COMPACT, ...): malloc'ed text (free() it), or
 * NULL when out of memory or when jansson refuses the value. */
char *kt_json_dumps(const json_t *j, size_t flags);

/* As json_loadb / json_loads; out of memory anywhere in the parse: NULL,
 * with err (may be NULL) saying so and json_error_code(err) ==
 * json_error_out_of_memory. */
json_t *kt_json_loadb(const char *buf, size_t n, size_t flags, json_error_t *err);
json_t *kt_json_loads(const char *s, size_t flags, json_error_t *err);

#endif
