/* One attempt of `hypershard launch`: fork/exec the job (mpiexec), pass
 * its stderr through while reading why it failed, pass SIGTERM / SIGINT /
 * SIGHUP on to it (once: a second would make mpiexec abandon its ranks),
 * and wait until every process of its group has ended. The signals stay
 * blocked in the launcher and are taken with sigtimedwait between reads,
 * so nothing runs in signal context. The job dies with the launcher: its
 * mpiexec gets SIGTERM when the launcher is gone, even by SIGKILL
 * (PR_SET_PDEATHSIG), and ends its ranks as for a stop. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/launch.h"

static sigset_t launch_signals(void) {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGTERM);
    sigaddset(&s, SIGINT);
    sigaddset(&s, SIGHUP);
    sigaddset(&s, SIGCHLD);
    return s;
}

/* After the job's mpiexec exits, how long the rest of its process group
 * (ranks finishing a stop's checkpoint) may take before it is killed. */
#define GROUP_DRAIN_S 60.0

void hs_launch_signals_block(void) {
    sigset_t s = launch_signals();
    sigprocmask(SIG_BLOCK, &s, NULL);
    /* ranks their mpiexec leaves become the launcher's children */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
}

/* The lines that say why a job ended, most telling first: Open MPI naming
 * the rank a signal ended (or srun, as MPIEXEC under Slurm, naming the task:
 * "srun: error: HOST: task 2: Killed"), a lost daemon (a host gone), the
 * watchdog, the trainer's own error, then mpiexec refusing a hostfile.
 * srun's "task 0: Exited with exit code 1" of a rank that saw its peer die
 * may come before the "Killed" of the peer, so it ranks below a signal. */
static int reason_rank(const char *line) {
    if (strstr(line, "srun: error: ") && strstr(line, ": task"))
        return strstr(line, "Exited with exit code") ? 2 : 1;
    /* Open MPI's "Process name: [[J,1],R]" under "The first process to do
     * so was": the rank that exited non-zero first, before the others'
     * "Terminated received" as mpiexec stops them */
    if (strstr(line, "Process name: [[")) return 2;
    static const char *const marks[] = {
        "exited on signal", "lost communication", "daemon",          "did not answer the watchdog",
        "stopping: rank",   "hypershard train:",  "in the hostfile", NULL};
    for (int i = 0; marks[i]; i++)
        if (strstr(line, marks[i])) return i + 1 + (i > 0);
    return 0;
}

static void scan_line(char *line, int *best, hs_launch_result *r) {
    int k = reason_rank(line);
    const char *code = strstr(line, "Exit code:");
    if (code && *best == 2 && strstr(r->reason, "exited non-zero first")) {
        /* the line after "Process name": its exit code */
        size_t n = strlen(r->reason);
        snprintf(r->reason + n, sizeof r->reason - n, " (exit code %d)", atoi(code + 10));
        return;
    }
    if (!k || (*best && k >= *best)) return;
    *best = k;
    while (*line == ' ' || *line == '\t') line++;
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == ' ')) line[--n] = '\0';
    const char *pn = strstr(line, "Process name: [[");
    int rank = -1;
    if (k == 2 && pn && sscanf(strchr(pn, ',') ? strchr(pn, ',') : "", ",%*d],%d]", &rank) == 1)
        snprintf(r->reason, sizeof r->reason, "world rank %d exited non-zero first", rank);
    else snprintf(r->reason, sizeof r->reason, "%s", line);
}

typedef struct line_buf {
    char text[1024];
    size_t len;
    int best;
} line_buf;

/* Pass `n` bytes on and cut them into lines for scan_line. */
static void take_output(line_buf *lb, const char *buf, size_t n, bool quiet, hs_launch_result *r) {
    if (!quiet && fwrite(buf, 1, n, stderr) != n) clearerr(stderr);
    for (size_t i = 0; i < n; i++) {
        if (lb->len + 1 < sizeof lb->text) lb->text[lb->len++] = buf[i];
        if (buf[i] != '\n') continue;
        lb->text[lb->len] = '\0';
        scan_line(lb->text, &lb->best, r);
        lb->len = 0;
    }
}

/* Wait up to wait_ms for output and pass it on; false at end of file. */
static bool pass_output(int fd, int wait_ms, line_buf *lb, bool quiet, hs_launch_result *r) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, wait_ms) <= 0) return true;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) take_output(lb, buf, (size_t)n, quiet, r);
    return n > 0 || (n < 0 && errno == EINTR);
}

static void child_exec(char *const *argv, int err_fd, pid_t launcher) {
    sigset_t s = launch_signals();
    sigprocmask(SIG_UNBLOCK, &s, NULL);
    setpgid(0, 0);
    /* a launcher gone before this line is seen by the parent test */
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != launcher) _exit(128 + SIGTERM);
    int in = open("/dev/null", O_RDONLY);
    if (in >= 0) dup2(in, STDIN_FILENO);
    dup2(err_fd, STDERR_FILENO);
    execvp(argv[0], argv);
    fprintf(stderr, "hypershard launch: cannot run %s: %s (set MPIEXEC to the mpiexec to use)\n",
            argv[0], strerror(errno));
    _exit(127);
}

/* Take the SIGTERM / SIGINT / SIGHUP that arrived: false when there was
 * none. pid != 0 (a process, or -group): the first goes on to it (mpiexec, which passes it
 * to every rank; SIGHUP as SIGTERM, a stop at the end of the step); a
 * second would make mpiexec leave its ranks and exit, so it is not. */
static bool take_signals(pid_t pid, hs_launch_result *r) {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGTERM);
    sigaddset(&s, SIGINT);
    sigaddset(&s, SIGHUP);
    struct timespec zero = {0, 0};
    int sig;
    bool any = false;
    while ((sig = sigtimedwait(&s, NULL, &zero)) > 0) {
        bool again = r->stop;
        fprintf(stderr, "hypershard launch: %s received: %s (no restart)\n", strsignal(sig),
                pid == 0 ? "not starting the job"
                : again  ? "the job is already stopping"
                         : "passing it on to the job");
        r->stop = any = true;
        if (again) continue;
        r->status = 128 + sig;
        if (pid != 0) kill(pid, sig == SIGHUP ? SIGTERM : sig);
    }
    return any;
}

/* Once mpiexec has exited, wait for the rest of its process group (ranks
 * it left behind) to end, passing their output on; past GROUP_DRAIN_S
 * they are killed. The launcher returns only when none is left, so a
 * rank never outlives it holding the checkpoint lock. */
static void drain_group(pid_t pgid, int fd, bool *open_fd, line_buf *lb, bool quiet,
                        hs_launch_result *r) {
    double t0 = hs_now();
    bool said = false, killed = false;
    for (;;) {
        /* the launcher is their subreaper (hs_launch_signals_block): reap
         * those mpiexec left, so none lingers as a zombie in the group */
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
        if (kill(-pgid, 0) != 0) break;
        if (!said)
            fprintf(stderr, "hypershard launch: waiting for the job's remaining processes\n");
        said = true;
        if (hs_now() - t0 > GROUP_DRAIN_S) {
            if (killed) {
                fprintf(stderr, "hypershard launch: the job's process group %d outlives SIGKILL\n",
                        (int)pgid);
                break;
            }
            fprintf(stderr, "hypershard launch: killing the job's processes left after %.0f s\n",
                    GROUP_DRAIN_S);
            kill(-pgid, SIGKILL);
            killed = true;
            t0 = hs_now();
        }
        if (*open_fd) *open_fd = pass_output(fd, 100, lb, quiet, r);
        else usleep(50 * 1000);
        if (!quiet) take_signals(-pgid, r);
    }
}

static int exit_status(int ws) {
    if (WIFEXITED(ws)) return WEXITSTATUS(ws);
    if (WIFSIGNALED(ws)) return 128 + WTERMSIG(ws);
    return 1;
}

bool hs_launch_run(char *const *argv, double timeout_s, bool probe, hs_launch_result *r) {
    memset(r, 0, sizeof *r);
    /* A stop asked for between attempts (or during a probe, which leaves
     * the signals pending) ends the launcher before the next attempt. */
    if (!probe && take_signals(0, r)) return true;
    int fds[2];
    if (pipe(fds) != 0) {
        fprintf(stderr, "hypershard launch: pipe: %s\n", strerror(errno));
        return false;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t launcher = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "hypershard launch: fork: %s\n", strerror(errno));
        close(fds[0]), close(fds[1]);
        return false;
    }
    if (pid == 0) {
        close(fds[0]);
        child_exec(argv, fds[1], launcher);
    }
    setpgid(pid, pid); /* also here: a signal may come before the child runs */
    close(fds[1]);
    line_buf lb = {.len = 0, .best = 0};
    double t0 = hs_now();
    bool open_fd = true, killed = false;
    int ws = 0;
    for (;;) {
        if (!probe) take_signals(pid, r);
        if (timeout_s > 0 && !killed && hs_now() - t0 > timeout_s) {
            kill(-pid, SIGKILL);
            killed = true;
            snprintf(r->reason, sizeof r->reason, "no answer within %.0f s", timeout_s);
        }
        if (open_fd) open_fd = pass_output(fds[0], 100, &lb, probe, r);
        else usleep(50 * 1000);
        pid_t w = waitpid(pid, &ws, WNOHANG);
        if (w == pid || (w < 0 && errno != EINTR)) break;
    }
    drain_group(pid, fds[0], &open_fd, &lb, probe, r);
    /* What the job wrote last, up to what is there now: a rank left
     * behind may hold the pipe open. */
    while (open_fd && pass_output(fds[0], 0, &lb, probe, r)) {
        struct pollfd p = {.fd = fds[0], .events = POLLIN};
        if (poll(&p, 1, 0) <= 0) break;
    }
    close(fds[0]);
    /* Reap the SIGCHLD that is now pending, so that it does not stay queued. */
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGCHLD);
    struct timespec zero = {0, 0};
    while (sigtimedwait(&s, NULL, &zero) > 0) {
    }
    r->status = exit_status(ws);
    if (lb.len) {
        lb.text[lb.len] = '\0';
        scan_line(lb.text, &lb.best, r);
    }
    return true;
}
