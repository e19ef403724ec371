// rdt.hpp: header-only C++17 wrapper over the rdt C ABI (rdt.h).
//
// Handles are RAII types: Runtime and Fetch are move-only, Ref copies by
// cloning the reference. Every call checks its status and throws rdt::Error
// carrying the status and the library's message. capi() gives the raw
// handle for calls the wrapper does not cover.
#ifndef RDT_HPP
#define RDT_HPP

#include <rdt.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
#if __has_include(<span>) && __cplusplus > 201703L
#include <span>
#endif

namespace rdt {

// ---- errors -------------------------------------------------------------

/// A failed rdt call: the status code and the detailed message.
class Error : public std::runtime_error {
 public:
  Error(rdt_status status, const std::string &message)
      : std::runtime_error(std::string(rdt_status_string(status)) + ": " + message), status_(status),
        message_(message) {}
  rdt_status status() const noexcept { return status_; }
  const std::string &message() const noexcept { return message_; }

 private:
  rdt_status status_;
  std::string message_;
};

/// Throws rdt::Error for anything but RDT_OK.
inline void check(rdt_status st) {
  if (st != RDT_OK) throw Error(st, rdt_last_error());
}

// ---- tensors ------------------------------------------------------------

template <class T> constexpr rdt_dtype dtype_of();
#define RDT_HPP_DTYPE(T, CODE)                                                                 \
  template <> constexpr rdt_dtype dtype_of<T>() { return rdt_dtype{CODE, uint8_t(8 * sizeof(T)), 1}; }
RDT_HPP_DTYPE(int8_t, RDT_DTYPE_INT)
RDT_HPP_DTYPE(int16_t, RDT_DTYPE_INT)
RDT_HPP_DTYPE(int32_t, RDT_DTYPE_INT)
RDT_HPP_DTYPE(int64_t, RDT_DTYPE_INT)
RDT_HPP_DTYPE(uint8_t, RDT_DTYPE_UINT)
RDT_HPP_DTYPE(uint16_t, RDT_DTYPE_UINT)
RDT_HPP_DTYPE(uint32_t, RDT_DTYPE_UINT)
RDT_HPP_DTYPE(uint64_t, RDT_DTYPE_UINT)
RDT_HPP_DTYPE(float, RDT_DTYPE_FLOAT)
RDT_HPP_DTYPE(double, RDT_DTYPE_FLOAT)
#undef RDT_HPP_DTYPE
template <> constexpr rdt_dtype dtype_of<bool>() { return rdt_dtype{RDT_DTYPE_BOOL, 8, 1}; }

/// A contiguous tensor: where it is, its shape, dtype and device. It does
/// not own the memory.
struct TensorView {
  void *data = nullptr;
  std::vector<int64_t> shape;
  rdt_dtype dtype{RDT_DTYPE_UINT, 8, 1};
  rdt_device device{RDT_DEVICE_CPU, 0};

  TensorView() = default;
  TensorView(void *d, std::vector<int64_t> s, rdt_dtype t, rdt_device dev = {RDT_DEVICE_CPU, 0})
      : data(d), shape(std::move(s)), dtype(t), device(dev) {}

  /// Host memory of T with a shape.
  template <class T> static TensorView of(T *data, std::vector<int64_t> shape) {
    return TensorView(const_cast<std::remove_const_t<T> *>(data), std::move(shape), dtype_of<std::remove_const_t<T>>());
  }
  /// A device pointer (for example CUDA memory on GPU `device_id`).
  static TensorView device_memory(void *ptr, std::vector<int64_t> shape, rdt_dtype dtype, int32_t device_type,
                                  int32_t device_id) {
    return TensorView(ptr, std::move(shape), dtype, rdt_device{device_type, device_id});
  }

  uint64_t nbytes() const {
    uint64_t n = (uint64_t(dtype.bits) * dtype.lanes + 7) / 8;
    for (int64_t d : shape) n *= uint64_t(d);
    return n;
  }

  /// The C view; valid while this TensorView lives and is not changed.
  rdt_tensor c() const {
    rdt_tensor t;
    std::memset(&t, 0, sizeof t);
    t.data = data;
    t.device = device;
    t.ndim = int32_t(shape.size());
    t.dtype = dtype;
    t.shape = shape.empty() ? nullptr : shape.data();
    return t;
  }
};

/// A 1-D view over a vector's elements.
template <class T> TensorView view(std::vector<T> &v) { return TensorView::of(v.data(), {int64_t(v.size())}); }
template <class T> TensorView view(const std::vector<T> &v) {
  return TensorView::of(v.data(), {int64_t(v.size())});
}
#ifdef __cpp_lib_span
template <class T, std::size_t N> TensorView view(std::span<T, N> s) {
  return TensorView::of(s.data(), {int64_t(s.size())});
}
#endif

namespace detail {
inline std::vector<rdt_tensor> c_tensors(const std::vector<TensorView> &ts) {
  std::vector<rdt_tensor> out;
  out.reserve(ts.size());
  for (auto &t : ts) out.push_back(t.c());
  return out;
}
inline int64_t millis(std::chrono::milliseconds t) { return t.count() < 0 ? -1 : int64_t(t.count()); }
}  // namespace detail

class Runtime;

// ---- references ----------------------------------------------------------

/// A reference to an object. Copying clones it; destruction releases it.
class Ref {
 public:
  Ref() = default;
  explicit Ref(rdt_ref *adopt) noexcept : ref_(adopt) {}
  Ref(const Ref &o) : ref_(nullptr) {
    if (o.ref_) check(rdt_ref_clone(o.ref_, &ref_));
  }
  Ref(Ref &&o) noexcept : ref_(std::exchange(o.ref_, nullptr)) {}
  Ref &operator=(Ref o) noexcept {
    std::swap(ref_, o.ref_);
    return *this;
  }
  ~Ref() { rdt_ref_release(ref_); }

  explicit operator bool() const noexcept { return ref_ != nullptr; }
  rdt_ref *capi() const noexcept { return ref_; }
  /// Gives up ownership of the C handle.
  rdt_ref *release() noexcept { return std::exchange(ref_, nullptr); }

  /// The ref as bytes any runtime can deserialize (leased by the owner).
  std::vector<uint8_t> serialize() const {
    void *bytes = nullptr;
    size_t n = 0;
    check(rdt_ref_serialize(ref_, &bytes, &n));
    std::vector<uint8_t> out(static_cast<uint8_t *>(bytes), static_cast<uint8_t *>(bytes) + n);
    rdt_bytes_free(bytes);
    return out;
  }

  rdt_object_info info() const {
    rdt_object_info i;
    rdt_object_info_init(&i);
    check(rdt_ref_info(ref_, &i));
    return i;
  }
  std::string id() const { return info().object_id; }

  /// Shape, dtype and device of tensor `index` of the object.
  rdt_tensor_info tensor_info(uint32_t index) const {
    rdt_tensor_info i;
    rdt_tensor_info_init(&i);
    check(rdt_ref_tensor_info(ref_, index, &i));
    return i;
  }

 private:
  rdt_ref *ref_ = nullptr;
};

// ---- fetches -------------------------------------------------------------

/// A fetch in progress, future-like. Destroying it aborts what still runs
/// and waits until nothing writes into the targets.
class Fetch {
 public:
  Fetch() = default;
  explicit Fetch(rdt_fetch *adopt) noexcept : f_(adopt) {}
  Fetch(const Fetch &) = delete;
  Fetch &operator=(const Fetch &) = delete;
  Fetch(Fetch &&o) noexcept : f_(std::exchange(o.f_, nullptr)) {}
  Fetch &operator=(Fetch &&o) noexcept {
    if (this != &o) {
      rdt_fetch_free(f_);
      f_ = std::exchange(o.f_, nullptr);
    }
    return *this;
  }
  ~Fetch() { rdt_fetch_free(f_); }

  /// Waits up to `timeout` (negative: forever). True when every transfer
  /// completed; false when the time ran out (the fetch goes on); throws the
  /// first transfer error.
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
    rdt_status st = rdt_fetch_wait(f_, detail::millis(timeout));
    if (st == RDT_ERR_TIMEOUT) return false;
    check(st);
    return true;
  }
  /// Whether it has completed (throws its error if it failed).
  bool ready() { return wait(std::chrono::milliseconds(0)); }
  /// Asks every transfer to stop; wait() then reports RDT_ERR_ABORTED.
  void abort() { check(rdt_fetch_abort(f_)); }
  rdt_fetch *capi() const noexcept { return f_; }

 private:
  rdt_fetch *f_ = nullptr;
};

// ---- transports ------------------------------------------------------------

/// One side of a transfer, as the transport's callbacks see it.
struct Transfer {
  rdt_transfer const *c;
  std::string object_id() const { return c->object_id; }
  uint64_t id() const { return c->transfer_id; }
  bool is_source() const { return c->role == RDT_ROLE_SOURCE; }
};

/// A transport written in C++. Override what your transport does; the
/// defaults are "no metadata" and, for send/recv, an error. Exceptions
/// thrown by any method become RDT_ERR_USER with what() as the message;
/// they never unwind into rdt.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual bool one_sided() const = 0;
  virtual bool can_abort() const { return false; }
  /// Source, at put: metadata that travels in every serialized ref.
  virtual std::vector<uint8_t> extract_metadata(const std::string & /*object_id*/,
                                                const std::vector<rdt_tensor> & /*tensors*/) {
    return {};
  }
  /// Destination, once per transfer.
  virtual std::vector<uint8_t> communicator_metadata(const Transfer &) { return {}; }
  /// Source of a two-sided transport: send and return when done.
  virtual void send(const Transfer &, const std::vector<rdt_tensor> &, const std::vector<uint8_t> & /*tmeta*/,
                    const std::vector<uint8_t> & /*cmeta*/) {
    throw std::logic_error("this transport does not send");
  }
  /// Destination: receive into the targets and return when done.
  virtual void recv(const Transfer &, const std::vector<rdt_tensor> &targets, const std::vector<uint8_t> &tmeta,
                    const std::vector<uint8_t> &cmeta) = 0;
  /// Source: the object was freed.
  virtual void garbage_collect(const std::string & /*object_id*/, const std::vector<rdt_tensor> &,
                               const std::vector<uint8_t> & /*tmeta*/) {}
  /// Either side: stop the transfer so that recv/send return soon.
  virtual void abort(const Transfer &) {}
};

namespace detail {
template <class F> rdt_status guard(F &&f) noexcept {
  try {
    f();
    return RDT_OK;
  } catch (const Error &e) {
    rdt_set_error(e.message().c_str());
    return e.status();
  } catch (const std::exception &e) {
    rdt_set_error(e.what());
    return RDT_ERR_USER;
  } catch (...) {
    rdt_set_error("a C++ transport threw an exception that is not a std::exception");
    return RDT_ERR_USER;
  }
}
inline std::vector<uint8_t> bytes(const void *p, size_t n) {
  auto b = static_cast<const uint8_t *>(p);
  return n ? std::vector<uint8_t>(b, b + n) : std::vector<uint8_t>();
}
inline std::vector<rdt_tensor> tensors(const rdt_tensor *t, size_t n) { return std::vector<rdt_tensor>(t, t + n); }
inline Transport *self(void *ud) { return static_cast<Transport *>(ud); }

inline rdt_transport_vtable vtable_for(Transport *t) {
  rdt_transport_vtable vt;
  rdt_transport_vtable_init(&vt);
  vt.flags = (t->one_sided() ? RDT_TRANSPORT_ONE_SIDED : 0u) | (t->can_abort() ? RDT_TRANSPORT_CAN_ABORT : 0u);
  vt.user_data = t;
  vt.free_user_data = [](void *ud) { delete self(ud); };
  vt.extract_metadata = [](void *ud, const char *obj, const rdt_tensor *ts, size_t n, rdt_buffer *out) {
    return guard([&] {
      auto m = self(ud)->extract_metadata(obj, tensors(ts, n));
      check(rdt_buffer_set(out, m.data(), m.size()));
    });
  };
  vt.communicator_metadata = [](void *ud, const rdt_transfer *x, rdt_buffer *out) {
    return guard([&] {
      auto m = self(ud)->communicator_metadata(Transfer{x});
      check(rdt_buffer_set(out, m.data(), m.size()));
    });
  };
  vt.send = [](void *ud, const rdt_transfer *x, const rdt_tensor *ts, size_t n, const void *tm, size_t tn,
               const void *cm, size_t cn) {
    return guard([&] { self(ud)->send(Transfer{x}, tensors(ts, n), bytes(tm, tn), bytes(cm, cn)); });
  };
  vt.recv = [](void *ud, const rdt_transfer *x, const rdt_tensor *ts, size_t n, const void *tm, size_t tn,
               const void *cm, size_t cn) {
    return guard([&] { self(ud)->recv(Transfer{x}, tensors(ts, n), bytes(tm, tn), bytes(cm, cn)); });
  };
  vt.garbage_collect = [](void *ud, const char *obj, const rdt_tensor *ts, size_t n, const void *tm, size_t tn) {
    guard([&] { self(ud)->garbage_collect(obj, tensors(ts, n), bytes(tm, tn)); });
  };
  vt.abort = [](void *ud, const rdt_transfer *x, void *) { return guard([&] { self(ud)->abort(Transfer{x}); }); };
  return vt;
}
}  // namespace detail

// ---- runtimes ------------------------------------------------------------

/// Options for a runtime; unset fields take the library's defaults.
struct Options {
  std::string name;
  std::chrono::milliseconds lease{0};
  std::chrono::milliseconds peer_timeout{0};
  std::string listen_tcp, auth_token, advertise_host, socket_dir, host_id;
  uint32_t flags = 0;  // RDT_RUNTIME_*
  int32_t log_level = RDT_LOG_DEFAULT;
};

/// An rdt runtime. Move-only; destruction destroys it (aborting its
/// fetches and freeing its objects).
class Runtime {
 public:
  explicit Runtime(const Options &o = Options()) {
    rdt_runtime_options c;
    rdt_runtime_options_init(&c);
    auto str = [](const std::string &s) { return s.empty() ? nullptr : s.c_str(); };
    c.name = str(o.name);
    c.lease_ms = o.lease.count();
    c.peer_timeout_ms = o.peer_timeout.count();
    c.listen_tcp = str(o.listen_tcp);
    c.auth_token = str(o.auth_token);
    c.advertise_host = str(o.advertise_host);
    c.socket_dir = str(o.socket_dir);
    c.host_id = str(o.host_id);
    c.flags = o.flags;
    c.log_level = o.log_level;
    check(rdt_runtime_create(&c, &rt_));
  }
  explicit Runtime(rdt_runtime *adopt) noexcept : rt_(adopt) {}
  Runtime(const Runtime &) = delete;
  Runtime &operator=(const Runtime &) = delete;
  Runtime(Runtime &&o) noexcept : rt_(std::exchange(o.rt_, nullptr)) {}
  Runtime &operator=(Runtime &&o) noexcept {
    if (this != &o) {
      rdt_runtime_destroy(rt_);
      rt_ = std::exchange(o.rt_, nullptr);
    }
    return *this;
  }
  ~Runtime() { rdt_runtime_destroy(rt_); }

  rdt_runtime *capi() const noexcept { return rt_; }

  std::string address() const {
    const char *a = nullptr;
    check(rdt_runtime_address(rt_, &a));
    return a;
  }

  /// Puts tensors as one object (not copied: keep them unmodified until
  /// freed). An empty transport lets each fetch choose.
  Ref put(const std::vector<TensorView> &tensors, const std::string &transport = "") {
    auto c = detail::c_tensors(tensors);
    rdt_ref *r = nullptr;
    check(rdt_put(rt_, c.data(), c.size(), transport.empty() ? nullptr : transport.c_str(), nullptr, nullptr, &r));
    return Ref(r);
  }

  Ref deserialize(const std::vector<uint8_t> &bytes) {
    rdt_ref *r = nullptr;
    check(rdt_ref_deserialize(rt_, bytes.data(), bytes.size(), &r));
    return Ref(r);
  }

  /// Starts fetching refs into targets (one per source tensor, ref after ref).
  Fetch fetch(const std::vector<Ref> &refs, const std::vector<TensorView> &targets,
              const std::string &transport = "") {
    std::vector<rdt_ref *> rs;
    for (auto &r : refs) rs.push_back(r.capi());
    auto c = detail::c_tensors(targets);
    rdt_fetch_options fo;
    rdt_fetch_options_init(&fo);
    fo.transport = transport.empty() ? nullptr : transport.c_str();
    rdt_fetch *f = nullptr;
    check(rdt_fetch_start(rt_, rs.data(), rs.size(), c.data(), c.size(), &fo, &f));
    return Fetch(f);
  }

  /// Fetches and waits; throws rdt::Error (RDT_ERR_TIMEOUT when the time ran out).
  void get(const std::vector<Ref> &refs, const std::vector<TensorView> &targets,
           std::chrono::milliseconds timeout = std::chrono::milliseconds(-1), const std::string &transport = "") {
    std::vector<rdt_ref *> rs;
    for (auto &r : refs) rs.push_back(r.capi());
    auto c = detail::c_tensors(targets);
    rdt_fetch_options fo;
    rdt_fetch_options_init(&fo);
    fo.transport = transport.empty() ? nullptr : transport.c_str();
    check(rdt_get(rt_, rs.data(), rs.size(), c.data(), c.size(), &fo, detail::millis(timeout)));
  }
  void get(const Ref &ref, const std::vector<TensorView> &targets,
           std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
    get(std::vector<Ref>{ref}, targets, timeout);
  }

  /// Blocks until no object holds memory at `data`; false on timeout.
  bool wait_tensor_freed(const void *data, std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
    rdt_status st = rdt_wait_tensor_freed(rt_, data, detail::millis(timeout));
    if (st == RDT_ERR_TIMEOUT) return false;
    check(st);
    return true;
  }

  rdt_stats stats() const {
    rdt_stats s;
    rdt_stats_init(&s);
    check(rdt_runtime_stats(rt_, &s));
    return s;
  }

  std::vector<rdt_transport_info> transports() const {
    size_t n = 0;
    check(rdt_transport_list(rt_, nullptr, 0, &n));
    std::vector<rdt_transport_info> out(n);
    for (auto &i : out) rdt_transport_info_init(&i);
    check(rdt_transport_list(rt_, out.data(), out.size(), &n));
    out.resize(std::min(n, out.size()));
    return out;
  }

 private:
  rdt_runtime *rt_ = nullptr;
};

/// Registers a C++ transport with a runtime, which owns it from then on.
inline void register_transport(Runtime &rt, const std::string &name, const std::vector<int32_t> &devices,
                               std::unique_ptr<Transport> transport) {
  rdt_transport_vtable vt = detail::vtable_for(transport.release());
  // On failure rdt calls free_user_data, which deletes the transport.
  check(rdt_register_transport(rt.capi(), name.c_str(), devices.data(), devices.size(), &vt));
}

}  // namespace rdt

#endif  // RDT_HPP
