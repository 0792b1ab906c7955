/*
 * huge.c - see huge.h.
 */
#include "base/huge.h"

#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>

#define HUGE_PAGE_BYTES ((size_t)2 << 20)

void *kt_huge_alloc(size_t bytes, size_t *mapped) {
    if (bytes == 0 || bytes > SIZE_MAX - HUGE_PAGE_BYTES) return NULL;
    const size_t size = (bytes + HUGE_PAGE_BYTES - 1) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, size, MADV_HUGEPAGE); /* a hint: fine if refused */
#endif
    *mapped = size;
    return p;
}

void kt_huge_free(void *p, size_t mapped) {
    if (p) munmap(p, mapped);
}

size_t kt_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f) && sscanf(line, "MemAvailable: %llu kB", &kb) != 1) {}
    fclose(f);
    return kb > SIZE_MAX / 1024 ? SIZE_MAX : (size_t)kb * 1024;
}

size_t kt_mem_budget(void) {
    return kt_mem_available() / 10 * 9;
}
