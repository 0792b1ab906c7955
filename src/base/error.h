/*
 * error.h - errors as values.
 *
 * Every function that can fail takes a `kt_error *` and returns a kt_status
 * (or NULL). The message is written for the user: it names the file, tensor
 * or key at fault and what was expected, so it can be acted on without a
 * debugger. `err` may be NULL when the caller does not want the message.
 */
#ifndef KT_BASE_ERROR_H
#define KT_BASE_ERROR_H

#include "kettle.h"

/* Fills err (if not NULL) with printf-style text; returns `status`. */
kt_status kt_error_set(kt_error *err, kt_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to an existing message (adds context going up). */
kt_status kt_error_wrap(kt_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
