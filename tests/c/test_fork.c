/* A child forked after the library was loaded gets RDT_ERR_FORKED with an
 * explanation instead of hanging in the Go runtime; the parent is fine. */
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

static int user_data_freed;
static void note_free(void *user_data) { *(int *)user_data += 1; }

int main(void) {
  rdt_runtime *rt = new_runtime("parent");
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    rdt_runtime *child = NULL;
    rdt_status st = rdt_runtime_create(NULL, &child);
    if (st != RDT_ERR_FORKED) _exit(2);
    if (strstr(rdt_last_error(), "spawn") == NULL) _exit(3);
    if (rdt_runtime_destroy(rt) != RDT_ERR_FORKED) _exit(4);
    /* A refused registration still hands the user data back. */
    rdt_transport_vtable vt;
    rdt_transport_vtable_init(&vt);
    vt.user_data = &user_data_freed;
    vt.free_user_data = note_free;
    int32_t cpu = RDT_DEVICE_CPU;
    if (rdt_register_transport(rt, "late", &cpu, 1, &vt) != RDT_ERR_FORKED) _exit(6);
    if (user_data_freed != 1) _exit(7);
    /* Functions that never enter Go still work. */
    if (strcmp(rdt_status_string(RDT_ERR_FORKED), "RDT_ERR_FORKED") != 0) _exit(5);
    _exit(0);
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  if (WEXITSTATUS(status) != 0) {
    fprintf(stderr, "child failed at step %d\n", WEXITSTATUS(status));
    return 1;
  }
  float data[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  rdt_tensor t = f32_tensor(data, shape);
  rdt_ref *ref;
  CHECK_OK(rdt_put(rt, &t, 1, NULL, NULL, NULL, &ref));
  CHECK_OK(rdt_ref_release(ref));
  CHECK_OK(rdt_runtime_destroy(rt));
  printf("test_fork: ok\n");
  return 0;
}
