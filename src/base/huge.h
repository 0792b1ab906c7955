/*
 * huge.h - big buffers (the model copy, the KV cache) in anonymous memory
 * that the kernel may back with 2 MB pages.
 *
 * Why: a decode step at a long context reads hundreds of MB of K and V,
 * a few hundred bytes per 4 KB page, so with 4 KB pages nearly every row
 * costs a TLB miss and its page walk (decode attention over a 4096-token
 * cache: a quarter of its time). Linux grants huge pages to an anonymous
 * mapping that asks with madvise where transparent huge pages are in
 * "madvise" mode (the common default); malloc's memory does not ask.
 * Elsewhere the hint is ignored and the buffer works the same.
 */
#ifndef KT_BASE_HUGE_H
#define KT_BASE_HUGE_H

#include <stddef.h>

/* A zeroed, page-aligned buffer of at least `bytes` (rounded up to 2 MB;
 * the rounded size in *mapped, for kt_huge_free). NULL if the mapping
 * fails (errno says why). */
void *kt_huge_alloc(size_t bytes, size_t *mapped);
void kt_huge_free(void *p, size_t mapped);

/* Bytes the kernel says can be allocated now without swapping
 * (MemAvailable of /proc/meminfo); 0 when it does not say. A mapping
 * larger than this succeeds (overcommit) and is killed when touched, so
 * big buffers are sized against it first. */
size_t kt_mem_available(void);
/* What a big buffer (the KV cache) may take: 90% of kt_mem_available
 * (or of the room a cgroup v2 limit leaves, when smaller: a container's
 * share), the rest left to activations, buffers and the system; 0:
 * unknown. The environment variable KETTLE_MEM_MB sets it instead (MiB). */
size_t kt_mem_budget(void);

#endif
