// The consumer: reads a serialized reference (one hex line) from stdin,
// allocates buffers from the shapes the reference describes, fetches into
// them and checks every element.
//
//   ./producer | ./consumer
#include <rdt/rdt.hpp>

#include <cstdio>
#include <iostream>
#include <string>

int main() {
  std::string hex;
  if (!std::getline(std::cin, hex) || hex.size() % 2) {
    std::fprintf(stderr, "consumer: no reference on stdin\n");
    return 1;
  }
  std::vector<uint8_t> bytes;
  for (size_t i = 0; i < hex.size(); i += 2) bytes.push_back(uint8_t(std::stoi(hex.substr(i, 2), nullptr, 16)));

  try {
    rdt::Runtime rt;
    rdt::Ref ref = rt.deserialize(bytes);  // a borrow, counted by the producer

    // Preallocated receive buffers, sized from the reference.
    std::vector<rdt::Tensor> targets = ref.tensors();  // shapes, dtypes; data == nullptr
    std::vector<float> weights(targets[0].numel());
    std::vector<int64_t> labels(targets[1].numel());
    targets[0].data = weights.data();
    targets[1].data = labels.data();

    // Asynchronously; rt.get(ref, targets, timeout) is the one-call form.
    rdt::Fetch fetch = rt.get_start(ref, targets);
    while (!fetch.wait(std::chrono::milliseconds(100))) std::fprintf(stderr, "consumer: still fetching\n");

    size_t bad = 0;
    for (size_t i = 0; i < weights.size(); i++) bad += weights[i] != float(i % 1000) * 0.5f;
    for (size_t i = 0; i < labels.size(); i++) bad += labels[i] != int64_t(i) * 7;
    std::printf("consumer: fetched %lld x %lld floats and %zu labels from object %s: %s\n",
                (long long)targets[0].shape[0], (long long)targets[0].shape[1], labels.size(), ref.id().c_str(),
                bad ? "MISMATCH" : "all values match");
    return bad ? 1 : 0;
  } catch (const rdt::Error &e) {  // every failure: status and message
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
