/* tb-holder: NFQUEUE packet holder for the userspace impairment backend.
 *
 * Binds one or more netfilter queues; every packet queued to QNUM is held DELAY_US (plus a
 * uniform jitter in [-JITTER_US, +JITTER_US], never reordering) and then accepted. Loss is done
 * in the kernel by the rules, not here.
 *
 * Accuracy: the hold is counted from the packet's arrival at the bridge (its kernel receive
 * timestamp, which this process switches on by holding one SO_TIMESTAMP socket), not from when
 * the holder got to read it; and timers are armed early by the running mean of how late this
 * process wakes up, so releases land on time on a busy machine.
 *
 * usage: tb-holder [--tag TAG] [--seed N] [--maxlen N] [--rt-prio N] QNUM:DELAY_US:JITTER_US ...
 * --rt-prio N runs it SCHED_FIFO at priority N (else at nice -10), so that a busy CPU does not
 * delay releases: it only ever sleeps in poll(), so it cannot starve the machine.
 * Prints "ready" on stdout once every queue is bound; on SIGTERM/SIGINT releases what it holds,
 * prints per-queue counts on stderr and exits 0.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

#define MAX_QUEUES 1024

typedef struct { uint32_t id; uint64_t due; } held_t;

typedef struct {
    struct nfq_q_handle *qh;
    int num;
    uint64_t delay_ns, jitter_ns, last_due;
    held_t *ring;
    size_t cap, head, tail;
    unsigned long n_in, n_out, n_full;
    uint64_t late_ns_sum; /* how late releases were, summed (diagnostics) */
} queue_t;

static queue_t queues[MAX_QUEUES];
static int n_queues;
static int64_t wake_late_ns; /* running mean of timer lateness, subtracted from new dues */
#define MAX_EARLY_NS 1000000LL
static volatile sig_atomic_t stop;
static uint64_t rng = 88172645463325252ULL;

static uint64_t xorshift(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

static uint64_t realtime_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

/* Monotonic time the packet reached the bridge, from its kernel timestamp; `now` if absent. */
static uint64_t arrival_ns(struct nfq_data *nfa, uint64_t now) {
    struct timeval tv;
    if (nfq_get_timestamp(nfa, &tv) != 0 || tv.tv_sec == 0) return now;
    int64_t offset = (int64_t)realtime_ns() - (int64_t)now_ns();
    int64_t at = (int64_t)tv.tv_sec * 1000000000LL + (int64_t)tv.tv_usec * 1000LL - offset;
    if (at > (int64_t)now || (int64_t)now - at > 100000000LL) return now; /* implausible */
    return (uint64_t)at;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa,
                     void *data) {
    (void)msg;
    queue_t *q = data;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    uint32_t id = ntohl(ph->packet_id);
    q->n_in++;
    size_t next = (q->tail + 1) % q->cap;
    if (next == q->head) { /* full: drop rather than pass it unimpaired */
        q->n_full++;
        return nfq_set_verdict(qh, id, NF_DROP, 0, NULL);
    }
    uint64_t now = now_ns();
    int64_t early = wake_late_ns < (int64_t)q->delay_ns ? wake_late_ns : (int64_t)q->delay_ns;
    uint64_t due = arrival_ns(nfa, now) + q->delay_ns - (uint64_t)early;
    if (q->jitter_ns) due = due - q->jitter_ns + xorshift() % (2 * q->jitter_ns + 1);
    if (due < q->last_due) due = q->last_due; /* FIFO: no reordering */
    q->last_due = due;
    q->ring[q->tail].id = id;
    q->ring[q->tail].due = due;
    q->tail = next;
    return 0;
}

/* Accept every held packet that is due (all of them if `all`); returns the earliest due left. */
static uint64_t release(int all) {
    uint64_t t = now_ns(), next = UINT64_MAX;
    for (int i = 0; i < n_queues; i++) {
        queue_t *q = &queues[i];
        while (q->head != q->tail && (all || q->ring[q->head].due <= t)) {
            if (!all && q->ring[q->head].due <= t) {
                int64_t late = (int64_t)(t - q->ring[q->head].due);
                q->late_ns_sum += (uint64_t)late;
                wake_late_ns += (late - wake_late_ns) / 16;
                if (wake_late_ns > MAX_EARLY_NS) wake_late_ns = MAX_EARLY_NS;
            }
            nfq_set_verdict(q->qh, q->ring[q->head].id, NF_ACCEPT, 0, NULL);
            q->n_out++;
            q->head = (q->head + 1) % q->cap;
        }
        if (q->head != q->tail && q->ring[q->head].due < next) next = q->ring[q->head].due;
    }
    return next;
}

static void on_signal(int sig) { (void)sig; stop = 1; }

static int usage(const char *msg) {
    fprintf(stderr, "tb-holder: %s\nusage: tb-holder [--tag TAG] [--seed N] [--maxlen N] "
                    "[--rt-prio N] QNUM:DELAY_US:JITTER_US ...\n", msg);
    return 2;
}

int main(int argc, char **argv) {
    uint32_t maxlen = 65536;
    uint64_t seed = 0;
    int have_seed = 0, rt_prio = 0;
    struct { int num; unsigned long long d, j; } spec[MAX_QUEUES];
    int n_spec = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tag") && i + 1 < argc) { i++; continue; }
        if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 10); have_seed = 1; continue;
        }
        if (!strcmp(argv[i], "--rt-prio") && i + 1 < argc) {
            rt_prio = atoi(argv[++i]); continue;
        }
        if (!strcmp(argv[i], "--maxlen") && i + 1 < argc) {
            maxlen = (uint32_t)strtoul(argv[++i], NULL, 10); continue;
        }
        if (n_spec >= MAX_QUEUES) return usage("too many queues");
        if (sscanf(argv[i], "%d:%llu:%llu", &spec[n_spec].num, &spec[n_spec].d,
                   &spec[n_spec].j) != 3)
            return usage("bad queue spec");
        n_spec++;
    }
    if (!n_spec) return usage("no queue given");
    rng ^= have_seed ? seed * 2654435761ULL + 1 : now_ns();
    prctl(PR_SET_TIMERSLACK, 1UL);
    if (rt_prio > 0) {
        struct sched_param sp = {.sched_priority = rt_prio};
        if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0) {
            fprintf(stderr, "tb-holder: SCHED_FIFO refused (%s); using nice -10\n", strerror(errno));
            setpriority(PRIO_PROCESS, 0, -10);
        }
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);

    struct nfq_handle *h = nfq_open();
    if (!h) { perror("tb-holder: nfq_open"); return 1; }
    for (int i = 0; i < n_spec; i++) {
        queue_t *q = &queues[i];
        q->num = spec[i].num;
        q->delay_ns = spec[i].d * 1000ULL;
        q->jitter_ns = spec[i].j * 1000ULL;
        q->cap = (size_t)maxlen + 1;
        q->ring = calloc(q->cap, sizeof(held_t));
        if (!q->ring) { perror("tb-holder: calloc"); return 1; }
        q->qh = nfq_create_queue(h, (uint16_t)q->num, on_packet, q);
        if (!q->qh) {
            fprintf(stderr, "tb-holder: cannot bind queue %d: %s\n", q->num, strerror(errno));
            return 1;
        }
        if (nfq_set_mode(q->qh, NFQNL_COPY_META, 0) < 0 || nfq_set_queue_maxlen(q->qh, maxlen) < 0) {
            fprintf(stderr, "tb-holder: cannot configure queue %d\n", q->num);
            return 1;
        }
        n_queues++;
    }
    nfnl_rcvbufsiz(nfq_nfnlh(h), 64 << 20);
    int fd = nfq_fd(h);
    int one = 1;
    setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);
    /* Kernel receive timestamps on every packet (see the header), for as long as we run. */
    int ts_sock = socket(AF_INET, SOCK_DGRAM, 0);
    if (ts_sock < 0 || setsockopt(ts_sock, SOL_SOCKET, SO_TIMESTAMP, &one, sizeof one) < 0)
        fprintf(stderr, "tb-holder: no kernel timestamps; holding from read time\n");
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    if (tfd < 0) { perror("tb-holder: timerfd"); return 1; }
    printf("ready\n");
    fflush(stdout);
    fclose(stdout);

    static char buf[1 << 16] __attribute__((aligned));
    struct pollfd pfd[2] = {{fd, POLLIN, 0}, {tfd, POLLIN, 0}};
    while (!stop) {
        uint64_t next = release(0);
        struct itimerspec its = {0};
        if (next != UINT64_MAX) {
            its.it_value.tv_sec = (time_t)(next / 1000000000ULL);
            its.it_value.tv_nsec = (long)(next % 1000000000ULL);
        }
        timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
        int r = poll(pfd, 2, 500);
        if (r < 0 && errno == EINTR) continue;
        if (pfd[1].revents & POLLIN) {
            uint64_t x;
            if (read(tfd, &x, sizeof x) < 0) { /* spurious */ }
        }
        if (pfd[0].revents & POLLIN) {
            for (;;) {
                int n = (int)recv(fd, buf, sizeof buf, MSG_DONTWAIT);
                if (n <= 0) break;
                nfq_handle_packet(h, buf, n);
                release(0);
            }
        }
    }
    release(1);
    for (int i = 0; i < n_queues; i++) {
        fprintf(stderr, "queue=%d in=%lu out=%lu full=%lu late_us_mean=%.1f\n", queues[i].num,
                queues[i].n_in, queues[i].n_out, queues[i].n_full,
                queues[i].n_out ? queues[i].late_ns_sum / 1e3 / queues[i].n_out : 0.0);
        nfq_destroy_queue(queues[i].qh);
    }
    nfq_close(h);
    return 0;
}
