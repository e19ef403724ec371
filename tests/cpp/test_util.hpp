// Helpers for the C++ suite: quiet runtimes, test data, test transports
// written the way an application writes its own, and child processes.
#ifndef RDT_TEST_UTIL_HPP
#define RDT_TEST_UTIL_HPP

#include <gtest/gtest.h>
#include <rdt/rdt.hpp>

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace rdt_test {

using namespace std::chrono_literals;

inline rdt::Options quiet(const std::string &name) {
  rdt::Options o;
  o.name = name;
  o.log_level = RDT_LOG_OFF;
  return o;
}

// Distinct, position-dependent contents.
inline std::vector<uint32_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; i++) v[i] = uint32_t(i * 2654435761u) ^ seed;
  return v;
}

// The status of the rdt::Error that f throws (RDT_OK if none); checks that
// the error carries a message and that what() names the status.
template <class F>
rdt_status status_of(F &&f) {
  try {
    f();
  } catch (const rdt::Error &e) {
    EXPECT_FALSE(e.message().empty()) << "an rdt::Error without a message";
    EXPECT_EQ(std::string(e.what()).rfind(rdt_status_string(e.status()), 0), 0u) << e.what();
    return e.status();
  }
  return RDT_OK;
}

// Waits until `rt` noticed that its peers are gone. Until it has, a fetch
// from an owner runtime destroyed in a still-running process may succeed
// over cma (it reads the freed object's memory): a core race, reported;
// these tests are about the wrapper's error mapping, so they wait.
inline void await_no_peers(rdt::Runtime &rt) {
  for (int i = 0; i < 5000 && rt.stats().peers != 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// The message of the rdt::Error that f throws ("" if none).
template <class F>
std::string message_of(F &&f) {
  try {
    f();
  } catch (const rdt::Error &e) {
    return e.message();
  }
  return "";
}

// Shared between a test and the MemTransports it registered (the runtime
// owns the transports, so the test watches them through this).
struct Probe {
  std::mutex mu;
  std::condition_variable cv;
  bool open = true;                 // recv/send/requests proceed while open
  bool aborted = false;             // set by abort(); recv then fails ABORTED
  bool abort_saw_request = false;   // abort() was called with a request
  std::string throw_in;             // the callback that throws
  std::string throw_kind = "std";   // std | rdt | nonstd | rdt_ok
  int delay_ms = 0;                 // recv sleeps this long before copying
  std::map<uint64_t, std::vector<uint8_t>> mailbox;  // two-sided: bytes sent per transfer
  std::atomic<int> extracts{0}, comms{0}, recvs{0}, sends{0}, aborts{0}, gcs{0};
  std::atomic<int> finished{0};  // receives that completed their copy
  std::atomic<int> destroyed{0}, requests_made{0}, requests_freed{0};
  std::atomic<int> ranged{0};  // recvs and sends that were handed ranges

  void set_open(bool o) {
    std::lock_guard<std::mutex> g(mu);
    open = o;
    cv.notify_all();
  }
  void maybe_throw(const char *where) {
    if (throw_in != where) return;
    std::string msg = std::string("boom from C++ ") + where;
    if (throw_kind == "rdt") throw rdt::Error(RDT_ERR_TRANSPORT, msg);
    if (throw_kind == "rdt_ok") throw rdt::Error(RDT_OK, msg);
    if (throw_kind == "nonstd") throw 42;
    throw std::runtime_error(msg);
  }
  // Blocks while closed; throws ABORTED if aborted meanwhile.
  void gate() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return open || aborted; });
    if (aborted) throw rdt::Error(RDT_ERR_ABORTED, "aborted while gated");
  }
};

// A request whose work runs on a thread of its own: wait() waits for it
// and rethrows what it threw. Subclasses that count call join() first in
// their destructors.
class ThreadRequest : public rdt::Transport::Request {
 public:
  explicit ThreadRequest(std::function<void()> work)
      : th_([this, work = std::move(work)] {
          try {
            work();
          } catch (...) {
            err_ = std::current_exception();
          }
          std::lock_guard<std::mutex> g(mu_);
          done_ = true;
          cv_.notify_all();
        }) {}
  ~ThreadRequest() override { join(); }
  bool wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> l(mu_);
    auto done = [&] { return done_; };
    if (timeout.count() < 0)
      cv_.wait(l, done);
    else if (!cv_.wait_for(l, timeout, done))
      return false;
    if (err_) std::rethrow_exception(err_);
    return true;
  }

 protected:
  void join() {
    if (th_.joinable()) th_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr err_;
  std::thread th_;  // last: it starts once the members above exist
};

// A transport for runtimes of one process. One-sided: the metadata holds the
// source tensors' addresses and recv copies from them. Two-sided: send puts
// the bytes in the probe's mailbox and recv takes them. Optionally
// asynchronous (fetch + Request::wait on a thread) and abortable.
class MemTransport : public rdt::Transport {
 public:
  struct Config {
    bool one_sided = true;
    bool can_abort = false;
    bool asynchronous = false;
    bool ranges = false;  // serves partial fetches (Transfer::ranges)
  };
  MemTransport(std::shared_ptr<Probe> p, Config c) : p_(std::move(p)), c_(c) {}
  ~MemTransport() override { p_->destroyed++; }

  bool one_sided() const override { return c_.one_sided; }
  bool can_abort() const override { return c_.can_abort; }
  bool asynchronous() const override { return c_.asynchronous; }
  bool serves_ranges() const override { return c_.ranges; }

  std::vector<uint8_t> extract_metadata(const std::string &, rdt::Tensors ts) override {
    p_->extracts++;
    p_->maybe_throw("extract_metadata");
    std::vector<uint8_t> m(ts.size() * sizeof(void *));
    for (size_t i = 0; i < ts.size(); i++) {
      void *a = rdt::bytes_of(ts[i]);
      std::memcpy(&m[i * sizeof a], &a, sizeof a);
    }
    return m;
  }
  std::vector<uint8_t> communicator_metadata(const rdt::Transfer &x) override {
    p_->comms++;
    p_->maybe_throw("communicator_metadata");
    uint64_t id = x.id();
    std::vector<uint8_t> m(sizeof id);
    std::memcpy(m.data(), &id, sizeof id);
    return m;
  }
  void send(const rdt::Transfer &x, rdt::Tensors ts, rdt::Bytes, rdt::Bytes cmeta) override {
    p_->sends++;
    p_->maybe_throw("send");
    check_cmeta(x, cmeta);
    std::vector<uint8_t> all;
    if (!x.ranges().empty()) p_->ranged++;
    for (auto &r : pieces(x, ts.size(), [&](size_t i) { return rdt::nbytes(ts[i]); })) {
      auto *b = static_cast<const uint8_t *>(rdt::bytes_of(ts[r.tensor])) + r.offset;
      all.insert(all.end(), b, b + r.length);
    }
    std::lock_guard<std::mutex> g(p_->mu);
    p_->mailbox[x.id()] = std::move(all);
    p_->cv.notify_all();
  }
  void recv(const rdt::Transfer &x, rdt::Tensors targets, rdt::Bytes tmeta, rdt::Bytes cmeta) override {
    p_->recvs++;
    p_->maybe_throw("recv");
    receive(x, targets, tmeta, cmeta);
  }
  std::unique_ptr<Request> fetch(const rdt::Transfer &x, rdt::Tensors targets, rdt::Bytes tmeta,
                                 rdt::Bytes cmeta) override {
    p_->maybe_throw("fetch");
    return std::make_unique<Req>(this, x, targets, tmeta.to_vector(), cmeta.to_vector());
  }
  void garbage_collect(const std::string &, rdt::Tensors, rdt::Bytes) override {
    p_->gcs++;
    p_->maybe_throw("garbage_collect");
  }
  void abort(const rdt::Transfer &, Request *request) override {
    p_->aborts++;
    std::lock_guard<std::mutex> g(p_->mu);
    p_->aborted = true;
    if (request) p_->abort_saw_request = true;
    p_->cv.notify_all();
    // Thrown after the abort took effect: the library only logs it.
    if (p_->throw_in == "abort") throw std::runtime_error("boom from C++ abort");
  }

 private:
  // An asynchronous receive running on its own thread; the transfer and
  // the targets stay valid until this request is freed.
  class Req : public ThreadRequest {
   public:
    Req(MemTransport *t, const rdt::Transfer &x, rdt::Tensors targets, std::vector<uint8_t> tmeta,
        std::vector<uint8_t> cmeta)
        : ThreadRequest([t, x, targets, tmeta = std::move(tmeta), cmeta = std::move(cmeta)] {
            t->receive(x, targets, rdt::Bytes(tmeta.data(), tmeta.size()), rdt::Bytes(cmeta.data(), cmeta.size()));
          }),
          t_(t) {
      t_->p_->requests_made++;
    }
    ~Req() override {
      join();
      t_->p_->requests_freed++;
    }
    bool wait(std::chrono::milliseconds timeout) override {
      t_->p_->recvs++;
      t_->p_->maybe_throw("wait");
      return ThreadRequest::wait(timeout);
    }

   private:
    MemTransport *t_;
  };

  // What each target receives: the transfer's ranges, or tensor i whole.
  template <class Size>
  static std::vector<rdt_range> pieces(const rdt::Transfer &x, size_t n, Size size) {
    if (!x.ranges().empty()) return x.ranges().to_vector();
    std::vector<rdt_range> out;
    for (size_t i = 0; i < n; i++) out.push_back(rdt_range{0, uint32_t(i), 0, size(i)});
    return out;
  }

  static void check_cmeta(const rdt::Transfer &x, rdt::Bytes cmeta) {
    uint64_t id = 0;
    if (cmeta.size() != sizeof id) throw std::runtime_error("communicator metadata did not arrive");
    std::memcpy(&id, cmeta.data(), sizeof id);
    if (id != x.id()) throw std::runtime_error("communicator metadata of another transfer");
  }

  void receive(const rdt::Transfer &x, rdt::Tensors targets, rdt::Bytes tmeta, rdt::Bytes cmeta) {
    check_cmeta(x, cmeta);
    p_->gate();
    if (p_->delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(p_->delay_ms));
    if (c_.one_sided) {
      if (!x.ranges().empty()) p_->ranged++;
      size_t n = tmeta.size() / sizeof(void *);
      if (x.ranges().empty() && n != targets.size()) throw std::runtime_error("bad transport metadata");
      size_t i = 0;
      for (auto &r : pieces(x, targets.size(), [&](size_t j) { return rdt::nbytes(targets[j]); })) {
        if (r.tensor >= n) throw std::runtime_error("a range of a tensor the metadata lacks");
        char *src;
        std::memcpy(&src, &tmeta[r.tensor * sizeof src], sizeof src);
        std::memcpy(rdt::bytes_of(targets[i++]), src + r.offset, r.length);
      }
    } else {
      std::vector<uint8_t> all;
      {
        std::unique_lock<std::mutex> l(p_->mu);
        p_->cv.wait(l, [&] { return p_->mailbox.count(x.id()) || p_->aborted; });
        if (!p_->mailbox.count(x.id())) throw rdt::Error(RDT_ERR_ABORTED, "aborted before the bytes came");
        all = std::move(p_->mailbox[x.id()]);
        p_->mailbox.erase(x.id());
      }
      size_t off = 0;
      for (auto &t : targets) {
        if (off + rdt::nbytes(t) > all.size()) throw std::runtime_error("short message");
        std::memcpy(rdt::bytes_of(t), all.data() + off, rdt::nbytes(t));
        off += rdt::nbytes(t);
      }
    }
    p_->finished++;
  }

  std::shared_ptr<Probe> p_;
  Config c_;
};

// Registers a MemTransport under `name` with every runtime given.
inline void register_mem(std::initializer_list<rdt::Runtime *> rts, const std::string &name,
                         const std::shared_ptr<Probe> &probe, MemTransport::Config c = {}) {
  for (rdt::Runtime *rt : rts)
    rdt::register_transport(*rt, name, {RDT_DEVICE_CPU}, std::make_unique<MemTransport>(probe, c));
}

// Registers a MemTransport "mem" with `a` and `b` over a new probe and
// returns the probe (set its fields before the first put or fetch).
inline std::shared_ptr<Probe> mem_probe(rdt::Runtime &a, rdt::Runtime &b, MemTransport::Config c = {}) {
  auto probe = std::make_shared<Probe>();
  register_mem({&a, &b}, "mem", probe, c);
  return probe;
}

// ---- transports that work between processes --------------------------------

// One-sided: the source writes the object to a file named in the metadata;
// receivers read it; garbage_collect removes it.
class FileTransport : public rdt::Transport {
 public:
  bool one_sided() const override { return true; }
  std::vector<uint8_t> extract_metadata(const std::string &obj, rdt::Tensors ts) override;
  void recv(const rdt::Transfer &, rdt::Tensors targets, rdt::Bytes tmeta, rdt::Bytes) override;
  void garbage_collect(const std::string &, rdt::Tensors, rdt::Bytes tmeta) override;
};

// Two-sided: the destination listens on a loopback port it names in the
// communicator metadata; the source connects and sends.
class SocketTransport : public rdt::Transport {
 public:
  ~SocketTransport() override;
  bool one_sided() const override { return false; }
  std::vector<uint8_t> communicator_metadata(const rdt::Transfer &x) override;
  void recv(const rdt::Transfer &x, rdt::Tensors targets, rdt::Bytes, rdt::Bytes) override;
  void send(const rdt::Transfer &, rdt::Tensors ts, rdt::Bytes, rdt::Bytes cmeta) override;

 private:
  std::mutex mu_;
  std::map<uint64_t, int> listeners_;
};

// Registers cppfile and cppsock with a runtime.
void register_process_transports(rdt::Runtime &rt);

// ---- child processes ------------------------------------------------------------

// A copy of this test program started with fork + exec (librdt does not
// survive a plain fork). It talks over its stdin and stdout.
class Child {
 public:
  explicit Child(const std::vector<std::string> &args);
  ~Child();
  std::string read_line();
  void write_line(const std::string &s);
  void kill_now();
  // SIGSTOP, returning once the process is stopped; resume() is SIGCONT
  // (the destructor resumes it too).
  void stop();
  void resume();

 private:
  pid_t pid_ = -1;
  FILE *in_ = nullptr, *out_ = nullptr;
};

std::string to_hex(const std::vector<uint8_t> &b);
std::vector<uint8_t> from_hex(const std::string &s);

// The built-in transports of `rt` that move host memory and carry every
// flag in `flags` (RDT_TRANSPORT_RANGES, RDT_TRANSPORT_WRITES, ...).
inline std::vector<std::string> builtin_host_transports(rdt::Runtime &rt, uint32_t flags = 0) {
  std::vector<std::string> out;
  for (auto &t : rt.transports()) {
    bool host = false;
    for (uint32_t i = 0; i < t.num_devices; i++) host = host || t.devices[i] == RDT_DEVICE_CPU;
    if ((t.flags & RDT_TRANSPORT_BUILTIN) && (t.flags & flags) == flags && host) out.push_back(t.name);
  }
  return out;
}

// The transports for cross-process tests: "auto", every built-in that moves
// host memory, and this suite's own two.
std::vector<std::string> process_transports();

// The child side (main dispatches "--child ..." here).
int child_main(int argc, char **argv);

}  // namespace rdt_test

#endif
