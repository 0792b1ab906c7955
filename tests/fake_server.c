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
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

static void fake_serve(int ls, fake_reply_fn reply, const char *mode) {
    for (;;) {
        int c = accept(ls, NULL, NULL);
        if (c < 0) _exit(0);
        char req[65536];
        size_t n = 0;
        ssize_t k;
        /* the whole request: headers, then Content-Length bytes of body */
        while (n < sizeof req - 1 && (k = read(c, req + n, sizeof req - 1 - n)) > 0) {
            n += (size_t)k, req[n] = 0;
            char *end = strstr(req, "\r\n\r\n"), *cl = strcasestr(req, "content-length:");
            if (end && (!cl || (size_t)(end + 4 - req) + strtoul(cl + 15, NULL, 10) <= n)) break;
        }
        req[n] = 0;
        reply(c, req, mode);
        close(c);
    }
}

pid_t fake_start(fake_reply_fn reply, const char *mode, int *port) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_true(ls >= 0 && !bind(ls, (struct sockaddr *)&a, sizeof a) && !listen(ls, 64));
    assert_int_equal(getsockname(ls, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) fake_serve(ls, reply, mode);
    close(ls);
    return pid;
}

void fake_stop(pid_t pid) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

void fake_nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) continue;
}
