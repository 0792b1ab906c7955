/*
 * huge.c - see huge.h.
 */
#include "base/huge.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

/* A cgroup v2 limit left (memory.max - memory.current): in a container
 * /proc/meminfo shows the host's memory, not the container's. 0: none. */
static size_t cgroup_room(void) {
    unsigned long long max = 0, cur = 0;
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
    bool limited = f && fscanf(f, "%llu", &max) == 1; /* "max": no limit */
    if (f) fclose(f);
    if (!limited) return 0;
    if ((f = fopen("/sys/fs/cgroup/memory.current", "r"))) {
        if (fscanf(f, "%llu", &cur) != 1) cur = 0;
        fclose(f);
    }
    return cur < max ? (size_t)(max - cur) : 1;
}

size_t kt_mem_budget(void) {
    const char *env = getenv("KETTLE_MEM_MB");
    char *end;
    unsigned long long mb = env ? strtoull(env, &end, 10) : 0;
    if (env && *env && !*end && mb > 0 && mb < SIZE_MAX / 1048576) return (size_t)mb * 1048576;
    size_t avail = kt_mem_available(), room = cgroup_room();
    if (room && (!avail || room < avail)) avail = room;
    return avail / 10 * 9;
}
