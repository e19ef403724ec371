/* Collective groups through the C ABI: argument checks, UNSUPPORTED naming
 * NCCL where NCCL is not installed, and where it is, a group of one and a
 * rank that never joins. Transfers over groups are tested in
 * transports/nccl and tests/python/test_gpu_nccl.py. */
#include "test_util.h"

static int has_transport(rdt_runtime *rt, const char *name) {
  return find_transport(rt, name, NULL);
}

int main(void) {
  rdt_runtime *rt = NULL;
  CHECK_OK(rdt_runtime_create(NULL, &rt));
  const char *addr = NULL;
  CHECK_OK(rdt_runtime_address(rt, &addr));

  /* Bad arguments: a status and a message, never a crash. */
  CHECK_STATUS(rdt_group_create(NULL, "g", 2, 0, NULL, 0, NULL, 1000), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("rt is NULL");
  CHECK_STATUS(rdt_group_create(rt, NULL, 2, 0, NULL, 0, NULL, 1000), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("name is NULL");
  CHECK_STATUS(rdt_group_create(rt, "g", 0, 0, NULL, 0, NULL, 1000), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("world size 0");
  CHECK_STATUS(rdt_group_create(rt, "g", -4, 0, NULL, 0, NULL, 1000), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_group_create(rt, "g", 70000, 0, NULL, 0, NULL, 1000), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_group_create(rt, "g", 2, 2, addr, 0, NULL, 1000), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("rank 2 is outside 0..1");
  CHECK_STATUS(rdt_group_create(rt, "g", 2, -1, addr, 0, NULL, 1000), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_group_create(rt, "g", 2, 1, NULL, 0, NULL, 1000), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("address of rank 0");
  CHECK_STATUS(rdt_group_create(rt, "g", 1, 0, NULL, -1, NULL, 1000), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("device -1");
  CHECK_STATUS(rdt_group_create(rt, "no spaces", 1, 0, NULL, 0, NULL, 1000), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("group name");
  CHECK_STATUS(rdt_group_create(rt, "", 1, 0, NULL, 0, NULL, 1000), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_group_create(rt, "g", 1, 0, NULL, 0, NULL, 0), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("timeout of 0");

  rdt_group_options opts;
  rdt_group_options_init(&opts);
  opts.struct_size = 2;
  CHECK_STATUS(rdt_group_create(rt, "g", 1, 0, NULL, 0, &opts, 1000), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("struct_size");
  /* A transport that does not form groups, and one that does not exist. */
  rdt_group_options_init(&opts);
  opts.backend = "tcp";
  CHECK_STATUS(rdt_group_create(rt, "g", 1, 0, NULL, 0, &opts, 1000), RDT_ERR_UNSUPPORTED);
  CHECK_MSG("does not form groups");
  opts.backend = "nosuch";
  CHECK_STATUS(rdt_group_create(rt, "g", 1, 0, NULL, 0, &opts, 1000), RDT_ERR_UNSUPPORTED);
  CHECK_MSG("nosuch is not available");

  /* Without NCCL (and a CUDA device) there is no nccl transport, and a
   * group says what is missing. */
  if (!has_transport(rt, "nccl")) {
    CHECK_STATUS(rdt_group_create(rt, "g", 1, 0, NULL, 0, NULL, 1000), RDT_ERR_UNSUPPORTED);
    CHECK_MSG("libnccl.so.2");
    CHECK_MSG("RDT_NCCL_LIBRARY");
    opts.backend = "NCCL"; /* case-insensitive */
    CHECK_STATUS(rdt_group_create(rt, "g", 2, 1, addr, 0, &opts, 1000), RDT_ERR_UNSUPPORTED);
  } else {
    /* With NCCL (on machines without GPUs: the test doubles of NCCL and the
     * CUDA driver, see `make fake-nccl-test`): a group of one forms, its
     * name is taken until it is destroyed, and a group whose other rank
     * never joins times out naming that rank. */
    CHECK_OK(rdt_group_create(rt, "solo", 1, 0, NULL, 0, NULL, 60000));
    CHECK_STATUS(rdt_group_create(rt, "solo", 1, 0, NULL, 0, NULL, 60000), RDT_ERR_ALREADY_EXISTS);
    CHECK_MSG("already exists");
    CHECK_OK(rdt_group_destroy(rt, "solo"));
    CHECK_STATUS(rdt_group_destroy(rt, "solo"), RDT_ERR_NOT_FOUND);
    CHECK_OK(rdt_group_create(rt, "solo", 1, 0, NULL, 0, NULL, 60000));
    CHECK_OK(rdt_group_destroy(rt, "solo"));
    CHECK_STATUS(rdt_group_create(rt, "pair", 2, 0, NULL, 0, NULL, 300), RDT_ERR_TIMEOUT);
    CHECK_MSG("ranks [1] of 2 did not join");
    CHECK_STATUS(rdt_group_destroy(rt, "pair"), RDT_ERR_NOT_FOUND);
    CHECK_STATUS(rdt_group_create(rt, "far", 1, 0, NULL, 4096, NULL, 60000), RDT_ERR_INVALID_ARGUMENT);
    CHECK_MSG("device 4096 does not exist");
  }

  /* Destroying what does not exist. */
  CHECK_STATUS(rdt_group_destroy(rt, "nope"), RDT_ERR_NOT_FOUND);
  CHECK_MSG("no group \"nope\"");
  CHECK_STATUS(rdt_group_destroy(rt, NULL), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_group_destroy(NULL, "g"), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_group_destroy(rt, "bad name"), RDT_ERR_INVALID_ARGUMENT);

  CHECK_OK(rdt_runtime_destroy(rt));
  CHECK_STATUS(rdt_group_destroy(rt, "g"), RDT_ERR_INVALID_ARGUMENT);
  printf("test_groups: ok\n");
  return 0;
}
