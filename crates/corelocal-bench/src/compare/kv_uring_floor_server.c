// kv_uring_floor_server: the least user-space work an io_uring memcached-protocol server can
// do for a workload of gets that miss; the io_uring counterpart of kv_floor_server.c. One
// pinned thread per CPU, each with an SO_REUSEPORT listener and its own ring (uring_floor.h):
//   multishot accept into a direct descriptor → recv into the slot's buffer → one send of
//   "END\r\n" per request line read (CQE skipped on success) and the next recv in the same
//   submit → recv 0 or an error → close the direct descriptor (CQE skipped on success).
// No liburing (raw syscalls), no parsing, no per-connection state beyond a 512-byte buffer:
// what is left is what the kernel and io_uring cost. Counting newlines answers pipelined and
// split lines alike without keeping any state.
// usage: kv_uring_floor_server PORT NCPUS FIRST_CPU [DEFER_ACCEPT_S (default 1)]
#include "uring_floor.h"

static const char END[] = "END\r\nEND\r\nEND\r\nEND\r\nEND\r\nEND\r\nEND\r\nEND\r\n";

static void send_ends(struct ring *r, unsigned slot, int lines) {
  while (lines > 0) {
    int n = lines < 8 ? lines : 8;
    struct io_uring_sqe *s = sqe_get(r);
    s->opcode = IORING_OP_SEND;
    s->fd = (int)slot;
    s->flags = IOSQE_FIXED_FILE | IOSQE_CQE_SKIP_SUCCESS;
    s->addr = (uint64_t)(uintptr_t)END;
    s->len = (unsigned)(5 * n);
    s->user_data = (uint64_t)KIND_OTHER << 32;
    lines -= n;
  }
}

static void complete(struct ring *r, char (*bufs)[BUF_BYTES], int listener,
                     struct io_uring_cqe *c) {
  unsigned kind = (unsigned)(c->user_data >> 32), slot = (unsigned)c->user_data;
  if (kind == KIND_ACCEPT) {
    on_accept(r, bufs, listener, c);
  } else if (kind == KIND_RECV) {
    if (c->res <= 0) { close_slot(r, slot); return; }
    int lines = 0;
    for (int j = 0; j < c->res; j++) lines += bufs[slot][j] == '\n';
    send_ends(r, slot, lines);
    arm_recv(r, bufs, slot);
  }
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s PORT NCPUS FIRST_CPU [DEFER_ACCEPT_S]\n", argv[0]);
    return 2;
  }
  port = atoi(argv[1]);
  if (argc > 4) defer_s = atoi(argv[4]);
  return run_workers(atoi(argv[2]), atoi(argv[3]));
}
