/* Every call is safe from any thread: C threads put, pass, fetch, clone,
 * release and query two runtimes at once, and the counts add up. */
#include "test_util.h"

enum { THREADS = 8, ROUNDS = 150, N = 1024 };

static rdt_runtime *a, *b;
static const char *transports[] = {"memcopy", "async", "mailbox"};

static void *worker(void *arg) {
  int id = (int)(intptr_t)arg;
  float *src = malloc(N * sizeof(float)), *dst = malloc(N * sizeof(float));
  int64_t shape[1] = {N};
  for (int round = 0; round < ROUNDS; round++) {
    for (int i = 0; i < N; i++) src[i] = (float)(id * 100000 + round * 10 + i);
    memset(dst, 0, N * sizeof(float));
    rdt_tensor t = f32_tensor(src, shape), target = f32_tensor(dst, shape);
    const char *name = transports[(id + round) % 3];
    rdt_ref *ref, *clone;
    CHECK_OK(rdt_put(a, &t, 1, name, NULL, NULL, &ref));
    CHECK_OK(rdt_ref_clone(ref, &clone));
    rdt_ref *borrowed = pass_ref(clone, b);
    CHECK_OK(rdt_ref_release(clone));
    CHECK_OK(rdt_get(b, &borrowed, 1, &target, 1, NULL, 30000));
    CHECK(memcmp(src, dst, N * sizeof(float)) == 0);
    CHECK_OK(rdt_ref_release(borrowed));
    CHECK_OK(rdt_ref_release(ref));
    CHECK_OK(rdt_wait_tensor_freed(a, src, 30000));
    if (round % 16 == 0) {
      size_t count;
      CHECK_OK(rdt_transport_list(b, NULL, 0, &count));
      CHECK(count == 3);
      stats_of(a);
    }
  }
  free(src);
  free(dst);
  return NULL;
}

int main(void) {
  a = new_runtime("a");
  b = new_runtime("b");
  static test_transport t[6];
  for (int i = 0; i < 6; i++) test_transport_init(&t[i]);
  register_cpu(a, "memcopy", memcopy_vtable(&t[0]));
  register_cpu(b, "memcopy", memcopy_vtable(&t[1]));
  register_cpu(a, "async", async_vtable(&t[2]));
  register_cpu(b, "async", async_vtable(&t[3]));
  register_cpu(a, "mailbox", mailbox_vtable(&t[4]));
  register_cpu(b, "mailbox", mailbox_vtable(&t[5]));
  pthread_t threads[THREADS];
  for (int i = 0; i < THREADS; i++)
    CHECK(pthread_create(&threads[i], NULL, worker, (void *)(intptr_t)i) == 0);
  for (int i = 0; i < THREADS; i++) pthread_join(threads[i], NULL);
  rdt_stats sa = stats_of(a), sb = stats_of(b);
  CHECK(sa.objects == 0 && sa.refs == 0 && sa.borrows == 0);
  CHECK(sa.objects_freed == THREADS * ROUNDS);
  CHECK(sb.refs == 0 && sb.borrowed_objects == 0 && sb.fetches_active == 0);
  CHECK(sb.transfers_completed == THREADS * ROUNDS);
  CHECK(t[3].fetches == t[3].releases);
  CHECK_OK(rdt_runtime_destroy(a));
  CHECK_OK(rdt_runtime_destroy(b));
  printf("test_threads: ok (%d threads x %d rounds)\n", THREADS, ROUNDS);
  return 0;
}
