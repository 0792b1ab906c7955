/*
 * fake_server.h - a stand-in HTTP server on loopback for the tests of
 * kettle's clients (the benches' failure paths): a child process whose
 * answers the test writes, misbehaving on purpose (a malformed stream, a
 * cut one, a stall, a 500). One copy, so the tests that need one share how
 * requests are read and how the server dies with the test.
 */
#ifndef KT_TESTS_FAKE_SERVER_H
#define KT_TESTS_FAKE_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Answers one request: writes to fd (the connection, closed afterwards);
 * req is the whole request, NUL-terminated. */
typedef void (*tu_fake_handler)(int fd, const char *req, void *arg);

/* A TCP socket bound to a free loopback port (*port), listening when
 * backlog > 0 (0: bound only, a port that refuses connections). Fails the
 * test when it cannot. */
int tu_loopback_socket(int backlog, int *port);
/* Reads one request whole (its headers, then Content-Length bytes of
 * body) into req, NUL-terminated, at most cap - 1 bytes; its length. */
size_t tu_read_request(int fd, char *req, size_t cap);
/* Forks a server on a free loopback port (*port) that reads each
 * connection's request and has `handler` answer it. per_connection: each
 * connection in a process of its own (which dies with the server), so a
 * handler may stall without holding up the next request; else one
 * connection at a time. The server's pid, for tu_fake_server_stop. */
pid_t tu_fake_server_start(tu_fake_handler handler, void *arg, bool per_connection, int *port);
/* SIGKILL and reap (its connection processes die with it). */
void tu_fake_server_stop(pid_t pid);
/* Sleeps at least ms milliseconds (the rest again after a signal): a
 * handler's pace. */
void tu_nap_ms(int ms);

#endif
