/* The README example: two runtimes, a tensor put in one and fetched into
 * the other. Built against an installed rdt by tests/consumer/run.sh. */
#include <rdt.h>
#include <stdio.h>

int main(void) {
  rdt_runtime *owner, *reader;
  rdt_runtime_create(NULL, &owner);
  rdt_runtime_create(NULL, &reader);

  float src[4] = {1, 2, 3, 4}, dst[4] = {0};
  int64_t shape[1] = {4};
  rdt_tensor t = {.data = src, .device = {RDT_DEVICE_CPU, 0}, .ndim = 1,
                  .dtype = {RDT_DTYPE_FLOAT, 32, 1}, .shape = shape};
  rdt_ref *ref, *borrowed;
  rdt_put(owner, &t, 1, NULL, NULL, NULL, &ref);   /* NULL: choose per fetch */

  void *bytes; size_t n;                            /* what you send to a peer */
  rdt_ref_serialize(ref, &bytes, &n);
  rdt_ref_deserialize(reader, bytes, n, &borrowed); /* in the peer */
  rdt_bytes_free(bytes);

  t.data = dst;
  rdt_status st = rdt_get(reader, &borrowed, 1, &t, 1, NULL, 5000);
  printf("%s: %g %g %g %g\n", rdt_status_string(st), dst[0], dst[1], dst[2], dst[3]);

  rdt_ref_release(borrowed);
  rdt_ref_release(ref);                             /* now src may be freed */
  rdt_runtime_destroy(reader);
  rdt_runtime_destroy(owner);
  return st != RDT_OK;
}
