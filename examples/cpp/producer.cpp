// The producer: puts two tensors into rdt, prints the serialized reference
// as one hex line on stdout, and waits until every consumer released it.
//
//   ./producer | ./consumer
//
// The line is all a consumer needs; in real use it travels over your own
// RPC, queue or file. The tensors are not copied: rdt reads them in place
// when a consumer fetches.
#include <rdt/rdt.hpp>

#include <cstdio>
#include <iostream>

int main() {
  try {
    rdt::Runtime rt;
    std::vector<float> weights(512 * 1024);
    std::vector<int64_t> labels(1024);
    for (size_t i = 0; i < weights.size(); i++) weights[i] = float(i % 1000) * 0.5f;
    for (size_t i = 0; i < labels.size(); i++) labels[i] = int64_t(i) * 7;

    // One object, two tensors; "" lets each fetch pick the transport.
    rdt::Ref ref = rt.put({rdt::tensor(weights, {512, 1024}), rdt::tensor(labels)});
    std::vector<uint8_t> bytes = ref.serialize();  // holds the object until deserialized
    static const char digits[] = "0123456789abcdef";
    for (uint8_t b : bytes) std::cout << digits[b >> 4] << digits[b & 15];
    std::cout << std::endl;  // flushed: the consumer can start now
    std::fprintf(stderr, "producer: object %s, %llu bytes, ref of %zu bytes sent\n", ref.id().c_str(),
                 (unsigned long long)ref.nbytes(), bytes.size());

    ref.reset();  // our own reference goes; the consumer's keeps the object
    if (!rt.wait_tensor_freed(weights.data(), std::chrono::seconds(60))) {
      std::fprintf(stderr, "producer: nobody released the object in time\n");
      return 1;
    }
    std::fprintf(stderr, "producer: released by every consumer; the buffers are ours again\n");
    return 0;
  } catch (const rdt::Error &e) {
    std::fprintf(stderr, "producer: %s\n", e.what());
    return 1;
  }
}
