/* rdt_runtime_fetch_histograms: after a known set of fetches between two
 * runtimes, the exact counts per transport and size class; capacity 0 and
 * small capacities; NULL arguments; the caller's struct_size as stride. */
#include <stddef.h>

#include "test_util.h"

/* Puts `times` objects of `floats` float32 each on `a` with transport
 * `name` and fetches each once from `b`. */
static void fetch_n(rdt_runtime *a, rdt_runtime *b, const char *name, int floats,
                    int times) {
  float *src = calloc((size_t)floats, sizeof(float)), *dst = calloc((size_t)floats, sizeof(float));
  CHECK(src != NULL && dst != NULL);
  int64_t shape[1] = {floats};
  rdt_tensor t = f32_tensor(src, shape), target = f32_tensor(dst, shape);
  for (int i = 0; i < times; i++) {
    src[0] = (float)i + 1.0f;
    rdt_ref *ref;
    CHECK_OK(rdt_put(a, &t, 1, name, NULL, NULL, &ref));
    rdt_ref *borrowed = pass_ref(ref, b);
    CHECK_OK(rdt_get(b, &borrowed, 1, &target, 1, NULL, 30000));
    CHECK(dst[0] == src[0]);
    CHECK_OK(rdt_ref_release(borrowed));
    CHECK_OK(rdt_ref_release(ref));
    CHECK_OK(rdt_wait_tensor_freed(a, src, 30000));
  }
  free(src);
  free(dst);
}

static uint64_t bucket_sum(const rdt_fetch_histogram *h) {
  uint64_t sum = 0;
  for (int b = 0; b < RDT_FETCH_LATENCY_BUCKETS; b++) sum += h->buckets[b];
  return sum;
}

int main(void) {
  /* The bounds the header gives. */
  CHECK(RDT_FETCH_SIZE_CLASS_MAX_BYTES(0) == 4096);
  CHECK(RDT_FETCH_SIZE_CLASS_MAX_BYTES(RDT_FETCH_SIZE_CLASSES - 2) == 256u << 20);
  CHECK(RDT_FETCH_LATENCY_BUCKET_MAX_US(RDT_FETCH_LATENCY_BUCKETS - 2) == 1u << 23);

  rdt_runtime *a = socket_runtime("owner"), *b = socket_runtime("reader");
  size_t count = 99;
  CHECK_OK(rdt_runtime_fetch_histograms(b, NULL, 0, &count));
  CHECK(count == 0); /* nothing fetched yet */

  fetch_n(a, b, "shm", 256, 3);        /* 1 KiB: class 0 */
  fetch_n(a, b, "tcp", 25600, 2);      /* 100 KiB: class 2 */
  CHECK(25600 * 4 > RDT_FETCH_SIZE_CLASS_MAX_BYTES(1) &&
        25600 * 4 <= RDT_FETCH_SIZE_CLASS_MAX_BYTES(2));

  CHECK_OK(rdt_runtime_fetch_histograms(b, NULL, 0, &count));
  CHECK(count == 2);
  rdt_fetch_histogram hs[4];
  for (int i = 0; i < 4; i++) rdt_fetch_histogram_init(&hs[i]);
  count = 0;
  CHECK_OK(rdt_runtime_fetch_histograms(b, hs, 4, &count));
  CHECK(count == 2);
  /* Sorted by transport name: shm, then tcp. */
  CHECK(strcmp(hs[0].transport, "shm") == 0);
  CHECK(hs[0].size_class == 0);
  CHECK(hs[0].count == 3 && bucket_sum(&hs[0]) == 3);
  CHECK(hs[0].bytes == 3 * 1024);
  CHECK(hs[0].failures == 0);
  CHECK(hs[0].sum_ns > 0);
  CHECK(strcmp(hs[1].transport, "tcp") == 0);
  CHECK(hs[1].size_class == 2);
  CHECK(hs[1].count == 2 && bucket_sum(&hs[1]) == 2);
  CHECK(hs[1].bytes == 2 * 102400);
  CHECK(hs[2].struct_size == sizeof hs[2] && hs[2].count == 0); /* untouched */
  /* The owner served these fetches; its histograms count only its own. */
  CHECK_OK(rdt_runtime_fetch_histograms(a, NULL, 0, &count));
  CHECK(count == 0);

  /* A small capacity gets the first entries and the full count. */
  rdt_fetch_histogram one;
  rdt_fetch_histogram_init(&one);
  CHECK_OK(rdt_runtime_fetch_histograms(b, &one, 1, &count));
  CHECK(count == 2);
  CHECK(strcmp(one.transport, "shm") == 0 && one.count == 3);

  /* The stride is the caller's struct_size: a newer caller's larger struct
   * keeps its tail, an older caller's smaller one gets only what fits. */
  struct bigger {
    rdt_fetch_histogram h;
    uint64_t tail;
  } big[2];
  for (int i = 0; i < 2; i++) {
    rdt_fetch_histogram_init(&big[i].h);
    big[i].h.struct_size = sizeof big[i];
    big[i].tail = 0xfeedu;
  }
  CHECK_OK(rdt_runtime_fetch_histograms(b, &big[0].h, 2, &count));
  CHECK(big[1].h.count == 2 && strcmp(big[1].h.transport, "tcp") == 0);
  CHECK(big[0].tail == 0xfeedu && big[1].tail == 0xfeedu);
  CHECK(big[0].h.struct_size == sizeof big[0]);
  size_t older = offsetof(rdt_fetch_histogram, buckets);
  uint64_t words[2 * sizeof(rdt_fetch_histogram) / 8]; /* aligned storage */
  unsigned char *raw = (unsigned char *)words;
  memset(raw, 0xab, sizeof words);
  rdt_fetch_histogram *first = (rdt_fetch_histogram *)(void *)raw;
  first->struct_size = (uint32_t)older;
  CHECK_OK(rdt_runtime_fetch_histograms(b, first, 2, &count));
  rdt_fetch_histogram second;
  memcpy(&second, raw + older, older);
  CHECK(first->count == 3 && second.count == 2 && second.struct_size == older);
  CHECK(strcmp(second.transport, "tcp") == 0);
  CHECK(raw[2 * older] == 0xab); /* nothing written past the two entries */

  /* A write is counted as a get is, under its own direction: b writes
   * 1 KiB twice into an object a exposed over shm. */
  float exposed[256] = {0}, ones[256];
  for (int i = 0; i < 256; i++) ones[i] = 1.0f;
  int64_t shape[1] = {256};
  rdt_tensor et = f32_tensor(exposed, shape), wt = f32_tensor(ones, shape);
  rdt_ref *writable;
  CHECK_OK(rdt_expose(a, &et, 1, "shm", NULL, NULL, &writable));
  rdt_ref *into = pass_ref(writable, b);
  for (int i = 0; i < 2; i++) CHECK_OK(rdt_write(b, &into, 1, &wt, 1, NULL, 30000));
  CHECK(exposed[255] == 1.0f);
  for (int i = 0; i < 4; i++) rdt_fetch_histogram_init(&hs[i]);
  CHECK_OK(rdt_runtime_fetch_histograms(b, hs, 4, &count));
  CHECK(count == 3); /* by transport, then direction: shm get, shm write, tcp get */
  CHECK(strcmp(hs[0].transport, "shm") == 0 && hs[0].direction == RDT_DIRECTION_GET && hs[0].count == 3);
  CHECK(strcmp(hs[1].transport, "shm") == 0 && hs[1].direction == RDT_DIRECTION_WRITE);
  CHECK(hs[1].count == 2 && hs[1].bytes == 2 * 1024 && hs[1].size_class == 0 && bucket_sum(&hs[1]) == 2);
  CHECK(hs[2].direction == RDT_DIRECTION_GET && strcmp(hs[2].transport, "tcp") == 0);
  rdt_transport_info infos[8];
  for (int i = 0; i < 8; i++) rdt_transport_info_init(&infos[i]);
  size_t ntransports = 0;
  CHECK_OK(rdt_transport_list(b, infos, 8, &ntransports));
  int seen = 0;
  for (size_t i = 0; i < ntransports && i < 8; i++) {
    if (strcmp(infos[i].name, "shm") != 0) continue;
    seen = 1;
    CHECK(infos[i].writes_completed == 2 && infos[i].bytes_written == 2 * 1024 && infos[i].writes_failed == 0);
    CHECK(infos[i].transfers_completed == 3); /* the gets alone */
  }
  CHECK(seen);
  /* A caller whose struct ends before `direction` cannot tell a write's
   * entry from a get's: it is given the gets only. */
  size_t before_direction = offsetof(rdt_fetch_histogram, direction);
  memset(raw, 0xab, sizeof words);
  first->struct_size = (uint32_t)before_direction;
  CHECK_OK(rdt_runtime_fetch_histograms(b, first, 2, &count));
  CHECK(count == 2);
  memcpy(&second, raw + before_direction, before_direction);
  CHECK(first->count == 3 && strcmp(second.transport, "tcp") == 0 && second.count == 2);
  CHECK_OK(rdt_ref_release(into));
  CHECK_OK(rdt_ref_release(writable));

  /* Bad arguments: a status and a message, never a crash. */
  CHECK_STATUS(rdt_runtime_fetch_histograms(b, hs, 4, NULL), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("count is NULL");
  CHECK_STATUS(rdt_runtime_fetch_histograms(b, NULL, 1, &count), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("out is NULL");
  CHECK_STATUS(rdt_runtime_fetch_histograms(NULL, NULL, 0, &count), RDT_ERR_INVALID_ARGUMENT);
  rdt_fetch_histogram bad;
  rdt_fetch_histogram_init(&bad);
  bad.struct_size = 2;
  CHECK_STATUS(rdt_runtime_fetch_histograms(b, &bad, 1, &count), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("struct_size");

  CHECK_OK(rdt_runtime_destroy(b));
  CHECK_STATUS(rdt_runtime_fetch_histograms(b, NULL, 0, &count), RDT_ERR_INVALID_ARGUMENT);
  CHECK_OK(rdt_runtime_destroy(a));
  printf("test_metrics: ok\n");
  return 0;
}
