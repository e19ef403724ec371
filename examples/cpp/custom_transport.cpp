// A custom transport in C++: a one-sided "copy" transport for runtimes in
// one process, registered under the same name in both. Exceptions thrown in
// its methods reach the caller of get() as rdt::Error(RDT_ERR_USER).
#include <rdt/rdt.hpp>

#include <cstdio>
#include <cstring>

class CopyTransport : public rdt::Transport {
 public:
  bool one_sided() const override { return true; }
  // The source describes where its tensors live (same process only).
  std::vector<uint8_t> extract_metadata(const std::string &, const std::vector<rdt_tensor> &ts) override {
    std::vector<uint8_t> m(ts.size() * sizeof(void *));
    for (size_t i = 0; i < ts.size(); i++) std::memcpy(&m[i * sizeof(void *)], &ts[i].data, sizeof(void *));
    return m;
  }
  void recv(const rdt::Transfer &, const std::vector<rdt_tensor> &targets, const std::vector<uint8_t> &tmeta,
            const std::vector<uint8_t> &) override {
    if (tmeta.size() != targets.size() * sizeof(void *)) throw std::runtime_error("metadata does not match");
    for (size_t i = 0; i < targets.size(); i++) {
      void *src;
      std::memcpy(&src, &tmeta[i * sizeof(void *)], sizeof(void *));
      uint64_t n = (uint64_t(targets[i].dtype.bits) + 7) / 8;
      for (int d = 0; d < targets[i].ndim; d++) n *= uint64_t(targets[i].shape[d]);
      std::memcpy(targets[i].data, src, n);
    }
  }
};

int main() {
  rdt::Options in_process;
  in_process.flags = RDT_RUNTIME_IN_PROCESS;
  rdt::Runtime a(in_process), b(in_process);
  for (rdt::Runtime *rt : {&a, &b})
    rdt::register_transport(*rt, "copy", {RDT_DEVICE_CPU}, std::make_unique<CopyTransport>());
  std::vector<int64_t> src{1, 2, 3, 5, 8, 13}, dst(6);
  rdt::Ref ref = a.put({rdt::view(src)}, "copy");
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  b.get(borrowed, {rdt::view(dst)}, std::chrono::seconds(5));
  std::printf("over 'copy': %lld %lld %lld %lld %lld %lld\n", (long long)dst[0], (long long)dst[1],
              (long long)dst[2], (long long)dst[3], (long long)dst[4], (long long)dst[5]);
  return dst == src ? 0 : 1;
}
