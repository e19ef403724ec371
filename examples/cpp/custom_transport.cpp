// A transport written in C++: "copy", one-sided, for runtimes in one
// process (the metadata carries the source's addresses). It also writes into
// objects another runtime exposed: the owner's metadata says where they lie,
// and the writer copies there alone. Register it under the same name in
// every runtime that uses it; the runtime owns it. An exception thrown in
// any of its methods reaches the caller of get() or write() as
// rdt::Error(RDT_ERR_USER) with the exception's message.
#include <rdt/rdt.hpp>

#include <cstdio>
#include <cstring>

class CopyTransport : public rdt::Transport {
 public:
  bool one_sided() const override { return true; }
  bool writes() const override { return true; }

  // Source, at put (owner, at expose): where the tensors are.
  std::vector<uint8_t> extract_metadata(const std::string &, rdt::Tensors tensors) override {
    std::vector<uint8_t> m(tensors.size() * sizeof(void *));
    for (size_t i = 0; i < tensors.size(); i++) {
      void *p = rdt::bytes_of(tensors[i]);
      std::memcpy(&m[i * sizeof p], &p, sizeof p);
    }
    return m;
  }

  // Destination: copy into the targets (shapes and dtypes already checked).
  void recv(const rdt::Transfer &, rdt::Tensors targets, rdt::Bytes tmeta, rdt::Bytes) override {
    if (tmeta.size() != targets.size() * sizeof(void *)) throw std::runtime_error("metadata does not match");
    for (size_t i = 0; i < targets.size(); i++) {
      void *src;
      std::memcpy(&src, &tmeta[i * sizeof src], sizeof src);
      std::memcpy(rdt::bytes_of(targets[i]), src, rdt::nbytes(targets[i]));
    }
  }

  // Writer: copy the sources to where the owner's tensors are (shapes and
  // dtypes already checked). The owner learns of it from its notice.
  void write(const rdt::Transfer &, rdt::Tensors sources, rdt::Bytes tmeta, rdt::Bytes) override {
    if (tmeta.size() != sources.size() * sizeof(void *)) throw std::runtime_error("metadata does not match");
    for (size_t i = 0; i < sources.size(); i++) {
      void *dst;
      std::memcpy(&dst, &tmeta[i * sizeof dst], sizeof dst);
      std::memcpy(dst, rdt::bytes_of(sources[i]), rdt::nbytes(sources[i]));
    }
  }
};

// Fails every receive, to show where its exception ends up.
class BrokenTransport : public rdt::Transport {
 public:
  bool one_sided() const override { return true; }
  void recv(const rdt::Transfer &, rdt::Tensors, rdt::Bytes, rdt::Bytes) override {
    throw std::runtime_error("the link is down");
  }
};

int main() {
  rdt::Options in_process;
  in_process.flags = RDT_RUNTIME_IN_PROCESS;  // peers within this process only
  in_process.log_level = RDT_LOG_ERROR;        // the failure below is expected: no warning
  rdt::Runtime a(in_process), b(in_process);
  for (rdt::Runtime *rt : {&a, &b}) {
    rdt::register_transport(*rt, "copy", {RDT_DEVICE_CPU}, std::make_unique<CopyTransport>());
    rdt::register_transport(*rt, "broken", {RDT_DEVICE_CPU}, std::make_unique<BrokenTransport>());
  }

  std::vector<int64_t> src{1, 2, 3, 5, 8, 13}, dst(6);
  rdt::Ref ref = a.put({rdt::tensor(src)}, "copy");
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  b.get(borrowed, {rdt::tensor(dst)}, std::chrono::seconds(5));
  std::printf("over 'copy': %lld %lld %lld %lld %lld %lld\n", (long long)dst[0], (long long)dst[1],
              (long long)dst[2], (long long)dst[3], (long long)dst[4], (long long)dst[5]);

  try {
    b.get(borrowed, {rdt::tensor(dst)}, std::chrono::seconds(5), "broken");  // override the transport
    return 1;
  } catch (const rdt::Error &e) {
    std::printf("over 'broken': %s\n", e.what());
    if (e.status() != RDT_ERR_USER) return 1;
  }

  // b writes into a buffer a exposed; a's notice carries b's tag.
  std::vector<int64_t> slot(6, 0);
  rdt::Ref exposed = a.expose({rdt::tensor(slot)}, "copy");
  rdt::Ref writable = b.deserialize(exposed.serialize());
  b.write(writable, {rdt::tensor(src)}, /*tag=*/7, std::chrono::seconds(5));
  rdt_write_notice note;
  if (!exposed.wait_notice(note, std::chrono::seconds(5)) || note.status != RDT_OK) return 1;
  std::printf("written over 'copy' with tag %llu: %lld ... %lld\n", (unsigned long long)note.tag,
              (long long)slot[0], (long long)slot[5]);
  return dst == src && slot == src ? 0 : 1;
}
