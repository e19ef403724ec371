/* Prepared transfers through the C ABI: a fetch and a write, each run many
 * times between two socket runtimes over cma and tcp. Every run moves the
 * bytes the source holds at that run; a write makes one notice per run with
 * that run's tag; the prepared transfer keeps the objects it reads
 * borrowed after the caller freed its refs; a revoked object, a destroyed
 * owner and bad handles fail clearly. */
#include <unistd.h>

#include "test_util.h"

enum { N = 4096 };

static void fill(float *p, int n, float base) {
  for (int i = 0; i < n; i++) p[i] = base + (float)i;
}

static void fetch_runs(const char *transport) {
  rdt_runtime *owner = socket_runtime("owner"), *reader = socket_runtime("reader");
  float *src = malloc(N * sizeof(float)), *dst = calloc(N, sizeof(float));
  int64_t shape[1] = {N};
  rdt_tensor t = f32_tensor(src, shape), out = f32_tensor(dst, shape);
  rdt_ref *ref = NULL;
  fill(src, N, 0);
  CHECK_OK(rdt_put(owner, &t, 1, transport, NULL, NULL, &ref));
  rdt_ref *theirs = pass_ref(ref, reader);

  rdt_prepared *p = NULL;
  CHECK_OK(rdt_prepare_get(reader, &theirs, 1, &out, 1, NULL, &p));
  CHECK_OK(rdt_ref_release(theirs)); /* the prepared fetch holds its own */
  for (int run = 0; run < 20; run++) {
    fill(src, N, (float)(100 * run));
    CHECK_OK(rdt_prepared_run(p, 0, 30000));
    CHECK(memcmp(src, dst, N * sizeof(float)) == 0);
  }
  rdt_stats s = stats_of(reader);
  CHECK(s.transfers_completed == 20 && s.bytes_received == 20ull * N * sizeof(float));

  /* Still borrowed: the owner frees the object only after the free. */
  CHECK_OK(rdt_ref_release(ref));
  CHECK_OK(rdt_prepared_run(p, 0, 30000));
  CHECK(stats_of(owner).objects_freed == 0);
  CHECK_OK(rdt_prepared_free(p));
  for (int i = 0; i < 3000 && stats_of(owner).objects_freed == 0; i++) usleep(1000);
  CHECK(stats_of(owner).objects_freed == 1);

  /* A destroyed owner fails the next run, clearly. */
  CHECK_OK(rdt_put(owner, &t, 1, transport, NULL, NULL, &ref));
  theirs = pass_ref(ref, reader);
  CHECK_OK(rdt_prepare_get(reader, &theirs, 1, &out, 1, NULL, &p));
  CHECK_OK(rdt_prepared_run(p, 0, 30000));
  CHECK_OK(rdt_ref_release(ref));
  CHECK_OK(rdt_runtime_destroy(owner));
  rdt_status st = RDT_OK;
  for (int i = 0; i < 3000 && st == RDT_OK; i++) {
    st = rdt_prepared_run(p, 0, 30000);
    if (st == RDT_OK) usleep(1000);
  }
  CHECK(st == RDT_ERR_PEER_UNAVAILABLE);
  CHECK_OK(rdt_prepared_free(p));
  CHECK_OK(rdt_ref_release(theirs));
  CHECK_OK(rdt_runtime_destroy(reader));
  free(src);
  free(dst);
}

static void write_runs(const char *transport) {
  rdt_runtime *owner = socket_runtime("owner"), *writer = socket_runtime("writer");
  float *slot = calloc(N, sizeof(float)), *src = malloc(N * sizeof(float));
  int64_t shape[1] = {N};
  rdt_tensor t = f32_tensor(slot, shape), in = f32_tensor(src, shape);
  rdt_ref *exposed = NULL;
  rdt_ref *w = expose_to(owner, &t, transport, writer, &exposed);

  rdt_write_options wo;
  rdt_write_options_init(&wo);
  wo.transport = transport;
  rdt_prepared *p = NULL;
  CHECK_OK(rdt_prepare_write(writer, &w, 1, &in, 1, &wo, &p));
  for (uint64_t tag = 1; tag <= 10; tag++) {
    fill(src, N, (float)tag);
    CHECK_OK(rdt_prepared_run(p, tag, 30000));
    rdt_write_notice n = take_notice(exposed);
    CHECK(n.status == RDT_OK && n.tag == tag && n.nbytes == N * sizeof(float));
    CHECK(memcmp(slot, src, N * sizeof(float)) == 0);
  }
  CHECK(stats_of(writer).writes_completed == 10);

  /* Revoked: the next run is refused, writes nothing and makes no notice. */
  CHECK_OK(rdt_ref_revoke_writes(exposed, 30000));
  float before = slot[0];
  fill(src, N, 9999);
  CHECK_STATUS(rdt_prepared_run(p, 11, 30000), RDT_ERR_PERMISSION_DENIED);
  CHECK(slot[0] == before);
  rdt_write_notice n;
  rdt_write_notice_init(&n);
  CHECK_STATUS(rdt_write_notice_wait(exposed, 0, &n), RDT_ERR_TIMEOUT);

  CHECK_OK(rdt_prepared_free(p));
  CHECK_OK(rdt_ref_release(w));
  CHECK_OK(rdt_ref_release(exposed));
  CHECK_OK(rdt_runtime_destroy(writer));
  CHECK_OK(rdt_runtime_destroy(owner));
  free(slot);
  free(src);
}

int main(void) {
  const char *transports[] = {"cma", "tcp"};
  for (int i = 0; i < 2; i++) {
    fetch_runs(transports[i]);
    write_runs(transports[i]);
  }

  /* Bad arguments. */
  rdt_runtime *rt = socket_runtime("alone");
  float x[4] = {0};
  int64_t shape[1] = {4};
  rdt_tensor t = f32_tensor(x, shape);
  rdt_ref *ref = NULL;
  CHECK_OK(rdt_put(rt, &t, 1, "cma", NULL, NULL, &ref));
  CHECK_STATUS(rdt_prepare_get(rt, &ref, 1, &t, 1, NULL, NULL), RDT_ERR_INVALID_ARGUMENT);
  rdt_prepared *p = NULL;
  CHECK_STATUS(rdt_prepare_write(rt, &ref, 1, &t, 1, NULL, &p), RDT_ERR_INVALID_ARGUMENT); /* put, not exposed */
  CHECK(p == NULL);
  CHECK_STATUS(rdt_prepared_run(NULL, 0, 0), RDT_ERR_INVALID_ARGUMENT);
  CHECK_OK(rdt_prepared_free(NULL));
  /* The runtime's own object: copied the ordinary way, run after run. */
  float y[4] = {0};
  rdt_tensor out = f32_tensor(y, shape);
  CHECK_OK(rdt_prepare_get(rt, &ref, 1, &out, 1, NULL, &p));
  x[2] = 5;
  CHECK_OK(rdt_prepared_run(p, 0, 30000));
  CHECK(y[2] == 5);
  CHECK_OK(rdt_prepared_free(p));
  CHECK_STATUS(rdt_prepared_run(p, 0, 0), RDT_ERR_INVALID_ARGUMENT); /* freed */
  CHECK_OK(rdt_ref_release(ref));
  CHECK_OK(rdt_runtime_destroy(rt));
  printf("test_prepared: ok\n");
  return 0;
}
