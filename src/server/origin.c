/*
 * origin.c - the Host and Origin rules of `kettle serve` (see origin.h).
 */
#include "server/origin.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_NAME 255 /* a DNS name's length; longer entries and headers are refused */

/* Names a loopback server always answers to. */
static const char *const LOOPBACK_NAMES[] = {"localhost", "127.0.0.1", "[::1]"};

/* s[0..n) lowercased into a new string, or NULL. */
static char *lower_dup(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    for (size_t i = 0; i < n; i++) d[i] = (char)tolower((unsigned char)s[i]);
    d[n] = 0;
    return d;
}

/* The host part of a Host value: "[::1]:8080" -> "[::1]", "a.b:80" ->
 * "a.b"; its length, 0 when malformed (an IPv6 address without its
 * bracket, a port that is not digits). */
static size_t host_part(const char *host) {
    size_t n = strlen(host);
    if (host[0] == '[') {
        const char *close = strchr(host, ']');
        if (!close || (close[1] && close[1] != ':')) return 0;
        return (size_t)(close - host) + 1;
    }
    const char *colon = strchr(host, ':');
    if (!colon) return n;
    for (const char *p = colon + 1; *p; p++)
        if (!isdigit((unsigned char)*p)) return 0;
    return (size_t)(colon - host);
}

static bool add_entry(char ***list, int *n, const char *s, size_t len) {
    char **grown = realloc(*list, sizeof(char *) * (size_t)(*n + 1));
    if (!grown) return false;
    *list = grown;
    return (grown[*n] = lower_dup(s, len)) ? (++*n, true) : false;
}

/* A comma list's entries into list (any: '*' seen); false with err. */
static bool parse_list(const char *text, const char *flag, bool origins, char ***list, int *n, bool *any,
                       kt_error *err) {
    for (const char *p = text; p && *p;) {
        size_t len = strcspn(p, ",");
        if (!len || len > MAX_NAME)
            return kt_error_set(err, KT_ERR_ARG, "%s: an empty or over-long entry in '%s'", flag, text), false;
        if (len == 1 && *p == '*') *any = true;
        else if (!origins && *p != '[' && memchr(p, ':', len))
            return kt_error_set(err, KT_ERR_ARG, "%s '%.*s': give the name without a port (any port is "
                                "allowed)", flag, (int)len, p), false;
        else if (origins && strncasecmp(p, "http://", 7) && strncasecmp(p, "https://", 8))
            return kt_error_set(err, KT_ERR_ARG, "%s '%.*s': an origin is scheme://host[:port], e.g. "
                                "http://localhost:3000 (or '*')", flag, (int)len, p), false;
        else if (!add_entry(list, n, p, origins && p[len - 1] == '/' ? len - 1 : len))
            return kt_error_set(err, KT_ERR_NOMEM, "out of memory"), false;
        p += len + (p[len] == ',');
    }
    return true;
}

bool srv_origin_rules_init(srv_origin_rules *r, bool loopback, const char *bound, const char *hosts,
                           const char *origins, kt_error *err) {
    *r = (srv_origin_rules){.check_host = loopback || (hosts && hosts[0])};
    bool ok = parse_list(hosts, "--allowed-host", false, &r->hosts, &r->n_hosts, &r->any_host, err) &&
              parse_list(origins, "--cors-origin", true, &r->origins, &r->n_origins, &r->any_origin, err);
    /* the bound address itself (127.0.0.2, or an IPv6 one in brackets) */
    if (ok && loopback && bound && bound[0] && strlen(bound) < MAX_NAME) {
        char name[MAX_NAME + 3];
        bool v6 = strchr(bound, ':') != NULL; /* a Host names an IPv6 address in brackets */
        size_t len = (size_t)snprintf(name, sizeof name, "%s%s%s", v6 ? "[" : "", bound, v6 ? "]" : "");
        if (!add_entry(&r->hosts, &r->n_hosts, name, len)) ok = (kt_error_set(err, KT_ERR_NOMEM, "out of memory"), false);
    }
    if (!ok) srv_origin_rules_free(r);
    return ok;
}

void srv_origin_rules_free(srv_origin_rules *r) {
    for (int i = 0; i < r->n_hosts; i++) free(r->hosts[i]);
    for (int i = 0; i < r->n_origins; i++) free(r->origins[i]);
    free(r->hosts), free(r->origins);
    *r = (srv_origin_rules){0};
}

static bool listed(char *const *list, int n, const char *s, size_t len) {
    for (int i = 0; i < n; i++)
        if (strlen(list[i]) == len && !strncasecmp(list[i], s, len)) return true;
    return false;
}

bool srv_host_allowed(const srv_origin_rules *r, const char *host) {
    if (!r->check_host || r->any_host || !host) return true; /* no Host: HTTP/1.0, not a browser */
    size_t len = strlen(host) > MAX_NAME ? 0 : host_part(host);
    if (!len) return false;
    for (size_t i = 0; i < sizeof LOOPBACK_NAMES / sizeof LOOPBACK_NAMES[0]; i++)
        if (strlen(LOOPBACK_NAMES[i]) == len && !strncasecmp(LOOPBACK_NAMES[i], host, len)) return true;
    return listed(r->hosts, r->n_hosts, host, len);
}

srv_origin_verdict srv_origin_check(const srv_origin_rules *r, const char *origin, const char *host) {
    if (!origin) return SRV_ORIGIN_NONE;
    size_t len = strlen(origin);
    if (len > MAX_NAME + 16) return SRV_ORIGIN_REFUSED;
    /* the page this server served itself: same scheme (http), host and port */
    if (host && !strncasecmp(origin, "http://", 7) && !strcasecmp(origin + 7, host)) return SRV_ORIGIN_SAME;
    if (len && origin[len - 1] == '/') len--;
    if (r->any_origin || listed(r->origins, r->n_origins, origin, len)) return SRV_ORIGIN_CORS;
    return SRV_ORIGIN_REFUSED;
}
