/*
 * webui.h - the chat page of `kettle serve` (src/server/webui/: index.html,
 * app.js, app.css), served at GET / from bytes built into the binary.
 *
 * The files are turned into C arrays at build time by
 * cmake/embed_files.cmake (no network, no tool beyond CMake), so a binary
 * copied anywhere still has its page, and the page can never be a version
 * other than the server's.
 */
#ifndef KT_SERVER_WEBUI_H
#define KT_SERVER_WEBUI_H

#include <microhttpd.h>
#include <stddef.h>

typedef struct srv_webui_file {
    const char *path; /* "/index.html", "/app.js", ... */
    const unsigned char *data;
    size_t len;
} srv_webui_file;

/* The built-in files (the generated webui_files.c). */
extern const srv_webui_file srv_webui_files[];
extern const size_t srv_webui_n_files;

/* The file a request path names ("/" is /index.html), or NULL. */
const srv_webui_file *srv_webui_find(const char *url);

struct srv_conn;
/* Answers c (GET or HEAD of a path srv_webui_find knows) with the file,
 * its type and the page's security headers. */
enum MHD_Result srv_webui_respond(struct srv_conn *c);

#endif
