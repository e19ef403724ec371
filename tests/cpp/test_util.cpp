#include "test_util.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>

namespace rdt_test {

// ---- FileTransport ----------------------------------------------------------

std::vector<uint8_t> FileTransport::extract_metadata(const std::string &obj, rdt::Tensors ts) {
  const char *dir = std::getenv("TMPDIR");
  std::string path = std::string(dir && *dir ? dir : "/tmp") + "/rdt-cpp-" + std::to_string(getpid()) + "-" + obj;
  std::ofstream f(path, std::ios::binary);
  for (auto &t : ts) f.write(static_cast<const char *>(rdt::bytes_of(t)), std::streamsize(rdt::nbytes(t)));
  if (!f) throw std::runtime_error("cannot write " + path);
  return std::vector<uint8_t>(path.begin(), path.end());
}

void FileTransport::recv(const rdt::Transfer &, rdt::Tensors targets, rdt::Bytes tmeta, rdt::Bytes) {
  std::string path(tmeta.begin(), tmeta.end());
  std::ifstream f(path, std::ios::binary);
  for (auto &t : targets) f.read(static_cast<char *>(rdt::bytes_of(t)), std::streamsize(rdt::nbytes(t)));
  if (!f) throw std::runtime_error("cannot read " + path);
}

void FileTransport::garbage_collect(const std::string &, rdt::Tensors, rdt::Bytes tmeta) {
  std::remove(std::string(tmeta.begin(), tmeta.end()).c_str());
}

// ---- SocketTransport -----------------------------------------------------------

namespace {
struct Fd {
  int fd;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};
// Waits up to 30 s for fd to become ready, so that a lost peer fails the
// transfer instead of hanging the suite.
void await(int fd, short events, const char *what) {
  pollfd p{fd, events, 0};
  int n = poll(&p, 1, 30000);
  if (n <= 0) throw std::runtime_error(std::string("timed out waiting to ") + what);
}
}  // namespace

SocketTransport::~SocketTransport() {
  for (auto &l : listeners_) close(l.second);
}

std::vector<uint8_t> SocketTransport::communicator_metadata(const rdt::Transfer &x) {
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd.fd < 0 || bind(fd.fd, reinterpret_cast<sockaddr *>(&a), sizeof a) || listen(fd.fd, 1) ||
      getsockname(fd.fd, reinterpret_cast<sockaddr *>(&a), &len))
    throw std::runtime_error("cannot listen on loopback");
  std::lock_guard<std::mutex> g(mu_);
  listeners_[x.id()] = std::exchange(fd.fd, -1);
  uint16_t port = ntohs(a.sin_port);
  return {uint8_t(port >> 8), uint8_t(port & 0xff)};
}

void SocketTransport::recv(const rdt::Transfer &x, rdt::Tensors targets, rdt::Bytes, rdt::Bytes) {
  int lfd;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = listeners_.find(x.id());
    if (it == listeners_.end()) throw std::runtime_error("no listener for this transfer");
    lfd = it->second;
    listeners_.erase(it);
  }
  Fd listener(lfd);
  await(lfd, POLLIN, "accept the sender");
  Fd conn(accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC));
  if (conn.fd < 0) throw std::runtime_error("accept failed");
  for (auto &t : targets) {
    auto *p = static_cast<char *>(rdt::bytes_of(t));
    uint64_t left = rdt::nbytes(t);
    while (left > 0) {
      await(conn.fd, POLLIN, "receive");
      ssize_t n = ::recv(conn.fd, p, left, 0);
      if (n <= 0) throw std::runtime_error("the sender hung up");
      p += n;
      left -= uint64_t(n);
    }
  }
}

void SocketTransport::send(const rdt::Transfer &, rdt::Tensors ts, rdt::Bytes, rdt::Bytes cmeta) {
  if (cmeta.size() != 2) throw std::runtime_error("bad communicator metadata");
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(cmeta[0] << 8 | cmeta[1]));
  if (fd.fd < 0 || connect(fd.fd, reinterpret_cast<sockaddr *>(&a), sizeof a))
    throw std::runtime_error("cannot connect to the receiver");
  for (auto &t : ts) {
    auto *p = static_cast<const char *>(rdt::bytes_of(t));
    uint64_t left = rdt::nbytes(t);
    while (left > 0) {
      ssize_t n = ::send(fd.fd, p, left, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("send failed");
      p += n;
      left -= uint64_t(n);
    }
  }
}

void register_process_transports(rdt::Runtime &rt) {
  rdt::register_transport(rt, "cppfile", {RDT_DEVICE_CPU}, std::make_unique<FileTransport>());
  rdt::register_transport(rt, "cppsock", {RDT_DEVICE_CPU}, std::make_unique<SocketTransport>());
}

std::vector<std::string> process_transports() {
  std::vector<std::string> out{"auto"};
  rdt::Runtime rt(quiet("lister"));
  for (const std::string &name : builtin_host_transports(rt)) out.push_back(name);
  out.push_back("cppfile");
  out.push_back("cppsock");
  return out;
}

// ---- hex -------------------------------------------------------------------------

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

// ---- child processes ------------------------------------------------------------

Child::Child(const std::vector<std::string> &args) {
  int to[2], from[2];
  if (pipe2(to, O_CLOEXEC) || pipe2(from, O_CLOEXEC)) throw std::runtime_error("pipe failed");
  std::vector<std::string> all{"test_rdt_cpp", "--child"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char *> argv;
  for (auto &a : all) argv.push_back(const_cast<char *>(a.c_str()));
  argv.push_back(nullptr);
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {  // only async-signal-safe calls until exec
    dup2(to[0], 0);
    dup2(from[1], 1);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  in_ = fdopen(to[1], "w");
  out_ = fdopen(from[0], "r");
}

Child::~Child() {
  if (pid_ > 0) ::kill(pid_, SIGCONT);  // a stopped child could not exit
  if (in_) fclose(in_);  // the child exits when its stdin closes
  if (out_) fclose(out_);
  if (pid_ > 0) {
    int status = 0;
    waitpid(pid_, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) || WIFSIGNALED(status));
  }
}

std::string Child::read_line() {
  std::string s;
  int ch;
  while ((ch = fgetc(out_)) != EOF && ch != '\n') s += char(ch);
  return s;
}

void Child::write_line(const std::string &s) {
  fputs((s + "\n").c_str(), in_);
  fflush(in_);
}

void Child::kill_now() {
  ::kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

void Child::stop() {
  ::kill(pid_, SIGSTOP);
  // The signal is delivered asynchronously: wait for the state to say so.
  for (int i = 0; i < 10000; i++) {
    siginfo_t info{};
    if (waitid(P_PID, id_t(pid_), &info, WSTOPPED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  throw std::runtime_error("the child did not stop");
}

void Child::resume() { ::kill(pid_, SIGCONT); }

// Modes:
//   source <transport> <n> <objects>  put <objects> objects of n u32 (seed = index),
//                                     print one serialized ref a line, keep them
//                                     until stdin closes
//   await-free <transport> <n>        put one object, print its ref, drop our own
//                                     reference, then print "freed" once every
//                                     other process released it
int child_main(int argc, char **argv) {
  std::string mode = argc > 2 ? argv[2] : "";
  try {
    rdt::Runtime rt(quiet("cpp-child"));
    register_process_transports(rt);
    if ((mode == "source" && argc == 6) || (mode == "await-free" && argc == 5)) {
      std::string transport = argv[3] == std::string("auto") ? "" : argv[3];
      size_t n = std::stoul(argv[4]);
      int objects = mode == "source" ? std::stoi(argv[5]) : 1;
      std::vector<std::vector<uint32_t>> data;
      std::vector<rdt::Ref> refs;
      for (int i = 0; i < objects; i++) data.push_back(pattern(n, uint32_t(i)));
      for (int i = 0; i < objects; i++) {
        refs.push_back(rt.put({rdt::tensor(data[size_t(i)])}, transport));
        std::cout << to_hex(refs.back().serialize()) << std::endl;
      }
      if (mode == "await-free") {
        refs.clear();
        bool freed = rt.wait_tensor_freed(data[0].data(), std::chrono::seconds(60));
        std::cout << (freed ? "freed" : "timeout") << std::endl;
      }
      std::string line;
      std::getline(std::cin, line);
      return 0;
    }
  } catch (const std::exception &e) {
    std::cerr << "child: " << e.what() << std::endl;
    return 1;
  }
  std::cerr << "child: bad arguments" << std::endl;
  return 2;
}

}  // namespace rdt_test
