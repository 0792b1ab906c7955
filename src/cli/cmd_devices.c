/*
 * cmd_devices.c - `kettle devices`: the GPUs this kettle could run on,
 * and when there is none it can use, why, in words a user can act on
 * (no CUDA in the build, no driver, a driver too old, no device, a device
 * older than the build's architectures). From kt_cuda_probe (src/cuda).
 *
 *   CUDA backend: built for architectures 90, runtime 13.0, driver 13.0
 *   GPU 0: NVIDIA H100 80GB HBM3, compute capability 9.0, 132 SMs, 79.2 GiB (78.6 free), usable
 *
 * Exit status 0 when GPU 0 is usable, 1 when not (the reason on stderr),
 * so a script can ask. The CPU is always there: `kettle --version` names
 * its kernels.
 */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "cuda/kt_cuda.h"

static void usage(FILE *out) {
    fprintf(out, "usage: kettle devices\n\n"
                 "Lists the NVIDIA GPUs this kettle's CUDA backend sees, or says why there is none it can\n"
                 "use. Exit status 0 when GPU 0 is usable, 1 when not.\n"
                 "The CUDA backend's kernels are not used by run / chat / serve yet (docs/ARCHITECTURE.md,\n"
                 "\"CUDA backend\").\n");
}

int cmd_devices(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "kettle devices: unexpected argument '%s'\n\n", argv[1]);
        usage(stderr);
        return 2;
    }
    kt_cuda_info info;
    kt_error err;
    const kt_status st = kt_cuda_probe(&info, &err);
    if (info.built) {
        printf("CUDA backend: built for architectures %s, runtime %d.%d", info.archs, info.runtime_version / 1000,
               (info.runtime_version % 1000) / 10);
        if (info.driver_version)
            printf(", driver %d.%d", info.driver_version / 1000, (info.driver_version % 1000) / 10);
        printf("\n");
    } else {
        printf("CUDA backend: not built\n");
    }
    for (int i = 0; i < info.n_devices && i < KT_CUDA_MAX_DEVICES; i++) {
        const kt_cuda_device *d = &info.dev[i];
        printf("GPU %d: %s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f free), %s\n", i, d->name, d->cc_major,
               d->cc_minor, d->n_sm, (double)d->mem_total_bytes / (1 << 30), (double)d->mem_free_bytes / (1 << 30),
               d->usable ? "usable" : "not usable by this build");
    }
    if (st != KT_OK) {
        fprintf(stderr, "kettle devices: no usable GPU: %s\n", err.msg);
        return 1;
    }
    return 0;
}
