/*
 * fault.c - the wrapped calls of test_fault (see fault.h).
 *
 * Each __wrap_SYM asks hit() whether it is the armed call; if not it calls
 * __real_SYM, which the linker binds to the real function (or to the
 * sanitizer's interceptor of it). A failure looks like the real one:
 *   allocations  NULL, errno ENOMEM (posix_memalign: ENOMEM returned)
 *   open class   NULL / -1, errno EIO
 *   reads        read: -1 EIO; fread: half the items read, then the
 *                stream's error flag set and the short count returned
 *   writes       write: -1 ENOSPC; fwrite: half written, error flag, short
 *                count; fflush: EOF with the error flag; fsync, rename:
 *                -1 EIO; close / fclose: the descriptor or stream is
 *                closed (as the real calls do even when they fail), then
 *                -1 / EOF with EIO: a write the kernel lost
 *   mmap         MAP_FAILED, ENOMEM
 *   threads      EAGAIN
 */
#include "fault/fault.h"

#include <dirent.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <sanitizer/common_interface_defs.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static atomic_bool counting;
static atomic_long n_calls, n_class[FAULT_N_CLASSES], n_lane[FAULT_MAX_LANES];
static atomic_int armed_lane;
static atomic_long armed;
static _Thread_local int my_lane; /* 0: the main thread, and threads not started through the wrapper */
static atomic_bool fired;
static const char *fired_sym;
#define MAX_FRAMES 24
static void *fired_frames[MAX_FRAMES];
static int n_fired_frames;

static const char *const CLASS_NAMES[FAULT_N_CLASSES] = {"alloc", "json", "open", "read", "write", "mmap", "thread"};

const char *fault_class_name(fault_class c) {
    return (unsigned)c < FAULT_N_CLASSES ? CLASS_NAMES[c] : "?";
}

void fault_start(int lane, long arm) {
    atomic_store(&n_calls, 0);
    for (int i = 0; i < FAULT_N_CLASSES; i++) atomic_store(&n_class[i], 0);
    for (int i = 0; i < FAULT_MAX_LANES; i++) atomic_store(&n_lane[i], 0);
    atomic_store(&fired, false);
    fired_sym = NULL, n_fired_frames = 0;
    atomic_store(&armed_lane, lane);
    atomic_store(&armed, arm);
    atomic_store(&counting, true);
}

long fault_stop(void) {
    atomic_store(&counting, false);
    return atomic_load(&n_calls);
}

bool fault_pause(void) { return atomic_exchange(&counting, false); }
void fault_resume(bool was_counting) { atomic_store(&counting, was_counting); }

long fault_count(void) { return atomic_load(&n_calls); }
long fault_count_lane(int lane) { return lane >= 0 && lane < FAULT_MAX_LANES ? atomic_load(&n_lane[lane]) : 0; }
long fault_count_class(fault_class c) { return atomic_load(&n_class[c]); }
bool fault_fired(void) { return atomic_load(&fired); }

static int tracing = -1; /* KT_FAULT_TRACE=1: every counted call printed (triage) */

static void trace(long n, const char *sym) {
    void *frames[MAX_FRAMES];
    int nf = backtrace(frames, MAX_FRAMES);
    char line[512];
    size_t len = (size_t)snprintf(line, sizeof line, "fault %ld %s", n, sym);
    for (int i = 2, shown = 0; i < nf && shown < 3 && len < sizeof line; i++) {
        char fr[200];
        __sanitizer_symbolize_pc(frames[i], "%f %s:%l", fr, sizeof fr);
        if (strstr(fr, "fault.c") || !strstr(fr, "/src/")) continue;
        len += (size_t)snprintf(line + len, sizeof line - len, " <- %s", strstr(fr, "/src/") ? fr : fr);
        shown++;
    }
    fprintf(stderr, "%s\n", line);
}

/* True when this call is the armed one: it must fail. */
static bool hit(fault_class c, const char *sym) {
    if (!atomic_load_explicit(&counting, memory_order_relaxed)) return false;
    atomic_fetch_add(&n_class[c], 1);
    atomic_fetch_add(&n_calls, 1);
    long n = atomic_fetch_add(&n_lane[my_lane], 1) + 1;
    if (tracing) {
        if (tracing < 0) tracing = getenv("KT_FAULT_TRACE") && atoi(getenv("KT_FAULT_TRACE")) > 0;
        if (tracing) trace(my_lane * 1000000000L + n, sym);
    }
    if (my_lane != atomic_load(&armed_lane) || n != atomic_load(&armed)) return false;
    fired_sym = sym;
    n_fired_frames = backtrace(fired_frames, MAX_FRAMES); /* warmed up by fault_init_jansson */
    atomic_store(&fired, true);
    return true;
}

/* The failed call and the first frames of ours that led to it (frames in
 * this file, jansson and libc skipped), symbolized by the sanitizer. */
const char *fault_fired_where(void) {
    static char out[1024];
    if (!fault_fired()) return "(not reached)";
    size_t len = (size_t)snprintf(out, sizeof out, "%s", fired_sym);
    int shown = 0;
    for (int i = 1; i < n_fired_frames && shown < 4 && len < sizeof out; i++) {
        char fr[256];
        __sanitizer_symbolize_pc(fired_frames[i], "%f %s:%l", fr, sizeof fr);
        if (strstr(fr, "fault.c") || !strstr(fr, "/src/")) continue;
        len += (size_t)snprintf(out + len, sizeof out - len, "%s %s", shown ? " <-" : " at", fr);
        shown++;
    }
    return out;
}

/* ---- allocations ---- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);

void *__wrap_malloc(size_t n) {
    if (hit(FAULT_ALLOC, "malloc")) return errno = ENOMEM, NULL;
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size) {
    if (hit(FAULT_ALLOC, "calloc")) return errno = ENOMEM, NULL;
    return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n) {
    if (hit(FAULT_ALLOC, "realloc")) return errno = ENOMEM, NULL;
    return __real_realloc(p, n);
}

char *__wrap_strdup(const char *s) {
    if (hit(FAULT_ALLOC, "strdup")) return errno = ENOMEM, NULL;
    return __real_strdup(s);
}

char *__wrap_strndup(const char *s, size_t n) {
    if (hit(FAULT_ALLOC, "strndup")) return errno = ENOMEM, NULL;
    return __real_strndup(s, n);
}

void *__wrap_aligned_alloc(size_t align, size_t n) {
    if (hit(FAULT_ALLOC, "aligned_alloc")) return errno = ENOMEM, NULL;
    return __real_aligned_alloc(align, n);
}

static void *json_malloc(size_t n) {
    if (hit(FAULT_JSON, "jansson malloc")) return errno = ENOMEM, NULL;
    return __real_malloc(n);
}

void fault_init_jansson(void) {
    json_set_alloc_funcs(json_malloc, free);
    void *warm[2];
    backtrace(warm, 2); /* its first call loads libgcc_s: not inside a wrapper */
}

/* ---- opening ---- */

int __real_open(const char *path, int flags, ...);
FILE *__real_fopen(const char *path, const char *mode);
DIR *__real_opendir(const char *path);
int __real_mkdir(const char *path, mode_t mode);
int __real_stat(const char *path, struct stat *st);
int __real_fstat(int fd, struct stat *st);

int __wrap_open(const char *path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, mode_t);
        va_end(ap);
    }
    if (hit(FAULT_OPEN, "open")) return errno = EIO, -1;
    return __real_open(path, flags, mode);
}

FILE *__wrap_fopen(const char *path, const char *mode) {
    if (hit(FAULT_OPEN, "fopen")) return errno = EIO, NULL;
    return __real_fopen(path, mode);
}

DIR *__wrap_opendir(const char *path) {
    if (hit(FAULT_OPEN, "opendir")) return errno = EIO, NULL;
    return __real_opendir(path);
}

int __wrap_mkdir(const char *path, mode_t mode) {
    if (hit(FAULT_OPEN, "mkdir")) return errno = EIO, -1;
    return __real_mkdir(path, mode);
}

int __wrap_stat(const char *path, struct stat *st) {
    if (hit(FAULT_OPEN, "stat")) return errno = EIO, -1;
    return __real_stat(path, st);
}

int __wrap_fstat(int fd, struct stat *st) {
    if (hit(FAULT_OPEN, "fstat")) return errno = EIO, -1;
    return __real_fstat(fd, st);
}

/* ---- reading ---- */

ssize_t __real_read(int fd, void *buf, size_t n);
size_t __real_fread(void *p, size_t size, size_t n, FILE *f);

ssize_t __wrap_read(int fd, void *buf, size_t n) {
    if (hit(FAULT_READ, "read")) return errno = EIO, -1;
    return __real_read(fd, buf, n);
}

size_t __wrap_fread(void *p, size_t size, size_t n, FILE *f) {
    if (hit(FAULT_READ, "fread")) {
        size_t got = n / 2 ? __real_fread(p, size, n / 2, f) : 0;
        f->_flags |= _IO_ERR_SEEN; /* what ferror() reads (glibc) */
        errno = EIO;
        return got;
    }
    return __real_fread(p, size, n, f);
}

/* ---- writing ---- */

ssize_t __real_write(int fd, const void *buf, size_t n);
size_t __real_fwrite(const void *p, size_t size, size_t n, FILE *f);
int __real_fflush(FILE *f);
int __real_fsync(int fd);
int __real_close(int fd);
int __real_fclose(FILE *f);
int __real_rename(const char *from, const char *to);

ssize_t __wrap_write(int fd, const void *buf, size_t n) {
    if (hit(FAULT_WRITE, "write")) return errno = ENOSPC, -1;
    return __real_write(fd, buf, n);
}

size_t __wrap_fwrite(const void *p, size_t size, size_t n, FILE *f) {
    if (hit(FAULT_WRITE, "fwrite")) {
        size_t put = n / 2 ? __real_fwrite(p, size, n / 2, f) : 0;
        f->_flags |= _IO_ERR_SEEN;
        errno = ENOSPC;
        return put;
    }
    return __real_fwrite(p, size, n, f);
}

int __wrap_fflush(FILE *f) {
    if (hit(FAULT_WRITE, "fflush")) {
        if (f) f->_flags |= _IO_ERR_SEEN;
        return errno = ENOSPC, EOF;
    }
    return __real_fflush(f);
}

int __wrap_fsync(int fd) {
    if (hit(FAULT_WRITE, "fsync")) return errno = EIO, -1;
    return __real_fsync(fd);
}

int __wrap_close(int fd) {
    if (hit(FAULT_WRITE, "close")) {
        __real_close(fd);
        return errno = EIO, -1;
    }
    return __real_close(fd);
}

int __wrap_fclose(FILE *f) {
    if (hit(FAULT_WRITE, "fclose")) {
        __real_fclose(f);
        return errno = EIO, EOF;
    }
    return __real_fclose(f);
}

int __wrap_rename(const char *from, const char *to) {
    if (hit(FAULT_WRITE, "rename")) return errno = EIO, -1;
    return __real_rename(from, to);
}

/* ---- mappings and threads ---- */

void *__real_mmap(void *addr, size_t n, int prot, int flags, int fd, off_t off);
int __real_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg);

void *__wrap_mmap(void *addr, size_t n, int prot, int flags, int fd, off_t off) {
    if (hit(FAULT_MMAP, "mmap")) return errno = ENOMEM, MAP_FAILED;
    return __real_mmap(addr, n, prot, flags, fd, off);
}

/* The lanes' start routines, in the order first seen. */
static void *(*lane_fn[FAULT_MAX_LANES])(void *);
static int n_lane_fns = 1;
static pthread_mutex_t lane_mu = PTHREAD_MUTEX_INITIALIZER;

static int lane_of(void *(*fn)(void *)) {
    pthread_mutex_lock(&lane_mu);
    int l = 1;
    while (l < n_lane_fns && lane_fn[l] != fn) l++;
    if (l == n_lane_fns && n_lane_fns < FAULT_MAX_LANES) lane_fn[n_lane_fns++] = fn;
    else if (l == n_lane_fns) l = FAULT_MAX_LANES - 1; /* more routines than lanes: they share the last */
    pthread_mutex_unlock(&lane_mu);
    return l;
}

typedef struct start {
    void *(*fn)(void *);
    void *arg;
    int lane;
} start;

static void *lane_main(void *p) {
    start s = *(start *)p;
    free(p);
    my_lane = s.lane;
    return s.fn(s.arg);
}

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg) {
    if (hit(FAULT_THREAD, "pthread_create")) return EAGAIN;
    start *s = __real_malloc(sizeof *s); /* the test's: not a point */
    if (!s) return EAGAIN;
    *s = (start){fn, arg, lane_of(fn)};
    int rc = __real_pthread_create(t, a, lane_main, s);
    if (rc) free(s);
    return rc;
}
