// kv_floor_server: the least user-space work a memcached-protocol server can do for a
// workload of gets that miss: one pinned thread per CPU, an SO_REUSEPORT listener each with
// SO_INCOMING_CPU, epoll, and for every request line read ("get KEY\r\n") an "END\r\n";
// read 0 → close. The kv counterpart of shared/tools/floor_server.c: the kernel's floor for
// `bench compare --workload kv1|kv100` (the bench's gets all miss: it stores nothing).
// Counting newlines answers pipelined and split lines alike without keeping any state.
// usage: kv_floor_server PORT NCPUS FIRST_CPU
#define _GNU_SOURCE
#include <sched.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
static int port;
static const char END[] = "END\r\nEND\r\nEND\r\nEND\r\nEND\r\nEND\r\nEND\r\nEND\r\n";
static void answer(int fd, int lines) {
  while (lines > 0) {
    int n = lines < 8 ? lines : 8;
    if (write(fd, END, 5 * n) < 0) return;
    lines -= n;
  }
}
static void *worker(void *arg) {
  int cpu = (int)(long)arg;
  cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s);
  int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  setsockopt(l, SOL_SOCKET, SO_INCOMING_CPU, &cpu, sizeof cpu);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (bind(l, (void *)&a, sizeof a) || listen(l, 4096)) { perror("bind/listen"); exit(1); }
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = l};
  epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
  struct epoll_event evs[256]; char buf[4096];
  for (;;) {
    int n = epoll_wait(ep, evs, 256, -1);
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      if (fd == l) {
        for (;;) {
          int c = accept4(l, NULL, NULL, SOCK_NONBLOCK);
          if (c < 0) break;
          struct epoll_event ce = {.events = EPOLLIN, .data.fd = c};
          epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
        }
        continue;
      }
      ssize_t r = read(fd, buf, sizeof buf);
      if (r <= 0) { close(fd); continue; }
      int lines = 0;
      for (ssize_t j = 0; j < r; j++) lines += buf[j] == '\n';
      answer(fd, lines);
    }
  }
  return NULL;
}
int main(int argc, char **argv) {
  if (argc < 4) { fprintf(stderr, "usage: %s PORT NCPUS FIRST_CPU\n", argv[0]); return 2; }
  port = atoi(argv[1]); int n = atoi(argv[2]), first = atoi(argv[3]);
  pthread_t t[256];
  for (int i = 0; i < n && i < 256; i++) pthread_create(&t[i], NULL, worker, (void *)(long)(first + i));
  for (int i = 0; i < n && i < 256; i++) pthread_join(t[i], NULL);
  return 0;
}
