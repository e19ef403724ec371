// The C++ wrapper: RAII, Ref semantics, C++ transports, errors, and real
// processes (this binary re-executes itself as the source).
#include <gtest/gtest.h>
#include <rdt/rdt.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>

using namespace std::chrono_literals;

namespace {

rdt::Options quiet(const char *name) {
  rdt::Options o;
  o.name = name;
  o.log_level = RDT_LOG_OFF;
  return o;
}

std::vector<uint32_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; i++) v[i] = uint32_t(i * 2654435761u) ^ seed;
  return v;
}

// One-sided: the source writes the object to a file named in the metadata;
// receivers read it; garbage_collect removes it.
class FileTransport : public rdt::Transport {
 public:
  bool one_sided() const override { return true; }
  std::vector<uint8_t> extract_metadata(const std::string &obj, const std::vector<rdt_tensor> &ts) override {
    std::string path = "/tmp/rdt-cpp-" + std::to_string(getpid()) + "-" + obj;
    std::ofstream f(path, std::ios::binary);
    for (auto &t : ts) f.write(static_cast<const char *>(t.data), std::streamsize(nbytes(t)));
    if (!f) throw std::runtime_error("cannot write " + path);
    return std::vector<uint8_t>(path.begin(), path.end());
  }
  void recv(const rdt::Transfer &, const std::vector<rdt_tensor> &targets, const std::vector<uint8_t> &tmeta,
            const std::vector<uint8_t> &) override {
    std::string path(tmeta.begin(), tmeta.end());
    std::ifstream f(path, std::ios::binary);
    for (auto &t : targets) f.read(static_cast<char *>(t.data), std::streamsize(nbytes(t)));
    if (!f) throw std::runtime_error("cannot read " + path);
  }
  void garbage_collect(const std::string &, const std::vector<rdt_tensor> &, const std::vector<uint8_t> &tmeta) override {
    std::remove(std::string(tmeta.begin(), tmeta.end()).c_str());
  }
  static uint64_t nbytes(const rdt_tensor &t) {
    uint64_t n = (uint64_t(t.dtype.bits) * t.dtype.lanes + 7) / 8;
    for (int i = 0; i < t.ndim; i++) n *= uint64_t(t.shape[i]);
    return n;
  }
};

// Two-sided: the destination listens on a port it names in the
// communicator metadata; the source connects and sends.
class SocketTransport : public rdt::Transport {
 public:
  bool one_sided() const override { return false; }
  std::vector<uint8_t> communicator_metadata(const rdt::Transfer &x) override {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) || listen(fd, 1) ||
        getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len))
      throw std::runtime_error("listen failed");
    std::lock_guard<std::mutex> g(mu_);
    listeners_[x.id()] = fd;
    uint16_t port = ntohs(a.sin_port);
    return {uint8_t(port >> 8), uint8_t(port & 0xff)};
  }
  void recv(const rdt::Transfer &x, const std::vector<rdt_tensor> &targets, const std::vector<uint8_t> &,
            const std::vector<uint8_t> &) override {
    int lfd;
    {
      std::lock_guard<std::mutex> g(mu_);
      lfd = listeners_.at(x.id());
      listeners_.erase(x.id());
    }
    int fd = accept(lfd, nullptr, nullptr);
    close(lfd);
    if (fd < 0) throw std::runtime_error("accept failed");
    for (auto &t : targets) {
      auto *p = static_cast<char *>(t.data);
      uint64_t left = FileTransport::nbytes(t);
      while (left > 0) {
        ssize_t n = ::recv(fd, p, left, 0);
        if (n <= 0) {
          close(fd);
          throw std::runtime_error("the sender hung up");
        }
        p += n;
        left -= uint64_t(n);
      }
    }
    close(fd);
  }
  void send(const rdt::Transfer &, const std::vector<rdt_tensor> &ts, const std::vector<uint8_t> &,
            const std::vector<uint8_t> &cmeta) override {
    if (cmeta.size() != 2) throw std::runtime_error("bad communicator metadata");
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(uint16_t(cmeta[0] << 8 | cmeta[1]));
    if (connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a)) {
      close(fd);
      throw std::runtime_error("connect failed");
    }
    for (auto &t : ts) {
      if (::send(fd, t.data, FileTransport::nbytes(t), MSG_NOSIGNAL) != ssize_t(FileTransport::nbytes(t))) {
        close(fd);
        throw std::runtime_error("send failed");
      }
    }
    close(fd);
  }

 private:
  std::mutex mu_;
  std::map<uint64_t, int> listeners_;
};

class Throwing : public rdt::Transport {
 public:
  bool one_sided() const override { return true; }
  void recv(const rdt::Transfer &, const std::vector<rdt_tensor> &, const std::vector<uint8_t> &,
            const std::vector<uint8_t> &) override {
    throw std::runtime_error("boom from C++");
  }
};

// Blocks in recv until aborted.
class Blocking : public rdt::Transport {
 public:
  bool one_sided() const override { return true; }
  bool can_abort() const override { return true; }
  void recv(const rdt::Transfer &, const std::vector<rdt_tensor> &, const std::vector<uint8_t> &,
            const std::vector<uint8_t> &) override {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return aborted; });
    throw rdt::Error(RDT_ERR_ABORTED, "aborted");
  }
  void abort(const rdt::Transfer &) override {
    std::lock_guard<std::mutex> g(mu);
    aborted = true;
    cv.notify_all();
  }
  std::mutex mu;
  std::condition_variable cv;
  bool aborted = false;
};

void register_test_transports(rdt::Runtime &rt) {
  rdt::register_transport(rt, "cppfile", {RDT_DEVICE_CPU}, std::make_unique<FileTransport>());
  rdt::register_transport(rt, "cppsock", {RDT_DEVICE_CPU}, std::make_unique<SocketTransport>());
}

std::string to_hex(const std::vector<uint8_t> &b) {
  static const char *d = "0123456789abcdef";
  std::string s;
  for (uint8_t c : b) {
    s += d[c >> 4];
    s += d[c & 15];
  }
  return s;
}

std::vector<uint8_t> from_hex(const std::string &s) {
  std::vector<uint8_t> b;
  for (size_t i = 0; i + 1 < s.size(); i += 2) b.push_back(uint8_t(std::stoi(s.substr(i, 2), nullptr, 16)));
  return b;
}

// The source process: puts `n` u32s with the given transport, prints the
// serialized ref, and keeps it until stdin closes.
int child_main(const std::string &transport, size_t n) {
  rdt::Runtime rt(quiet("cpp-source"));
  register_test_transports(rt);
  auto data = pattern(n, 77);
  rdt::Ref ref = rt.put({rdt::view(data)}, transport == "auto" ? "" : transport);
  std::cout << to_hex(ref.serialize()) << std::endl;
  std::string line;
  std::getline(std::cin, line);
  return 0;
}

struct Child {
  pid_t pid = -1;
  FILE *in = nullptr, *out = nullptr;
  ~Child() {
    if (in) fclose(in);
    if (out) fclose(out);
    if (pid > 0) waitpid(pid, nullptr, 0);
  }
};

std::unique_ptr<Child> spawn(const std::string &transport, size_t n) {
  int to[2], from[2];
  if (pipe(to) || pipe(from)) throw std::runtime_error("pipe");
  auto c = std::make_unique<Child>();
  c->pid = fork();
  if (c->pid == 0) {
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[1]);
    close(from[0]);
    std::string count = std::to_string(n);
    execl("/proc/self/exe", "test_rdt_cpp", "--child", transport.c_str(), count.c_str(), (char *)nullptr);
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  c->in = fdopen(to[1], "w");
  c->out = fdopen(from[0], "r");
  return c;
}

std::string read_line(FILE *f) {
  std::string s;
  int ch;
  while ((ch = fgetc(f)) != EOF && ch != '\n') s += char(ch);
  return s;
}

}  // namespace

TEST(Raii, HandlesAreReleasedAtScopeExit) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  std::vector<float> src(1000, 1.5f), dst(1000);
  {
    rdt::Ref ref = a.put({rdt::view(src)});
    rdt::Ref borrowed = b.deserialize(ref.serialize());
    b.get(borrowed, {rdt::view(dst)}, 5s);
    EXPECT_EQ(a.stats().refs, 1u);
    EXPECT_EQ(b.stats().refs, 1u);
  }
  EXPECT_EQ(a.stats().refs, 0u);
  EXPECT_EQ(b.stats().refs, 0u);
  EXPECT_TRUE(a.wait_tensor_freed(src.data(), 10s));
  EXPECT_EQ(dst[999], 1.5f);
}

TEST(Raii, FetchDestructorAbortsAndWaits) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  rdt::register_transport(a, "blocking", {RDT_DEVICE_CPU}, std::make_unique<Blocking>());
  auto blocking = std::make_unique<Blocking>();
  rdt::register_transport(b, "blocking", {RDT_DEVICE_CPU}, std::move(blocking));
  std::vector<int32_t> src(10, 1), dst(10);
  rdt::Ref ref = a.put({rdt::view(src)}, "blocking");
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  {
    rdt::Fetch f = b.fetch({borrowed}, {rdt::view(dst)});
    EXPECT_FALSE(f.wait(50ms));
  }  // aborts the blocked recv and waits for it
  EXPECT_EQ(b.stats().fetches_active, 0u);
}

TEST(Ref, CopyClonesAndMoveTransfers) {
  rdt::Runtime a(quiet("a"));
  std::vector<double> src(4, 2.0);
  rdt::Ref r1 = a.put({rdt::view(src)});
  rdt::Ref r2 = r1;  // clone
  EXPECT_EQ(a.stats().refs, 2u);
  EXPECT_EQ(r1.id(), r2.id());
  rdt::Ref r3 = std::move(r1);  // no new handle
  EXPECT_EQ(a.stats().refs, 2u);
  EXPECT_FALSE(r1);
  EXPECT_TRUE(r3);
  r2 = r3;  // copy-assign: releases the old handle, clones the new one
  EXPECT_EQ(a.stats().refs, 2u);
  r2 = rdt::Ref();
  EXPECT_EQ(a.stats().refs, 1u);
  EXPECT_THROW(r1.serialize(), rdt::Error);
}

TEST(Errors, EveryFailureIsAnRdtError) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  std::vector<float> src(8), small(4);
  auto status_of = [](auto &&f) {
    try {
      f();
    } catch (const rdt::Error &e) {
      EXPECT_FALSE(e.message().empty());
      return e.status();
    }
    return RDT_OK;
  };
  EXPECT_EQ(status_of([&] { a.put({rdt::view(src)}, "nope"); }), RDT_ERR_NOT_FOUND);
  EXPECT_EQ(status_of([&] { a.deserialize({1, 2, 3}); }), RDT_ERR_CORRUPT);
  rdt::Ref ref = a.put({rdt::view(src)});
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  EXPECT_EQ(status_of([&] { b.get(borrowed, {rdt::view(small)}); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { b.get(borrowed, {}); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { ref.tensor_info(5); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { rdt::register_transport(a, "bad name!", {RDT_DEVICE_CPU}, std::make_unique<Throwing>()); }),
            RDT_ERR_INVALID_ARGUMENT);
  EXPECT_FALSE(a.wait_tensor_freed(src.data(), 10ms));  // still held: a timeout, not an error
  rdt::Options bad;
  bad.listen_tcp = "not an address";
  bad.log_level = RDT_LOG_OFF;
  EXPECT_EQ(status_of([&] { rdt::Runtime r(bad); }), RDT_ERR_INVALID_ARGUMENT);
}

TEST(Transports, AnExceptionInACallbackReachesGet) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  rdt::register_transport(a, "throwing", {RDT_DEVICE_CPU}, std::make_unique<Throwing>());
  rdt::register_transport(b, "throwing", {RDT_DEVICE_CPU}, std::make_unique<Throwing>());
  std::vector<int32_t> src(4), dst(4);
  rdt::Ref ref = a.put({rdt::view(src)}, "throwing");
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  try {
    b.get(borrowed, {rdt::view(dst)}, 5s);
    FAIL() << "get succeeded";
  } catch (const rdt::Error &e) {
    EXPECT_EQ(e.status(), RDT_ERR_USER);
    EXPECT_NE(e.message().find("boom from C++"), std::string::npos) << e.message();
  }
}

class AcrossProcesses : public ::testing::TestWithParam<std::string> {};

TEST_P(AcrossProcesses, PutInOneProcessGetInAnother) {
  const size_t n = 300000;
  auto child = spawn(GetParam(), n);
  std::string hex = read_line(child->out);
  ASSERT_FALSE(hex.empty()) << "the source process said nothing";
  rdt::Runtime rt(quiet("cpp-reader"));
  register_test_transports(rt);
  std::vector<uint32_t> got(n);  // preallocated: rdt writes straight into it
  {
    rdt::Ref ref = rt.deserialize(from_hex(hex));
    rt.get(ref, {rdt::view(got)}, 30s);
  }
  EXPECT_EQ(got, pattern(n, 77));
  fputs("done\n", child->in);
  fflush(child->in);
}

INSTANTIATE_TEST_SUITE_P(Transports, AcrossProcesses,
                         ::testing::Values("auto", "cma", "shm", "tcp", "cppfile", "cppsock"));

int main(int argc, char **argv) {
  if (argc == 4 && std::string(argv[1]) == "--child") return child_main(argv[2], std::stoul(argv[3]));
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
