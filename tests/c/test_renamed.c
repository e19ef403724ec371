/* The names rdt.h renamed (its "Renamed names" section) still compile, link
 * and work: a program written against the earlier header gets and writes
 * with them exactly as with the new names. Built with
 * -Wno-deprecated-declarations; CMakeLists.txt also checks that, without it,
 * each old name warns and names its replacement. */
#include "test_util.h"

enum { N = 256 };

static void fill(float *p, float base) {
  for (int i = 0; i < N; i++) p[i] = base + (float)i;
}

/* rdt_fetch_start and the rdt_fetch handle calls, with rdt_fetch_options
 * and an rdt_source_range: a partial get of the second half. */
static void old_get(rdt_runtime *owner, rdt_runtime *reader) {
  float src[N], dst[N / 2];
  int64_t shape[1] = {N}, half[1] = {N / 2};
  rdt_tensor t = f32_tensor(src, shape), out = f32_tensor(dst, half);
  fill(src, 0);
  rdt_ref *ref = NULL;
  CHECK_OK(rdt_put(owner, &t, 1, NULL, NULL, NULL, &ref));
  rdt_ref *theirs = pass_ref(ref, reader);

  rdt_source_range range = {0, 0, (N / 2) * sizeof(float), RDT_REST_OF_TENSOR};
  rdt_fetch_options opts;
  rdt_fetch_options_init(&opts);
  opts.sources = &range;
  opts.num_sources = 1;
  rdt_fetch *f = NULL;
  CHECK_OK(rdt_fetch_start(reader, &theirs, 1, &out, 1, &opts, &f));
  int fd = -1;
  CHECK_OK(rdt_fetch_event_fd(f, &fd));
  CHECK(fd >= 0);
  CHECK_OK(rdt_fetch_wait(f, 30000));
  CHECK(memcmp(dst, src + N / 2, sizeof dst) == 0);
  CHECK_OK(rdt_fetch_abort(f)); /* after completion: the result stays */
  CHECK_OK(rdt_fetch_wait(f, 0));
  CHECK_OK(rdt_fetch_free(f));
  /* The old names are the new calls: a freed handle is refused alike. */
  CHECK_STATUS(rdt_fetch_wait(f, 0), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("rdt_pending_wait");

  /* rdt_fetch_prepare. */
  rdt_prepared *p = NULL;
  CHECK_OK(rdt_fetch_prepare(reader, &theirs, 1, &out, 1, &opts, &p));
  fill(src, 1000);
  CHECK_OK(rdt_prepared_run(p, 0, 30000));
  CHECK(memcmp(dst, src + N / 2, sizeof dst) == 0);
  CHECK_OK(rdt_prepared_free(p));

  CHECK_OK(rdt_ref_release(theirs));
  CHECK_OK(rdt_ref_release(ref));
}

/* rdt_write_start into an rdt_fetch, and rdt_write_prepare. */
static void old_write(rdt_runtime *owner, rdt_runtime *writer) {
  float slot[N] = {0}, src[N];
  int64_t shape[1] = {N};
  rdt_tensor t = f32_tensor(slot, shape), in = f32_tensor(src, shape);
  rdt_ref *exposed = NULL;
  rdt_ref *w = expose_to(owner, &t, NULL, writer, &exposed);
  rdt_write_notice note;
  rdt_write_notice_init(&note);

  fill(src, 7);
  rdt_write_options wo;
  rdt_write_options_init(&wo);
  wo.tag = 1;
  rdt_fetch *f = NULL;
  CHECK_OK(rdt_write_start(writer, &w, 1, &in, 1, &wo, &f));
  CHECK_OK(rdt_fetch_wait(f, 30000));
  CHECK_OK(rdt_fetch_free(f));
  CHECK_OK(rdt_write_notice_wait(exposed, 30000, &note));
  CHECK(note.status == RDT_OK && note.tag == 1);
  CHECK(memcmp(slot, src, sizeof src) == 0);

  rdt_prepared *p = NULL;
  CHECK_OK(rdt_write_prepare(writer, &w, 1, &in, 1, NULL, &p));
  fill(src, 70);
  CHECK_OK(rdt_prepared_run(p, 2, 30000));
  CHECK_OK(rdt_write_notice_wait(exposed, 30000, &note));
  CHECK(note.status == RDT_OK && note.tag == 2);
  CHECK(memcmp(slot, src, sizeof src) == 0);
  CHECK_OK(rdt_prepared_free(p));

  CHECK_OK(rdt_ref_release(w));
  CHECK_OK(rdt_ref_release(exposed));
}

int main(void) {
  rdt_runtime *a = socket_runtime("owner"), *b = socket_runtime("other");
  old_get(a, b);
  old_write(a, b);
  CHECK_OK(rdt_runtime_destroy(b));
  CHECK_OK(rdt_runtime_destroy(a));
  printf("test_renamed: ok\n");
  return 0;
}
