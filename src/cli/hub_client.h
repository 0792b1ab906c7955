/*
 * hub_client.h - what `kettle pull` asks of a Hugging Face Hub (or any
 * HTTP server): a repository's file list, and one file downloaded into a
 * .part file that a later call resumes.
 *
 * The Hub is $KETTLE_HF_ENDPOINT (default https://huggingface.co); $HF_TOKEN,
 * when set, goes as a Bearer header to it only (libcurl drops it on a
 * redirect to another host, such as the Hub's CDN) and is never printed.
 * Every transfer has a bounded connect time and fails when no byte comes
 * for a while, so a dead server is an error, never a hang.
 */
#ifndef KT_CLI_HUB_CLIENT_H
#define KT_CLI_HUB_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "kettle.h"

/* The Hub's base URL, without a trailing '/'. */
const char *hub_endpoint(void);

/* A file of a repository. */
typedef struct hub_file {
    char *path;        /* in the repository, maybe in a folder */
    uint64_t size;     /* 0: not listed */
    char sha256[65];   /* the LFS object id, "" when not listed */
} hub_file;

/* The .gguf files of OWNER/REPO at main: the tree API
 * (/api/models/OWNER/REPO/tree/main, with sizes and sha256), else the
 * model API's siblings (names only). Caller frees with hub_files_free. */
kt_status hub_list_ggufs(const char *owner, const char *repo, hub_file **files, int *n, kt_error *err);
void hub_files_free(hub_file *files, int n);

/* {endpoint}/OWNER/REPO/resolve/main/PATH (each path step escaped) into a
 * malloc'd string; NULL when out of memory. */
char *hub_resolve_url(const char *owner, const char *repo, const char *path);

/* One download into a .part file. */
typedef struct hub_fetch {
    /* in */
    const char *url;
    const char *part_path;
    uint64_t expect_size;    /* 0: unknown */
    bool trust_etag;         /* a Hub URL: a 64-hex ETag is the sha256 */
    /* out */
    uint64_t size;           /* bytes in the part */
    char sha256[65];         /* of all of them */
    char server_sha256[65];  /* what the server said (X-Linked-Etag, or a trusted ETag); "" when nothing */
    uint64_t server_size;    /* X-Linked-Size, else the Content-Range total or a 200's Content-Length; 0: not said */
    char commit[64];         /* X-Repo-Commit, "" when not said */
    uint64_t resumed_from;   /* bytes already there that the server agreed to continue */
    bool restarted;          /* a part was there but the server sent the whole file */
    bool interrupted;        /* the transfer stopped: the part is kept for a resume */
} hub_fetch;

/* Downloads f->url into f->part_path, continuing a part already there with
 * a Range request (a server that ignores it starts over), hashing
 * everything; a progress bar on a terminal; Ctrl-C stops it. KT_OK when
 * the server sent the whole file (the caller checks size and checksum and
 * renames); on an interrupted transfer an error that says the part is kept
 * and how to resume, with f->interrupted set. */
kt_status hub_download(hub_fetch *f, kt_error *err);

#endif
