/* rdt_transport_list_unavailable and rdt_build_info. ctest points the GPU
 * transports' libraries at paths that do not exist (RDT_CUDA_LIBRARY,
 * RDT_NCCL_LIBRARY, RDT_NIXL_LIBRARY), so cuda_ipc, nccl and nixl are
 * missing on every host, GPU or not, each with a reason naming its path. */
#include "test_util.h"

#include <stddef.h>

static rdt_runtime *builtin_runtime(void) {
  rdt_runtime_options opts;
  rdt_runtime_options_init(&opts);
  opts.name = "unavailable";
  opts.flags = RDT_RUNTIME_IN_PROCESS;
  rdt_runtime *rt = NULL;
  CHECK_OK(rdt_runtime_create(&opts, &rt));
  return rt;
}

static void lists_missing_builtins_with_their_reasons(rdt_runtime *rt) {
  size_t count = 0;
  CHECK_OK(rdt_transport_list_unavailable(rt, NULL, 0, &count));
  CHECK(count == 3);
  rdt_unavailable_transport infos[4];
  for (int i = 0; i < 4; i++) rdt_unavailable_transport_init(&infos[i]);
  CHECK_OK(rdt_transport_list_unavailable(rt, infos, 4, &count));
  CHECK(count == 3);
  const char *names[3] = {"cuda_ipc", "nccl", "nixl"};
  const char *paths[3] = {"/nonexistent/libcuda.so.1", "/nonexistent/libnccl.so.2",
                          "/nonexistent/libnixl_capi.so"};
  for (int i = 0; i < 3; i++) {
    CHECK(strcmp(infos[i].name, names[i]) == 0);
    CHECK(infos[i].status == RDT_ERR_UNSUPPORTED);
    CHECK(strstr(infos[i].reason, paths[i]) != NULL);
    CHECK(infos[i].struct_size == sizeof infos[i]);
  }
  CHECK(infos[3].name[0] == '\0'); /* beyond count: untouched */

  /* A short array gets the first entries and the full count. */
  rdt_unavailable_transport one;
  rdt_unavailable_transport_init(&one);
  CHECK_OK(rdt_transport_list_unavailable(rt, &one, 1, &count));
  CHECK(count == 3 && strcmp(one.name, "cuda_ipc") == 0);

  /* An older, shorter struct (no reason) is filled up to its size, with
   * that stride. */
  struct old_info {
    uint32_t struct_size;
    int32_t status;
    char name[RDT_NAME_MAX + 1];
  } old[3];
  memset(old, 0x7f, sizeof old);
  for (int i = 0; i < 3; i++) old[i].struct_size = sizeof old[i];
  CHECK_OK(rdt_transport_list_unavailable(rt, (rdt_unavailable_transport *)old, 3, &count));
  CHECK(strcmp(old[1].name, "nccl") == 0 && old[2].status == RDT_ERR_UNSUPPORTED);
  CHECK(old[2].struct_size == sizeof old[2]);
}

static void rejects_bad_arguments(rdt_runtime *rt) {
  rdt_unavailable_transport info;
  rdt_unavailable_transport_init(&info);
  size_t count = 0;
  CHECK_STATUS(rdt_transport_list_unavailable(rt, &info, 1, NULL), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_transport_list_unavailable(rt, NULL, 1, &count), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_transport_list_unavailable(NULL, &info, 1, &count), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_transport_list_unavailable((rdt_runtime *)(uintptr_t)0x1234, &info, 1, &count),
               RDT_ERR_INVALID_ARGUMENT);
  info.struct_size = 4; /* too small to hold status */
  CHECK_STATUS(rdt_transport_list_unavailable(rt, &info, 1, &count), RDT_ERR_INVALID_ARGUMENT);
  CHECK(strstr(rdt_last_error(), "struct_size") != NULL);
}

static void build_info_names_the_toolchain(void) {
  const char *info = rdt_build_info();
  CHECK(info != NULL);
  CHECK(strncmp(info, "go=go", 5) == 0);
  CHECK(strstr(info, "\nos=linux\n") != NULL);
  CHECK(strstr(info, "\nbuildmode=c-shared") != NULL);
  CHECK(strstr(info, "\ncc=") != NULL);
  CHECK(rdt_build_info() == info); /* static storage, made once */
}

int main(void) {
  rdt_runtime *rt = builtin_runtime();
  lists_missing_builtins_with_their_reasons(rt);
  rejects_bad_arguments(rt);
  CHECK_OK(rdt_runtime_destroy(rt));
  build_info_names_the_toolchain();
  printf("test_unavailable: ok\n");
  return 0;
}
