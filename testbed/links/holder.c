/* tb-holder: NFQUEUE packet holder of the userspace impairment backend.
 *
 * Each bound netfilter queue is one direction of one link. A packet queued there is lost by the
 * queue's Gilbert-Elliott chain (random loss is a one-state chain), or held for the delay plus a
 * jitter drawn from the queue's distribution (never below 0) and then accepted. ORDER keep (the
 * default) accepts in arrival order: a packet due before its predecessor waits for it (never
 * reordered); ORDER reorder accepts each when it is due, so packets pass each other as their
 * delays say. testbed/links/model.py is this model in numbers. A queue steps through phases (a
 * schedule): phase i applies from AT_US after the config was loaded; packets already held keep
 * their release time.
 *
 * Config file (re-read on SIGHUP: a queue whose phases changed restarts its clock at the reload,
 * one whose phases are repeated keeps running as it was; queues no longer named are released
 * and unbound; a queue's LIMIT is fixed when it is first bound):
 *   generation N
 *   queue QNUM LIMIT SEED LINK DIRECTION [ORDER]   (SEED 0: seeded from the clock; ORDER keep)
 *   phase QNUM AT_US DELAY_US JITTER_US DIST P R ONE_MINUS_H ONE_MINUS_K
 * DIST is uniform | normal | pareto | paretonormal (sigma = JITTER_US for the last three).
 * Every phase change is appended to the --log file as one JSON line stamped with wall-clock
 * time. After each load each queue's clock, "QNUM LINK DIRECTION T0_NS" (CLOCK_MONOTONIC ns from
 * which its phases count), is written to CONFIG.clocks, then the generation number to
 * CONFIG.ack.
 *
 * Accuracy: the hold counts from the packet's kernel receive timestamp (switched on by holding
 * one SO_TIMESTAMP socket), not from when it was read; a packet without one (the kernel clears
 * it when a bridge forwards, so queue at PREROUTING) is held from when it was read and counted
 * as unstamped. Timers are armed early by the running mean of how late this process wakes up,
 * leaving out releases more than STALL_NS late (a stall, not a wake-up: counting it would
 * release the packets after it early); timer slack is 1 ns; --rt-prio runs it SCHED_FIFO.
 * A backup releaser thread, pinned to another CPU than the main thread, releases what is more
 * than BACKUP_GRACE_NS overdue: on a VM the hypervisor takes one virtual CPU at a time for
 * milliseconds (steal), and the other then releases on time. It also reads the queue socket
 * when it wakes (at least every BACKUP_POLL_NS), so packets that reach the holder while the
 * main thread's CPU is taken are still held from their arrival and released when due; one
 * thread reads at a time (read_lock), so each queue's packets enter its ring in the order the
 * kernel queued them. Each release is one batch verdict
 * (every held packet of the queue up to the last one due), and one releaser at a time releases a
 * queue (the other skips it until that verdict has returned), so two releasers never reorder:
 * a verdict passes its packets on inside the call, and a releaser stalled there must not be
 * overtaken by the other passing on later packets of the same queue from its own CPU;
 * --no-backup runs the main thread alone, --backup-only leaves every read and release to the
 * backup (both to measure one releaser alone).
 *
 * --stamp-probes writes each probe datagram's release time into it, for a probe whose packets are
 * held on the receiving host after the kernel stamped their arrival (a lab impaired on its
 * hosts): an IPv4 UDP datagram of at most STAMP_MAX_BYTES whose payload starts with PROBE_MAGIC
 * gets, in the 8 bytes after it, the CLOCK_MONOTONIC ns at which its verdict was issued (big
 * endian; its UDP checksum recomputed). Such a packet is accepted on its own, in order between
 * the batches before and after it; one that finds its queue's STAMP_SLOTS copies in use passes
 * unstamped (counted as probe_unstamped).
 *
 * usage: tb-holder [--tag TAG] [--seed N] [--rt-prio N] [--log FILE] [--no-backup |
 *                  --backup-only] [--stamp-probes] CONFIG
 * Prints "ready" on stdout once every queue is bound; on SIGTERM/SIGINT releases what it holds,
 * prints per-queue counts on stderr and exits 0. Counts are per generation: a reload first
 * prints each queue's counts under the generation it replaces, then starts them afresh.
 * With them comes one "held_up" line: the spells in which both releasers were held up by more
 * than HELD_UP_NS at once (woke that late after their timers, or took that long over a pass of
 * microseconds), with overlapping delays (neither CPU ran them: on a VM, the hypervisor paused
 * both virtual CPUs), how many, the longest and the total overlap; then one
 * "held_up_spell" line per spell (the first MAX_SPELLS): when it began and ended (the overlap,
 * CLOCK_MONOTONIC ns), so a measurement can tell which of its packets were due in one.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
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
#define MAX_EARLY_NS 1000000LL
#define STALL_NS 500000LL /* a main-thread release later than this says nothing of wake-ups */
#define BACKUP_GRACE_NS 200000ULL /* the backup releases packets overdue by more than this */
#define BACKUP_POLL_NS 2000000ULL /* ... and looks at least this often */
#define BUSY_RETRY_NS 50000ULL /* a queue the other releaser is releasing: look again after */
#define HELD_UP_NS 500000ULL /* a releaser this late after its timer, or this long over a pass,
                                 * was held up */
#define MAX_SPELLS 4096 /* spells listed per generation (all are counted) */
#define STAMP_MAX_BYTES 1500 /* --stamp-probes: the longest packet stamped (and bytes copied):
                              * an Ethernet MTU, so a full-size probe datagram is stamped too */
#define STAMP_SLOTS 256     /* ... and the probe packets one queue may hold at once */
static const char PROBE_MAGIC[4] = {'t', 'b', 'R', 'X'};
enum { UNIFORM, NORMAL, PARETO, PARETONORMAL };
static const char *DIST_NAMES[] = {"uniform", "normal", "pareto", "paretonormal"};

/* stamp: slot, or -1; done: accepted out of arrival order (ORDER reorder), slot still in the ring */
typedef struct { uint32_t id; int32_t stamp; uint64_t due; uint8_t done; } held_t;
/* --stamp-probes: a held probe packet's copy, its length and where its release stamp goes */
typedef struct { uint16_t len, at; unsigned char pkt[STAMP_MAX_BYTES]; } probe_copy_t;

typedef struct {
    uint64_t at_ns, delay_ns, jitter_ns;
    int dist;
    double p, r, one_minus_h, one_minus_k;
} phase_t;

typedef struct {
    struct nfq_q_handle *qh;
    int num, bad, cur; /* bad: Gilbert-Elliott state; cur: phase in force (-1: none yet) */
    int reorder;       /* ORDER reorder: each packet leaves when due, passing others */
    char link[64], direction[8];
    phase_t *phases, *prev; /* prev: phases before a reload, kept if the reload repeats them */
    int n_phases, prev_n, prev_cur, prev_bad;
    uint64_t prev_t0, prev_rng;
    uint64_t t0, last_due, rng;
    held_t *ring;
    size_t cap;
    _Atomic size_t head, tail; /* head: taken by either releaser; tail: by the reader */
    probe_copy_t *probes;                  /* --stamp-probes: STAMP_SLOTS held probe packets */
    _Atomic size_t probe_head, probe_tail; /* taken in FIFO order, as the ring; freed in any */
    _Atomic unsigned long n_probe_stamped;
    unsigned long n_probe_unstamped;
    _Atomic int releasing;     /* a releaser holds the queue: from reading its run to the verdict */
    unsigned long n_in, n_lost, n_full, n_unstamped; /* unstamped: held from when it was read */
    unsigned long n_read_by_backup;                  /* read by the backup (waiting unread) */
    _Atomic unsigned long n_out, n_late500, n_backup; /* n_late500: released >0.5 ms late */
    _Atomic uint64_t late_ns_sum, late_ns_max;        /* n_backup: released by the backup */
} queue_t;

static queue_t *queues[MAX_QUEUES];
static int n_queues;
static struct nfq_handle *nfq;
static int nfq_sock = -1;
/* One reader of the queue socket at a time: the callbacks it runs change a queue's ring tail,
 * random state, phase and counts. */
static pthread_mutex_t read_lock = PTHREAD_MUTEX_INITIALIZER;
/* Set in the backup releaser's thread alone: whose wake-ups, releases and reads these are. */
static _Thread_local int on_backup;
static int64_t wake_late_ns;
static volatile sig_atomic_t stop, reload;
static pthread_mutex_t queues_lock = PTHREAD_MUTEX_INITIALIZER; /* queues[] changes under it */
static int backup_only; /* --backup-only: the main thread neither reads nor releases */
static int stamp_probes; /* --stamp-probes */
static uint64_t seed;
static FILE *change_log;

/* Late wake-ups per releaser (0 main, 1 backup): the last one's [timer, woke] */
static _Atomic uint64_t late_from[2], late_to[2];
static _Atomic uint64_t both_counted_to; /* end of the last spell counted (none twice) */
static _Atomic unsigned long n_held_up;
static _Atomic uint64_t held_up_max_ns, held_up_sum_ns;
static uint64_t spell_from[MAX_SPELLS], spell_to[MAX_SPELLS]; /* each spell: when neither ran */

static uint64_t clock_ns(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}
static uint64_t now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}
static double unit(uint64_t *s) { return (double)(xorshift(s) >> 11) / 9007199254740992.0; }
static double std_normal(uint64_t *s) {
    double u = unit(s), v = unit(s);
    return sqrt(-2.0 * log(u > 0 ? u : 1e-300)) * cos(2 * M_PI * v);
}
/* Pareto(shape 3, scale 1) moved to mean 0 and scaled to sigma 1. */
static double std_pareto(uint64_t *s) {
    double u = unit(s);
    return (pow(u > 0 ? u : 1e-300, -1.0 / 3.0) - 1.5) / 0.8660254037844386;
}

/* Signed jitter in ns for one packet. */
static int64_t jitter(queue_t *q, const phase_t *ph) {
    if (!ph->jitter_ns) return 0;
    double j = (double)ph->jitter_ns, x;
    switch (ph->dist) {
    case NORMAL: x = std_normal(&q->rng); break;
    case PARETO: x = std_pareto(&q->rng); break;
    case PARETONORMAL: x = unit(&q->rng) < 0.25 ? std_pareto(&q->rng) : std_normal(&q->rng); break;
    default: return (int64_t)(xorshift(&q->rng) % (2 * ph->jitter_ns + 1)) - (int64_t)ph->jitter_ns;
    }
    return (int64_t)(x * j);
}

/* Gilbert-Elliott: lose by the current state's loss rate, then step the chain. */
static int lose(queue_t *q, const phase_t *ph) {
    double loss = q->bad ? ph->one_minus_h : ph->one_minus_k;
    int lost = loss >= 1.0 || (loss > 0 && unit(&q->rng) < loss);
    if (q->bad ? unit(&q->rng) < ph->r : (ph->p > 0 && unit(&q->rng) < ph->p)) q->bad = !q->bad;
    return lost;
}

static void log_phase(queue_t *q, const phase_t *ph, unsigned long generation) {
    if (!change_log) return;
    fprintf(change_log,
            "{\"at\": %.6f, \"generation\": %lu, \"queue\": %d, \"link\": \"%s\", "
            "\"direction\": \"%s\", \"phase\": %d, \"delay_us\": %.3f, \"jitter_us\": %.3f, "
            "\"jitter_dist\": \"%s\", \"order\": \"%s\", \"p\": %.9g, \"r\": %.9g, "
            "\"1-h\": %.9g, \"1-k\": %.9g}\n",
            clock_ns(CLOCK_REALTIME) / 1e9, generation, q->num, q->link, q->direction, q->cur,
            ph->delay_ns / 1e3, ph->jitter_ns / 1e3, DIST_NAMES[ph->dist],
            q->reorder ? "reorder" : "keep", ph->p, ph->r, ph->one_minus_h, ph->one_minus_k);
    fflush(change_log);
}

static unsigned long generation;

/* This thread's releaser armed its timer for `armed` and woke at `woke` (or began a pass that
 * should take microseconds at `armed` and ended it at `woke`: its CPU was taken while it ran):
 * when late by more than HELD_UP_NS and the other releaser's last late wake-up or pass overlaps
 * it by as much, count one spell in which neither ran. */
static void note_wake(uint64_t armed, uint64_t woke) {
    int who = on_backup;
    if (woke < armed + HELD_UP_NS) return;
    late_from[who] = armed;
    late_to[who] = woke;
    uint64_t from = atomic_load(&late_from[!who]), to = atomic_load(&late_to[!who]);
    uint64_t start = from > armed ? from : armed, end = to < woke ? to : woke;
    if (end < start + HELD_UP_NS) return;
    uint64_t counted = atomic_load(&both_counted_to);
    if (start < counted || !atomic_compare_exchange_strong(&both_counted_to, &counted, end)) return;
    unsigned long n = atomic_fetch_add(&n_held_up, 1);
    if (n < MAX_SPELLS) {
        spell_from[n] = start;
        spell_to[n] = end;
    }
    held_up_sum_ns += end - start;
    uint64_t was = atomic_load(&held_up_max_ns);
    while (end - start > was && !atomic_compare_exchange_weak(&held_up_max_ns, &was, end - start)) {}
}

/* Print the held-up spells under the generation in force, and start afresh. */
static void flush_held_up(void) {
    fprintf(stderr, "held_up gen=%lu both=%lu longest_us=%.1f total_us=%.1f\n", generation,
            (unsigned long)n_held_up, held_up_max_ns / 1e3, held_up_sum_ns / 1e3);
    for (unsigned long i = 0; i < n_held_up && i < MAX_SPELLS; i++)
        fprintf(stderr, "held_up_spell gen=%lu from_ns=%llu to_ns=%llu\n", generation,
                (unsigned long long)spell_from[i], (unsigned long long)spell_to[i]);
    n_held_up = 0;
    held_up_max_ns = held_up_sum_ns = 0;
}

/* Move each queue to the phase in force at `t`; returns the next phase change time. */
static uint64_t advance_phases(uint64_t t) {
    uint64_t next = UINT64_MAX;
    for (int i = 0; i < n_queues; i++) {
        queue_t *q = queues[i];
        int was = q->cur;
        while (q->cur + 1 < q->n_phases && q->t0 + q->phases[q->cur + 1].at_ns <= t) q->cur++;
        if (q->cur != was) log_phase(q, &q->phases[q->cur], generation);
        if (q->cur + 1 < q->n_phases && q->t0 + q->phases[q->cur + 1].at_ns < next)
            next = q->t0 + q->phases[q->cur + 1].at_ns;
    }
    return next;
}

/* Monotonic time the packet reached the bridge, from its kernel timestamp; `now` (counted in
 * q->n_unstamped) if it has none or an implausible one. */
static uint64_t arrival_ns(queue_t *q, struct nfq_data *nfa, uint64_t now) {
    struct timeval tv;
    int64_t at = (int64_t)now;
    if (nfq_get_timestamp(nfa, &tv) == 0 && tv.tv_sec != 0) {
        int64_t offset = (int64_t)clock_ns(CLOCK_REALTIME) - (int64_t)now;
        at = (int64_t)tv.tv_sec * 1000000000LL + (int64_t)tv.tv_usec * 1000LL - offset;
    }
    if (at >= (int64_t)now || (int64_t)now - at > 100000000LL) { /* none, or implausible */
        q->n_unstamped++;
        return now;
    }
    return (uint64_t)at;
}

/* Offset of the release stamp in pkt (an IPv4 packet of `len` bytes, whole): its UDP payload
 * after PROBE_MAGIC when it is a probe datagram; 0 otherwise. */
static size_t probe_stamp_at(const unsigned char *pkt, int len) {
    if (len < 20 || len > STAMP_MAX_BYTES || (pkt[0] >> 4) != 4 || pkt[9] != 17) return 0;
    size_t ihl = (size_t)(pkt[0] & 0x0f) * 4, total = (size_t)pkt[2] << 8 | pkt[3];
    if (ihl < 20 || total != (size_t)len || (((pkt[6] & 0x3f) << 8) | pkt[7]) != 0) return 0;
    if (ihl + 8 > total) return 0; /* not a fragment, and the whole packet is here */
    size_t udp_len = (size_t)pkt[ihl + 4] << 8 | pkt[ihl + 5], payload = ihl + 8;
    if (udp_len > total - ihl || payload + sizeof PROBE_MAGIC + 8 > ihl + udp_len) return 0;
    if (memcmp(pkt + payload, PROBE_MAGIC, sizeof PROBE_MAGIC) != 0) return 0;
    return payload + sizeof PROBE_MAGIC;
}

/* Internet checksum words of `n` bytes added to `sum`. */
static uint32_t sum16(uint32_t sum, const unsigned char *p, size_t n) {
    for (size_t i = 0; i + 1 < n; i += 2) sum += (uint32_t)(p[i] << 8 | p[i + 1]);
    if (n & 1) sum += (uint32_t)(p[n - 1] << 8);
    return sum;
}

/* Write `when` (big endian) at `at` of the probe packet and recompute its UDP checksum (one of
 * 0 stays 0: none). */
static void write_stamp(unsigned char *pkt, size_t at, uint64_t when) {
    for (int i = 0; i < 8; i++) pkt[at + (size_t)i] = (unsigned char)(when >> (56 - 8 * i));
    size_t ihl = (size_t)(pkt[0] & 0x0f) * 4;
    unsigned char *udp = pkt + ihl;
    if (udp[6] == 0 && udp[7] == 0) return;
    size_t udp_len = (size_t)udp[4] << 8 | udp[5]; /* the IP packet may be padded past it */
    udp[6] = udp[7] = 0;
    uint32_t sum = sum16(0, pkt + 12, 8) + 17 + (uint32_t)udp_len; /* pseudo-header */
    sum = sum16(sum, udp, udp_len);
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    uint16_t check = (uint16_t)~sum;
    if (check == 0) check = 0xffff;
    udp[6] = (unsigned char)(check >> 8);
    udp[7] = (unsigned char)(check & 0xff);
}

/* Keep a copy of a probe packet to stamp at its release; its slot, or -1 (not a probe, or no
 * slot free: counted). */
static int32_t keep_probe(queue_t *q, struct nfq_data *nfa) {
    unsigned char *pkt;
    int len = q->probes ? nfq_get_payload(nfa, &pkt) : -1;
    size_t at = len > 0 ? probe_stamp_at(pkt, len) : 0;
    if (!at) return -1;
    size_t tail = atomic_load(&q->probe_tail), next = (tail + 1) % STAMP_SLOTS;
    if (next == atomic_load(&q->probe_head)) {
        q->n_probe_unstamped++;
        return -1;
    }
    probe_copy_t *c = &q->probes[tail];
    memcpy(c->pkt, pkt, (size_t)len);
    c->len = (uint16_t)len;
    c->at = (uint16_t)at;
    atomic_store(&q->probe_tail, next);
    return (int32_t)tail;
}

/* Accept one held probe packet with its release time written in, and free its slot (then the
 * slots from the oldest on that are free, so one freed out of order waits for those before). */
static void accept_stamped(queue_t *q, const held_t *h) {
    probe_copy_t *c = &q->probes[h->stamp];
    write_stamp(c->pkt, c->at, now_ns());
    nfq_set_verdict(q->qh, h->id, NF_ACCEPT, c->len, c->pkt);
    c->len = 0;
    size_t head = atomic_load(&q->probe_head), tail = atomic_load(&q->probe_tail);
    while (head != tail && q->probes[head].len == 0) head = (head + 1) % STAMP_SLOTS;
    atomic_store(&q->probe_head, head);
    q->n_probe_stamped++;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa,
                     void *data) {
    (void)msg;
    queue_t *q = data;
    uint32_t id = ntohl(nfq_get_msg_packet_hdr(nfa)->packet_id);
    uint64_t now = now_ns();
    advance_phases(now);
    const phase_t *ph = &q->phases[q->cur < 0 ? 0 : q->cur];
    q->n_in++;
    if (on_backup) q->n_read_by_backup++;
    if (lose(q, ph)) {
        q->n_lost++;
        return nfq_set_verdict(qh, id, NF_DROP, 0, NULL);
    }
    size_t tail = atomic_load(&q->tail), next = (tail + 1) % q->cap;
    if (next == atomic_load(&q->head)) { /* full: drop rather than pass it unimpaired */
        q->n_full++;
        return nfq_set_verdict(qh, id, NF_DROP, 0, NULL);
    }
    uint64_t at = arrival_ns(q, nfa, now);
    int64_t early = wake_late_ns < (int64_t)ph->delay_ns ? wake_late_ns : (int64_t)ph->delay_ns;
    int64_t due = (int64_t)at + (int64_t)ph->delay_ns - early + jitter(q, ph);
    if (due < (int64_t)at) due = (int64_t)at;
    if (!q->reorder && (uint64_t)due < q->last_due) due = (int64_t)q->last_due; /* FIFO */
    if ((uint64_t)due > q->last_due) q->last_due = (uint64_t)due;
    q->ring[tail].id = id;
    q->ring[tail].done = 0;
    q->ring[tail].stamp = keep_probe(q, nfa);
    q->ring[tail].due = (uint64_t)due;
    atomic_store(&q->tail, next); /* publishes the slot to the releasers */
    return 0;
}

/* The lateness of one packet released at `t`, added to a pass's sums. */
static void note_late(uint64_t t, uint64_t due, uint64_t *sum, uint64_t *worst, unsigned long *late500) {
    int64_t late = (int64_t)(t - due);
    if (late < 0) late = 0;
    *sum += (uint64_t)late;
    if ((uint64_t)late > *worst) *worst = (uint64_t)late;
    *late500 += late > 500000;
}

/* ORDER keep: accept the run of held packets from the head due by `cutoff` (all if `all`) with
 * one batch verdict (probe packets to stamp each on their own, in order); entries accepted out
 * of order before a reload to keep are passed over. Returns how many; *sum, *worst and
 * *late500 get their lateness. */
static unsigned long release_run(queue_t *q, int all, uint64_t cutoff, uint64_t t, uint64_t *sum,
                                 uint64_t *worst, unsigned long *late500) {
    size_t head = atomic_load(&q->head), tail = atomic_load(&q->tail), end = head;
    uint32_t last = 0;
    int batch = 0; /* packets up to `last` wait for a batch verdict */
    unsigned long n = 0;
    while (end != tail && (all || q->ring[end].done || q->ring[end].due <= cutoff)) {
        const held_t *h = &q->ring[end];
        end = (end + 1) % q->cap;
        if (h->done) continue;
        note_late(t, h->due, sum, worst, late500);
        if (h->stamp >= 0) {
            if (batch) nfq_set_verdict_batch(q->qh, last, NF_ACCEPT);
            accept_stamped(q, h);
            batch = 0;
        } else {
            last = h->id;
            batch = 1;
        }
        n++;
    }
    if (end != head) {
        atomic_store(&q->head, end);
        if (batch) nfq_set_verdict_batch(q->qh, last, NF_ACCEPT);
    }
    return n;
}

/* ORDER reorder: accept every held packet due by `cutoff` (all if `all`), earliest due first,
 * each with its own verdict, then move the head past the accepted ones at its front. */
static unsigned long release_due(queue_t *q, int all, uint64_t cutoff, uint64_t t, uint64_t *sum,
                                 uint64_t *worst, unsigned long *late500) {
    size_t head = atomic_load(&q->head), tail = atomic_load(&q->tail), from = head;
    unsigned long n = 0;
    for (;;) {
        size_t best = q->cap;
        for (size_t i = from; i != tail; i = (i + 1) % q->cap) {
            const held_t *h = &q->ring[i];
            if (h->done || (!all && h->due > cutoff)) continue;
            if (all) { best = from = i; break; } /* all: in arrival order, in one sweep */
            if (best == q->cap || h->due < q->ring[best].due) best = i;
        }
        if (best == q->cap) break;
        held_t *h = &q->ring[best];
        note_late(t, h->due, sum, worst, late500);
        if (h->stamp >= 0) accept_stamped(q, h);
        else nfq_set_verdict(q->qh, h->id, NF_ACCEPT, 0, NULL);
        h->done = 1;
        n++;
    }
    while (head != tail && q->ring[head].done) head = (head + 1) % q->cap;
    atomic_store(&q->head, head);
    return n;
}

/* The earliest due of q's held packets (UINT64_MAX: none), for the releaser holding q. */
static uint64_t earliest_due(queue_t *q) {
    size_t head = atomic_load(&q->head), tail = atomic_load(&q->tail);
    uint64_t best = UINT64_MAX;
    for (size_t i = head; i != tail; i = (i + 1) % q->cap) {
        if (q->ring[i].done) continue;
        if (q->ring[i].due < best) best = q->ring[i].due;
        if (!q->reorder) break; /* in order: the first held is the next due */
    }
    return best;
}

/* Accept the held packets of q due by `cutoff` (all if `all`), as q's ORDER says, for this
 * thread's releaser, and set *next to the earliest due left. Returns 1 (and does nothing)
 * while the other releaser holds q.
 * Lateness counts to when the run is read (after the verdicts of the queues before it in this
 * pass). The run is read before head moves past it, since the main thread may refill its slots
 * as soon as it has. */
static int release_queue(queue_t *q, int all, uint64_t cutoff, uint64_t *next) {
    int idle = 0;
    if (!atomic_compare_exchange_strong(&q->releasing, &idle, 1)) return 1;
    uint64_t t = now_ns(), sum = 0, worst = 0;
    unsigned long late500 = 0;
    unsigned long n = (q->reorder ? release_due : release_run)(q, all, cutoff, t, &sum, &worst,
                                                               &late500);
    q->n_out += n;
    *next = earliest_due(q);
    atomic_store(&q->releasing, 0);
    if (n == 0 || all) return 0;
    q->late_ns_sum += sum;
    q->n_late500 += late500;
    if (on_backup) q->n_backup += n;
    uint64_t was = atomic_load(&q->late_ns_max);
    while (worst > was && !atomic_compare_exchange_weak(&q->late_ns_max, &was, worst)) {}
    if (!on_backup && (int64_t)(sum / n) <= STALL_NS) {
        int64_t mean = (int64_t)(sum / n);
        wake_late_ns += (mean - wake_late_ns) / 16;
        if (wake_late_ns > MAX_EARLY_NS) wake_late_ns = MAX_EARLY_NS;
    }
    return 0;
}

/* Main thread: accept every held packet that is due (all if `all`); returns the earliest due
 * left. */
static uint64_t release(int all) {
    uint64_t t = now_ns(), next = UINT64_MAX;
    if (backup_only && !all) return next;
    for (int i = 0; i < n_queues; i++) {
        queue_t *q = queues[i];
        uint64_t due;
        if (release_queue(q, all, t, &due)) { /* the backup is releasing it */
            if (t + BUSY_RETRY_NS < next) next = t + BUSY_RETRY_NS;
            continue;
        }
        if (due < next) next = due;
    }
    return next;
}

/* Read and hold every message waiting on the queue socket (without waiting for more), as the
 * one reader; returns how many. The backup does not wait for the main thread to finish reading
 * (its CPU may be taken mid-read): it reads next time. */
static int read_waiting(char *buf, size_t size) {
    int n_read = 0;
    if (on_backup ? pthread_mutex_trylock(&read_lock) != 0 : pthread_mutex_lock(&read_lock) != 0)
        return 0;
    for (;;) {
        int n = (int)recv(nfq_sock, buf, size, MSG_DONTWAIT);
        if (n <= 0) break;
        nfq_handle_packet(nfq, buf, n);
        n_read++;
    }
    pthread_mutex_unlock(&read_lock);
    return n_read;
}

/* Backup releaser: wakes BACKUP_GRACE_NS after the earliest due (at least every
 * BACKUP_POLL_NS), reads what the main thread has not read, and releases what it has not
 * released. */
static void *backup_releaser(void *arg) {
    (void)arg;
    int tfd = timerfd_create(CLOCK_MONOTONIC, 0);
    if (tfd < 0) { perror("tb-holder: backup timerfd"); return NULL; }
    static char buf[1 << 16] __attribute__((aligned));
    on_backup = 1;
    while (!stop) {
        uint64_t t = now_ns(), next = t + BACKUP_POLL_NS;
        pthread_mutex_lock(&queues_lock); /* queues[] and their callbacks stay while it reads */
        read_waiting(buf, sizeof buf);
        for (int i = 0; i < n_queues; i++) {
            queue_t *q = queues[i];
            uint64_t due;
            if (release_queue(q, 0, t - BACKUP_GRACE_NS, &due)) { /* the main thread is */
                if (t + BUSY_RETRY_NS < next) next = t + BUSY_RETRY_NS;
                continue;
            }
            if (due != UINT64_MAX && due + BACKUP_GRACE_NS < next) next = due + BACKUP_GRACE_NS;
        }
        pthread_mutex_unlock(&queues_lock);
        note_wake(t, now_ns());
        if (next <= t) next = t + 1000;
        struct itimerspec its = {0};
        its.it_value.tv_sec = (time_t)(next / 1000000000ULL);
        its.it_value.tv_nsec = (long)(next % 1000000000ULL);
        timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
        uint64_t x;
        if (read(tfd, &x, sizeof x) < 0 && errno != EINTR) break;
        note_wake(next, now_ns());
    }
    close(tfd);
    return NULL;
}

/* Pin the calling thread to `cpu`; 0 on success. */
static int pin_to(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static int backup_cpu = -1;

static void *backup_main(void *arg) {
    if (pin_to(backup_cpu) != 0) fprintf(stderr, "tb-holder: could not pin the backup\n");
    return backup_releaser(arg);
}

/* Start the backup releaser on the second CPU this process may use, the main thread pinned to
 * the first; returns 0 when it runs. Signals stay with the main thread. */
static int start_backup(pthread_t *thread) {
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) return -1;
    int cpus[2], n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
        if (CPU_ISSET(c, &allowed)) cpus[n++] = c;
    if (pin_to(cpus[0]) != 0) return -1;
    backup_cpu = cpus[1];
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(thread, NULL, backup_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* Print q's counts (if it saw any packet since they were last printed) under the generation in
 * force, and start them afresh. */
static void flush_counts(queue_t *q) {
    if (q->n_in || q->n_out || q->n_lost || q->n_full)
        fprintf(stderr,
                "queue=%d link=%s/%s gen=%lu in=%lu out=%lu lost=%lu full=%lu late_us_mean=%.1f "
                "late_us_max=%.1f late_over_500us=%lu by_backup=%lu unstamped=%lu "
                "read_by_backup=%lu probe_stamped=%lu probe_unstamped=%lu\n",
                q->num, q->link, q->direction, generation, q->n_in, (unsigned long)q->n_out,
                q->n_lost, q->n_full, q->n_out ? (double)q->late_ns_sum / 1e3 / q->n_out : 0.0,
                (double)q->late_ns_max / 1e3, (unsigned long)q->n_late500,
                (unsigned long)q->n_backup, q->n_unstamped, q->n_read_by_backup,
                (unsigned long)q->n_probe_stamped, q->n_probe_unstamped);
    q->n_in = q->n_lost = q->n_full = q->n_unstamped = q->n_read_by_backup = 0;
    q->n_probe_stamped = q->n_probe_unstamped = 0;
    q->n_out = q->n_late500 = q->n_backup = 0;
    q->late_ns_sum = q->late_ns_max = 0;
}

static void drop_queue(int i) {
    queue_t *q = queues[i];
    uint64_t t = now_ns(), next;
    release_queue(q, 1, t, &next);
    flush_counts(q);
    nfq_destroy_queue(q->qh);
    free(q->ring);
    free(q->probes);
    free(q->phases);
    free(q->prev);
    free(q);
    queues[i] = queues[--n_queues];
}

static queue_t *find_queue(int num) {
    for (int i = 0; i < n_queues; i++)
        if (queues[i]->num == num) return queues[i];
    return NULL;
}

static int same_phase(const phase_t *a, const phase_t *b) {
    return a->at_ns == b->at_ns && a->delay_ns == b->delay_ns && a->jitter_ns == b->jitter_ns &&
           a->dist == b->dist && a->p == b->p && a->r == b->r &&
           a->one_minus_h == b->one_minus_h && a->one_minus_k == b->one_minus_k;
}

/* A queue whose phases a reload repeats keeps its clock, phase, chain state and random stream,
 * so changing one link does not restart the schedules of the others. */
static void keep_if_unchanged(queue_t *q) {
    int same = q->prev && q->prev_n == q->n_phases;
    for (int i = 0; same && i < q->n_phases; i++) same = same_phase(&q->prev[i], &q->phases[i]);
    if (same) {
        free(q->phases);
        q->phases = q->prev;
        q->cur = q->prev_cur;
        q->bad = q->prev_bad;
        q->t0 = q->prev_t0;
        q->rng = q->prev_rng;
    } else {
        free(q->prev);
    }
    q->prev = NULL;
}

static int parse_dist(const char *s) {
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, DIST_NAMES[i])) return i;
    return -1;
}

/* Write CONFIG.clocks: each queue's number, link, direction and the CLOCK_MONOTONIC ns its
 * phases count from (whole, by a rename). */
static void write_clocks(const char *path) {
    char name[4096], tmp[4200];
    snprintf(name, sizeof name, "%s.clocks", path);
    snprintf(tmp, sizeof tmp, "%s.tmp", name);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    for (int i = 0; i < n_queues; i++)
        fprintf(f, "%d %s %s %llu\n", queues[i]->num, queues[i]->link, queues[i]->direction,
                (unsigned long long)queues[i]->t0);
    if (fclose(f) == 0) rename(tmp, name);
}

/* Read CONFIG: bind new queues, replace every queue's phases, unbind queues not named. */
static int load_config(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) { fprintf(stderr, "tb-holder: cannot open %s: %s\n", path, strerror(errno)); return -1; }
    char line[512], link[64], dir[8], dist[16], order[16];
    int named[MAX_QUEUES], n_named = 0, num, rc = 0;
    unsigned long limit;
    unsigned long long qseed;
    unsigned long long at, d, j;
    double p, r, h, k;
    uint64_t t0 = now_ns();
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "generation %lu", &generation) == 1) continue;
        int words = sscanf(line, "queue %d %lu %llu %63s %7s %15s", &num, &limit, &qseed, link,
                           dir, order);
        if (words >= 5) {
            if (words == 6 && strcmp(order, "keep") && strcmp(order, "reorder")) {
                fprintf(stderr, "tb-holder: bad order (keep or reorder): %s", line);
                rc = -1;
                break;
            }
            queue_t *q = find_queue(num);
            if (!q) {
                if (n_queues >= MAX_QUEUES) { rc = -1; break; }
                q = calloc(1, sizeof *q);
                if (!q) { rc = -1; break; }
                q->num = num;
                q->cap = (size_t)limit + 1;
                q->ring = calloc(q->cap, sizeof(held_t));
                if (stamp_probes) q->probes = calloc(STAMP_SLOTS, sizeof(probe_copy_t));
                q->qh = q->ring && (q->probes || !stamp_probes)
                            ? nfq_create_queue(nfq, (uint16_t)num, on_packet, q)
                            : NULL;
                if (!q->qh ||
                    nfq_set_mode(q->qh, stamp_probes ? NFQNL_COPY_PACKET : NFQNL_COPY_META,
                                 stamp_probes ? STAMP_MAX_BYTES : 0) < 0 ||
                    nfq_set_queue_maxlen(q->qh, (uint32_t)limit) < 0) {
                    fprintf(stderr, "tb-holder: cannot bind queue %d: %s\n", num, strerror(errno));
                    free(q->ring);
                    free(q->probes);
                    free(q);
                    rc = -1;
                    break;
                }
                queues[n_queues++] = q;
            }
            snprintf(q->link, sizeof q->link, "%s", link);
            snprintf(q->direction, sizeof q->direction, "%s", dir);
            q->reorder = words == 6 && !strcmp(order, "reorder");
            free(q->prev);
            q->prev = q->phases;
            q->prev_n = q->n_phases;
            q->prev_cur = q->cur;
            q->prev_bad = q->bad;
            q->prev_t0 = q->t0;
            q->prev_rng = q->rng;
            q->rng = (qseed ? qseed : seed ? seed : now_ns()) * 2654435761ULL + (uint64_t)num * 0x9E3779B97F4A7C15ULL + 1;
            q->phases = NULL;
            q->n_phases = 0;
            q->cur = -1;
            q->bad = 0;
            q->t0 = t0;
            if (n_named < MAX_QUEUES) named[n_named++] = num;
            continue;
        }
        if (sscanf(line, "phase %d %llu %llu %llu %15s %lf %lf %lf %lf", &num, &at, &d, &j, dist, &p,
                   &r, &h, &k) == 9) {
            queue_t *q = find_queue(num);
            int di = parse_dist(dist);
            if (!q || di < 0) { fprintf(stderr, "tb-holder: bad phase: %s", line); rc = -1; break; }
            phase_t *grown = realloc(q->phases, (size_t)(q->n_phases + 1) * sizeof(phase_t));
            if (!grown) { rc = -1; break; }
            q->phases = grown;
            q->phases[q->n_phases++] = (phase_t){at * 1000ULL, d * 1000ULL, j * 1000ULL, di, p, r, h, k};
            continue;
        }
        if (line[0] != '\n' && line[0] != '#') { fprintf(stderr, "tb-holder: bad line: %s", line); rc = -1; break; }
    }
    fclose(f);
    for (int i = 0; i < n_queues; i++) keep_if_unchanged(queues[i]);
    for (int i = n_queues - 1; i >= 0; i--) {
        int keep = 0;
        for (int n = 0; n < n_named; n++) keep |= queues[i]->num == named[n];
        if (!keep || queues[i]->n_phases == 0) drop_queue(i);
    }
    advance_phases(now_ns());
    write_clocks(path);
    char ack[4096];
    snprintf(ack, sizeof ack, "%s.ack", path);
    FILE *a = fopen(ack, "w");
    if (a) { fprintf(a, "%lu %s\n", generation, rc ? "error" : "ok"); fclose(a); }
    return rc;
}

static void on_signal(int sig) {
    if (sig == SIGHUP) reload = 1;
    else stop = 1;
}

static int usage(const char *msg) {
    fprintf(stderr, "tb-holder: %s\nusage: tb-holder [--tag TAG] [--seed N] [--rt-prio N] "
                    "[--log FILE] [--no-backup | --backup-only] [--stamp-probes] CONFIG\n", msg);
    return 2;
}

int main(int argc, char **argv) {
    int rt_prio = 0, backup = 1;
    const char *config = NULL, *log_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tag") && i + 1 < argc) { i++; continue; }
        if (!strcmp(argv[i], "--seed") && i + 1 < argc) { seed = strtoull(argv[++i], NULL, 10) + 1; continue; }
        if (!strcmp(argv[i], "--rt-prio") && i + 1 < argc) { rt_prio = atoi(argv[++i]); continue; }
        if (!strcmp(argv[i], "--log") && i + 1 < argc) { log_path = argv[++i]; continue; }
        if (!strcmp(argv[i], "--no-backup")) { backup = 0; continue; }
        if (!strcmp(argv[i], "--backup-only")) { backup_only = 1; continue; }
        if (!strcmp(argv[i], "--stamp-probes")) { stamp_probes = 1; continue; }
        if (config) return usage("more than one config file");
        config = argv[i];
    }
    if (!config) return usage("no config file");
    if (backup_only && !backup) return usage("--backup-only and --no-backup exclude each other");
    prctl(PR_SET_TIMERSLACK, 1UL);
    if (rt_prio > 0) {
        struct sched_param sp = {.sched_priority = rt_prio};
        if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0) {
            fprintf(stderr, "tb-holder: SCHED_FIFO refused (%s); using nice -10\n", strerror(errno));
            setpriority(PRIO_PROCESS, 0, -10);
        }
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (log_path && !(change_log = fopen(log_path, "a"))) {
        fprintf(stderr, "tb-holder: cannot open log %s: %s\n", log_path, strerror(errno));
        return 1;
    }

    nfq = nfq_open();
    if (!nfq) { perror("tb-holder: nfq_open"); return 1; }
    if (load_config(config) != 0) return 1;
    nfnl_rcvbufsiz(nfq_nfnlh(nfq), 64 << 20);
    int fd = nfq_sock = nfq_fd(nfq);
    int one = 1;
    setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);
    /* Kernel receive timestamps on every packet (see the header), for as long as we run. */
    int ts_sock = socket(AF_INET, SOCK_DGRAM, 0);
    if (ts_sock < 0 || setsockopt(ts_sock, SOL_SOCKET, SO_TIMESTAMP, &one, sizeof one) < 0)
        fprintf(stderr, "tb-holder: no kernel timestamps; holding from read time\n");
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    if (tfd < 0) { perror("tb-holder: timerfd"); return 1; }
    pthread_t backup_thread;
    int backed = backup && start_backup(&backup_thread) == 0;
    if (backup && !backed) fprintf(stderr, "tb-holder: one CPU only; no backup releaser\n");
    if (backup_only && !backed) {
        fprintf(stderr, "tb-holder: --backup-only needs a backup releaser (two CPUs)\n");
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    fclose(stdout);

    static char buf[1 << 16] __attribute__((aligned));
    struct pollfd pfd[2] = {{backup_only ? -1 : fd, POLLIN, 0}, {tfd, POLLIN, 0}};
    while (!stop) {
        if (reload) {
            reload = 0;
            pthread_mutex_lock(&queues_lock);
            for (int i = 0; i < n_queues; i++) flush_counts(queues[i]);
            flush_held_up();
            int rc = load_config(config);
            pthread_mutex_unlock(&queues_lock);
            if (rc != 0) fprintf(stderr, "tb-holder: reload failed; kept going\n");
        }
        uint64_t ran = now_ns(), next = release(0);
        pthread_mutex_lock(&read_lock); /* the reader's callbacks advance phases too */
        uint64_t change = advance_phases(now_ns());
        pthread_mutex_unlock(&read_lock);
        note_wake(ran, now_ns()); /* a pass stalled (its CPU not run) counts as late too */
        if (change < next) next = change;
        struct itimerspec its = {0};
        if (next != UINT64_MAX) {
            its.it_value.tv_sec = (time_t)(next / 1000000000ULL);
            its.it_value.tv_nsec = (long)(next % 1000000000ULL);
        }
        timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
        int r = poll(pfd, 2, 500);
        if (next != UINT64_MAX) note_wake(next, now_ns());
        if (r < 0 && errno == EINTR) continue;
        if (pfd[1].revents & POLLIN) {
            uint64_t x;
            if (read(tfd, &x, sizeof x) < 0) { /* spurious */ }
        }
        if (pfd[0].revents & POLLIN) {
            for (;;) {
                uint64_t ran = now_ns();
                if (!read_waiting(buf, sizeof buf)) break;
                release(0);
                note_wake(ran, now_ns());
            }
        }
    }
    if (backed) pthread_join(backup_thread, NULL);
    release(1);
    while (n_queues) drop_queue(n_queues - 1);
    flush_held_up();
    nfq_close(nfq);
    return 0;
}
