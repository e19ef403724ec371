// Compiled as C++17 with -Wall -Wextra -pedantic -Werror.
#include <rdt.h>

#include <type_traits>

static_assert(std::is_standard_layout<rdt_tensor>::value, "rdt_tensor is a C struct");
static_assert(sizeof(rdt_dtype) == 4, "rdt_dtype matches DLDataType");
static_assert(sizeof(rdt_device) == 8, "rdt_device matches DLDevice");

int main() {
  rdt_runtime_options opts;
  rdt_runtime_options_init(&opts);
  rdt_transport_vtable vt;
  rdt_transport_vtable_init(&vt);
  return opts.abi_version == RDT_ABI_VERSION && vt.recv == nullptr ? 0 : 1;
}
