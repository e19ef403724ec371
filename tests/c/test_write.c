/* Writing into exposed objects through the C ABI: two runtimes with the
 * socket control plane; the owner exposes buffers, the writer writes into
 * them (whole, then a byte range) over cma, and every write ends in one
 * notice that carries the writer's tag. Refusals write nothing. */
#include <poll.h>

#include "test_util.h"

/* Whether fd becomes readable within ms. */
static int readable_within(int fd, int ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  int n = poll(&p, 1, ms);
  CHECK(n >= 0);
  return n == 1;
}

static int readable(int fd) { return readable_within(fd, 0); }

int main(void) {
  rdt_runtime *owner = socket_runtime("owner"), *writer = socket_runtime("writer");
  enum { N = 1024, M = 100 };
  float *weights = calloc(N, sizeof(float));
  uint8_t *bias = calloc(M, 1);
  int64_t shape_w[1] = {N}, shape_b[1] = {M};
  rdt_tensor exposed_t[2] = {f32_tensor(weights, shape_w), u8_tensor(bias, shape_b)};
  rdt_ref *exposed = NULL;
  CHECK_OK(rdt_expose(owner, exposed_t, 2, "cma", NULL, NULL, &exposed));
  rdt_object_info info;
  rdt_object_info_init(&info);
  CHECK_OK(rdt_ref_info(exposed, &info));
  CHECK(info.is_writable == 1 && info.is_owner == 1);

  rdt_ref *w = pass_ref(exposed, writer);
  rdt_object_info_init(&info);
  CHECK_OK(rdt_ref_info(w, &info));
  CHECK(info.is_writable == 1 && info.is_owner == 0);
  int fd = -1;
  CHECK_OK(rdt_write_notice_event_fd(exposed, &fd));
  CHECK(fd >= 0 && !readable(fd));
  CHECK_STATUS(rdt_write_notice_event_fd(w, &fd), RDT_ERR_INVALID_ARGUMENT); /* a writer's ref */

  /* A whole write, tagged. */
  float *src_w = malloc(N * sizeof(float));
  uint8_t *src_b = malloc(M);
  for (int i = 0; i < N; i++) src_w[i] = (float)i * 0.25f;
  for (int i = 0; i < M; i++) src_b[i] = (uint8_t)(200 - i);
  rdt_tensor sources[2] = {f32_tensor(src_w, shape_w), u8_tensor(src_b, shape_b)};
  rdt_write_options wo;
  rdt_write_options_init(&wo);
  wo.tag = 7;
  CHECK_OK(rdt_write(writer, &w, 1, sources, 2, &wo, 30000));
  /* The notice follows the bytes: the writer's done travels to the owner. */
  CHECK(readable_within(fd, 30000));
  rdt_write_notice n;
  rdt_write_notice_init(&n);
  CHECK_OK(rdt_write_notice_wait(exposed, 30000, &n));
  CHECK(n.status == RDT_OK && n.tag == 7 && n.nbytes == N * sizeof(float) + M);
  CHECK(n.message[0] == '\0' && strlen(n.writer) == 32);
  CHECK(memcmp(weights, src_w, N * sizeof(float)) == 0);
  CHECK(memcmp(bias, src_b, M) == 0);
  CHECK(!readable(fd));
  CHECK_STATUS(rdt_write_notice_wait(exposed, 0, &n), RDT_ERR_TIMEOUT);

  /* Bytes [10, 20) of the second tensor, started and waited on as a fetch. */
  uint8_t patch[10];
  memset(patch, 0xEE, sizeof patch);
  int64_t shape_p[1] = {10};
  rdt_tensor patch_t = u8_tensor(patch, shape_p);
  rdt_source_range dest = {.ref = 0, .tensor = 1, .offset = 10, .length = 10};
  wo.tag = 8;
  wo.destinations = &dest;
  wo.num_destinations = 1;
  rdt_fetch *op = NULL;
  CHECK_OK(rdt_write_start(writer, &w, 1, &patch_t, 1, &wo, &op));
  CHECK_OK(rdt_fetch_wait(op, 30000));
  CHECK_OK(rdt_fetch_free(op));
  rdt_write_notice_init(&n);
  CHECK_OK(rdt_write_notice_wait(exposed, 30000, &n));
  CHECK(n.status == RDT_OK && n.tag == 8 && n.nbytes == 10);
  for (int i = 0; i < M; i++)
    CHECK(bias[i] == ((i >= 10 && i < 20) ? 0xEE : (uint8_t)(200 - i)));

  /* Refusals: past the tensor, a read ref, a fetch of a writable ref. */
  dest.offset = 95;
  CHECK_STATUS(rdt_write(writer, &w, 1, &patch_t, 1, &wo, 30000), RDT_ERR_INVALID_ARGUMENT);
  rdt_ref *put = NULL;
  CHECK_OK(rdt_put(owner, &patch_t, 1, NULL, NULL, NULL, &put));
  rdt_ref *r = pass_ref(put, writer);
  CHECK_STATUS(rdt_write(writer, &r, 1, &patch_t, 1, NULL, 30000), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("not writable");
  CHECK_STATUS(rdt_get(writer, &w, 1, sources, 2, NULL, 30000), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("exposed for writing");

  /* Revoked: the owner admits nothing more. */
  CHECK_OK(rdt_ref_revoke_writes(exposed, 30000));
  CHECK_STATUS(rdt_write(writer, &w, 1, sources, 2, NULL, 30000), RDT_ERR_PERMISSION_DENIED);
  CHECK_MSG("revoked");
  CHECK(memcmp(weights, src_w, N * sizeof(float)) == 0);

  rdt_stats st = stats_of(writer);
  CHECK(st.writes_completed == 2 && st.bytes_written == N * sizeof(float) + M + 10);
  CHECK(st.writes_failed == 1); /* the revoked one; the others failed before starting */

  CHECK_OK(rdt_ref_release(r));
  CHECK_OK(rdt_ref_release(put));
  CHECK_OK(rdt_ref_release(w));
  CHECK_OK(rdt_ref_release(exposed));
  CHECK_OK(rdt_wait_tensor_freed(owner, weights, 30000));
  CHECK_OK(rdt_runtime_destroy(writer));
  CHECK_OK(rdt_runtime_destroy(owner));
  free(weights);
  free(bias);
  free(src_w);
  free(src_b);
  printf("test_write: ok\n");
  return 0;
}
