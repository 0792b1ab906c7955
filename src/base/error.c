/*
 * error.c - filling kt_error values; see error.h.
 */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

kt_status kt_error_set(kt_error *err, kt_status status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

kt_status kt_error_wrap(kt_error *err, const char *fmt, ...) {
    if (!err) return KT_ERR_INTERNAL;
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* Compose "prefix: old" by hand, truncating the old text at the end. */
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    old[sizeof old - 1] = 0;
    size_t cap = sizeof err->msg - 1, n = strlen(prefix);
    if (n > cap) n = cap;
    memcpy(err->msg, prefix, n);
    const char *rest[2] = {": ", old};
    for (int i = 0; i < 2; i++) {
        size_t m = strlen(rest[i]);
        if (m > cap - n) m = cap - n;
        memcpy(err->msg + n, rest[i], m);
        n += m;
    }
    err->msg[n] = 0;
    return err->status;
}
