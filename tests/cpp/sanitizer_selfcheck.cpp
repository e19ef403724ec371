// Sanitizer build only: proves that the sanitizers still see the bugs they
// exist for in a process running librdt's Go runtime. Each mode commits one
// bug after creating a runtime; ctest expects the sanitizer's report.
//   leak      rdt_ref_serialize bytes never freed (LeakSanitizer: the
//             suppression for Go's own allocation must not hide this)
//   overflow  a heap buffer overflow (AddressSanitizer)
//   segv      a wild write (AddressSanitizer's SEGV report, through Go's
//             signal handler, which forwards faults outside Go code)
//   ub        signed integer overflow (UndefinedBehaviorSanitizer)
#include <rdt/rdt.hpp>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char **argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  rdt::Options o;
  o.log_level = RDT_LOG_OFF;
  rdt::Runtime rt(o);
  std::vector<float> v(16);
  rdt::Ref ref = rt.put({rdt::tensor(v)});
  if (mode == "leak") {
    void *bytes = nullptr;
    size_t n = 0;
    rdt::check(rdt_ref_serialize(ref.capi(), &bytes, &n));
    std::printf("serialized %zu bytes and dropped them\n", n);
    bytes = nullptr;
  } else if (mode == "overflow") {
    volatile char *p = static_cast<char *>(std::malloc(8));
    p[8] = 1;
    std::free(const_cast<char *>(p));
  } else if (mode == "segv") {
    volatile int *p = reinterpret_cast<int *>(uintptr_t(16));
    *p = 1;
  } else if (mode == "ub") {
    volatile int big = INT_MAX;
    int x = big + argc;
    std::printf("%d\n", x);
  } else {
    return 2;
  }
  return 0;
}
