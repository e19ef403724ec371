/* Writing into exposed objects through the C ABI: two runtimes with the
 * socket control plane; the owner exposes buffers, the writer writes into
 * them (whole, then a byte range) over cma, and every write ends in one
 * notice that carries the writer's tag. Refusals write nothing. Then the
 * same through a transport the application registers (a write callback),
 * with a failing and an aborted write, and the registrations rdt refuses. */
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

/* Whether the runtime lists `name` with RDT_TRANSPORT_WRITES. */
static int lists_writes(rdt_runtime *rt, const char *name) {
  rdt_transport_info info;
  if (find_transport(rt, name, &info)) return (info.flags & RDT_TRANSPORT_WRITES) != 0;
  CHECK(!"transport not listed");
  return 0;
}

/* A one-range write: its bytes (up to 16), their tensor and where they go. */
typedef struct patch {
  uint8_t bytes[16];
  int64_t shape[1];
  rdt_tensor t;
  rdt_range dest;
} patch;

/* Makes p `length` bytes of `value` bound for bytes [offset, offset +
 * length) of tensor `tensor` of the first ref, and aims the writes of `wo`
 * at that range, with `tag`. */
static void aim_patch(patch *p, rdt_write_options *wo, uint64_t tag, uint32_t tensor, uint64_t offset,
                      uint8_t value, uint64_t length) {
  CHECK(length <= sizeof p->bytes);
  memset(p->bytes, value, length);
  p->shape[0] = (int64_t)length;
  p->t = u8_tensor(p->bytes, p->shape);
  p->dest = (rdt_range){.ref = 0, .tensor = tensor, .offset = offset, .length = length};
  wo->tag = tag;
  wo->destinations = &p->dest;
  wo->num_destinations = 1;
}

/* Releases the writer's ref w and the owner's exposed ref, waits until the
 * owner frees `memory`, and destroys both runtimes. */
static void end_exposed(rdt_runtime *owner, rdt_runtime *writer, rdt_ref *exposed, rdt_ref *w,
                        const void *memory) {
  CHECK_OK(rdt_ref_release(w));
  CHECK_OK(rdt_ref_release(exposed));
  CHECK_OK(rdt_wait_tensor_freed(owner, memory, 30000));
  CHECK_OK(rdt_runtime_destroy(writer));
  CHECK_OK(rdt_runtime_destroy(owner));
}

/* A transport registered through the vtable writes: memcopy_write_vtable's
 * write callback copies into the addresses its extract_metadata published
 * on the owner. */
static void custom_transport_writes(void) {
  test_transport t;
  test_transport_init(&t);
  rdt_runtime *owner = new_runtime("custom-owner"), *writer = new_runtime("custom-writer");
  register_cpu(owner, "memwrite", memcopy_write_vtable(&t));
  register_cpu(writer, "memwrite", memcopy_write_vtable(&t));
  CHECK(lists_writes(writer, "memwrite"));
  enum { N = 256 };
  uint8_t *slot = calloc(N, 1), *src = malloc(N);
  for (int i = 0; i < N; i++) src[i] = (uint8_t)(i * 3 + 1);
  int64_t shape[1] = {N};
  rdt_tensor slot_t = u8_tensor(slot, shape), src_t = u8_tensor(src, shape);
  rdt_ref *exposed = NULL;
  rdt_ref *w = expose_to(owner, &slot_t, "memwrite", writer, &exposed);

  /* Whole, tagged: every byte lands, the notice carries the tag. */
  rdt_write_options wo;
  rdt_write_options_init(&wo);
  wo.tag = 11;
  CHECK_OK(rdt_write(writer, &w, 1, &src_t, 1, &wo, 30000));
  rdt_write_notice n = take_notice(exposed);
  CHECK(n.status == RDT_OK && n.tag == 11 && n.nbytes == N);
  CHECK(memcmp(slot, src, N) == 0);
  CHECK(t.writes == 1 && t.comms >= 1);

  /* A byte range: only bytes [100, 116) change. */
  memset(slot, 0, N);
  patch p;
  aim_patch(&p, &wo, 12, 0, 100, 0xAB, 16);
  CHECK_OK(rdt_write(writer, &w, 1, &p.t, 1, &wo, 30000));
  n = take_notice(exposed);
  CHECK(n.status == RDT_OK && n.tag == 12 && n.nbytes == 16);
  for (int i = 0; i < N; i++) CHECK(slot[i] == ((i >= 100 && i < 116) ? 0xAB : 0));
  wo.destinations = NULL;
  wo.num_destinations = 0;

  /* The third write's callback fails: the writer gets its status and
   * message, the owner a failure notice with the writer's tag. */
  t.fail_at = 3;
  t.fail_status = RDT_ERR_TRANSPORT;
  t.fail_message = "the link went down";
  wo.tag = 13;
  CHECK_STATUS(rdt_write(writer, &w, 1, &src_t, 1, &wo, 30000), RDT_ERR_TRANSPORT);
  CHECK_MSG("the link went down");
  CHECK_MSG("memwrite");
  n = take_notice(exposed);
  CHECK(n.status == RDT_ERR_TRANSPORT && n.tag == 13);
  CHECK(strstr(n.message, "the link went down") != NULL);
  t.fail_at = 0;

  /* Aborted while the callback waits: abort reaches it, the wait says
   * ABORTED, the notice says the write failed. */
  pthread_mutex_lock(&t.mu);
  t.gated = 1;
  t.nevents = 0;
  pthread_mutex_unlock(&t.mu);
  wo.tag = 14;
  rdt_pending *op = NULL;
  CHECK_OK(rdt_write_start(writer, &w, 1, &src_t, 1, &wo, &op));
  pthread_mutex_lock(&t.mu);
  while (t.nevents == 0) pthread_cond_wait(&t.cond, &t.mu); /* the callback is at the gate */
  pthread_mutex_unlock(&t.mu);
  CHECK_OK(rdt_pending_abort(op));
  CHECK_STATUS(rdt_pending_wait(op, 30000), RDT_ERR_ABORTED);
  CHECK_OK(rdt_pending_free(op));
  CHECK(t.aborts == 1);
  n = take_notice(exposed);
  CHECK(n.status != RDT_OK && n.tag == 14);
  pthread_mutex_lock(&t.mu);
  t.gated = 0;
  t.write_aborted = 0;
  pthread_mutex_unlock(&t.mu);

  rdt_stats st = stats_of(writer);
  CHECK(st.writes_completed == 2 && st.writes_failed == 2);
  end_exposed(owner, writer, exposed, w, slot);
  free(slot);
  free(src);
}

/* What rdt refuses at registration, and a vtable from an older header. */
static void custom_write_refusals(void) {
  test_transport t;
  test_transport_init(&t);
  rdt_runtime *rt = new_runtime("refusals");
  int32_t cpu = RDT_DEVICE_CPU;
  rdt_transport_vtable vt = memcopy_write_vtable(&t);
  vt.flags &= ~RDT_TRANSPORT_ONE_SIDED;
  vt.send = memcopy_vtable(&t).recv; /* any send: two-sided is what is refused */
  CHECK_STATUS(rdt_register_transport(rt, "w", &cpu, 1, &vt), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("RDT_TRANSPORT_WRITES without RDT_TRANSPORT_ONE_SIDED");
  vt = memcopy_write_vtable(&t);
  vt.write = NULL;
  CHECK_STATUS(rdt_register_transport(rt, "w", &cpu, 1, &vt), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("neither write nor write_start");
  vt = memcopy_write_vtable(&t);
  vt.flags &= ~RDT_TRANSPORT_WRITES;
  CHECK_STATUS(rdt_register_transport(rt, "w", &cpu, 1, &vt), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("without setting RDT_TRANSPORT_WRITES");
  vt = memcopy_write_vtable(&t);
  vt.write = NULL;
  vt.write_start = async_vtable(&t).fetch; /* any write_start, but no wait */
  CHECK_STATUS(rdt_register_transport(rt, "w", &cpu, 1, &vt), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("together");
  CHECK(t.freed_user_data == 4); /* every refusal handed the user data back */

  /* A struct_size that ends inside the write pointer (no header ever had
   * it) would copy half a pointer and crash at the first write: refused,
   * the user data handed back. Likewise inside write_start. */
  vt = memcopy_write_vtable(&t);
  vt.struct_size = (uint32_t)(offsetof(rdt_transport_vtable, write) + sizeof(void *) / 2);
  CHECK_STATUS(rdt_register_transport(rt, "w", &cpu, 1, &vt), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("ends inside a field");
  vt.struct_size = (uint32_t)(offsetof(rdt_transport_vtable, write_start) + 1);
  CHECK_STATUS(rdt_register_transport(rt, "w", &cpu, 1, &vt), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("ends inside a field");
  CHECK(t.freed_user_data == 6);

  /* Built against a header without the write fields: registers, does not
   * write, and exposing with it is refused. */
  vt = memcopy_vtable(&t);
  vt.struct_size = (uint32_t)offsetof(rdt_transport_vtable, write);
  CHECK_OK(rdt_register_transport(rt, "older", &cpu, 1, &vt));
  CHECK(!lists_writes(rt, "older"));
  uint8_t b[4] = {0};
  int64_t shape[1] = {4};
  rdt_tensor bt = u8_tensor(b, shape);
  rdt_ref *r = NULL;
  CHECK_STATUS(rdt_expose(rt, &bt, 1, "older", NULL, NULL, &r), RDT_ERR_UNSUPPORTED);
  CHECK_OK(rdt_put(rt, &bt, 1, "older", NULL, NULL, &r)); /* it still moves puts */
  CHECK_OK(rdt_ref_release(r));
  CHECK_OK(rdt_runtime_destroy(rt));
  CHECK(t.freed_user_data == 7);
}

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
  rdt_write_notice n = take_notice(exposed);
  CHECK(n.status == RDT_OK && n.tag == 7 && n.nbytes == N * sizeof(float) + M);
  CHECK(n.message[0] == '\0' && strlen(n.writer) == 32);
  CHECK(memcmp(weights, src_w, N * sizeof(float)) == 0);
  CHECK(memcmp(bias, src_b, M) == 0);
  CHECK(!readable(fd));
  CHECK_STATUS(rdt_write_notice_wait(exposed, 0, &n), RDT_ERR_TIMEOUT);

  /* Bytes [10, 20) of the second tensor, started and waited on as a fetch. */
  patch p;
  aim_patch(&p, &wo, 8, 1, 10, 0xEE, 10);
  rdt_pending *op = NULL;
  CHECK_OK(rdt_write_start(writer, &w, 1, &p.t, 1, &wo, &op));
  CHECK_OK(rdt_pending_wait(op, 30000));
  CHECK_OK(rdt_pending_free(op));
  n = take_notice(exposed);
  CHECK(n.status == RDT_OK && n.tag == 8 && n.nbytes == 10);
  for (int i = 0; i < M; i++)
    CHECK(bias[i] == ((i >= 10 && i < 20) ? 0xEE : (uint8_t)(200 - i)));

  /* Refusals: past the tensor, a read ref, a fetch of a writable ref. */
  p.dest.offset = 95;
  CHECK_STATUS(rdt_write(writer, &w, 1, &p.t, 1, &wo, 30000), RDT_ERR_INVALID_ARGUMENT);
  rdt_ref *put = NULL;
  CHECK_OK(rdt_put(owner, &p.t, 1, NULL, NULL, NULL, &put));
  rdt_ref *r = pass_ref(put, writer);
  CHECK_STATUS(rdt_write(writer, &r, 1, &p.t, 1, NULL, 30000), RDT_ERR_INVALID_ARGUMENT);
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
  end_exposed(owner, writer, exposed, w, weights);
  free(weights);
  free(bias);
  free(src_w);
  free(src_b);
  custom_transport_writes();
  custom_write_refusals();
  printf("test_write: ok\n");
  return 0;
}
