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
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
    return err->status;
}
