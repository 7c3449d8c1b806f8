// uring_floor.h: what the C io_uring floors share (kv_uring_floor_server.c,
// http_uring_floor_server.c): the ring set up as corelocal's (SINGLE_ISSUER | DEFER_TASKRUN |
// COOP_TASKRUN, a sparse table of direct descriptors; raw syscalls, no liburing), multishot
// accept, a receive into the slot's buffer, a close with its completion skipped, one
// SO_REUSEPORT listener per pinned thread (SO_INCOMING_CPU, TCP_DEFER_ACCEPT as `corelocal
// serve` sets it), and the thread's loop. Each floor defines `complete` (one CQE) and main.
#ifndef URING_FLOOR_H
#define URING_FLOOR_H
#define _GNU_SOURCE
#include <sched.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <linux/io_uring.h>

#define SQ_ENTRIES 256
#define CQ_ENTRIES 4096
#define FILES 16384
#define BUF_BYTES 512
enum { KIND_ACCEPT = 1, KIND_RECV = 2, KIND_OTHER = 3 };

static int port, defer_s = 1;

struct ring {
  int fd;
  unsigned *sq_head, *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
  struct io_uring_sqe *sqes;
  struct io_uring_cqe *cqes;
  unsigned pending;
};

static void die(const char *what) { perror(what); exit(1); }

static void ring_init(struct ring *r) {
  struct io_uring_params p;
  memset(&p, 0, sizeof p);
  p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_COOP_TASKRUN |
            IORING_SETUP_CQSIZE;
  p.cq_entries = CQ_ENTRIES;
  r->fd = (int)syscall(__NR_io_uring_setup, SQ_ENTRIES, &p);
  if (r->fd < 0) die("io_uring_setup");
  size_t sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  size_t cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
  if (cq_len > sq_len) sq_len = cq_len; // IORING_FEAT_SINGLE_MMAP: one mapping for both
  char *sq = mmap(NULL, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                  IORING_OFF_SQ_RING);
  if (sq == MAP_FAILED) die("mmap sq");
  r->sqes = mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
  if (r->sqes == MAP_FAILED) die("mmap sqes");
  r->sq_head = (unsigned *)(sq + p.sq_off.head);
  r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
  r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
  r->sq_array = (unsigned *)(sq + p.sq_off.array);
  r->cq_head = (unsigned *)(sq + p.cq_off.head);
  r->cq_tail = (unsigned *)(sq + p.cq_off.tail);
  r->cq_mask = (unsigned *)(sq + p.cq_off.ring_mask);
  r->cqes = (struct io_uring_cqe *)(sq + p.cq_off.cqes);
  struct io_uring_rsrc_register files = {.nr = FILES, .flags = IORING_RSRC_REGISTER_SPARSE};
  if (syscall(__NR_io_uring_register, r->fd, IORING_REGISTER_FILES2, &files, sizeof files) < 0)
    die("register files");
}

static int enter(struct ring *r, unsigned submit, unsigned wait) {
  int n = (int)syscall(__NR_io_uring_enter, r->fd, submit, wait, IORING_ENTER_GETEVENTS, NULL, 0);
  if (n < 0) return n;
  r->pending -= (unsigned)n;
  return n;
}

static struct io_uring_sqe *sqe_get(struct ring *r) {
  unsigned tail = *r->sq_tail;
  if (tail - __atomic_load_n(r->sq_head, __ATOMIC_ACQUIRE) == SQ_ENTRIES) enter(r, r->pending, 0);
  unsigned i = tail & *r->sq_mask;
  struct io_uring_sqe *s = &r->sqes[i];
  memset(s, 0, sizeof *s);
  r->sq_array[i] = i;
  __atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
  r->pending++;
  return s;
}

static void arm_accept(struct ring *r, int listener) {
  struct io_uring_sqe *s = sqe_get(r);
  s->opcode = IORING_OP_ACCEPT;
  s->fd = listener;
  s->ioprio = IORING_ACCEPT_MULTISHOT;
  s->file_index = IORING_FILE_INDEX_ALLOC;
  s->user_data = (uint64_t)KIND_ACCEPT << 32;
}

static void arm_recv(struct ring *r, char (*bufs)[BUF_BYTES], unsigned slot) {
  struct io_uring_sqe *s = sqe_get(r);
  s->opcode = IORING_OP_RECV;
  s->fd = (int)slot;
  s->flags = IOSQE_FIXED_FILE;
  s->addr = (uint64_t)(uintptr_t)bufs[slot];
  s->len = BUF_BYTES;
  s->user_data = ((uint64_t)KIND_RECV << 32) | slot;
}

// An accept completion: the new connection's first receive is armed, and the multishot accept
// again once the kernel ended it. Returns the new slot, or the accept's error (< 0).
static int on_accept(struct ring *r, char (*bufs)[BUF_BYTES], int listener,
                     struct io_uring_cqe *c) {
  if (c->res >= 0) arm_recv(r, bufs, (unsigned)c->res);
  if (!(c->flags & IORING_CQE_F_MORE)) arm_accept(r, listener);
  return c->res;
}

static void close_slot(struct ring *r, unsigned slot) {
  struct io_uring_sqe *s = sqe_get(r);
  s->opcode = IORING_OP_CLOSE;
  s->file_index = slot + 1;
  s->flags = IOSQE_CQE_SKIP_SUCCESS;
  s->user_data = (uint64_t)KIND_OTHER << 32;
}

static int listen_on(int cpu) {
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  setsockopt(l, SOL_SOCKET, SO_INCOMING_CPU, &cpu, sizeof cpu);
  if (defer_s > 0) setsockopt(l, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer_s, sizeof defer_s);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (bind(l, (void *)&a, sizeof a) || listen(l, 4096)) die("bind/listen");
  return l;
}

static void complete(struct ring *r, char (*bufs)[BUF_BYTES], int listener,
                     struct io_uring_cqe *c);

static void *worker(void *arg) {
  int cpu = (int)(long)arg;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  char (*bufs)[BUF_BYTES] = calloc(FILES, BUF_BYTES);
  struct ring r = {0};
  ring_init(&r);
  int listener = listen_on(cpu);
  arm_accept(&r, listener);
  for (;;) {
    enter(&r, r.pending, 1);
    unsigned head = *r.cq_head, tail = __atomic_load_n(r.cq_tail, __ATOMIC_ACQUIRE);
    for (; head != tail; head++) complete(&r, bufs, listener, &r.cqes[head & *r.cq_mask]);
    __atomic_store_n(r.cq_head, head, __ATOMIC_RELEASE);
  }
  return NULL;
}

// Runs one pinned worker thread per CPU, FIRST_CPU to FIRST_CPU + NCPUS - 1, until killed.
static int run_workers(int n, int first) {
  if (n < 1 || n > 256) {
    fprintf(stderr, "NCPUS must be 1 to 256\n");
    return 2;
  }
  pthread_t t[256];
  for (int i = 0; i < n; i++)
    pthread_create(&t[i], NULL, worker, (void *)(long)(first + i));
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
  return 0;
}

#endif
