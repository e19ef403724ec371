/* rdt_pending_event_fd: an event loop waits for a pending get with poll() on
 * its descriptor, then takes the result with rdt_pending_wait(f, 0). */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <unistd.h>

#include "test_util.h"

static int64_t shape16[1] = {16};

/* The number of eventfds this process has open. */
static int count_eventfds(void) {
  DIR *d = opendir("/proc/self/fd");
  CHECK(d != NULL);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char path[300], link[64];
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t len = readlink(path, link, sizeof link - 1);
    if (len < 0) continue;
    link[len] = '\0';
    if (strcmp(link, "anon_inode:[eventfd]") == 0) n++;
  }
  closedir(d);
  return n;
}

/* 1 if fd became readable within timeout_ms, else 0. */
static int readable(int fd, int timeout_ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  int n;
  do {
    n = poll(&p, 1, timeout_ms);
  } while (n < 0 && errno == EINTR);
  CHECK(n >= 0);
  return n == 1 && (p.revents & POLLIN);
}

static rdt_runtime *src, *dst;
static test_transport ts, td;
static float in[16], out[16];
static rdt_ref *borrowed;

static rdt_pending *start(void) {
  rdt_tensor target = f32_tensor(out, shape16);
  rdt_pending *f = NULL;
  CHECK_OK(rdt_get_start(dst, &borrowed, 1, &target, 1, NULL, &f));
  return f;
}

static int fetches_so_far(void) {
  pthread_mutex_lock(&td.mu);
  int n = td.fetches;
  pthread_mutex_unlock(&td.mu);
  return n;
}

static void set_gated(int gated) {
  pthread_mutex_lock(&td.mu);
  td.gated = gated;
  td.open = 0;
  pthread_mutex_unlock(&td.mu);
}

/* Readable only once the transfer finished; then wait(0) has the result;
 * the descriptor is the fetch's and free closes it. */
static void test_completion(void) {
  int before = count_eventfds();
  set_gated(1);
  memset(out, 0, sizeof out);
  int fetched = fetches_so_far();
  rdt_pending *f = start();
  int fd = -1, again = -1;
  CHECK_OK(rdt_pending_event_fd(f, &fd));
  CHECK(fd >= 0);
  CHECK_OK(rdt_pending_event_fd(f, &again));
  CHECK(again == fd);
  CHECK(count_eventfds() == before + 1);
  wait_fetches(&td, fetched + 1);
  CHECK(!readable(fd, 50));
  CHECK_STATUS(rdt_pending_wait(f, 0), RDT_ERR_TIMEOUT);
  test_transport_open(&td);
  CHECK(readable(fd, 10000));
  CHECK_OK(rdt_pending_wait(f, 0));
  CHECK(readable(fd, 0)); /* it stays readable */
  CHECK(memcmp(in, out, sizeof in) == 0);
  CHECK_OK(rdt_pending_free(f));
  CHECK(count_eventfds() == before);
  CHECK_STATUS(rdt_pending_event_fd(f, &fd), RDT_ERR_INVALID_ARGUMENT);
}

/* A failed transfer completes the fetch too. */
static void test_failure(void) {
  set_gated(0);
  pthread_mutex_lock(&td.mu);
  td.fail_at = td.waits + 1;
  td.fail_status = RDT_ERR_TRANSPORT;
  td.fail_message = "cable unplugged";
  pthread_mutex_unlock(&td.mu);
  rdt_pending *f = start();
  int fd = -1;
  CHECK_OK(rdt_pending_event_fd(f, &fd));
  CHECK(readable(fd, 10000));
  CHECK_STATUS(rdt_pending_wait(f, 0), RDT_ERR_TRANSPORT);
  CHECK_MSG("cable unplugged");
  CHECK_OK(rdt_pending_free(f));
  pthread_mutex_lock(&td.mu);
  td.fail_at = 0;
  pthread_mutex_unlock(&td.mu);
}

/* An abort completes it once nothing writes into the target. */
static void test_abort(void) {
  int before = count_eventfds();
  set_gated(1);
  int fetched = fetches_so_far();
  rdt_pending *f = start();
  int fd = -1;
  CHECK_OK(rdt_pending_event_fd(f, &fd));
  wait_fetches(&td, fetched + 1);
  CHECK(!readable(fd, 20));
  CHECK_OK(rdt_pending_abort(f));
  CHECK(readable(fd, 10000));
  CHECK_STATUS(rdt_pending_wait(f, 0), RDT_ERR_ABORTED);
  CHECK_OK(rdt_pending_free(f));
  CHECK(count_eventfds() == before);

  /* Asked for after completion: readable at once. */
  set_gated(0);
  f = start();
  CHECK_OK(rdt_pending_wait(f, 10000));
  CHECK_OK(rdt_pending_event_fd(f, &fd));
  CHECK(readable(fd, 0));
  CHECK_OK(rdt_pending_free(f));
  CHECK(count_eventfds() == before);
}

static void test_bad_arguments(void) {
  int fd = -1;
  CHECK_STATUS(rdt_pending_event_fd(NULL, &fd), RDT_ERR_INVALID_ARGUMENT);
  rdt_pending *f = start();
  CHECK_STATUS(rdt_pending_event_fd(f, NULL), RDT_ERR_INVALID_ARGUMENT);
  CHECK_OK(rdt_pending_wait(f, 10000));
  CHECK_OK(rdt_pending_free(f));
}

int main(void) {
  runtime_pair("src", "dst", "async", async_vtable, &src, &dst, &ts, &td);
  for (int i = 0; i < 16; i++) in[i] = (float)i + 0.5f;
  rdt_tensor t = f32_tensor(in, shape16);
  borrowed = put_borrowed(src, &t, "async", dst);

  test_completion();
  test_failure();
  test_abort();
  test_bad_arguments();

  CHECK_OK(rdt_ref_release(borrowed));
  CHECK(stats_of(dst).fetches_active == 0);
  destroy_pair(src, dst);
  printf("test_event_fd: ok\n");
  return 0;
}
