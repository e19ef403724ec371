/* Compiled with -std=c99 -Wall -Wextra -pedantic -Werror: the public header
 * must stay clean C99. The inline initializers are exercised too. */
#include <rdt.h>

int main(void) {
  rdt_runtime_options opts;
  rdt_get_options fopts;
  rdt_transport_vtable vt;
  rdt_object_info info;
  rdt_tensor_info tinfo;
  rdt_transport_info tr;
  rdt_stats stats;
  rdt_runtime_options_init(&opts);
  rdt_get_options_init(&fopts);
  rdt_transport_vtable_init(&vt);
  rdt_object_info_init(&info);
  rdt_tensor_info_init(&tinfo);
  rdt_transport_info_init(&tr);
  rdt_stats_init(&stats);
  return (opts.abi_version == RDT_ABI_VERSION && opts.struct_size == sizeof opts &&
          vt.struct_size == sizeof vt && vt.write == NULL && vt.write_start == NULL &&
          stats.struct_size == sizeof stats &&
          fopts.transport == NULL && info.struct_size && tinfo.struct_size &&
          tr.struct_size)
             ? 0
             : 1;
}
