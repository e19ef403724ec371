/* rdtbench: measures moving tensors between two processes through the C
 * ABI. (The demo, `make demo`, is examples/c/demo.c.)
 *
 *   rdtbench bench [RESULTS.md]   transports against the machine's own
 *                                 limits (memcpy, process_vm_readv, TCP);
 *                                 bench/run.sh (`make bench`) adds the
 *                                 Python figures after it
 *   rdtbench row TRANSPORT SHAPE [RUNS]
 *                                 one measurement, one line of key=value:
 *                                 TRANSPORT is cma, shm, tcp, nixl or auto;
 *                                 SHAPE is one tensor (4KiB, 1MiB, 64MiB,
 *                                 1GiB) or one object of COUNTxSIZE tensors
 *                                 (1024x4KiB, 4096x64KiB, 100000x10688),
 *                                 measured against one tensor of the same
 *                                 bytes, or "reshard": two receivers each
 *                                 pulling half the rows of a 1 GiB state
 *                                 dict against one pulling it whole, or
 *                                 "write:SIZE": writes into an exposed
 *                                 buffer against fetches of the same size.
 *                                 Writes no file: for measuring a change
 *                                 without rewriting bench/RESULTS.md
 *   rdtbench compare              the C side of bench/python_bench.py
 *
 * The parent fetches; a child process (this program, exec'd again with the
 * hidden "source" mode) owns the tensors and serves them. They talk over the
 * child's stdin and stdout with one-line commands; refs travel as hex. */
#define _GNU_SOURCE
#include <rdt.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)
#define MAX_REFS 256

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "rdtbench: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

static void check(rdt_status st, const char *what) {
  if (st != RDT_OK)
    die("%s: %s: %s", what, rdt_status_string(st), rdt_last_error());
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Buffers come from mmap so that large ones are page-aligned and freed
 * back to the kernel at once. */
/* Buffers of 4 MiB and more are advised for transparent huge pages, as
 * numpy advises its large arrays: the C and Python measurements then move
 * the same kind of memory, and so do the baselines. */
static void *map(size_t n) {
  void *p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap %zu bytes: %s", n, strerror(errno));
  if (n >= 4 * 1024 * 1024) madvise(p, n, MADV_HUGEPAGE); /* advice only */
  return p;
}

/* The pattern is a function of the offset and a seed, so either side can
 * produce or check it without sharing the bytes. */
static void fill(void *p, size_t n, uint64_t seed) {
  uint64_t *w = p;
  for (size_t i = 0; i < n / 8; i++) w[i] = (i * 0x9E3779B97F4A7C15ull) ^ seed;
  for (size_t i = n / 8 * 8; i < n; i++) ((uint8_t *)p)[i] = (uint8_t)(i ^ seed);
}

static int verify(const void *p, size_t n, uint64_t seed) {
  const uint64_t *w = p;
  for (size_t i = 0; i < n / 8; i++)
    if (w[i] != ((i * 0x9E3779B97F4A7C15ull) ^ seed)) return 0;
  for (size_t i = n / 8 * 8; i < n; i++)
    if (((const uint8_t *)p)[i] != (uint8_t)(i ^ seed)) return 0;
  return 1;
}

static rdt_tensor byte_tensor(void *data, int64_t *shape) {
  rdt_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = RDT_DEVICE_CPU;
  t.ndim = 1;
  t.dtype.code = RDT_DTYPE_UINT;
  t.dtype.bits = 8;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

static char *to_hex(const uint8_t *b, size_t n) {
  char *s = malloc(2 * n + 1);
  for (size_t i = 0; i < n; i++) sprintf(s + 2 * i, "%02x", b[i]);
  s[2 * n] = 0;
  return s;
}

static size_t from_hex(const char *s, uint8_t *out, size_t cap) {
  size_t n = 0;
  while (s[0] && s[1] && n < cap) {
    unsigned v;
    if (sscanf(s, "%2x", &v) != 1) break;
    out[n++] = (uint8_t)v;
    s += 2;
  }
  return n;
}

/* ------------------------------------------------------------------------ */
/* The source process                                                       */
/* ------------------------------------------------------------------------ */

/* The resharding shape: a state dict of SD_MATRICES float32 matrices of
 * SD_ROWS x SD_COLS (4 MiB each, 1 GiB in all) and SD_VECTORS float32
 * vectors of SD_COLS (biases and norms), one buffer, tensor after tensor. */
enum { SD_MATRICES = 256, SD_VECTORS = 32, SD_TENSORS = SD_MATRICES + SD_VECTORS, SD_ROWS = 1024,
       SD_COLS = 1024 };
#define SD_MATRIX_BYTES ((uint64_t)SD_ROWS * SD_COLS * 4)
#define SD_VECTOR_BYTES ((uint64_t)SD_COLS * 4)
#define SD_BYTES (SD_MATRICES * SD_MATRIX_BYTES + SD_VECTORS * SD_VECTOR_BYTES)

static uint64_t sd_offset(int i) {
  return i < SD_MATRICES ? (uint64_t)i * SD_MATRIX_BYTES
                         : SD_MATRICES * SD_MATRIX_BYTES + (uint64_t)(i - SD_MATRICES) * SD_VECTOR_BYTES;
}

struct held {
  rdt_ref *ref;
  void *data;      /* ntensors tensors of size bytes, one after another */
  size_t size;
  size_t ntensors;
};

/* Commands, one per line on stdin:
 *   put <transport|auto> <bytes> <count> <seed>  -> refs <hex> ...
 *   obj <transport|auto> <bytes> <count> <seed>  one object of count tensors
 *                                                (tensor i filled with seed+i)
 *                                                -> refs <hex>
 *   drop                                         -> dropped
 *   expose <transport|auto> <bytes>              a zeroed buffer others write
 *                                                into -> refs <hex>
 *   notices <n> <seed>  takes n notices of writes into the last exposed
 *                 buffer; all must be successes and it must hold the
 *                 pattern of seed -> notices ok | notices bad <why>
 *   raw <bytes>   a plain buffer for the baselines -> raw <pid> <addr>
 *   tcp           a plain TCP server for the baseline -> tcp <port>
 */
static void serve_tcp(int lfd);

static void print_ref(rdt_ref *ref) {
  void *bytes;
  size_t n;
  check(rdt_ref_serialize(ref, &bytes, &n), "serialize");
  char *hex = to_hex(bytes, n);
  printf("%s", hex);
  free(hex);
  rdt_bytes_free(bytes);
}

static int source_main(void) {
  rdt_runtime_options o;
  rdt_runtime_options_init(&o);
  o.name = "rdtbench-source";
  rdt_runtime *rt;
  check(rdt_runtime_create(&o, &rt), "runtime");
  static struct held held[MAX_REFS];
  size_t nheld = 0;
  char line[256];
  setvbuf(stdout, NULL, _IOLBF, 0);
  while (fgets(line, sizeof line, stdin)) {
    char transport[64];
    unsigned long long size, count, seed;
    if (sscanf(line, "put %63s %llu %llu %llu", transport, &size, &count,
               &seed) == 4) {
      if (nheld + count > MAX_REFS) die("source: too many objects");
      printf("refs");
      for (unsigned long long i = 0; i < count; i++) {
        struct held *h = &held[nheld++];
        h->size = size;
        h->ntensors = 1;
        h->data = map(size);
        fill(h->data, size, seed + i);
        int64_t shape[1] = {(int64_t)size};
        rdt_tensor t = byte_tensor(h->data, shape);
        check(rdt_put(rt, &t, 1, strcmp(transport, "auto") ? transport : NULL,
                      NULL, NULL, &h->ref),
              "put");
        printf(" ");
        print_ref(h->ref);
      }
      printf("\n");
    } else if (sscanf(line, "obj %63s %llu %llu %llu", transport, &size, &count, &seed) == 4) {
      if (nheld + 1 > MAX_REFS) die("source: too many objects");
      if (count == 0 || count > (1u << 20) || size > 64 * GiB / count) die("source: bad object shape");
      struct held *h = &held[nheld++];
      h->size = size;
      h->ntensors = count;
      h->data = map(size * count);
      int64_t shape[1] = {(int64_t)size};
      rdt_tensor *t = calloc(count, sizeof *t);
      for (unsigned long long i = 0; i < count; i++) {
        fill((char *)h->data + i * size, size, seed + i);
        t[i] = byte_tensor((char *)h->data + i * size, shape);
      }
      check(rdt_put(rt, t, count, strcmp(transport, "auto") ? transport : NULL, NULL, NULL, &h->ref),
            "put");
      free(t);
      printf("refs ");
      print_ref(h->ref);
      printf("\n");
    } else if (sscanf(line, "sd %63s %llu", transport, &seed) == 2) {
      /* The resharding shape (see state_dict below), one object. */
      if (nheld + 1 > MAX_REFS) die("source: too many objects");
      struct held *h = &held[nheld++];
      h->size = SD_BYTES;
      h->ntensors = 1; /* freed as one buffer: drop waits on its first tensor */
      h->data = map(SD_BYTES);
      fill(h->data, SD_BYTES, seed);
      rdt_tensor t[SD_TENSORS];
      int64_t mat[2] = {SD_ROWS, SD_COLS}, vec[1] = {SD_COLS};
      for (int i = 0; i < SD_TENSORS; i++) {
        t[i] = byte_tensor((char *)h->data + sd_offset(i), i < SD_MATRICES ? mat : vec);
        t[i].ndim = i < SD_MATRICES ? 2 : 1;
        t[i].dtype.code = RDT_DTYPE_FLOAT;
        t[i].dtype.bits = 32;
      }
      check(rdt_put(rt, t, SD_TENSORS, strcmp(transport, "auto") ? transport : NULL, NULL, NULL, &h->ref),
            "put");
      printf("refs ");
      print_ref(h->ref);
      printf("\n");
    } else if (sscanf(line, "expose %63s %llu", transport, &size) == 2) {
      if (nheld + 1 > MAX_REFS) die("source: too many objects");
      struct held *h = &held[nheld++];
      h->size = size;
      h->ntensors = 1;
      h->data = map(size);
      memset(h->data, 0, size);
      int64_t shape[1] = {(int64_t)size};
      rdt_tensor t = byte_tensor(h->data, shape);
      check(rdt_expose(rt, &t, 1, strcmp(transport, "auto") ? transport : NULL, NULL, NULL, &h->ref),
            "expose");
      printf("refs ");
      print_ref(h->ref);
      printf("\n");
    } else if (sscanf(line, "notices %llu %llu", &count, &seed) == 2) {
      if (nheld == 0) die("source: nothing exposed");
      struct held *h = &held[nheld - 1];
      const char *bad = NULL;
      for (unsigned long long i = 0; i < count && !bad; i++) {
        rdt_write_notice note;
        rdt_write_notice_init(&note);
        check(rdt_write_notice_wait(h->ref, 60000, &note), "write_notice_wait");
        if (note.status != RDT_OK) bad = "a write failed";
      }
      if (!bad && !verify(h->data, h->size, seed)) bad = "the buffer does not hold the last write";
      printf(bad ? "notices bad %s\n" : "notices ok\n", bad);
    } else if (strncmp(line, "drop", 4) == 0) {
      /* Release our handles, then wait for the receiver's borrows to go:
       * only then may the memory be reused. */
      for (size_t i = 0; i < nheld; i++) check(rdt_ref_release(held[i].ref), "release");
      for (size_t i = 0; i < nheld; i++) {
        for (size_t j = 0; j < held[i].ntensors; j++)
          check(rdt_wait_tensor_freed(rt, (char *)held[i].data + j * held[i].size, 30000),
                "wait_tensor_freed");
        size_t bytes = held[i].size * held[i].ntensors;
        munmap(held[i].data, bytes ? bytes : 1);
      }
      nheld = 0;
      printf("dropped\n");
    } else if (sscanf(line, "raw %llu", &size) == 1) {
      void *p = map(size);
      fill(p, size, 1);
      printf("raw %d %" PRIuPTR "\n", (int)getpid(), (uintptr_t)p);
    } else if (strncmp(line, "tcp", 3) == 0) {
      int lfd = socket(AF_INET, SOCK_STREAM, 0);
      struct sockaddr_in a = {.sin_family = AF_INET,
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
      socklen_t al = sizeof a;
      int one = 1;
      setsockopt(lfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      if (bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 1) ||
          getsockname(lfd, (struct sockaddr *)&a, &al))
        die("tcp listen: %s", strerror(errno));
      printf("tcp %d\n", ntohs(a.sin_port));
      serve_tcp(lfd);
    } else if (strncmp(line, "quit", 4) == 0) {
      break;
    }
  }
  check(rdt_runtime_destroy(rt), "destroy");
  return 0;
}

/* The raw TCP baseline: for every 8-byte length received, write that many
 * bytes from one buffer. The same request-then-stream shape as a pull. */
static void serve_tcp(int lfd) {
  if (fork() != 0) return; /* the child serves; the source keeps reading */
  int fd = accept(lfd, NULL, NULL);
  if (fd < 0) _exit(1);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  size_t cap = 64 * MiB;
  char *buf = map(cap);
  memset(buf, 7, cap);
  uint64_t want;
  while (recv(fd, &want, sizeof want, MSG_WAITALL) == sizeof want) {
    while (want > 0) {
      size_t n = want < cap ? want : cap;
      ssize_t w = send(fd, buf, n, 0);
      if (w <= 0) _exit(0);
      want -= (uint64_t)w;
    }
  }
  _exit(0);
}

/* ------------------------------------------------------------------------ */
/* The receiving side                                                       */
/* ------------------------------------------------------------------------ */

struct source {
  pid_t pid;
  FILE *to, *from;
};

static const char *self_path;

static struct source spawn_source(void) {
  int in[2], out[2];
  if (pipe(in) || pipe(out)) die("pipe: %s", strerror(errno));
  pid_t pid = fork();
  if (pid < 0) die("fork: %s", strerror(errno));
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[1]);
    close(out[0]);
    execl(self_path, self_path, "source", (char *)NULL);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  struct source s = {pid, fdopen(in[1], "w"), fdopen(out[0], "r")};
  setvbuf(s.to, NULL, _IOLBF, 0);
  return s;
}

static char *ask(struct source *s, const char *fmt, ...) {
  static char *line;
  static size_t cap;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(s->to, fmt, ap);
  va_end(ap);
  fflush(s->to);
  if (getline(&line, &cap, s->from) < 0) die("the source process stopped");
  return line;
}

static void stop_source(struct source *s) {
  fprintf(s->to, "quit\n");
  fclose(s->to);
  fclose(s->from);
  int st;
  waitpid(s->pid, &st, 0);
}

/* Deserializes the refs of a "refs <hex> ..." answer. */
static size_t take_refs(rdt_runtime *rt, char *line, int count, rdt_ref **refs) {
  if (strncmp(line, "refs ", 5) != 0) die("source said: %s", line);
  char *tok = strtok(line + 5, " \n");
  size_t n = 0;
  while (tok && n < (size_t)count) {
    /* A ref of thousands of tensors is hundreds of KiB. */
    size_t cap = strlen(tok) / 2 + 1;
    uint8_t *bytes = malloc(cap);
    size_t len = from_hex(tok, bytes, cap);
    check(rdt_ref_deserialize(rt, bytes, len, &refs[n]), "deserialize");
    free(bytes);
    n++;
    tok = strtok(NULL, " \n");
  }
  if (n != (size_t)count) die("source sent %zu refs, wanted %d", n, count);
  return n;
}

/* Puts `count` objects of `size` bytes in the source and deserializes them. */
static size_t put_remote(rdt_runtime *rt, struct source *s, const char *transport,
                         uint64_t size, int count, uint64_t seed, rdt_ref **refs) {
  return take_refs(rt, ask(s, "put %s %" PRIu64 " %d %" PRIu64 "\n", transport, size, count, seed),
                   count, refs);
}

/* The same, one object of `count` tensors of `size` bytes. */
static void put_remote_object(rdt_runtime *rt, struct source *s, const char *transport,
                              uint64_t size, uint64_t count, uint64_t seed, rdt_ref **ref) {
  take_refs(rt, ask(s, "obj %s %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", transport, size, count, seed),
            1, ref);
}

static void drop_remote(struct source *s, rdt_ref **refs, size_t n) {
  for (size_t i = 0; i < n; i++) check(rdt_ref_release(refs[i]), "release");
  char *line = ask(s, "drop\n");
  if (strncmp(line, "dropped", 7) != 0) die("source said: %s", line);
}

/* Fetches n refs of `size` bytes each into targets; returns seconds. */
static double get_timed(rdt_runtime *rt, rdt_ref **refs, size_t n, void **bufs,
                        uint64_t size, const char *override) {
  rdt_tensor t[MAX_REFS];
  int64_t shape[1] = {(int64_t)size};
  for (size_t i = 0; i < n; i++) t[i] = byte_tensor(bufs[i], shape);
  rdt_get_options fo;
  rdt_get_options_init(&fo);
  fo.transport = override;
  double t0 = now();
  rdt_status st = rdt_get(rt, refs, n, t, n, &fo, 120000);
  double dt = now() - t0;
  check(st, "get");
  return dt;
}

/* Fetches one object of `count` tensors of `size` bytes into one buffer,
 * tensor i at offset i * size, with one rdt_get; returns seconds. */
static double get_object_timed(rdt_runtime *rt, rdt_ref *ref, uint64_t count, char *buf,
                               uint64_t size) {
  rdt_tensor *t = calloc(count, sizeof *t);
  int64_t shape[1] = {(int64_t)size};
  for (uint64_t i = 0; i < count; i++) t[i] = byte_tensor(buf + i * size, shape);
  double t0 = now();
  rdt_status st = rdt_get(rt, &ref, 1, t, count, NULL, 120000);
  double dt = now() - t0;
  check(st, "get");
  free(t);
  return dt;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double percentile(double *v, int n, double p) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  int i = (int)(p * (n - 1) + 0.5);
  return v[i];
}

/* rdtbench row's RUNS argument, when given. */
static int iterations_override;

static int iterations_for(uint64_t size) {
  if (iterations_override) return iterations_override;
  if (size <= 64 * KiB) return 3000;
  if (size <= 4 * MiB) return 200;
  if (size <= 64 * MiB) return 20;
  return 5;
}

static int transport_available(rdt_runtime *rt, const char *name) {
  rdt_transport_info infos[32];
  for (int i = 0; i < 32; i++) rdt_transport_info_init(&infos[i]);
  size_t n = 0;
  check(rdt_transport_list(rt, infos, 32, &n), "transport_list");
  for (size_t i = 0; i < n && i < 32; i++)
    if (strcmp(infos[i].name, name) == 0) return 1;
  return 0;
}

/* Whether transport `name` writes into exposed objects. */
static int transport_writes(rdt_runtime *rt, const char *name) {
  rdt_transport_info infos[32];
  for (int i = 0; i < 32; i++) rdt_transport_info_init(&infos[i]);
  size_t n = 0;
  check(rdt_transport_list(rt, infos, 32, &n), "transport_list");
  for (size_t i = 0; i < n && i < 32; i++)
    if (strcmp(infos[i].name, name) == 0) return (infos[i].flags & RDT_TRANSPORT_WRITES) != 0;
  return 0;
}

static uint64_t transport_uses(rdt_runtime *rt, const char *name) {
  rdt_transport_info infos[32];
  for (int i = 0; i < 32; i++) rdt_transport_info_init(&infos[i]);
  size_t n = 0;
  check(rdt_transport_list(rt, infos, 32, &n), "transport_list");
  for (size_t i = 0; i < n && i < 32; i++)
    if (strcmp(infos[i].name, name) == 0) return infos[i].transfers_completed;
  return 0;
}

/* Each named transport's completed transfers so far, into uses. */
static void count_uses(rdt_runtime *rt, const char *const *names, int n, uint64_t *uses) {
  for (int j = 0; j < n; j++) uses[j] = transport_uses(rt, names[j]);
}

/* Which of the named transports completed a transfer since before, or "?". */
static const char *moved_by(rdt_runtime *rt, const char *const *names, int n, const uint64_t *before) {
  const char *by = "?";
  for (int j = 0; j < n; j++)
    if (transport_uses(rt, names[j]) > before[j]) by = names[j];
  return by;
}

static const char *human(uint64_t n) {
  static char buf[4][32];
  static int k;
  char *b = buf[k++ & 3];
  if (n >= GiB && n % GiB == 0) snprintf(b, 32, "%" PRIu64 " GiB", n / GiB);
  else if (n >= MiB && n % MiB == 0) snprintf(b, 32, "%" PRIu64 " MiB", n / MiB);
  else if (n >= KiB && n % KiB == 0) snprintf(b, 32, "%" PRIu64 " KiB", n / KiB);
  else snprintf(b, 32, "%" PRIu64 " B", n);
  return b;
}

static rdt_runtime *receiver_runtime(void) {
  rdt_runtime_options o;
  rdt_runtime_options_init(&o);
  o.name = "rdtbench";
  rdt_runtime *rt;
  check(rdt_runtime_create(&o, &rt), "runtime");
  return rt;
}

/* The host transports, nixl's DRAM path included where NIXL is installed. */
static const char *const host_transports[] = {"cma", "shm", "tcp", "nixl"};
#define NUM_TRANSPORTS 4

/* ------------------------------------------------------------------------ */
/* bench                                                                    */
/* ------------------------------------------------------------------------ */

static FILE *report;

static void out(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fflush(stdout);
  if (report) {
    va_start(ap, fmt);
    vfprintf(report, fmt, ap);
    va_end(ap);
  }
}

/* Baselines report their best run: the machine's limit, so that the
 * transports' ratios (taken at their median) err on the low side. */
static double best(const double *t, int n) {
  double m = t[0];
  for (int i = 1; i < n; i++) m = t[i] < m ? t[i] : m;
  return m;
}

static double baseline_memcpy(uint64_t size) {
  char *a = map(size), *b = map(size);
  memset(a, 1, size);
  memset(b, 2, size);
  double times[20];
  int n = size >= GiB ? 5 : 20;
  for (int i = 0; i < n; i++) {
    double t0 = now();
    memcpy(b, a, size);
    times[i] = now() - t0;
  }
  double m = best(times, n);
  munmap(a, size);
  munmap(b, size);
  return (double)size / m / 1e9;
}

/* One thread reads another process's buffer with process_vm_readv (or
 * writes it with process_vm_writev): what a hand-written cross-memory copy
 * achieves. The best of 256 KiB, 1 MiB and 4 MiB calls. */
static double baseline_vm(struct source *s, uint64_t size, int write) {
  char *line = ask(s, "raw %" PRIu64 "\n", size);
  int pid;
  uintptr_t addr;
  if (sscanf(line, "raw %d %" SCNuPTR, &pid, &addr) != 2) die("source said: %s", line);
  char *local = map(size);
  memset(local, 3, size);
  int n = iterations_for(size);
  double *t = calloc((size_t)n, sizeof *t);
  const size_t chunks[] = {256 * KiB, 1 * MiB, 4 * MiB};
  double m = 1e30;
  for (int c = 0; c < 3; c++) {
    for (int i = 0; i < n; i++) {
      double t0 = now();
      for (uint64_t off = 0; off < size;) {
        size_t len = size - off < chunks[c] ? size - off : chunks[c];
        struct iovec l = {local + off, len}, r = {(void *)(addr + off), len};
        ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (got <= 0) die("%s: %s", write ? "process_vm_writev" : "process_vm_readv", strerror(errno));
        off += (uint64_t)got;
      }
      t[i] = now() - t0;
    }
    double b = best(t, n);
    m = b < m ? b : m;
  }
  free(t);
  munmap(local, size);
  return (double)size / m / 1e9;
}

static int raw_tcp_fd = -1;

static double baseline_tcp(struct source *s, uint64_t size) {
  if (raw_tcp_fd < 0) {
    char *line = ask(s, "tcp\n");
    int port;
    if (sscanf(line, "tcp %d", &port) != 1) die("source said: %s", line);
    raw_tcp_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(raw_tcp_fd, (struct sockaddr *)&a, sizeof a)) die("connect: %s", strerror(errno));
    int one = 1;
    setsockopt(raw_tcp_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  char *dst = map(size);
  memset(dst, 0, size);
  int n = iterations_for(size);
  double *t = calloc((size_t)n, sizeof *t);
  for (int i = 0; i < n; i++) {
    double t0 = now();
    uint64_t want = size;
    if (send(raw_tcp_fd, &want, sizeof want, 0) != sizeof want) die("send: %s", strerror(errno));
    for (uint64_t off = 0; off < size;) {
      ssize_t r = recv(raw_tcp_fd, dst + off, size - off, 0);
      if (r <= 0) die("recv: %s", strerror(errno));
      off += (uint64_t)r;
    }
    t[i] = now() - t0;
  }
  double m = best(t, n);
  free(t);
  munmap(dst, size);
  return (double)size / m / 1e9;
}

/* The round trip a small pull cannot beat: a 24-byte request and a 4 KiB
 * answer between two processes that wait in blocking reads, over a Unix
 * socket pair and over the raw loopback TCP connection. Medians, as for
 * the transports' small-message latency. */
static void baseline_round_trips(struct source *s, double *unix_us, double *tcp_us) {
  enum { request = 24, answer = 4096 + 24, rounds = 3000 };
  static char buf[answer];
  double *t = calloc(rounds, sizeof *t);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) die("socketpair: %s", strerror(errno));
  pid_t pid = fork();
  if (pid < 0) die("fork: %s", strerror(errno));
  if (pid == 0) {
    close(sv[0]);
    char r[request];
    while (recv(sv[1], r, request, MSG_WAITALL) == request)
      if (send(sv[1], buf, answer, 0) != answer) break;
    _exit(0);
  }
  close(sv[1]);
  for (int i = 0; i < rounds; i++) {
    double t0 = now();
    if (send(sv[0], buf, request, 0) != request) die("send: %s", strerror(errno));
    if (recv(sv[0], buf, answer, MSG_WAITALL) != answer) die("recv: %s", strerror(errno));
    t[i] = now() - t0;
  }
  close(sv[0]);
  waitpid(pid, NULL, 0);
  *unix_us = percentile(t, rounds, 0.5) * 1e6;
  baseline_tcp(s, 4 * KiB); /* connects */
  for (int i = 0; i < rounds; i++) {
    double t0 = now();
    uint64_t want = 4 * KiB;
    if (send(raw_tcp_fd, &want, sizeof want, 0) != sizeof want) die("send: %s", strerror(errno));
    if (recv(raw_tcp_fd, buf, 4 * KiB, MSG_WAITALL) != 4 * KiB) die("recv: %s", strerror(errno));
    t[i] = now() - t0;
  }
  *tcp_us = percentile(t, rounds, 0.5) * 1e6;
  free(t);
}

static double baseline_pickle(void) {
  const char *py = getenv("PYTHON");
  char cmd[512];
  snprintf(cmd, sizeof cmd, "%s bench/pickle_pipe.py", py && *py ? py : "python3");
  FILE *p = popen(cmd, "r");
  double v = 0;
  if (!p || fscanf(p, "%lf", &v) != 1) v = 0;
  if (p) pclose(p);
  return v;
}

struct result {
  double gbps;
  double p50_us, p99_us;
};

static struct result measure(rdt_runtime *rt, struct source *s, const char *transport,
                             uint64_t size) {
  rdt_ref *ref;
  put_remote(rt, s, transport, size, 1, 9, &ref);
  void *buf = map(size);
  memset(buf, 0, size);
  /* The first fetch also checks the bytes; it is not timed. */
  get_timed(rt, &ref, 1, &buf, size, NULL);
  if (!verify(buf, size, 9)) die("%s %s: the bytes arrived corrupted", transport, human(size));
  int n = iterations_for(size);
  double *t = calloc((size_t)n, sizeof *t);
  for (int i = 0; i < n; i++) t[i] = get_timed(rt, &ref, 1, &buf, size, NULL);
  struct result r;
  r.p50_us = percentile(t, n, 0.5) * 1e6;
  r.p99_us = percentile(t, n, 0.99) * 1e6;
  r.gbps = (double)size / (r.p50_us * 1e-6) / 1e9;
  free(t);
  munmap(buf, size);
  drop_remote(s, &ref, 1);
  return r;
}

/* Writes of `size` bytes into a buffer the source exposed, with rdt_write
 * (which returns once every byte landed); the first is checked at the
 * source, the rest timed, and every notice is taken there and checked. */
static struct result measure_write(rdt_runtime *rt, struct source *s, const char *transport,
                                   uint64_t size) {
  rdt_ref *ref;
  take_refs(rt, ask(s, "expose %s %" PRIu64 "\n", transport, size), 1, &ref);
  void *buf = map(size);
  fill(buf, size, 11);
  int64_t shape[1] = {(int64_t)size};
  rdt_tensor t = byte_tensor(buf, shape);
  rdt_write_options wo;
  rdt_write_options_init(&wo);
  wo.transport = strcmp(transport, "auto") ? transport : NULL;
  check(rdt_write(rt, &ref, 1, &t, 1, &wo, 120000), "write");
  char *line = ask(s, "notices 1 11\n");
  if (strncmp(line, "notices ok", 10) != 0) die("%s write of %s: %s", transport, human(size), line);
  int n = iterations_for(size);
  double *times = calloc((size_t)n, sizeof *times);
  for (int i = 0; i < n; i++) {
    wo.tag = (uint64_t)i + 2;
    double t0 = now();
    rdt_status st = rdt_write(rt, &ref, 1, &t, 1, &wo, 120000);
    times[i] = now() - t0;
    check(st, "write");
  }
  line = ask(s, "notices %d 11\n", n);
  if (strncmp(line, "notices ok", 10) != 0) die("%s writes of %s: %s", transport, human(size), line);
  struct result r;
  r.p50_us = percentile(times, n, 0.5) * 1e6;
  r.p99_us = percentile(times, n, 0.99) * 1e6;
  r.gbps = (double)size / (r.p50_us * 1e-6) / 1e9;
  free(times);
  munmap(buf, size);
  drop_remote(s, &ref, 1);
  return r;
}

/* Prepared transfers of `size` bytes: a fetch of a put object (write 0) or
 * a write into an exposed one (write 1), prepared once and run again and
 * again; the first run checks the bytes and is not timed, and for writes
 * the source takes and checks every notice. */
static struct result measure_prepared(rdt_runtime *rt, struct source *s, const char *transport,
                                      uint64_t size, int write) {
  rdt_ref *ref;
  if (write)
    take_refs(rt, ask(s, "expose %s %" PRIu64 "\n", transport, size), 1, &ref);
  else
    put_remote(rt, s, transport, size, 1, 9, &ref);
  void *buf = map(size);
  if (write)
    fill(buf, size, 11);
  else
    memset(buf, 0, size);
  int64_t shape[1] = {(int64_t)size};
  rdt_tensor t = byte_tensor(buf, shape);
  rdt_prepared *p = NULL;
  if (write) {
    rdt_write_options wo;
    rdt_write_options_init(&wo);
    wo.transport = strcmp(transport, "auto") ? transport : NULL;
    check(rdt_prepare_write(rt, &ref, 1, &t, 1, &wo, &p), "write_prepare");
  } else {
    check(rdt_prepare_get(rt, &ref, 1, &t, 1, NULL, &p), "fetch_prepare");
  }
  check(rdt_prepared_run(p, 1, 120000), "prepared_run");
  if (write) {
    char *line = ask(s, "notices 1 11\n");
    if (strncmp(line, "notices ok", 10) != 0) die("%s prepared write of %s: %s", transport, human(size), line);
  } else if (!verify(buf, size, 9)) {
    die("%s prepared %s: the bytes arrived corrupted", transport, human(size));
  }
  int n = iterations_for(size);
  double *times = calloc((size_t)n, sizeof *times);
  for (int i = 0; i < n; i++) {
    double t0 = now();
    rdt_status st = rdt_prepared_run(p, (uint64_t)i + 2, 120000);
    times[i] = now() - t0;
    check(st, "prepared_run");
  }
  if (write) {
    char *line = ask(s, "notices %d 11\n", n);
    if (strncmp(line, "notices ok", 10) != 0) die("%s prepared writes of %s: %s", transport, human(size), line);
  }
  struct result r;
  r.p50_us = percentile(times, n, 0.5) * 1e6;
  r.p99_us = percentile(times, n, 0.99) * 1e6;
  r.gbps = (double)size / (r.p50_us * 1e-6) / 1e9;
  free(times);
  check(rdt_prepared_free(p), "prepared_free");
  munmap(buf, size);
  drop_remote(s, &ref, 1);
  return r;
}

/* One fetch of 16 refs against one ref of the same total bytes. */
static void measure_batch(rdt_runtime *rt, struct source *s, const char *transport,
                          double *t_many, double *t_one) {
  const uint64_t total = 64 * MiB, part = total / 16;
  rdt_ref *refs[16], *one;
  put_remote(rt, s, transport, part, 16, 30, refs);
  put_remote(rt, s, transport, total, 1, 50, &one);
  void *bufs[16];
  char *big = map(total);
  memset(big, 0, total);
  for (int i = 0; i < 16; i++) bufs[i] = big + (uint64_t)i * part;
  void *bigp = big;
  const int n = 20;
  double a[20], b[20];
  get_timed(rt, refs, 16, bufs, part, NULL);
  for (int i = 0; i < 16; i++)
    if (!verify(bufs[i], part, 30 + (uint64_t)i)) die("batch: corrupt bytes");
  get_timed(rt, &one, 1, &bigp, total, NULL);
  for (int i = 0; i < n; i++) {
    a[i] = get_timed(rt, refs, 16, bufs, part, NULL);
    b[i] = get_timed(rt, &one, 1, &bigp, total, NULL);
  }
  *t_many = percentile(a, n, 0.5);
  *t_one = percentile(b, n, 0.5);
  munmap(big, total);
  /* The source drops all 17 objects at once: release every borrow first. */
  check(rdt_ref_release(one), "release");
  drop_remote(s, refs, 16);
}

static double run_timed(rdt_prepared *p, uint64_t tag) {
  double t0 = now();
  check(rdt_prepared_run(p, tag, 120000), "prepared_run");
  return now() - t0;
}

/* measure_object's gets again as prepared gets, which do the per-tensor
 * work once (a and b: `runs` doubles each for the times). */
static void measure_object_prepared(rdt_runtime *rt, const char *transport, rdt_ref *many, rdt_ref *one,
                                    char *buf, uint64_t part, uint64_t count, int runs, double *a, double *b,
                                    double *t_pmany, double *t_pone) {
  const uint64_t total = part * count;
  rdt_tensor *t = calloc(count, sizeof *t);
  int64_t part_shape[1] = {(int64_t)part}, total_shape[1] = {(int64_t)total};
  for (uint64_t i = 0; i < count; i++) t[i] = byte_tensor(buf + i * part, part_shape);
  rdt_tensor whole = byte_tensor(buf, total_shape);
  rdt_prepared *pmany, *pone;
  check(rdt_prepare_get(rt, &many, 1, t, count, NULL, &pmany), "fetch_prepare");
  check(rdt_prepare_get(rt, &one, 1, &whole, 1, NULL, &pone), "fetch_prepare");
  memset(buf, 0, total);
  run_timed(pmany, 1);
  for (uint64_t i = 0; i < count; i++)
    if (!verify(buf + i * part, part, 70 + i))
      die("%s %" PRIu64 " x %s prepared: the bytes arrived corrupted", transport, count, human(part));
  run_timed(pone, 1);
  for (int i = 0; i < runs; i++) {
    a[i] = run_timed(pmany, (uint64_t)i + 2);
    b[i] = run_timed(pone, (uint64_t)i + 2);
  }
  *t_pmany = percentile(a, runs, 0.5);
  *t_pone = percentile(b, runs, 0.5);
  check(rdt_prepared_free(pmany), "prepared_free");
  check(rdt_prepared_free(pone), "prepared_free");
  free(t);
}

/* One object of `count` tensors of `part` bytes against one tensor of the
 * same total bytes, one get each, interleaved; medians in seconds. With
 * t_pmany, also both as prepared gets (t_pmany, t_pone). */
static void measure_object(rdt_runtime *rt, struct source *s, const char *transport, uint64_t part,
                           uint64_t count, int runs, double *t_many, double *t_one, double *t_pmany,
                           double *t_pone) {
  const uint64_t total = part * count;
  rdt_ref *many, *one;
  put_remote_object(rt, s, transport, part, count, 70, &many);
  put_remote(rt, s, transport, total, 1, 60, &one);
  char *buf = map(total);
  memset(buf, 0, total);
  void *bufp = buf;
  /* The first fetch of each also checks the bytes; it is not timed. */
  get_object_timed(rt, many, count, buf, part);
  for (uint64_t i = 0; i < count; i++)
    if (!verify(buf + i * part, part, 70 + i))
      die("%s %" PRIu64 " x %s: the bytes arrived corrupted", transport, count, human(part));
  get_timed(rt, &one, 1, &bufp, total, NULL);
  if (!verify(buf, total, 60)) die("%s %s: the bytes arrived corrupted", transport, human(total));
  double *a = calloc((size_t)runs, sizeof *a), *b = calloc((size_t)runs, sizeof *b);
  for (int i = 0; i < runs; i++) {
    a[i] = get_object_timed(rt, many, count, buf, part);
    b[i] = get_timed(rt, &one, 1, &bufp, total, NULL);
  }
  *t_many = percentile(a, runs, 0.5);
  *t_one = percentile(b, runs, 0.5);
  if (t_pmany) measure_object_prepared(rt, transport, many, one, buf, part, count, runs, a, b, t_pmany, t_pone);
  free(a);
  free(b);
  munmap(buf, total);
  check(rdt_ref_release(one), "release");
  drop_remote(s, &many, 1);
}

/* The two shapes of many tensors in one object the bench measures: KV-cache
 * blocks by the thousand, small and mid-sized. */
static const struct {
  uint64_t count, part;
  int runs;
} object_shapes[] = {{1024, 4 * KiB, 40}, {4096, 64 * KiB, 5}};
#define NUM_OBJECT_SHAPES 2

static void machine_description(void) {
  struct utsname u;
  uname(&u);
  char model[256] = "unknown CPU";
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[512];
  while (f && fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) == 0) {
      char *c = strchr(line, ':');
      if (c) snprintf(model, sizeof model, "%s", c + 2);
      model[strcspn(model, "\n")] = 0;
      break;
    }
  }
  if (f) fclose(f);
  long mem_kb = 0;
  f = fopen("/proc/meminfo", "r");
  if (f) {
    if (fscanf(f, "MemTotal: %ld kB", &mem_kb) != 1) mem_kb = 0;
    fclose(f);
  }
  time_t t = time(NULL);
  char date[64];
  strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&t));
  out("Machine: %s, %ld cores, %.1f GiB, Linux %s (%s). rdt %s, %s.\n\n", model,
      sysconf(_SC_NPROCESSORS_ONLN), (double)mem_kb / (1024.0 * 1024.0), u.release, u.machine,
      rdt_version(), date);
}

/* One receiver of the resharding shape: rank `rank` of `ranks` takes its
 * rows of every matrix and every vector whole (ranks 1: the whole object),
 * into one buffer of its own. */
struct shard {
  rdt_runtime *rt;
  rdt_ref *ref;
  int rank, ranks;
  char *buf;
  double seconds;
  uint64_t bytes; /* what its runtime received, from its statistics */
};

static uint64_t bytes_received(rdt_runtime *rt) {
  rdt_stats st;
  rdt_stats_init(&st);
  check(rdt_runtime_stats(rt, &st), "stats");
  return st.bytes_received;
}

static uint64_t shard_bytes(int ranks) {
  return SD_MATRICES * (SD_MATRIX_BYTES / ranks) + SD_VECTORS * SD_VECTOR_BYTES;
}

static void *pull_shard(void *arg) {
  struct shard *sh = arg;
  rdt_range src[SD_TENSORS];
  rdt_tensor t[SD_TENSORS];
  int64_t shape[SD_TENSORS][1];
  const uint64_t rows = SD_ROWS / sh->ranks, part = rows * SD_COLS * 4;
  uint64_t off = 0;
  for (int i = 0; i < SD_TENSORS; i++) {
    uint64_t n = i < SD_MATRICES ? part : SD_VECTOR_BYTES;
    src[i] = (rdt_range){0, (uint32_t)i, i < SD_MATRICES ? sh->rank * part : 0, n};
    shape[i][0] = (int64_t)(n / 4);
    t[i] = byte_tensor(sh->buf + off, shape[i]);
    t[i].dtype.code = RDT_DTYPE_FLOAT;
    t[i].dtype.bits = 32;
    off += n;
  }
  rdt_get_options fo;
  rdt_get_options_init(&fo);
  fo.sources = src;
  fo.num_sources = SD_TENSORS;
  uint64_t before = bytes_received(sh->rt);
  double t0 = now();
  check(rdt_get(sh->rt, &sh->ref, 1, t, SD_TENSORS, &fo, 120000), "get (shard)");
  sh->seconds = now() - t0;
  sh->bytes = bytes_received(sh->rt) - before;
  return NULL;
}

/* The resharding row: one receiver pulling the whole state dict against two
 * receivers (runtimes of their own, pulling at once) each pulling half the
 * rows of every matrix. Medians of interleaved runs: the whole pull, and
 * the time until both halves are in. */
static void measure_reshard(struct source *s, const char *transport, int runs, double *t_whole,
                            double *t_halves, uint64_t *half_bytes) {
  rdt_runtime *rts[3] = {receiver_runtime(), receiver_runtime(), receiver_runtime()};
  struct shard sh[3];
  char *line = ask(s, "sd %s 80\n", transport);
  for (int i = 0; i < 3; i++) {
    sh[i] = (struct shard){.rt = rts[i], .rank = i == 0 ? 0 : i - 1, .ranks = i == 0 ? 1 : 2,
                           .buf = map(shard_bytes(i == 0 ? 1 : 2))};
    char *copy = strdup(line);
    take_refs(rts[i], copy, 1, &sh[i].ref);
    free(copy);
  }
  double *a = calloc((size_t)runs + 1, sizeof *a), *b = calloc((size_t)runs + 1, sizeof *b);
  for (int r = 0; r <= runs; r++) { /* run 0 warms up, unmeasured */
    pull_shard(&sh[0]);
    pthread_t th[2];
    double t0 = now();
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, pull_shard, &sh[1 + i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    if (r > 0) {
      a[r - 1] = sh[0].seconds;
      b[r - 1] = now() - t0;
    }
  }
  *t_whole = percentile(a, runs, 0.5);
  *t_halves = percentile(b, runs, 0.5);
  half_bytes[0] = sh[1].bytes;
  half_bytes[1] = sh[2].bytes;
  if (sh[0].bytes != shard_bytes(1) || sh[1].bytes != shard_bytes(2) || sh[2].bytes != shard_bytes(2))
    die("resharding over %s: the receivers moved %" PRIu64 ", %" PRIu64 " and %" PRIu64 " bytes", transport,
        sh[0].bytes, sh[1].bytes, sh[2].bytes);
  free(a);
  free(b);
  for (int i = 0; i < 3; i++) {
    check(rdt_ref_release(sh[i].ref), "release");
    munmap(sh[i].buf, shard_bytes(i == 0 ? 1 : 2));
  }
  line = ask(s, "drop\n");
  if (strncmp(line, "dropped", 7) != 0) die("source said: %s", line);
  for (int i = 0; i < 3; i++) check(rdt_runtime_destroy(rts[i]), "destroy");
}

/* Views of one GiB: one object of `count` tensors of 1 GiB / count bytes
 * (rounded down to 64 bytes) against one tensor of the same bytes. */
static const struct {
  uint64_t count;
  int runs;
} view_counts[] = {{1000, 3}, {10000, 3}, {100000, 3}};
#define NUM_VIEW_COUNTS 3

static int bench_main(const char *path) {
  report = path ? fopen(path, "w") : NULL;
  if (path && !report) die("cannot write %s: %s", path, strerror(errno));
  out("# rdt benchmark results\n\nWritten by `make bench`. Source and receiver are separate "
      "processes; the receiver fetches into buffers it has touched before (as a real "
      "consumer reusing its buffers does). Throughput is bytes over the median time of one "
      "whole `rdt_get` through the C ABI; baselines report their best run (the machine's limit), "
      "so ratios err low. The pickle baseline is end to end: the producer pickles and writes, the "
      "consumer reads and unpickles. Buffers of 4 MiB and more, on both sides and in the "
      "baselines, are advised for transparent huge pages (as numpy does for its large arrays).\n\n");
  machine_description();
  rdt_runtime *rt = receiver_runtime();
  struct source s = spawn_source();

  const uint64_t sizes[] = {4 * KiB, 1 * MiB, 64 * MiB, 1 * GiB};
  double mc[4], vm[4], tcp[4], vmw[4];
  for (int i = 0; i < 4; i++) {
    mc[i] = baseline_memcpy(sizes[i] < MiB ? MiB : sizes[i]);
    vm[i] = baseline_vm(&s, sizes[i], 0);
    vmw[i] = baseline_vm(&s, sizes[i], 1);
    tcp[i] = baseline_tcp(&s, sizes[i]);
  }
  double pickle = baseline_pickle();
  double unix_rtt, tcp_rtt;
  baseline_round_trips(&s, &unix_rtt, &tcp_rtt);
  out("## Baselines, measured in this run (GB/s)\n\n");
  out("| size | memcpy (1 core) | raw process_vm_readv | raw process_vm_writev | raw loopback TCP |\n"
      "|---|---|---|---|---|\n");
  for (int i = 0; i < 4; i++)
    out("| %s | %.2f | %.2f | %.2f | %.2f |\n", human(sizes[i]), mc[i], vm[i], vmw[i], tcp[i]);
  out("\nPickle of 64 MiB over a `multiprocessing` pipe (spawn): %.2f GB/s%s\n\n", pickle,
      pickle > 0 ? "" : " (python3 not available)");
  out("Round trip of a 24-byte request and a 4 KiB answer between two processes waiting in "
      "blocking reads (p50): %.1f µs over a Unix socket pair, %.1f µs over loopback TCP. A small "
      "pull that does not busy-wait cannot beat these.\n\n",
      unix_rtt, tcp_rtt);

  out("## Transports (GB/s; ratio to the baseline that bounds it)\n\n");
  out("| transport | 4 KiB p50 | 4 KiB p99 | 4 KiB | 1 MiB | 64 MiB | 1 GiB |\n"
      "|---|---|---|---|---|---|---|\n");
  double gb64[NUM_TRANSPORTS] = {0}, gb1g[NUM_TRANSPORTS] = {0}, p50[NUM_TRANSPORTS] = {0};
  for (int k = 0; k < NUM_TRANSPORTS; k++) {
    const char *name = host_transports[k];
    if (!transport_available(rt, name)) {
      out("| %s | not available | | | | | |\n", name);
      continue;
    }
    struct result r[4];
    for (int i = 0; i < 4; i++) r[i] = measure(rt, &s, name, sizes[i]);
    gb64[k] = r[2].gbps;
    gb1g[k] = r[3].gbps;
    p50[k] = r[0].p50_us;
    const double *limit = k == 1 ? mc : k == 2 ? tcp : vm;
    out("| %s | %.1f µs | %.1f µs | %.2f | %.2f (%.2fx) | %.2f (%.2fx) | %.2f (%.2fx) |\n", name,
        r[0].p50_us, r[0].p99_us, r[0].gbps, r[1].gbps, r[1].gbps / limit[1], r[2].gbps,
        r[2].gbps / limit[2], r[3].gbps, r[3].gbps / limit[3]);
  }
  out("\nRatios: cma and nixl (UCX over shared memory) against raw process_vm_readv, shm "
      "against memcpy, tcp against raw loopback TCP, each at the same size.\n\n");

  out("## 16 refs in one fetch against one ref of the same 64 MiB\n\n");
  out("| transport | 16 × 4 MiB | 1 × 64 MiB | ratio |\n|---|---|---|---|\n");
  double batch_ratio[NUM_TRANSPORTS] = {0};
  for (int k = 0; k < NUM_TRANSPORTS; k++) {
    if (!transport_available(rt, host_transports[k])) continue;
    double many, one;
    measure_batch(rt, &s, host_transports[k], &many, &one);
    batch_ratio[k] = many / one;
    out("| %s | %.2f ms | %.2f ms | %.2f |\n", host_transports[k], many * 1e3, one * 1e3,
        batch_ratio[k]);
  }

  out("\n## Many tensors in one object against one tensor of the same bytes\n\n");
  out("| transport | 1,024 × 4 KiB | 1 × 4 MiB | ratio | prepared ratio | 4,096 × 64 KiB | 1 × 256 MiB | ratio "
      "| prepared ratio |\n|---|---|---|---|---|---|---|---|---|\n");
  double object_ratio[NUM_TRANSPORTS][NUM_OBJECT_SHAPES] = {{0}};
  for (int k = 0; k < NUM_TRANSPORTS; k++) {
    if (!transport_available(rt, host_transports[k])) continue;
    out("| %s", host_transports[k]);
    for (int j = 0; j < NUM_OBJECT_SHAPES; j++) {
      double many, one, pmany, pone;
      measure_object(rt, &s, host_transports[k], object_shapes[j].part, object_shapes[j].count,
                     object_shapes[j].runs, &many, &one, &pmany, &pone);
      object_ratio[k][j] = many / one;
      out(" | %.2f ms | %.2f ms | %.2f | %.2f", many * 1e3, one * 1e3, object_ratio[k][j], pmany / pone);
    }
    out(" |\n");
  }
  out("\nOne `rdt_get` of the object (one ref, one target per tensor, all in one buffer) against "
      "one `rdt_get` of one tensor of the same bytes; medians of interleaved runs. Prepared ratio: the "
      "same two as runs of prepared gets (`rdt_prepare_get`), which check and describe the targets "
      "once.\n");

  out("\n## Views of 1 GiB: one object of N tensors against one tensor of the same bytes\n\n");
  out("| transport | 1 tensor | 1,000 views | 10,000 views | 100,000 views |\n|---|---|---|---|---|\n");
  double view_ratio[NUM_TRANSPORTS][NUM_VIEW_COUNTS] = {{0}};
  for (int k = 0; k < 3; k++) {
    if (!transport_available(rt, host_transports[k])) continue;
    double ones[NUM_VIEW_COUNTS], many[NUM_VIEW_COUNTS];
    for (int j = 0; j < NUM_VIEW_COUNTS; j++) {
      uint64_t part = GiB / view_counts[j].count / 64 * 64;
      measure_object(rt, &s, host_transports[k], part, view_counts[j].count, view_counts[j].runs, &many[j],
                     &ones[j], NULL, NULL);
      view_ratio[k][j] = many[j] / ones[j];
    }
    out("| %s | %.0f ms | %.2fx | %.2fx | %.2fx |\n", host_transports[k], ones[0] * 1e3, view_ratio[k][0],
        view_ratio[k][1], view_ratio[k][2]);
  }
  out("\nOne `rdt_get` of the object (one target per view, all in one buffer) against one "
      "`rdt_get` of one tensor of the same bytes, each ratio against the tensor measured beside it; "
      "medians of 3 interleaved runs. The same table through Python is in the Python section below.\n");

  out("\n## Resharding: two receivers each pulling half the rows of every matrix\n\n");
  out("A state dict of %d float32 matrices of %d x %d and %d vectors (%s in all). One receiver pulls it "
      "whole; two receivers (runtimes of their own, at once) each pull rows [r*%d, (r+1)*%d) of every "
      "matrix and every vector whole.\n\n",
      SD_MATRICES, SD_ROWS, SD_COLS, SD_VECTORS, human(SD_BYTES), SD_ROWS / 2, SD_ROWS / 2);
  out("| transport | one whole receiver | two half receivers | ratio | bytes each half moved |\n"
      "|---|---|---|---|---|\n");
  double reshard_ratio[NUM_TRANSPORTS] = {0};
  for (int k = 0; k < 3; k++) {
    if (!transport_available(rt, host_transports[k])) continue;
    double whole, halves;
    uint64_t hb[2];
    measure_reshard(&s, host_transports[k], 3, &whole, &halves, hb);
    reshard_ratio[k] = halves / whole;
    out("| %s | %.1f ms | %.1f ms | %.2f | %s, %s (%.3f of the object each) |\n", host_transports[k],
        whole * 1e3, halves * 1e3, reshard_ratio[k], human(hb[0]), human(hb[1]), (double)hb[0] / SD_BYTES);
  }

  out("\n## Writes into an exposed buffer against fetches of the same bytes, same run\n\n");
  out("The source process exposes a buffer (`rdt_expose`); this process writes into it with "
      "`rdt_write`, which returns once every byte landed, and the source takes and checks every "
      "notice. Ratios: to the same transport's fetch above, and to the raw copy in that direction "
      "(process_vm_writev for cma, memcpy for shm, loopback TCP for tcp).\n\n");
  out("| transport | 4 KiB p50 | 4 KiB p99 | 64 MiB | 1 GiB | 64 MiB / fetch | 1 GiB / fetch |\n"
      "|---|---|---|---|---|---|---|\n");
  double w64[NUM_TRANSPORTS] = {0}, w1g[NUM_TRANSPORTS] = {0};
  for (int k = 0; k < 3; k++) { /* cma, shm, tcp */
    const char *name = host_transports[k];
    if (!transport_available(rt, name) || !transport_writes(rt, name)) continue;
    struct result r4 = measure_write(rt, &s, name, 4 * KiB), r64 = measure_write(rt, &s, name, 64 * MiB),
                  r1g = measure_write(rt, &s, name, GiB);
    w64[k] = r64.gbps;
    w1g[k] = r1g.gbps;
    const double *limit = k == 1 ? mc : k == 2 ? tcp : vmw;
    out("| %s | %.1f µs | %.1f µs | %.2f (%.2fx raw) | %.2f (%.2fx raw) | %.2fx | %.2fx |\n", name, r4.p50_us,
        r4.p99_us, r64.gbps, r64.gbps / limit[2], r1g.gbps, r1g.gbps / limit[3], gb64[k] > 0 ? r64.gbps / gb64[k] : 0,
        gb1g[k] > 0 ? r1g.gbps / gb1g[k] : 0);
  }

  out("\n## Prepared transfers against ordinary ones, same run\n\n");
  out("`rdt_prepare_get` / `rdt_prepare_write` once, then `rdt_prepared_run` again and again, against "
      "`rdt_get` / `rdt_write` of the same 4 KiB (p50; for writes the source takes and checks every "
      "notice).\n\n");
  out("| transport | get | prepared get | ratio | write | prepared write | ratio |\n|---|---|---|---|---|---|---|\n");
  double prep_fetch[NUM_TRANSPORTS] = {0}, prep_write[NUM_TRANSPORTS] = {0};
  for (int k = 0; k < 3; k++) {
    const char *name = host_transports[k];
    if (!transport_available(rt, name)) continue;
    struct result f = measure(rt, &s, name, 4 * KiB), pf = measure_prepared(rt, &s, name, 4 * KiB, 0);
    prep_fetch[k] = pf.p50_us / f.p50_us;
    if (transport_writes(rt, name)) {
      struct result w = measure_write(rt, &s, name, 4 * KiB), pw = measure_prepared(rt, &s, name, 4 * KiB, 1);
      prep_write[k] = pw.p50_us / w.p50_us;
      out("| %s | %.1f µs | %.1f µs | %.2fx | %.1f µs | %.1f µs | %.2fx |\n", name, f.p50_us, pf.p50_us,
          prep_fetch[k], w.p50_us, pw.p50_us, prep_write[k]);
    } else {
      out("| %s | %.1f µs | %.1f µs | %.2fx | – | – | – |\n", name, f.p50_us, pf.p50_us, prep_fetch[k]);
    }
  }

  out("\n## Targets\n\n| target | measured | met |\n|---|---|---|\n");
#define TARGET(desc, value, ok) out("| %s | %s | %s |\n", desc, value, (ok) ? "yes" : "**no**")
  char v[128];
  snprintf(v, sizeof v, "%.2fx / %.2fx", gb64[0] / vm[2], gb1g[0] / vm[3]);
  TARGET("cma >= 0.85x raw process_vm_readv at 64 MiB and 1 GiB", v,
         gb64[0] >= 0.85 * vm[2] && gb1g[0] >= 0.85 * vm[3]);
  snprintf(v, sizeof v, "%.1fx", pickle > 0 ? gb64[0] / pickle : 0);
  TARGET("cma >= 5x pickle over a pipe (64 MiB)", v, pickle > 0 && gb64[0] >= 5 * pickle);
  snprintf(v, sizeof v, "%.2fx", gb64[2] / tcp[2]);
  TARGET("tcp >= 0.7x raw loopback TCP at 64 MiB", v, gb64[2] >= 0.7 * tcp[2]);
  snprintf(v, sizeof v, "%.2fx", gb64[1] / mc[2]);
  TARGET("shm >= 0.4x memcpy at 64 MiB", v, gb64[1] >= 0.4 * mc[2]);
  snprintf(v, sizeof v, "%.1f µs (cma)", p50[0]);
  TARGET("4 KiB fetch p50 <= 100 µs through the C ABI", v, p50[0] > 0 && p50[0] <= 100);
  snprintf(v, sizeof v, "%.1f µs (%.2fx the Unix-socket round trip)", p50[1],
           p50[1] / unix_rtt);
  TARGET("shm 4 KiB p50 <= 15 µs", v, p50[1] > 0 && p50[1] <= 15);
  snprintf(v, sizeof v, "%.1f µs (%.2fx the loopback TCP round trip)", p50[2], p50[2] / tcp_rtt);
  TARGET("tcp 4 KiB p50 <= 25 µs", v, p50[2] > 0 && p50[2] <= 25);
  snprintf(v, sizeof v, "%.2f / %.2f / %.2f (cma/shm/tcp)", batch_ratio[0], batch_ratio[1],
           batch_ratio[2]);
  TARGET("16 refs together <= 1.3x one ref of the same bytes", v,
         batch_ratio[0] <= 1.3 && batch_ratio[1] <= 1.3 && batch_ratio[2] <= 1.3);
  snprintf(v, sizeof v, "%.2f, %.2f / %.2f, %.2f / %.2f, %.2f (cma/shm/tcp)", object_ratio[0][0],
           object_ratio[0][1], object_ratio[1][0], object_ratio[1][1], object_ratio[2][0],
           object_ratio[2][1]);
  int objects_met = 1;
  for (int k = 0; k < 3; k++)
    for (int j = 0; j < NUM_OBJECT_SHAPES; j++)
      objects_met &= object_ratio[k][j] > 0 && object_ratio[k][j] <= 1.5;
  TARGET("1,024 x 4 KiB and 4,096 x 64 KiB in one object <= 1.5x one tensor of the same bytes",
         v, objects_met);
  snprintf(v, sizeof v, "%.2f / %.2f / %.2f (cma/shm/tcp)", view_ratio[0][2], view_ratio[1][2],
           view_ratio[2][2]);
  TARGET("100,000 views of 1 GiB <= 1.5x one tensor (cma, shm), <= 2x (tcp), through C", v,
         view_ratio[0][2] > 0 && view_ratio[0][2] <= 1.5 && view_ratio[1][2] <= 1.5 && view_ratio[2][2] <= 2);
  snprintf(v, sizeof v, "%.2f / %.2f / %.2f (cma/shm/tcp)", view_ratio[0][1], view_ratio[1][1],
           view_ratio[2][1]);
  TARGET("10,000 views of 1 GiB <= 1.2x one tensor, through C", v,
         view_ratio[0][1] > 0 && view_ratio[0][1] <= 1.2 && view_ratio[1][1] <= 1.2 && view_ratio[2][1] <= 1.2);
  snprintf(v, sizeof v, "%.2f / %.2f / %.2f (cma/shm/tcp)", reshard_ratio[0], reshard_ratio[1],
           reshard_ratio[2]);
  TARGET("two half-row receivers together <= 1.1x one whole receiver", v,
         reshard_ratio[0] > 0 && reshard_ratio[0] <= 1.1 && reshard_ratio[1] <= 1.1 && reshard_ratio[2] <= 1.1);
  snprintf(v, sizeof v, "%.2fx / %.2fx (cma), %.2fx / %.2fx (tcp)", gb64[0] > 0 ? w64[0] / gb64[0] : 0,
           gb1g[0] > 0 ? w1g[0] / gb1g[0] : 0, gb64[2] > 0 ? w64[2] / gb64[2] : 0, gb1g[2] > 0 ? w1g[2] / gb1g[2] : 0);
  TARGET("writes >= 0.9x the same transport's fetch at 64 MiB and 1 GiB", v,
         w64[0] >= 0.9 * gb64[0] && w1g[0] >= 0.9 * gb1g[0] && w64[2] >= 0.9 * gb64[2] && w1g[2] >= 0.9 * gb1g[2]);
  snprintf(v, sizeof v, "%.2fx / %.2fx / %.2fx get (cma/shm/tcp), %.2fx / %.2fx write (cma/tcp)", prep_fetch[0],
           prep_fetch[1], prep_fetch[2], prep_write[0], prep_write[2]);
  TARGET("prepared 4 KiB get and write <= 0.5x the ordinary ones, through C", v,
         prep_fetch[0] > 0 && prep_fetch[0] <= 0.5 && prep_fetch[1] <= 0.5 && prep_fetch[2] <= 0.5 &&
             prep_write[0] > 0 && prep_write[0] <= 0.5 && prep_write[2] <= 0.5);
  stop_source(&s);
  check(rdt_runtime_destroy(rt), "destroy");
  if (report) fclose(report);
  return 0;
}

/* The C side of bench/python_bench.py: the same two measurements, so the
 * Python binding's overhead is a difference taken in one run. */
static int compare_main(void) {
  rdt_runtime *a = receiver_runtime(), *b = receiver_runtime();
  enum { N = 5000 };
  static char src[4096], dst[4096];
  int64_t shape[1] = {4096};
  double *t = calloc(N, sizeof *t);
  for (int i = 0; i < N; i++) {
    double t0 = now();
    rdt_tensor in = byte_tensor(src, shape), out = byte_tensor(dst, shape);
    rdt_ref *ref, *borrowed;
    void *bytes;
    size_t n;
    check(rdt_put(a, &in, 1, NULL, NULL, NULL, &ref), "put");
    check(rdt_ref_serialize(ref, &bytes, &n), "serialize");
    check(rdt_ref_deserialize(b, bytes, n, &borrowed), "deserialize");
    rdt_bytes_free(bytes);
    check(rdt_get(b, &borrowed, 1, &out, 1, NULL, 10000), "get");
    check(rdt_ref_release(borrowed), "release");
    check(rdt_ref_release(ref), "release");
    t[i] = now() - t0;
  }
  printf("roundtrip_4k_us %.2f\n", percentile(t, N, 0.5) * 1e6);
  free(t);
  struct source s = spawn_source();
  struct result r = measure(b, &s, "auto", 64 * MiB);
  printf("get_64m_gbps %.3f\n", r.gbps);
  stop_source(&s);
  check(rdt_runtime_destroy(b), "destroy");
  check(rdt_runtime_destroy(a), "destroy");
  return 0;
}

/* Parses "4KiB", "1MiB", "64MiB", "1GiB" (or a plain byte count) into *n. */
static int parse_size(const char *s, uint64_t *n) {
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s) return 0;
  uint64_t unit = strcmp(end, "KiB") == 0 ? KiB
                  : strcmp(end, "MiB") == 0 ? MiB
                  : strcmp(end, "GiB") == 0 ? GiB
                  : *end == 0               ? 1
                                            : 0;
  if (unit == 0 || v == 0 || v > 64 * GiB / unit) return 0;
  *n = v * unit;
  return 1;
}

/* rdtbench row TRANSPORT SHAPE [RUNS]: one measurement as one line of
 * key=value, for measuring without rewriting bench/RESULTS.md. */
static int row_main(int argc, char **argv) {
  const char *usage = "usage: rdtbench row cma|shm|tcp|nixl|auto SIZE|COUNTxSIZE|reshard|write:SIZE|prepared:SIZE [RUNS]\n"
                      "  SIZE is 4KiB, 1MiB, 64MiB, 1GiB or bytes; COUNTxSIZE is one object of\n"
                      "  COUNT tensors (1024x4KiB, 4096x64KiB, up to 1048576) against one tensor of\n"
                      "  the same bytes; reshard is two half-row receivers against one whole one;\n"
                      "  write:SIZE writes into an exposed buffer against fetches of SIZE;\n"
                      "  prepared:SIZE prepared fetches and writes against unprepared ones\n";
  if (argc < 4 || argc > 5) {
    fputs(usage, stderr);
    return 2;
  }
  const char *transport = argv[2], *shape = argv[3];
  if (strcmp(shape, "reshard") == 0) {
    int runs = argc == 5 ? atoi(argv[4]) : 3;
    if (runs < 1 || runs > 1000) {
      fputs(usage, stderr);
      return 2;
    }
    struct source s = spawn_source();
    double whole, halves;
    uint64_t hb[2];
    measure_reshard(&s, transport, runs, &whole, &halves, hb);
    printf("transport=%s shape=reshard runs=%d whole_ms=%.3f halves_ms=%.3f ratio=%.2f half_bytes=%" PRIu64
           ",%" PRIu64 " object_bytes=%" PRIu64 "\n",
           transport, runs, whole * 1e3, halves * 1e3, halves / whole, hb[0], hb[1], (uint64_t)SD_BYTES);
    stop_source(&s);
    return 0;
  }
  if (strncmp(shape, "prepared:", 9) == 0) {
    uint64_t size;
    int runs = argc == 5 ? atoi(argv[4]) : 0;
    if (!parse_size(shape + 9, &size) || (argc == 5 && (runs < 1 || runs > 4000))) {
      fputs(usage, stderr);
      return 2;
    }
    if (runs) iterations_override = runs;
    rdt_runtime *rt = receiver_runtime();
    struct source s = spawn_source();
    struct result f = measure(rt, &s, transport, size), pf = measure_prepared(rt, &s, transport, size, 0);
    int writes = transport_writes(rt, transport);
    struct result w = {0}, pw = {0};
    if (writes) {
      w = measure_write(rt, &s, transport, size);
      pw = measure_prepared(rt, &s, transport, size, 1);
    }
    printf("transport=%s shape=prepared:%s runs=%d fetch_p50_us=%.2f prepared_fetch_p50_us=%.2f fetch_ratio=%.2f",
           transport, shape + 9, iterations_for(size), f.p50_us, pf.p50_us, pf.p50_us / f.p50_us);
    if (writes)
      printf(" write_p50_us=%.2f prepared_write_p50_us=%.2f write_ratio=%.2f", w.p50_us, pw.p50_us, pw.p50_us / w.p50_us);
    printf("\n");
    stop_source(&s);
    check(rdt_runtime_destroy(rt), "destroy");
    return 0;
  }
  if (strncmp(shape, "write:", 6) == 0) {
    uint64_t size;
    int runs = argc == 5 ? atoi(argv[4]) : 0;
    if (!parse_size(shape + 6, &size) || (argc == 5 && (runs < 1 || runs > 4000))) {
      fputs(usage, stderr);
      return 2;
    }
    if (runs) iterations_override = runs;
    rdt_runtime *rt = receiver_runtime();
    struct source s = spawn_source();
    struct result w = measure_write(rt, &s, transport, size), f = measure(rt, &s, transport, size);
    printf("transport=%s shape=write:%s runs=%d write_p50_us=%.2f write_p99_us=%.2f write_gbps=%.3f "
           "fetch_p50_us=%.2f fetch_gbps=%.3f ratio=%.2f\n",
           transport, shape + 6, iterations_for(size), w.p50_us, w.p99_us, w.gbps, f.p50_us, f.gbps, w.gbps / f.gbps);
    stop_source(&s);
    check(rdt_runtime_destroy(rt), "destroy");
    return 0;
  }
  uint64_t count = 1, size;
  const char *x = strchr(shape, 'x');
  char *end;
  if (x) {
    count = strtoull(shape, &end, 10);
    if (end != x || count == 0 || count > (1u << 20)) {
      fputs(usage, stderr);
      return 2;
    }
    shape = x + 1;
  }
  if (!parse_size(shape, &size) || size > 64 * GiB / count) {
    fputs(usage, stderr);
    return 2;
  }
  int runs = 0;
  if (argc == 5 && ((runs = atoi(argv[4])) < 1 || runs > 100000)) {
    fputs(usage, stderr);
    return 2;
  }
  rdt_runtime *rt = receiver_runtime();
  if (strcmp(transport, "auto") != 0 && !transport_available(rt, transport)) {
    printf("transport=%s shape=%s available=no\n", transport, argv[3]);
    check(rdt_runtime_destroy(rt), "destroy");
    return 3;
  }
  struct source s = spawn_source();
  uint64_t before[NUM_TRANSPORTS];
  count_uses(rt, host_transports, NUM_TRANSPORTS, before);
  if (x) {
    if (!runs) runs = count * size <= 4 * MiB ? 40 : 5;
    double many, one, pmany, pone;
    measure_object(rt, &s, transport, size, count, runs, &many, &one, &pmany, &pone);
    printf("transport=%s by=%s shape=%" PRIu64 "x%s runs=%d many_ms=%.3f one_ms=%.3f ratio=%.2f "
           "many_gbps=%.3f prepared_many_ms=%.3f prepared_one_ms=%.3f prepared_ratio=%.2f\n",
           transport, moved_by(rt, host_transports, NUM_TRANSPORTS, before), count, shape, runs,
           many * 1e3, one * 1e3, many / one, (double)(count * size) / many / 1e9, pmany * 1e3,
           pone * 1e3, pmany / pone);
  } else {
    if (runs) iterations_override = runs;
    struct result r = measure(rt, &s, transport, size);
    printf("transport=%s by=%s shape=%s runs=%d p50_us=%.2f p99_us=%.2f gbps=%.3f\n", transport,
           moved_by(rt, host_transports, NUM_TRANSPORTS, before), shape, iterations_for(size),
           r.p50_us, r.p99_us, r.gbps);
  }
  stop_source(&s);
  check(rdt_runtime_destroy(rt), "destroy");
  return 0;
}

int main(int argc, char **argv) {
  self_path = "/proc/self/exe";
  signal(SIGPIPE, SIG_IGN);
  static char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    self_path = exe;
  }
  if (argc >= 2 && strcmp(argv[1], "source") == 0) return source_main();
  if (argc >= 2 && strcmp(argv[1], "compare") == 0) return compare_main();
  if (argc >= 2 && strcmp(argv[1], "bench") == 0) return bench_main(argc >= 3 ? argv[2] : NULL);
  if (argc >= 2 && strcmp(argv[1], "row") == 0) return row_main(argc, argv);
  fprintf(stderr, "usage: %s bench [RESULTS.md] | row TRANSPORT SHAPE [RUNS] | compare\n"
                  "(the demo is `make demo`: examples/c/demo.c)\n", argv[0]);
  return 2;
}
