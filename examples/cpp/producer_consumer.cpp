// A producer process puts a tensor; a consumer process fetches it into a
// preallocated buffer. The serialized ref travels over a pipe here; in real
// use it goes over whatever RPC connects your processes.
//
//   producer_consumer            (starts the consumer itself, as a new program:
//                                 librdt is loaded at start and does not survive
//                                 a plain fork, so the child execs)
#include <rdt/rdt.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <numeric>
#include <string>

static int consumer(int fd) {
  std::vector<uint8_t> bytes(4096);
  ssize_t n = read(fd, bytes.data(), bytes.size());
  if (n <= 0) return 1;
  bytes.resize(size_t(n));
  rdt::Runtime rt;
  rdt::Ref ref = rt.deserialize(bytes);          // a borrow, counted by the producer
  std::vector<float> buffer(1 << 20);            // preallocated: rdt writes straight into it
  rt.get(ref, {rdt::view(buffer)}, std::chrono::seconds(10));
  std::printf("consumer: got %zu floats, buffer[12345] = %g\n", buffer.size(), buffer[12345]);
  return buffer[12345] == 12345.0f ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc == 2 && std::string(argv[1]) == "--consumer") return consumer(0);
  int fds[2];
  if (pipe(fds) != 0) return 1;
  pid_t pid = fork();
  if (pid == 0) {  // fork + exec: the child starts a fresh librdt
    dup2(fds[0], 0);
    close(fds[1]);
    execl("/proc/self/exe", argv[0], "--consumer", (char *)nullptr);
    _exit(127);
  }
  close(fds[0]);
  try {
    rdt::Runtime rt;
    std::vector<float> weights(1 << 20);
    std::iota(weights.begin(), weights.end(), 0.0f);
    rdt::Ref ref = rt.put({rdt::view(weights)});  // not copied
    auto bytes = ref.serialize();
    std::printf("producer: put %zu floats as object %s, ref is %zu bytes\n", weights.size(), ref.id().c_str(),
                bytes.size());
    if (write(fds[1], bytes.data(), bytes.size()) != ssize_t(bytes.size())) return 1;
    ref = rdt::Ref();                              // our handle goes; the consumer's borrow remains
    close(fds[1]);
    rt.wait_tensor_freed(weights.data());          // until the consumer released it
    std::printf("producer: the consumer is done; the buffer is ours again\n");
  } catch (const rdt::Error &e) {
    std::fprintf(stderr, "rdt: %s\n", e.what());
    return 1;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
