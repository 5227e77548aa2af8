/* SIGTERM / SIGINT as a request to stop after the current step. Both are
 * blocked in every thread (the mask is set before any thread exists, and
 * threads inherit it); one thread waits for them with sigwait, so nothing
 * runs in signal context and no global flag exists: the request lives in
 * the hs_stop the trainer reads. The watcher lives as long as the process. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hypershard/train.h"

struct hs_stop {
    sigset_t set;
    atomic_int signal;
    pthread_t thread;
};

static void say(const char *text) {
    ssize_t n = write(STDERR_FILENO, text, strlen(text));
    (void)n;
}

static void *watch(void *arg) {
    hs_stop *s = arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&s->set, &sig) != 0) continue;
        int expected = 0;
        if (atomic_compare_exchange_strong(&s->signal, &expected, sig)) {
            char msg[160];
            snprintf(msg, sizeof msg,
                     "hypershard train: %s received: stopping after this step "
                     "(a second signal ends the run at once)\n",
                     strsignal(sig));
            say(msg);
            continue;
        }
        say("hypershard train: second signal: ending the run now\n");
        _exit(128 + sig);
    }
    return NULL;
}

hs_stop *hs_stop_start(void) {
    hs_stop *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    sigemptyset(&s->set);
    sigaddset(&s->set, SIGTERM);
    sigaddset(&s->set, SIGINT);
    atomic_init(&s->signal, 0);
    if (pthread_sigmask(SIG_BLOCK, &s->set, NULL) != 0 ||
        pthread_create(&s->thread, NULL, watch, s) != 0) {
        pthread_sigmask(SIG_UNBLOCK, &s->set, NULL);
        free(s);
        return NULL;
    }
    pthread_detach(s->thread);
    return s;
}

int hs_stop_signal(const hs_stop *s) { return s ? atomic_load(&((hs_stop *)s)->signal) : 0; }
