/*
 * webui.c - serves the built-in chat page (webui.h): a path lookup over the
 * embedded files and one response with the right type and headers.
 *
 * The page is static, so it needs no API key (http.c lets it through); the
 * API it calls still does, and the page asks the user for the key. The
 * Content-Security-Policy allows nothing but this server: the page has no
 * inline script or style, so a model's text that somehow ended up as markup
 * could still run nothing.
 */
#include <microhttpd.h>
#include <string.h>

#include "server/http_internal.h"
#include "server/webui.h"

/* 'self' only; data: for the inline empty favicon; no framing, no forms,
 * no <base> (which could point 'self' scripts elsewhere). */
#define CSP "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

const srv_webui_file *srv_webui_find(const char *url) {
    if (!strcmp(url, "/")) url = "/index.html";
    for (size_t i = 0; i < srv_webui_n_files; i++)
        if (!strcmp(url, srv_webui_files[i].path)) return &srv_webui_files[i];
    return NULL;
}

static const char *type_of(const char *path) {
    static const struct { const char *ext, *type; } TYPES[] = {
        {".html", "text/html; charset=utf-8"},
        {".js", "text/javascript; charset=utf-8"},
        {".css", "text/css; charset=utf-8"},
        {".png", "image/png"},
        {".svg", "image/svg+xml"},
    };
    const char *dot = strrchr(path, '.');
    for (size_t i = 0; dot && i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (!strcmp(dot, TYPES[i].ext)) return TYPES[i].type;
    return "application/octet-stream";
}

enum MHD_Result srv_webui_respond(srv_conn *c) {
    const srv_webui_file *f = srv_webui_find(c->url);
    if (!f) return MHD_NO; /* routing sends only known paths here */
    /* PERSISTENT: the bytes are static, MHD neither copies nor frees them;
     * for HEAD MHD sends the headers (with Content-Length) and no body */
    struct MHD_Response *r = MHD_create_response_from_buffer(f->len, (void *)f->data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type_of(f->path));
    /* revalidate each time: a restarted server may be a newer kettle */
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "Content-Security-Policy", CSP);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    enum MHD_Result q = MHD_queue_response(c->mc, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    c->status = 200;
    return q;
}
