/*
 * fault.h - fault injection for test_fault (built with -DKT_FAULT=ON).
 *
 * The test program is linked with `-Wl,--wrap=SYM` for every allocation and
 * I/O call kettle's library and server make (CMakeLists.txt lists them), so
 * those calls from our own objects land in fault.c's __wrap_SYM, which
 * counts them and passes them on to the real function (__real_SYM), except
 * the one call chosen by fault_start(n): the n-th counted call fails the way
 * the real one can (NULL / -1 / MAP_FAILED / a short count with the
 * stream's error flag set; errno ENOMEM, EIO or ENOSPC). Calls made inside
 * shared libraries (glibc, pcre2, libmicrohttpd) are not ours and are not
 * wrapped; jansson's allocations are, through json_set_alloc_funcs.
 *
 * One fault per run: after the n-th call fails, the rest succeed, so the
 * test sees how the code recovers from exactly that failure.
 */
#ifndef KT_TEST_FAULT_H
#define KT_TEST_FAULT_H

#include <stdbool.h>
#include <stddef.h>

typedef enum fault_class {
    FAULT_ALLOC,  /* malloc, calloc, realloc, strdup, strndup, aligned_alloc */
    FAULT_JSON,   /* jansson's allocations (json_set_alloc_funcs) */
    FAULT_OPEN,   /* open, fopen, opendir, mkdir, stat, fstat */
    FAULT_READ,   /* read, fread */
    FAULT_WRITE,  /* write, fwrite, fflush, fsync, close, fclose, rename */
    FAULT_MMAP,   /* mmap */
    FAULT_THREAD, /* pthread_create */
    FAULT_N_CLASSES
} fault_class;

const char *fault_class_name(fault_class c);

/* Calls are counted per lane: lane 0 is the main thread's; a thread
 * started by a wrapped pthread_create (ours: the engine, the disk
 * writer, pool workers) counts in the lane of its start routine, lanes
 * numbered as routines are first seen. Threads that run at once (the
 * disk writer beside the engine) interleave their calls differently from
 * run to run, but each lane's calls come in the same order every time,
 * so (lane, n) names the same call in every run. */
#define FAULT_MAX_LANES 8

/* Starts counting from zero; arm > 0 makes the arm-th counted call of
 * `lane` fail, 0 fails none. */
void fault_start(int lane, long arm);
long fault_count_lane(int lane);
/* Stops counting; returns how many calls were counted since fault_start. */
long fault_stop(void);
/* Stops counting for a while (the test's own allocations); returns
 * whether it was counting, for fault_resume. */
bool fault_pause(void);
void fault_resume(bool was_counting);
/* Calls counted since fault_start, all or of one class. */
long fault_count(void);
long fault_count_class(fault_class c);
/* Whether the armed call was reached (and failed), and which it was:
 * "malloc at file.c:123 in func" (a static buffer). */
bool fault_fired(void);
const char *fault_fired_where(void);

/* Installs the counting allocator into jansson; call once before any
 * json_t exists. */
void fault_init_jansson(void);

#endif
