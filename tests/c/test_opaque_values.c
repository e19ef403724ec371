/* Opaque values the application hands rdt (put's user_data, a transport's
 * user_data and requests, tensor data addresses that rdt only passes on)
 * may be any bits, small integers included. The Go runtime takes a value
 * below 4096 held as a pointer for a corrupt one and aborts with "invalid
 * pointer found on stack" when it moves a goroutine's stack, which frequent
 * garbage collection makes likely. Children run put/release and fetch
 * loops with small integer cookies under GOGC=1 on two threads and two
 * runtimes; every child must exit cleanly, and every callback must get
 * back exactly the values that were passed. */
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

extern char **environ;

enum {
  CHILDREN = 3,
  CHILD_MS = 4000,          /* each child's loops run this long */
  CHILD_DEADLINE_MS = 60000, /* a child still running then is a failure */
  SMALL = 4095,             /* cookies cycle through 1..SMALL */
  N = 16,                   /* floats per put */
};

#define TRANSPORT_USER_DATA ((void *)(uintptr_t)7)

static atomic_int bad; /* set by a callback that got a value it never gave */
static atomic_long released[SMALL + 1];
static atomic_int request_live[SMALL + 1];
static atomic_int transport_freed;

static void fail_in_callback(const char *what, uintptr_t v) {
  fprintf(stderr, "child: %s got %#lx\n", what, (unsigned long)v);
  atomic_store(&bad, 1);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uintptr_t cookie(long i) { return 1 + (uintptr_t)(i % SMALL); }

/* ---- release callbacks ---------------------------------------------- */

static void on_release(void *user_data) {
  uintptr_t v = (uintptr_t)user_data;
  if (v < 1 || v > SMALL) {
    fail_in_callback("release", v);
    return;
  }
  atomic_fetch_add(&released[v], 1);
}

/* ---- a transport whose user data and requests are small integers ---- */
/* Its puts carry fake data addresses (small integers) that it never
 * dereferences: the metadata is the address, and a receive fills each
 * target with the address's low byte. */

static void check_ud(const char *what, void *ud) {
  if (ud != TRANSPORT_USER_DATA) fail_in_callback(what, (uintptr_t)ud);
}

static void cookie_free_ud(void *ud) {
  check_ud("free_user_data", ud);
  atomic_fetch_add(&transport_freed, 1);
}

static rdt_status cookie_extract(void *ud, const char *oid,
                                 const rdt_tensor *ts, size_t n,
                                 rdt_buffer *out) {
  (void)oid;
  check_ud("extract_metadata", ud);
  if (n != 1) return RDT_ERR_UNSUPPORTED;
  uintptr_t addr = (uintptr_t)ts[0].data;
  if (addr < 1 || addr > SMALL) fail_in_callback("extract_metadata data", addr);
  return rdt_buffer_set(out, &addr, sizeof addr);
}

static atomic_long next_request;

static rdt_status cookie_fetch(void *ud, const rdt_transfer *x,
                               const rdt_tensor *targets, size_t n,
                               const void *tm, size_t tms, const void *cm,
                               size_t cms, void **request) {
  (void)x, (void)cm, (void)cms;
  check_ud("fetch", ud);
  if (n != 1 || tms != sizeof(uintptr_t)) return RDT_ERR_TRANSPORT;
  uintptr_t addr;
  memcpy(&addr, tm, sizeof addr);
  memset(targets[0].data, (int)(addr & 0xff), N * sizeof(float));
  uintptr_t id = cookie(atomic_fetch_add(&next_request, 1));
  if (atomic_exchange(&request_live[id], 1) != 0) fail_in_callback("fetch reused request", id);
  *request = (void *)id;
  return RDT_OK;
}

static void check_request(const char *what, void *request) {
  uintptr_t id = (uintptr_t)request;
  if (id < 1 || id > SMALL || !atomic_load(&request_live[id])) fail_in_callback(what, id);
}

static rdt_status cookie_wait(void *ud, void *request, int64_t timeout_ms) {
  (void)timeout_ms;
  check_ud("wait", ud);
  check_request("wait", request);
  return RDT_OK;
}

static void cookie_release_request(void *ud, void *request) {
  check_ud("release_request", ud);
  check_request("release_request", request);
  atomic_store(&request_live[(uintptr_t)request & SMALL], 0);
}

static rdt_status cookie_abort(void *ud, const rdt_transfer *x, void *request) {
  (void)x;
  check_ud("abort", ud);
  if (request != NULL) check_request("abort", request);
  return RDT_OK;
}

static void cookie_gc(void *ud, const char *oid, const rdt_tensor *ts, size_t n,
                      const void *tm, size_t tms) {
  (void)oid, (void)tm, (void)tms;
  check_ud("garbage_collect", ud);
  if (n == 1 && ((uintptr_t)ts[0].data < 1 || (uintptr_t)ts[0].data > SMALL))
    fail_in_callback("garbage_collect data", (uintptr_t)ts[0].data);
}

static void register_cookie(rdt_runtime *rt) {
  rdt_transport_vtable vt;
  rdt_transport_vtable_init(&vt);
  vt.flags = RDT_TRANSPORT_ONE_SIDED | RDT_TRANSPORT_CAN_ABORT;
  vt.user_data = TRANSPORT_USER_DATA;
  vt.free_user_data = cookie_free_ud;
  vt.extract_metadata = cookie_extract;
  vt.fetch = cookie_fetch;
  vt.wait = cookie_wait;
  vt.release_request = cookie_release_request;
  vt.abort = cookie_abort;
  vt.garbage_collect = cookie_gc;
  register_cpu(rt, "cookie", vt);
}

/* ---- the child's two threads ------------------------------------------ */

static rdt_runtime *with_callbacks, *with_queue;
static int64_t deadline;
static long put_counts[2][SMALL + 1]; /* [runtime][cookie]: puts made */

/* Puts real memory into `with_callbacks` with small user data, and every
 * few rounds an object with a fake small data address through the cookie
 * transport, fetched into `with_queue`. */
static void *callbacks_loop(void *arg) {
  (void)arg;
  float src[N], dst[N];
  int64_t shape[1] = {N};
  for (int i = 0; i < N; i++) src[i] = (float)i;
  for (long i = 0; now_ms() < deadline; i++) {
    uintptr_t v = cookie(i);
    rdt_tensor t = f32_tensor(src, shape);
    rdt_ref *ref;
    CHECK_OK(rdt_put(with_callbacks, &t, 1, NULL, on_release, (void *)v, &ref));
    put_counts[0][v]++;
    rdt_ref *borrowed = pass_ref(ref, with_queue); /* as refs sent elsewhere are */
    CHECK_OK(rdt_ref_release(borrowed));
    CHECK_OK(rdt_ref_release(ref));
    if (i % 8 != 0) continue;

    rdt_tensor fake = f32_tensor((float *)v, shape);
    CHECK_OK(rdt_put(with_callbacks, &fake, 1, "cookie", on_release, (void *)v, &ref));
    put_counts[0][v]++;
    borrowed = pass_ref(ref, with_queue);
    rdt_tensor target = f32_tensor(dst, shape);
    if (i % 16 == 0) {
      rdt_pending *f;
      CHECK_OK(rdt_get_start(with_queue, &borrowed, 1, &target, 1, NULL, &f));
      CHECK_OK(rdt_pending_abort(f));
      rdt_status st = rdt_pending_wait(f, 30000);
      CHECK(st == RDT_OK || st == RDT_ERR_ABORTED);
      CHECK_OK(rdt_pending_free(f));
    } else {
      memset(dst, 0xee, sizeof dst);
      CHECK_OK(rdt_get(with_queue, &borrowed, 1, &target, 1, NULL, 30000));
      unsigned char want[sizeof dst];
      memset(want, (int)(v & 0xff), sizeof want);
      CHECK(memcmp(dst, want, sizeof dst) == 0);
    }
    CHECK_OK(rdt_ref_release(borrowed));
    CHECK_OK(rdt_ref_release(ref));
    CHECK_OK(rdt_wait_tensor_freed(with_callbacks, (void *)v, 30000));
  }
  return NULL;
}

static long taken[SMALL + 1];

static void take_all(int64_t timeout_ms) {
  void *keys[256];
  size_t n = 0;
  CHECK_OK(rdt_runtime_take_released(with_queue, keys, 256, &n, timeout_ms));
  for (size_t i = 0; i < n; i++) {
    uintptr_t v = (uintptr_t)keys[i];
    if (v < 1 || v > SMALL) {
      fail_in_callback("rdt_runtime_take_released", v);
      continue;
    }
    taken[v]++;
  }
}

/* Puts into the runtime that queues releases, with small user data. */
static void *queue_loop(void *arg) {
  (void)arg;
  float src[N];
  int64_t shape[1] = {N};
  for (int i = 0; i < N; i++) src[i] = (float)-i;
  for (long i = 0; now_ms() < deadline; i++) {
    uintptr_t v = cookie(i * 7);
    rdt_tensor t = f32_tensor(src, shape);
    rdt_ref *ref;
    CHECK_OK(rdt_put(with_queue, &t, 1, NULL, NULL, (void *)v, &ref));
    put_counts[1][v]++;
    rdt_ref *borrowed = pass_ref(ref, with_callbacks);
    CHECK_OK(rdt_ref_release(borrowed));
    CHECK_OK(rdt_ref_release(ref));
    if (i % 64 == 0) take_all(0);
  }
  return NULL;
}

static long sum(const long *counts) {
  long s = 0;
  for (int v = 1; v <= SMALL; v++) s += counts[v];
  return s;
}

static long sum_atomic(atomic_long *counts) {
  long s = 0;
  for (int v = 1; v <= SMALL; v++) s += atomic_load(&counts[v]);
  return s;
}

static int child(void) {
  with_callbacks = new_runtime("callbacks");
  rdt_runtime_options opts;
  rdt_runtime_options_init(&opts);
  opts.name = "queue";
  opts.flags = RDT_RUNTIME_IN_PROCESS | RDT_RUNTIME_NO_BUILTIN_TRANSPORTS |
               RDT_RUNTIME_QUEUE_RELEASES;
  CHECK_OK(rdt_runtime_create(&opts, &with_queue));
  register_cookie(with_callbacks);
  register_cookie(with_queue);

  deadline = now_ms() + CHILD_MS;
  pthread_t a, b;
  CHECK(pthread_create(&a, NULL, callbacks_loop, NULL) == 0);
  CHECK(pthread_create(&b, NULL, queue_loop, NULL) == 0);
  pthread_join(a, NULL);
  pthread_join(b, NULL);

  /* Every object was released: each value comes back as often as it was
   * passed, and no other value ever does. */
  int64_t until = now_ms() + 30000;
  while (sum_atomic(released) < sum(put_counts[0]) && now_ms() < until) usleep(1000);
  while (sum(taken) < sum(put_counts[1]) && now_ms() < until) take_all(100);
  for (int v = 1; v <= SMALL; v++) {
    if (atomic_load(&released[v]) != put_counts[0][v] || taken[v] != put_counts[1][v]) {
      fprintf(stderr, "child: user data %d: %ld releases for %ld puts, %ld taken for %ld puts\n", v,
              atomic_load(&released[v]), put_counts[0][v], taken[v], put_counts[1][v]);
      return 1;
    }
  }
  CHECK_OK(rdt_runtime_destroy(with_callbacks));
  CHECK_OK(rdt_runtime_destroy(with_queue));
  CHECK(atomic_load(&transport_freed) == 2);
  if (atomic_load(&bad)) return 1;
  printf("child %d: %ld and %ld puts\n", (int)getpid(), sum(put_counts[0]), sum(put_counts[1]));
  return 0;
}

/* ---- the parent: children with GOGC=1 ------------------------------- */

static pid_t spawn_child(void) {
  size_t n = 0;
  while (environ[n]) n++;
  char **env = calloc(n + 2, sizeof *env);
  CHECK(env != NULL);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "GOGC=", 5) != 0) env[k++] = environ[i];
  env[k++] = "GOGC=1"; /* a garbage collection every few puts */
  env[k] = NULL;
  char *argv[] = {"test_opaque_values", "child", NULL};
  pid_t pid;
  CHECK(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, env) == 0);
  free(env);
  return pid;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "child") == 0) return child();

  pid_t pids[CHILDREN];
  for (int i = 0; i < CHILDREN; i++) pids[i] = spawn_child();
  int64_t until = now_ms() + CHILD_DEADLINE_MS;
  int failed = 0, running = CHILDREN;
  while (running > 0) {
    for (int i = 0; i < CHILDREN; i++) {
      if (pids[i] == 0) continue;
      int status;
      pid_t got = waitpid(pids[i], &status, WNOHANG);
      CHECK(got >= 0);
      if (got == 0) {
        if (now_ms() < until) continue;
        kill(pids[i], SIGKILL);
        waitpid(pids[i], &status, 0);
        fprintf(stderr, "child %d did not finish in %d ms\n", (int)pids[i], CHILD_DEADLINE_MS);
        failed++;
      } else if (WIFSIGNALED(status)) {
        fprintf(stderr, "child %d died of signal %d\n", (int)pids[i], WTERMSIG(status));
        failed++;
      } else if (WEXITSTATUS(status) != 0) {
        fprintf(stderr, "child %d exited with %d\n", (int)pids[i], WEXITSTATUS(status));
        failed++;
      }
      pids[i] = 0;
      running--;
    }
    usleep(20000);
  }
  CHECK(failed == 0);
  printf("test_opaque_values: ok\n");
  return 0;
}
