/* The built-in transports through the C ABI: two runtimes with the socket
 * control plane move tensors over cma, shm, tcp and the automatic choice,
 * and a fetch override picks another transport than the ref names. */
#include "test_util.h"

static uint64_t completed(rdt_runtime *rt, const char *name) {
  rdt_transport_info info;
  if (find_transport(rt, name, &info)) return info.transfers_completed;
  fprintf(stderr, "no transport %s\n", name);
  abort();
}

static void move(rdt_runtime *a, rdt_runtime *b, const char *put_as,
                 const char *fetch_as, const char *expect) {
  enum { N = 300000 }; /* above the small-transfer fast paths */
  float *src = malloc(N * sizeof(float)), *dst = calloc(N, sizeof(float));
  for (int i = 0; i < N; i++) src[i] = (float)i * 0.5f;
  int64_t shape[1] = {N};
  rdt_tensor t = f32_tensor(src, shape), target = f32_tensor(dst, shape);
  rdt_ref *ref;
  CHECK_OK(rdt_put(a, &t, 1, put_as, NULL, NULL, &ref));
  rdt_ref *borrowed = pass_ref(ref, b);
  uint64_t before = completed(b, expect);
  rdt_get_options fo;
  rdt_get_options_init(&fo);
  fo.transport = fetch_as;
  CHECK_OK(rdt_get(b, &borrowed, 1, &target, 1, &fo, 30000));
  CHECK(memcmp(src, dst, N * sizeof(float)) == 0);
  CHECK(completed(b, expect) == before + 1);
  CHECK_OK(rdt_ref_release(borrowed));
  CHECK_OK(rdt_ref_release(ref));
  CHECK_OK(rdt_wait_tensor_freed(a, src, 30000));
  free(src);
  free(dst);
}

/* An owner destroyed while its process goes on: its memory may be reused at
 * once, so a borrower that has not yet noticed must get an error, never the
 * bytes. Repeated, because noticing is a race. */
static void destroyed_owner_is_never_read(void) {
  const char *names[] = {"cma", NULL, "shm", "tcp"};
  for (int round = 0; round < 40; round++) {
    rdt_runtime *a = socket_runtime("doomed"), *b = socket_runtime("reader");
    enum { N = 1024 };
    float *src = malloc(N * sizeof(float)), dst[N];
    for (int i = 0; i < N; i++) src[i] = 1.0f;
    int64_t shape[1] = {N};
    rdt_tensor t = f32_tensor(src, shape), target = f32_tensor(dst, shape);
    rdt_ref *ref;
    CHECK_OK(rdt_put(a, &t, 1, names[round % 4], NULL, NULL, &ref));
    rdt_ref *borrowed = pass_ref(ref, b);
    CHECK_OK(rdt_ref_release(ref));
    CHECK_OK(rdt_runtime_destroy(a)); /* frees the object; the memory is ours again */
    for (int i = 0; i < N; i++) src[i] = -1.0f;
    rdt_status st = rdt_get(b, &borrowed, 1, &target, 1, NULL, 10000);
    CHECK(st != RDT_OK);
    CHECK(st == RDT_ERR_PEER_UNAVAILABLE || st == RDT_ERR_NOT_FOUND);
    CHECK_OK(rdt_ref_release(borrowed));
    CHECK_OK(rdt_runtime_destroy(b));
    free(src);
  }
}

/* The automatic choice's order reaches the bindings through the list:
 * host memory tries cma, then shm, then tcp; only tcp crosses hosts. */
static void automatic_order_is_listed(rdt_runtime *rt) {
  rdt_transport_info infos[MAX_LISTED];
  size_t n = list_transports(rt, infos);
  uint32_t cma = 0, shm = 0, tcp = 0;
  for (size_t i = 0; i < n && i < MAX_LISTED; i++) {
    const rdt_transport_info *t = &infos[i];
    CHECK(t->flags & RDT_TRANSPORT_BUILTIN);
    if (strcmp(t->name, "cma") == 0) cma = t->auto_rank_host;
    if (strcmp(t->name, "shm") == 0) shm = t->auto_rank_host;
    if (strcmp(t->name, "tcp") == 0) tcp = t->auto_rank_host;
    CHECK(!!(t->flags & RDT_TRANSPORT_SAME_HOST_ONLY) ==
          (strcmp(t->name, "cma") == 0 || strcmp(t->name, "shm") == 0 || strcmp(t->name, "cuda_ipc") == 0));
    if (strcmp(t->name, "cma") == 0 || strcmp(t->name, "shm") == 0 || strcmp(t->name, "tcp") == 0)
      CHECK(t->auto_rank_cuda == 0);
  }
  CHECK(cma > 0 && cma < shm && shm < tcp);
}

int main(void) {
  rdt_runtime *a = socket_runtime("owner"), *b = socket_runtime("reader");
  size_t count = 0;
  CHECK_OK(rdt_transport_list(b, NULL, 0, &count));
  CHECK(count >= 3);
  automatic_order_is_listed(b);
  move(a, b, "cma", NULL, "cma");
  move(a, b, "shm", NULL, "shm");
  move(a, b, "tcp", NULL, "tcp");
  move(a, b, NULL, NULL, "cma");  /* auto: same host, host memory */
  move(a, b, "cma", "tcp", "tcp"); /* a per-fetch override */
  destroyed_owner_is_never_read();
  CHECK_OK(rdt_runtime_destroy(b));
  CHECK_OK(rdt_runtime_destroy(a));
  printf("test_builtin: ok\n");
  return 0;
}
