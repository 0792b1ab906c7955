/*
 * deadline.h - slow clients cut: each request must arrive whole (headers
 * and body) within --http-timeout seconds of its connection opening or of
 * the previous answer on it ending.
 *
 * libmicrohttpd's own connection timeout is an inactivity timeout: a
 * client sending one byte every few seconds (slowloris) keeps a
 * connection, and its memory, forever. So every connection is tracked
 * from MHD's connection notification, and one thread shuts down the
 * socket of any connection whose request is late (MHD then sees the
 * connection end and closes it). A late body byte is refused at once by
 * http.c (408 in the log). Once the request is in, the deadline no
 * longer applies: an answer may take as long as generation does. No
 * engine work is ever started for a request whose body is not complete
 * (http.c dispatches only after MHD's last call), so a slow client holds
 * a connection, never an engine slot.
 */
#ifndef KT_SERVER_DEADLINE_H
#define KT_SERVER_DEADLINE_H

#include <microhttpd.h>
#include <stdbool.h>

#include "base/error.h"

typedef struct srv_deadlines srv_deadlines;

/* Starts the thread that cuts late connections; NULL with err. */
srv_deadlines *srv_deadlines_new(int timeout_s, kt_error *err);
/* After MHD_stop_daemon: stops the thread and frees what is left. */
void srv_deadlines_free(srv_deadlines *d);
/* MHD_OPTION_NOTIFY_CONNECTION's callback (cls: the srv_deadlines). */
void srv_deadline_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                         enum MHD_ConnectionNotificationCode code);
/* The connection's request is in whole: no deadline while it is answered. */
void srv_deadline_received(struct MHD_Connection *mc);
/* Its answer is done: the next request on it (keep-alive) has its own deadline. */
void srv_deadline_restart(struct MHD_Connection *mc);
/* Whether its request is past its deadline (or was cut for it). */
bool srv_deadline_passed(struct MHD_Connection *mc);
/* Connections cut so far. */
unsigned long long srv_deadlines_cut(srv_deadlines *d);

#endif
