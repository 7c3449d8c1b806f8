// http_uring_floor_server: the least user-space work an io_uring HTTP/1.1 server can do, the
// io_uring counterpart of shared/tools/floor_server.c and the HTTP twin of
// kv_uring_floor_server.c. One pinned thread per CPU, each with an SO_REUSEPORT listener and
// its own ring (uring_floor.h):
//   multishot accept into a direct descriptor → recv into the slot's buffer → a fixed answer
//   per request head read ("\r\n\r\n" counted across reads) →
//   one-shot: the answer sent MSG_WAITALL | MSG_MORE and linked to the close of the direct
//   descriptor, so the FIN rides in the answer's segment (corelocal's way); both CQEs skipped;
//   keepalive: the answer sent (CQE skipped) and the next recv in the same submit.
//   recv 0 or an error → close.
// No liburing (raw syscalls), no parsing beyond finding the end of a head, no per-connection
// state but a 512-byte buffer and the bytes of "\r\n\r\n" matched so far.
// usage: http_uring_floor_server PORT NCPUS FIRST_CPU [keepalive] [DEFER_ACCEPT_S (default 1)]
#include "uring_floor.h"

static int keepalive;
static const char RESP_CLOSE[] =
    "HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\n";
static const char RESP_KA[] = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nhello\n";
static const char HEAD_END[] = "\r\n\r\n";
// Bytes of HEAD_END matched so far, per slot of this thread's ring (each ring numbers its
// direct descriptors from 0, so the array is the thread's own).
static _Thread_local unsigned char matched[FILES];

// The one-shot answer, hard-linked to the close: the FIN rides in its segment (MSG_MORE).
static void answer_and_close(struct ring *r, unsigned slot) {
  struct io_uring_sqe *s = sqe_get(r);
  s->opcode = IORING_OP_SEND;
  s->fd = (int)slot;
  // Hard-linked: the close runs even if the send fails.
  s->flags = IOSQE_FIXED_FILE | IOSQE_CQE_SKIP_SUCCESS | IOSQE_IO_HARDLINK;
  s->addr = (uint64_t)(uintptr_t)RESP_CLOSE;
  s->len = sizeof RESP_CLOSE - 1;
  s->msg_flags = MSG_WAITALL | MSG_MORE;
  s->user_data = (uint64_t)KIND_OTHER << 32;
  close_slot(r, slot);
}

static void send_ka(struct ring *r, unsigned slot, int heads) {
  for (; heads > 0; heads--) {
    struct io_uring_sqe *s = sqe_get(r);
    s->opcode = IORING_OP_SEND;
    s->fd = (int)slot;
    s->flags = IOSQE_FIXED_FILE | IOSQE_CQE_SKIP_SUCCESS;
    s->addr = (uint64_t)(uintptr_t)RESP_KA;
    s->len = sizeof RESP_KA - 1;
    s->user_data = (uint64_t)KIND_OTHER << 32;
  }
}

// Request heads completed by these bytes ("\r\n\r\n" matched across reads).
static int heads_in(unsigned slot, const char *p, int n) {
  int heads = 0;
  unsigned m = matched[slot];
  for (int j = 0; j < n; j++) {
    m = p[j] == HEAD_END[m] ? m + 1 : (p[j] == '\r' ? 1 : 0);
    if (m == 4) { heads++; m = 0; }
  }
  matched[slot] = (unsigned char)m;
  return heads;
}

static void complete(struct ring *r, char (*bufs)[BUF_BYTES], int listener,
                     struct io_uring_cqe *c) {
  unsigned kind = (unsigned)(c->user_data >> 32), slot = (unsigned)c->user_data;
  if (kind == KIND_ACCEPT) {
    int accepted = on_accept(r, bufs, listener, c);
    if (accepted >= 0) matched[accepted] = 0; // read once its receive completes, later
  } else if (kind == KIND_RECV) {
    if (c->res <= 0) { close_slot(r, slot); return; }
    int heads = heads_in(slot, bufs[slot], c->res);
    if (!keepalive && heads > 0) { answer_and_close(r, slot); return; }
    send_ka(r, slot, heads);
    arm_recv(r, bufs, slot);
  }
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s PORT NCPUS FIRST_CPU [keepalive] [DEFER_ACCEPT_S]\n", argv[0]);
    return 2;
  }
  port = atoi(argv[1]);
  int next = 4;
  if (argc > next && strcmp(argv[next], "keepalive") == 0) {
    keepalive = 1;
    next++;
  }
  if (argc > next) defer_s = atoi(argv[next]);
  return run_workers(atoi(argv[2]), atoi(argv[3]));
}
