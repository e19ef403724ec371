/* The rdt demo: tensors fetched from a second process over every transport
 * rdt has on this machine, every byte checked. `make demo` builds and runs
 * it; on its own it is `demo` (the receiver), which starts a copy of itself
 * as the source.
 *
 * What it shows, in the order a program of your own would do it:
 *
 *   source process                          this process (the receiver)
 *   rdt_runtime_create                      rdt_runtime_create
 *   rdt_put(tensors, "tcp" or NULL) -> ref
 *   rdt_ref_serialize(ref) -> bytes  ---->  rdt_ref_deserialize(bytes) -> ref
 *        (over a pipe here; in a real program your RPC, a queue, a file)
 *                                           rdt_get(ref, into my buffers)
 *                                           rdt_ref_release(ref)
 *   rdt_ref_release(ref)
 *   rdt_wait_tensor_freed: the memory may be reused
 *
 * rdt_get pulls the bytes straight from the source's memory into the
 * receiver's buffers; the source's program does nothing per fetch.
 *
 * Each row fetches the same object several times into the same buffers. Its
 * first fetch connects to the source and prepares the memory (registering
 * it, mapping it), so that cost is on a line of its own per transport; the
 * row shows the median of the fetches after it, which is what a program that
 * keeps fetching sees.
 *
 * Exits 1 when a row did not happen as shown (bytes wrong, or another
 * transport than the one asked for moved them) and, with RDT_REQUIRE_GPU=1,
 * when there are no GPU rows. */
#define _GNU_SOURCE
#include <rdt.h>

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "demo_cuda.h"

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)

enum {
  MAX_TENSORS = 64,     /* the most tensors one row puts */
  TIMEOUT_MS = 120000,  /* for every rdt_get */
  MAX_TRANSPORTS = 32,  /* what rdt_transport_list may report */
};

static const uint64_t big = 256 * MiB, small = 4 * KiB;
static const int nsmall = 64;

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "demo: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

/* Every rdt call returns a status; rdt_last_error() says what went wrong on
 * this thread. */
static void check(rdt_status st, const char *call) {
  if (st != RDT_OK) die("%s: %s: %s", call, rdt_status_string(st), rdt_last_error());
}

static void *alloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) die("out of memory (%zu bytes)", n);
  return p;
}

/* Tensor memory on the host, from mmap so that it is page-aligned. Buffers
 * of 4 MiB and more are advised for transparent huge pages, as numpy
 * advises its large arrays: fewer page faults and TLB misses for whoever
 * copies them, rdt's transports included. */
static void *host_alloc(size_t n) {
  void *p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap of %zu bytes: %s", n, strerror(errno));
  if (n >= 4 * MiB) madvise(p, n, MADV_HUGEPAGE); /* advice: its failure changes nothing */
  return p;
}

static void host_free(void *p, size_t n) {
  if (munmap(p, n ? n : 1)) die("munmap: %s", strerror(errno));
}

/* ------------------------------------------------------------------------ */
/* Tensors and their bytes                                                  */
/* ------------------------------------------------------------------------ */

/* A one-dimensional tensor of `*shape` bytes at `data`, in host memory or
 * in GPU 0's memory. */
static rdt_tensor byte_tensor(void *data, const int64_t *shape, int on_gpu) {
  rdt_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = on_gpu ? RDT_DEVICE_CUDA : RDT_DEVICE_CPU;
  t.device.device_id = 0;
  t.ndim = 1;
  t.dtype.code = RDT_DTYPE_UINT;
  t.dtype.bits = 8;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

/* The bytes of a tensor are a function of their offset and a seed, so the
 * receiver can check them without the source's copy. n is a multiple of 8. */
static void fill(void *p, size_t n, uint64_t seed) {
  uint64_t *w = p;
  for (size_t i = 0; i < n / 8; i++) w[i] = (i * 0x9E3779B97F4A7C15ull) ^ seed;
}

static int intact(const void *p, size_t n, uint64_t seed) {
  const uint64_t *w = p;
  for (size_t i = 0; i < n / 8; i++)
    if (w[i] != ((i * 0x9E3779B97F4A7C15ull) ^ seed)) return 0;
  return 1;
}

/* ------------------------------------------------------------------------ */
/* The pipe between the two processes                                      */
/* ------------------------------------------------------------------------ */

/* The receiver asks, the source answers: a put is answered with one
 * serialized ref per tensor (its length, then its bytes), a drop with a
 * zero length once the source's memory is free. */
enum { OP_PUT = 1, OP_DROP, OP_QUIT };
struct request {
  int32_t op;
  int32_t on_gpu;      /* put the tensors in GPU 0's memory */
  uint32_t count;      /* tensors, each an object of its own */
  uint64_t size;       /* bytes per tensor */
  uint64_t seed;       /* tensor i holds the pattern of seed + i */
  char transport[32];  /* "": rdt chooses per fetch */
};

static void write_all(int fd, const void *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) die("writing to the other process: %s", strerror(errno));
    p = (const char *)p + w;
    n -= (size_t)w;
  }
}

/* Returns 0 at end of file before the first byte; dies on one later. */
static int read_all(int fd, void *p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) die("reading from the other process: %s", strerror(errno));
    if (r == 0) {
      if (got == 0) return 0;
      die("the other process stopped mid-message");
    }
    got += (size_t)r;
  }
  return 1;
}

/* ------------------------------------------------------------------------ */
/* The source process: owns the tensors and serves them                     */
/* ------------------------------------------------------------------------ */

struct object {
  rdt_ref *ref;
  void *data;
  size_t size;
  int on_gpu;
};

/* Puts one tensor of `size` bytes holding the pattern of `seed` and sends
 * its serialized ref to the receiver. */
static void put_one(rdt_runtime *rt, const struct request *rq, uint64_t seed, struct object *obj) {
  void *host = host_alloc(rq->size);
  fill(host, rq->size, seed);
  obj->size = rq->size;
  obj->on_gpu = rq->on_gpu;
  obj->data = host;
  if (rq->on_gpu) {
    obj->data = demo_cuda_alloc(rq->size);
    demo_cuda_upload(obj->data, host, rq->size);
    host_free(host, rq->size);
  }
  int64_t shape[1] = {(int64_t)rq->size};
  rdt_tensor t = byte_tensor(obj->data, shape, rq->on_gpu);
  /* The transport named here travels in the ref; NULL lets the receiver's
   * rdt choose per fetch. The data stays where it is: rdt_put copies
   * nothing. */
  check(rdt_put(rt, &t, 1, rq->transport[0] ? rq->transport : NULL, NULL, NULL, &obj->ref),
        "rdt_put");
  void *bytes;
  size_t n;
  check(rdt_ref_serialize(obj->ref, &bytes, &n), "rdt_ref_serialize");
  uint64_t len = n;
  write_all(STDOUT_FILENO, &len, sizeof len);
  write_all(STDOUT_FILENO, bytes, n);
  rdt_bytes_free(bytes);
}

/* Releases the source's refs, then waits until the receiver released its
 * own: only then is the memory the source's to free. */
static void drop_all(rdt_runtime *rt, struct object *objs, size_t n) {
  for (size_t i = 0; i < n; i++) check(rdt_ref_release(objs[i].ref), "rdt_ref_release");
  for (size_t i = 0; i < n; i++) {
    check(rdt_wait_tensor_freed(rt, objs[i].data, 30000), "rdt_wait_tensor_freed");
    if (objs[i].on_gpu)
      demo_cuda_free(objs[i].data);
    else
      host_free(objs[i].data, objs[i].size);
  }
}

static int run_source(void) {
  rdt_runtime_options o;
  rdt_runtime_options_init(&o);
  o.name = "demo-source";
  rdt_runtime *rt;
  check(rdt_runtime_create(&o, &rt), "rdt_runtime_create");
  struct object objs[MAX_TENSORS];
  size_t nobjs = 0;
  struct request rq;
  while (read_all(STDIN_FILENO, &rq, sizeof rq) && rq.op != OP_QUIT) {
    if (rq.op == OP_PUT) {
      rq.transport[sizeof rq.transport - 1] = 0;
      if (rq.count > MAX_TENSORS - nobjs || rq.size % 8 != 0) die("source: a bad request");
      if (rq.on_gpu) {
        const char *why = demo_cuda_open();
        if (why) die("source: %s", why);
      }
      for (uint32_t i = 0; i < rq.count; i++) put_one(rt, &rq, rq.seed + i, &objs[nobjs++]);
    } else if (rq.op == OP_DROP) {
      drop_all(rt, objs, nobjs);
      nobjs = 0;
      uint64_t done = 0;
      write_all(STDOUT_FILENO, &done, sizeof done);
    } else {
      die("source: unknown request %d", rq.op);
    }
  }
  drop_all(rt, objs, nobjs);
  check(rdt_runtime_destroy(rt), "rdt_runtime_destroy");
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The receiver: asks the source for tensors and fetches them               */
/* ------------------------------------------------------------------------ */

struct source {
  pid_t pid;
  int to, from; /* pipes to its stdin, from its stdout */
};

static struct source start_source(void) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) die("cannot find this program (/proc/self/exe): %s", strerror(errno));
  self[n] = 0;
  int in[2], out[2];
  if (pipe(in) || pipe(out)) die("pipe: %s", strerror(errno));
  pid_t pid = fork();
  if (pid < 0) die("fork: %s", strerror(errno));
  if (pid == 0) {
    if (dup2(in[0], STDIN_FILENO) < 0 || dup2(out[1], STDOUT_FILENO) < 0) _exit(127);
    close(in[0]);
    close(in[1]);
    close(out[0]);
    close(out[1]);
    execl(self, self, "source", (char *)NULL);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  return (struct source){pid, in[1], out[0]};
}

static void stop_source(struct source *s) {
  struct request rq = {.op = OP_QUIT};
  write_all(s->to, &rq, sizeof rq);
  close(s->to);
  close(s->from);
  int st;
  if (waitpid(s->pid, &st, 0) < 0) die("waitpid: %s", strerror(errno));
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die("the source process failed (status %#x)", st);
}

/* Has the source put `count` tensors and turns their serialized refs into
 * refs of this runtime. */
static void put_in_source(struct source *s, rdt_runtime *rt, const char *transport, int count,
                          uint64_t size, uint64_t seed, int on_gpu, rdt_ref **refs) {
  struct request rq = {.op = OP_PUT, .on_gpu = on_gpu, .count = (uint32_t)count, .size = size,
                       .seed = seed};
  snprintf(rq.transport, sizeof rq.transport, "%s", transport);
  write_all(s->to, &rq, sizeof rq);
  for (int i = 0; i < count; i++) {
    uint64_t len;
    if (!read_all(s->from, &len, sizeof len)) die("the source process stopped");
    if (len == 0 || len > 16 * MiB) die("the source sent a ref of %" PRIu64 " bytes", len);
    void *bytes = alloc(len);
    if (!read_all(s->from, bytes, len)) die("the source process stopped");
    check(rdt_ref_deserialize(rt, bytes, len, &refs[i]), "rdt_ref_deserialize");
    free(bytes);
  }
}

/* Releases this side's refs and waits until the source freed the tensors. */
static void drop_in_source(struct source *s, rdt_ref **refs, int count) {
  for (int i = 0; i < count; i++) check(rdt_ref_release(refs[i]), "rdt_ref_release");
  struct request rq = {.op = OP_DROP};
  write_all(s->to, &rq, sizeof rq);
  uint64_t done;
  if (!read_all(s->from, &done, sizeof done)) die("the source process stopped");
}

/* ------------------------------------------------------------------------ */
/* Which transport moved the bytes                                          */
/* ------------------------------------------------------------------------ */

/* Every transport's count of completed fetches, as the receiver. */
struct counts {
  size_t n;
  rdt_transport_info info[MAX_TRANSPORTS];
};

static void count_transfers(rdt_runtime *rt, struct counts *c) {
  for (int i = 0; i < MAX_TRANSPORTS; i++) rdt_transport_info_init(&c->info[i]);
  check(rdt_transport_list(rt, c->info, MAX_TRANSPORTS, &c->n), "rdt_transport_list");
  if (c->n > MAX_TRANSPORTS) c->n = MAX_TRANSPORTS;
}

static int transport_available(rdt_runtime *rt, const char *name) {
  struct counts c;
  count_transfers(rt, &c);
  for (size_t i = 0; i < c.n; i++)
    if (strcmp(c.info[i].name, name) == 0) return 1;
  return 0;
}

/* Why rdt could not make the transport `name` here, in its own words. */
static const char *why_unavailable(rdt_runtime *rt, const char *name) {
  static rdt_unavailable_transport u[MAX_TRANSPORTS];
  for (int i = 0; i < MAX_TRANSPORTS; i++) rdt_unavailable_transport_init(&u[i]);
  size_t n = 0;
  check(rdt_transport_list_unavailable(rt, u, MAX_TRANSPORTS, &n), "rdt_transport_list_unavailable");
  for (size_t i = 0; i < n && i < MAX_TRANSPORTS; i++)
    if (strcmp(u[i].name, name) == 0) return u[i].reason;
  return "not built into this librdt";
}

/* The transport whose count grew since `before`: "?" when none did, the
 * names joined by "+" when several did. */
static const char *moved_by(rdt_runtime *rt, const struct counts *before) {
  static char by[256];
  struct counts after;
  count_transfers(rt, &after);
  by[0] = 0;
  for (size_t i = 0; i < after.n; i++) {
    uint64_t was = 0;
    for (size_t j = 0; j < before->n; j++)
      if (strcmp(before->info[j].name, after.info[i].name) == 0)
        was = before->info[j].transfers_completed;
    if (after.info[i].transfers_completed > was) {
      size_t len = strlen(by);
      snprintf(by + len, sizeof by - len, "%s%s", len ? "+" : "", after.info[i].name);
    }
  }
  return by[0] ? by : "?";
}

/* ------------------------------------------------------------------------ */
/* One row: one object per tensor, fetched several times                    */
/* ------------------------------------------------------------------------ */

struct row {
  double first; /* seconds of the first fetch */
  double warm;  /* median seconds of the fetches after it */
  int runs;     /* how many those were */
  int intact;   /* the first and the last fetch brought the right bytes */
  const char *by;
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sets every target's bytes to zero, so a check after the next fetch sees
 * only what that fetch brought. */
static void clear(void **bufs, int count, uint64_t size, int on_gpu, void *zeros) {
  for (int i = 0; i < count; i++) {
    if (on_gpu)
      demo_cuda_upload(bufs[i], zeros, size);
    else
      memset(bufs[i], 0, size);
  }
}

static int all_intact(void **bufs, int count, uint64_t size, uint64_t seed, int on_gpu,
                      void *scratch) {
  int ok = 1;
  for (int i = 0; i < count; i++) {
    const void *p = bufs[i];
    if (on_gpu) {
      demo_cuda_download(scratch, bufs[i], size);
      p = scratch;
    }
    ok &= intact(p, size, seed + (uint64_t)i);
  }
  return ok;
}

/* The source puts `count` tensors of `size` bytes, each its own object, over
 * `asked` ("auto": rdt chooses); this process fetches all of them with one
 * rdt_get, first once and then `runs` times more into the same buffers. */
static struct row fetch_row(rdt_runtime *rt, struct source *src, const char *asked, int count,
                            uint64_t size, int on_gpu, int runs, uint64_t seed) {
  rdt_ref *refs[MAX_TENSORS];
  put_in_source(src, rt, strcmp(asked, "auto") ? asked : "", count, size, seed, on_gpu, refs);

  /* The targets: one buffer per tensor, touched before the first fetch, as
   * a program that reuses its buffers has them. */
  void *bufs[MAX_TENSORS], *scratch = host_alloc(size);
  rdt_tensor targets[MAX_TENSORS];
  int64_t shape[1] = {(int64_t)size};
  memset(scratch, 0, size);
  for (int i = 0; i < count; i++) {
    bufs[i] = on_gpu ? demo_cuda_alloc(size) : host_alloc(size);
    targets[i] = byte_tensor(bufs[i], shape, on_gpu);
  }
  clear(bufs, count, size, on_gpu, scratch);

  struct counts before;
  count_transfers(rt, &before);
  struct row r = {.runs = runs};
  double *times = alloc((size_t)runs * sizeof *times);
  for (int k = -1; k < runs; k++) {
    if (k == runs - 1) clear(bufs, count, size, on_gpu, scratch);
    double t0 = now();
    /* One call fetches every ref, each into its target. NULL options: each
     * ref's own transport, or rdt's choice when it names none. */
    check(rdt_get(rt, refs, (size_t)count, targets, (size_t)count, NULL, TIMEOUT_MS), "rdt_get");
    double dt = now() - t0;
    if (k < 0) {
      r.first = dt;
      r.intact = all_intact(bufs, count, size, seed, on_gpu, scratch);
    } else {
      times[k] = dt;
    }
  }
  r.intact &= all_intact(bufs, count, size, seed, on_gpu, scratch);
  r.by = moved_by(rt, &before);
  qsort(times, (size_t)runs, sizeof *times, cmp_double);
  r.warm = times[runs / 2];

  free(times);
  for (int i = 0; i < count; i++) {
    if (on_gpu)
      demo_cuda_free(bufs[i]);
    else
      host_free(bufs[i], size);
  }
  host_free(scratch, size);
  drop_in_source(src, refs, count);
  return r;
}

/* ------------------------------------------------------------------------ */
/* The table                                                                */
/* ------------------------------------------------------------------------ */

static const char *bytes_text(uint64_t n) {
  static char buf[4][32];
  static int k;
  char *b = buf[k++ & 3];
  if (n >= MiB && n % MiB == 0)
    snprintf(b, 32, "%" PRIu64 " MiB", n / MiB);
  else if (n >= KiB && n % KiB == 0)
    snprintf(b, 32, "%" PRIu64 " KiB", n / KiB);
  else
    snprintf(b, 32, "%" PRIu64 " B", n);
  return b;
}

static const char *time_text(double s) {
  static char buf[4][32];
  static int k;
  char *b = buf[k++ & 3];
  if (s < 10e-3)
    snprintf(b, 32, "%.3f ms", s * 1e3);
  else
    snprintf(b, 32, "%.1f ms", s * 1e3);
  return b;
}

/* Prints a row; returns whether it happened as its line says: the bytes
 * arrived intact, over the transport asked for or (asked "auto") over one
 * transport that counted the fetches. Says why not under the row. */
static int print_row(const char *asked, const char *what, uint64_t bytes, const struct row *r) {
  printf("%-8s %-18s %-9s %-9s %11s %7.2f GB/s  %s\n", asked, what, bytes_text(bytes), r->by,
         time_text(r->warm), (double)bytes / r->warm / 1e9, r->intact ? "verified" : "CORRUPT");
  if (!r->intact) {
    printf("  FAILED: the bytes above came back wrong\n");
    return 0;
  }
  if (strcmp(r->by, "?") == 0) {
    printf("  FAILED: no transport counted the fetches above\n");
    return 0;
  }
  if (strchr(r->by, '+')) {
    printf("  FAILED: more than one transport moved the bytes above\n");
    return 0;
  }
  if (strcmp(asked, "auto") != 0 && strcmp(asked, r->by) != 0) {
    printf("  FAILED: asked for %s, but %s moved the bytes\n", asked, r->by);
    return 0;
  }
  return 1;
}

/* Host memory to host memory: one 256 MiB tensor, then 64 objects of one 4 KiB tensor
 * in one rdt_get. Returns the number of rows that failed. */
static int host_rows(rdt_runtime *rt, struct source *src, const char *name, uint64_t seed) {
  char what[32];
  struct row one = fetch_row(rt, src, name, 1, big, 0, 5, seed);
  int failures = !print_row(name, "1 tensor", big, &one);
  struct row many = fetch_row(rt, src, name, nsmall, small, 0, 50, seed + 1000);
  snprintf(what, sizeof what, "%d refs, 1 get", nsmall);
  failures += !print_row(name, what, small * (uint64_t)nsmall, &many);
  printf("%-8s first fetch: %s (1 tensor), %s (%d refs): connecting, preparing memory\n", "",
         time_text(one.first), time_text(many.first), nsmall);
  return failures;
}

/* GPU 0 of the source to GPU 0 of this process, device to device, no host
 * copy. No GPU is a failure only under RDT_REQUIRE_GPU=1, as in the GPU
 * tests. Returns the number of failures. */
static int gpu_rows(rdt_runtime *rt, struct source *src) {
  const char *why = demo_cuda_open();
  if (!why && !transport_available(rt, "cuda_ipc"))
    why = why_unavailable(rt, "cuda_ipc");
  if (why) {
    printf("%-8s (no GPU rows: %s)\n", "cuda", why);
    const char *require = getenv("RDT_REQUIRE_GPU");
    if (require && strcmp(require, "1") == 0) {
      printf("  FAILED: RDT_REQUIRE_GPU=1 asks for the GPU rows\n");
      return 1;
    }
    return 0;
  }
  printf("GPU 0 of both processes: %s\n", demo_cuda_device_name());
  const char *names[] = {"auto", "cuda_ipc", "nixl"};
  int failures = 0;
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
    if (k > 0 && !transport_available(rt, names[k])) {
      printf("%-8s (not available here: %s)\n", names[k], why_unavailable(rt, names[k]));
      continue;
    }
    struct row r = fetch_row(rt, src, names[k], 1, big, 1, 5, 300 + k);
    failures += !print_row(names[k], "1 tensor, GPU 0", big, &r);
    printf("%-8s first fetch: %s: connecting, opening the memory\n", "", time_text(r.first));
  }
  return failures;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "source") == 0) return run_source();
  if (argc != 1) {
    fprintf(stderr, "usage: %s\n(runs the demo: no arguments)\n", argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN); /* a source that stopped is an error from write */
  setvbuf(stdout, NULL, _IOLBF, 0);

  rdt_runtime_options o;
  rdt_runtime_options_init(&o);
  o.name = "demo";
  rdt_runtime *rt;
  check(rdt_runtime_create(&o, &rt), "rdt_runtime_create");
  struct source src = start_source();

  printf("rdt %s demo: this process (pid %d) fetches tensors that another process (pid %d) "
         "put.\nEach row is the median of repeated fetches of one object after its first; "
         "the first\nfetch's cost is on a line of its own per transport.\n\n",
         rdt_version(), (int)getpid(), (int)src.pid);
  printf("%-8s %-18s %-9s %-9s %11s %12s\n", "asked", "what", "bytes", "moved by", "warm time",
         "speed");
  const char *names[] = {"auto", "cma", "shm", "tcp", "nixl"};
  int failures = 0;
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
    if (k > 0 && !transport_available(rt, names[k])) {
      printf("%-8s (not available here: %s)\n", names[k], why_unavailable(rt, names[k]));
      continue;
    }
    failures += host_rows(rt, &src, names[k], 100 * (k + 1));
  }
  failures += gpu_rows(rt, &src);

  stop_source(&src);
  check(rdt_runtime_destroy(rt), "rdt_runtime_destroy");
  printf("\n\"auto\" lets rdt choose per fetch. Every object was freed in the source once this "
         "side released it.\n");
  if (failures) {
    printf("The demo failed: %d of its rows (marked FAILED above) did not happen as shown.\n",
           failures);
    return 1;
  }
  return 0;
}
