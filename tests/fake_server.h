/*
 * fake_server.h - a fake HTTP server for the bench tests: a forked child on
 * a loopback port that reads each whole request (headers, then
 * Content-Length bytes of body) and lets a callback write the answer, one
 * connection at a time, until it is killed. The tests make it misbehave
 * (malformed or cut streams, stalls) or answer at a known pace, which a
 * real server cannot be made to do.
 */
#ifndef KT_TESTS_FAKE_SERVER_H
#define KT_TESTS_FAKE_SERVER_H

#include <sys/types.h>

/* Writes the answer to the request `req` (NUL-terminated) on fd; `mode`
 * is the string given to fake_start. The connection is closed after. */
typedef void (*fake_reply_fn)(int fd, const char *req, const char *mode);

/* Starts the server; *port is where it listens. Fails the test if it cannot. */
pid_t fake_start(fake_reply_fn reply, const char *mode, int *port);
/* Kills it and reaps it. */
void fake_stop(pid_t pid);
/* Sleeps at least ms milliseconds (the rest again after a signal). */
void fake_nap_ms(int ms);

#endif
