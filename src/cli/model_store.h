/*
 * model_store.h - the folder of models `kettle pull` downloads, and how a
 * name like OWNER/REPO:QUANT finds a file in it.
 *
 * The store is $KETTLE_MODELS if set, else $XDG_CACHE_HOME/kettle/models,
 * else ~/.cache/kettle/models. A pulled file lives at
 * STORE/OWNER/REPO/FILE.gguf beside FILE.gguf.meta.json (its sha256, size,
 * source URL and commit); a download in progress is FILE.gguf.part. A plain
 * URL's file lives under the pseudo-owner "_url" (STORE/_url/HOST/FILE.gguf).
 * Only complete files (renamed from .part after their checks) are models.
 *
 * Choosing a file by QUANT is the same rule for the Hub's listing and for
 * the store, so `kettle pull X:Q4_K_M` and `-m X:Q4_K_M` agree.
 */
#ifndef KT_CLI_MODEL_STORE_H
#define KT_CLI_MODEL_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kettle.h"

#define MS_PATH_MAX 4096
#define MS_URL_OWNER "_url" /* the owner of files pulled from a plain URL */

/* OWNER/REPO[:QUANT], parsed. quant is "" when not given. */
typedef struct ms_ref {
    char owner[128], repo[128], quant[128];
} ms_ref;

/* Parses OWNER/REPO[:QUANT] (names of letters, digits, '.', '_', '-';
 * not "." or ".."). false with err->msg saying what is wrong. */
bool ms_parse_ref(const char *s, ms_ref *ref, kt_error *err);
/* True if s has the shape of a reference (and so is not meant as a path). */
bool ms_looks_like_ref(const char *s);

/* The store's folder into buf (not created). false (message) when neither
 * KETTLE_MODELS, XDG_CACHE_HOME nor HOME is set. */
bool ms_root(char *buf, size_t cap, kt_error *err);
/* STORE/OWNER/REPO into buf. */
bool ms_repo_dir(const ms_ref *ref, char *buf, size_t cap, kt_error *err);
/* mkdir -p of a folder. */
kt_status ms_mkdirs(const char *dir, kt_error *err);

/* ---- choosing a file ---- */

/* A file to choose from: a name (no folder) and its size (0: unknown). */
typedef struct ms_candidate {
    const char *name;
    uint64_t size;
} ms_candidate;

/* The index of the file QUANT names (case-insensitive; a whole word of the
 * name, as "Q4_K" in "m-Q4_K.gguf" but not in "m-Q4_K_M.gguf", before a
 * substring match). With no QUANT: the only file, else the Q4_K_M one,
 * else (prefer_smallest) the smallest. -1 when none or several match,
 * err->msg saying so; ms_print_candidates lists the choices. `what` names
 * the set in messages ("OWNER/REPO"). */
int ms_pick(const ms_candidate *c, int n, const char *quant, bool prefer_smallest, const char *what,
            kt_error *err);
/* "  NAME  (SIZE)" lines on `out`, after a failed pick. */
void ms_print_candidates(FILE *out, const ms_candidate *c, int n);
/* The quantization a file name states ("Q4_K_M", "F16", ...) into buf; ""
 * when none. */
const char *ms_quant_of(const char *file_name, char *buf, size_t cap);
/* True for a split GGUF's name (NAME-00001-of-00003.gguf). */
bool ms_is_split(const char *file_name);

/* ---- files in the store ---- */

/* A file's metadata, as pull writes it beside the file. */
typedef struct ms_meta {
    char repo[260];     /* OWNER/REPO */
    char source[2048];  /* the URL it came from */
    char sha256[65];    /* "" when no checksum was published */
    char commit[64];    /* the repository's commit, "" when unknown */
    uint64_t size;
} ms_meta;

/* Writes PATH.meta.json atomically. */
kt_status ms_write_meta(const char *model_path, const ms_meta *m, kt_error *err);

/* The *.gguf names in a repo folder, sorted, with their sizes (caller frees
 * with ms_names_free); with_partial adds the downloads that stopped, by
 * the name they will have. *n 0 and KT_OK when the folder does not exist. */
kt_status ms_repo_files(const char *dir, bool with_partial, ms_candidate **files, int *n, kt_error *err);
void ms_names_free(ms_candidate *files, int n);

/* The file REF names in the store into path. */
kt_status ms_find(const ms_ref *ref, char *path, size_t cap, kt_error *err);

/* The model file a command's -m argument names: a path that exists is that
 * path; else OWNER/REPO[:QUANT] pulled into the store is its file; else an
 * error saying to run 'kettle pull'. Anything else is returned as given, for
 * the loader to report. Never downloads. */
kt_status ms_resolve(const char *arg, char *path, size_t cap, kt_error *err);
/* For the commands: replaces *model by its resolved path (kept in buf); on
 * failure prints "kettle CMD: ..." (and the choices) and returns 1; 0 when
 * done. A NULL *model is left alone. */
int ms_resolve_opt(const char *cmd, const char **model, char *buf, size_t cap);

/* One entry of `kettle ls`. */
typedef struct ms_entry {
    char name[260];  /* OWNER/REPO */
    char file[256];  /* FILE.gguf */
    char path[MS_PATH_MAX + 320]; /* the folder, a file name, ".part" */
    uint64_t size;
    bool partial;    /* a .part: a download that stopped */
} ms_entry;

/* Every file in the store (complete and partial), sorted by name then
 * file; caller frees *entries. KT_OK with none when the store is absent. */
kt_status ms_list(ms_entry **entries, int *n, kt_error *err);

/* Removes FILE (and its metadata and .part) from a repo folder, then the
 * repo and owner folders if they are left empty. */
kt_status ms_remove(const char *dir, const char *file, kt_error *err);

#endif
