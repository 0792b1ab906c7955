/*
 * fake_server.c - see fake_server.h.
 */
#include "fake_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

int tu_loopback_socket(int backlog, int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_true(fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a));
    assert_true(!getsockname(fd, (struct sockaddr *)&a, &len));
    if (backlog > 0) assert_true(!listen(fd, backlog));
    *port = ntohs(a.sin_port);
    return fd;
}

size_t tu_read_request(int fd, char *req, size_t cap) {
    size_t n = 0;
    ssize_t k;
    req[0] = 0;
    /* until the headers' end and Content-Length bytes after it have come */
    while (n < cap - 1 && (k = read(fd, req + n, cap - 1 - n)) > 0) {
        n += (size_t)k, req[n] = 0;
        char *end = strstr(req, "\r\n\r\n"), *cl = strcasestr(req, "content-length:");
        if (end && (!cl || (size_t)(end + 4 - req) + strtoul(cl + 15, NULL, 10) <= n)) break;
    }
    req[n] = 0;
    return n;
}

static void answer(int fd, tu_fake_handler handler, void *arg) {
    char req[65536];
    tu_read_request(fd, req, sizeof req);
    handler(fd, req, arg);
}

/* The server's loop, in its child until killed. */
static void serve(int ls, tu_fake_handler handler, void *arg, bool per_connection) {
    if (per_connection) signal(SIGCHLD, SIG_IGN); /* no zombies */
    for (;;) {
        int c = accept(ls, NULL, NULL);
        if (c < 0) _exit(0);
        if (!per_connection) {
            answer(c, handler, arg);
        } else if (fork() == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* a stalled one goes with the server */
            answer(c, handler, arg);
            _exit(0);
        }
        close(c);
    }
}

pid_t tu_fake_server_start(tu_fake_handler handler, void *arg, bool per_connection, int *port) {
    int ls = tu_loopback_socket(64, port);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) serve(ls, handler, arg, per_connection);
    close(ls);
    return pid;
}

void tu_fake_server_stop(pid_t pid) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

void tu_nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) continue;
}
