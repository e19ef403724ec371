/* Views through the C ABI: two socket runtimes of one process (one host)
 * share the owner's staged copy; the mapping is read-only or, asked for,
 * copy-on-write; the view keeps the object borrowed and outlives the
 * owner's runtime; what cannot be viewed and bad handles fail clearly. */
#include <setjmp.h>
#include <signal.h>
#include <unistd.h>

#include "test_util.h"

enum { N = 1 << 20 }; /* floats: 4 MiB, a segment of its own */

static sigjmp_buf faulted;
static void on_segv(int sig) {
  (void)sig;
  siglongjmp(faulted, 1);
}

/* Whether writing *p faults. */
static int write_faults(volatile float *p) {
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_segv;
  sigaction(SIGSEGV, &sa, &old);
  int faults = 1;
  if (sigsetjmp(faulted, 1) == 0) {
    *p = 1.0f;
    faults = 0;
  }
  sigaction(SIGSEGV, &old, NULL);
  return faults;
}

int main(void) {
  rdt_runtime *owner = socket_runtime("owner"), *reader = socket_runtime("reader");
  float *src = malloc(N * sizeof(float));
  for (int i = 0; i < N; i++) src[i] = (float)i;
  int64_t shape[1] = {N};
  rdt_tensor t = f32_tensor(src, shape);
  rdt_ref *ref = NULL;
  CHECK_OK(rdt_put(owner, &t, 1, NULL, NULL, NULL, &ref));
  rdt_ref *theirs = pass_ref(ref, reader);

  rdt_view *a = NULL, *b = NULL;
  CHECK_OK(rdt_view_open(reader, theirs, NULL, 30000, &a));
  rdt_view_options vo;
  rdt_view_options_init(&vo);
  vo.flags = RDT_VIEW_PRIVATE;
  CHECK_OK(rdt_view_open(reader, theirs, &vo, 30000, &b));
  CHECK_OK(rdt_ref_release(theirs)); /* the views hold their own */
  void *pa = NULL, *pb = NULL;
  int mapped = 0;
  CHECK_OK(rdt_view_data(a, &pa, 1, &mapped));
  CHECK(mapped == 1 && pa != (void *)src);
  CHECK_OK(rdt_view_data(b, &pb, 1, NULL));
  uint64_t held = 0;
  CHECK_OK(rdt_view_sizes(a, &held, 1));
  CHECK(held == N * sizeof(float));
  CHECK_STATUS(rdt_view_sizes(a, NULL, 1), RDT_ERR_INVALID_ARGUMENT);
  uint64_t two_sizes[2];
  CHECK_STATUS(rdt_view_sizes(a, two_sizes, 2), RDT_ERR_INVALID_ARGUMENT);
  CHECK(memcmp(pa, src, N * sizeof(float)) == 0);
  src[7] = -1; /* the put's buffer changes: a view holds the staged bytes */
  CHECK(((float *)pa)[7] == 7.0f);
  CHECK(write_faults((float *)pa + 3)); /* read-only */
  CHECK(!write_faults((float *)pb + 3)); /* copy-on-write */
  CHECK(((float *)pb)[3] == 1.0f && ((float *)pa)[3] == 3.0f);
  rdt_stats s = stats_of(reader);
  CHECK(s.views_open == 2 && s.bytes_viewed == 2ull * N * sizeof(float));
  CHECK(s.transfers_completed == 0);

  /* Borrowed by the views: freed only once both are released. */
  CHECK_OK(rdt_ref_release(ref));
  usleep(100000);
  CHECK(stats_of(owner).objects_freed == 0);
  CHECK_OK(rdt_view_release(b));
  CHECK_STATUS(rdt_view_release(b), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_view_data(b, &pb, 1, NULL), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_view_sizes(b, &held, 1), RDT_ERR_INVALID_ARGUMENT);

  /* The owner's runtime destroyed: the view reads what it read. */
  CHECK_OK(rdt_runtime_destroy(owner));
  for (int i = 0; i < N; i += 4096) CHECK(((float *)pa)[i] == (float)i);
  void *two[2];
  CHECK_STATUS(rdt_view_data(a, two, 2, NULL), RDT_ERR_INVALID_ARGUMENT); /* it has one tensor */
  CHECK_STATUS(rdt_view_data(a, NULL, 1, NULL), RDT_ERR_INVALID_ARGUMENT);
  CHECK_OK(rdt_view_release(a));
  CHECK(stats_of(reader).views_open == 0 && stats_of(reader).bytes_viewed == 0);
  CHECK_OK(rdt_view_release(NULL));

  /* A runtime's own object: its put tensor, not mapped. */
  rdt_ref *mine = NULL;
  CHECK_OK(rdt_put(reader, &t, 1, NULL, NULL, NULL, &mine));
  rdt_view *own = NULL;
  CHECK_OK(rdt_view_open(reader, mine, NULL, 1000, &own));
  CHECK_OK(rdt_view_data(own, &pa, 1, &mapped));
  CHECK(pa == (void *)src && mapped == 0);
  CHECK_OK(rdt_view_release(own));

  /* The reader's runtime destroyed under an open view: the mapping stays
   * readable until the view is released, and releasing it is safe. */
  rdt_runtime *owner2 = socket_runtime("owner2"), *reader2 = socket_runtime("reader2");
  rdt_ref *r2 = NULL;
  for (int i = 0; i < N; i++) src[i] = (float)(2 * i);
  CHECK_OK(rdt_put(owner2, &t, 1, "shm", NULL, NULL, &r2));
  rdt_ref *t2 = pass_ref(r2, reader2);
  rdt_view *v2 = NULL;
  CHECK_OK(rdt_view_open(reader2, t2, NULL, 30000, &v2));
  CHECK_OK(rdt_view_data(v2, &pa, 1, NULL));
  CHECK_OK(rdt_ref_release(t2));
  CHECK_OK(rdt_runtime_destroy(reader2));
  CHECK(((float *)pa)[N - 1] == (float)(2 * (N - 1)));
  CHECK_OK(rdt_view_release(v2));
  CHECK_OK(rdt_ref_release(r2));
  CHECK_OK(rdt_runtime_destroy(owner2));

  /* Refusals. */
  rdt_view *none = NULL;
  CHECK_STATUS(rdt_view_open(reader, mine, NULL, 1000, NULL), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_view_open(reader, NULL, NULL, 1000, &none), RDT_ERR_INVALID_ARGUMENT);
  vo.flags = 1u << 7;
  CHECK_STATUS(rdt_view_open(reader, mine, &vo, 1000, &none), RDT_ERR_INVALID_ARGUMENT);
  vo.struct_size = 2;
  CHECK_STATUS(rdt_view_open(reader, mine, &vo, 1000, &none), RDT_ERR_INVALID_ARGUMENT);
  CHECK(none == NULL);
  CHECK_OK(rdt_ref_release(mine));
  CHECK_STATUS(rdt_view_open(reader, mine, NULL, 1000, &none), RDT_ERR_INVALID_ARGUMENT); /* released */
  CHECK_OK(rdt_runtime_destroy(reader));
  free(src);
  printf("test_view: ok\n");
  return 0;
}
