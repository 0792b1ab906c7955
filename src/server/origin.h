/*
 * origin.h - who may drive `kettle serve`: the Host and Origin rules that
 * keep web pages off a local server.
 *
 * Every program on the machine can reach 127.0.0.1, and so can every web
 * page the user opens: a page may POST to http://127.0.0.1:8080 (a
 * drive-by request), or make its own name resolve to 127.0.0.1 and then
 * read the answers as same-origin (DNS rebinding). So:
 *
 *   Host    bound to a loopback address, a request must name the server
 *           as localhost, 127.0.0.1, [::1] or the bound address (any
 *           port), or a name given with --allowed-host ("*": any); a
 *           rebinding page's own name is refused. Bound elsewhere the
 *           check is off unless --allowed-host names hosts.
 *   Origin  a request with an Origin header (browsers send one on
 *           cross-origin requests and on their own POSTs) must come from
 *           the server's own origin ("http://" + its Host) or one listed
 *           with --cors-origin ("*": any). Clients that are not browsers
 *           (curl, SDKs) send none and are not affected.
 *   CORS    only for listed origins: their requests get
 *           Access-Control-Allow-Origin and their preflight OPTIONS a 204.
 *
 * Pure functions over header values, so each rule is unit tested.
 */
#ifndef KT_SERVER_ORIGIN_H
#define KT_SERVER_ORIGIN_H

#include <stdbool.h>
#include <stddef.h>

#include "base/error.h"

typedef struct srv_origin_rules {
    bool check_host;  /* refuse Host names not listed (loopback bind, or --allowed-host given) */
    bool any_host;    /* --allowed-host '*' */
    char **hosts;     /* names besides the built-in loopback ones, lowercase, without port */
    int n_hosts;
    bool any_origin;  /* --cors-origin '*' */
    char **origins;   /* listed origins, lowercase, without a trailing '/' */
    int n_origins;
} srv_origin_rules;

/* The rules from the comma lists of --allowed-host and --cors-origin
 * (NULL: none); `loopback` says the server is bound to a loopback
 * address, `bound` that address as text (accepted as a Host too). False
 * with err for an empty or malformed entry. */
bool srv_origin_rules_init(srv_origin_rules *r, bool loopback, const char *bound, const char *hosts,
                           const char *origins, kt_error *err);
void srv_origin_rules_free(srv_origin_rules *r);

/* Whether a Host header value (NULL: none, as HTTP/1.0 allows) passes. */
bool srv_host_allowed(const srv_origin_rules *r, const char *host);

typedef enum srv_origin_verdict {
    SRV_ORIGIN_NONE,    /* no Origin header: not a browser's cross-origin request */
    SRV_ORIGIN_SAME,    /* the server's own origin (its chat page) */
    SRV_ORIGIN_CORS,    /* a listed origin: answered with CORS headers */
    SRV_ORIGIN_REFUSED  /* any other page: 403 */
} srv_origin_verdict;

srv_origin_verdict srv_origin_check(const srv_origin_rules *r, const char *origin, const char *host);

#endif
