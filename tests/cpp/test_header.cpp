// Compiled as C++17 and as C++20 with -Wall -Wextra -pedantic -Werror (and
// -Wshadow -Wconversion -Wsign-conversion -Wold-style-cast): the
// wrapper is clean in both, and with C++20 rdt::view takes std::span.
#include <rdt/rdt.hpp>

#include <cstdio>

struct Noop : rdt::Transport {
  bool one_sided() const override { return true; }
};

int main() {
  int failures = 0;
  std::vector<float> v(6, 1.0f);
  rdt::Tensor t = rdt::tensor(v, {2, 3});
  if (t.nbytes() != 24) failures++;
#if defined(__cpp_lib_span)
  std::span<float> s(v);
  if (rdt::tensor(s).numel() != 6 || rdt::tensor(s, {3, 2}).shape[0] != 3) failures++;
  std::span<const float, 6> fixed(v.data(), 6);
  if (rdt::tensor(fixed).data != v.data()) failures++;
  std::puts("C++20: std::span views");
#else
  std::puts("C++17");
#endif
  try {
    rdt::Runtime rt;
    rdt::register_transport(rt, "noop", {RDT_DEVICE_CPU}, std::make_unique<Noop>());
    rdt::Ref ref = rt.put({t});
    std::vector<float> out(6);
    rt.get(ref, {rdt::tensor(out, {2, 3})}, std::chrono::seconds(10));
    if (out != v) failures++;
  } catch (const rdt::Error &e) {
    std::fprintf(stderr, "%s\n", e.what());
    failures++;
  }
  return failures;
}
