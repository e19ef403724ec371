// rdt.hpp: the header-only C++17 wrapper over rdt's C ABI (rdt.h).
//
//   #include <rdt/rdt.hpp>
//
//   rdt::Runtime rt;                                   // move-only
//   rdt::Ref ref = rt.put({rdt::tensor(weights)});     // copy = clone, move = free
//   std::vector<uint8_t> bytes = ref.serialize();      // hand to another process
//   ...
//   rdt::Ref borrowed = rt.deserialize(bytes);
//   rt.get(borrowed, {rdt::tensor(buffer)}, std::chrono::seconds(10));
//   rt.get(borrowed, {rdt::tensor(rows)}, {rdt::rows(0, borrowed, 0, 128, 256)});  // rows 128..255 only
//
// The words are rdt.h's (docs/abi.md, "Vocabulary"): get and write, each
// blocking (get, write), started (get_start, write_start: an rdt::Fetch or
// rdt::Write, both an rdt::Pending) or prepared (prepare_get, prepare_write:
// an rdt::Prepared); rdt::Range is a byte range of one tensor; rdt::Tensor
// describes local memory; a view (Runtime::view, rdt::ObjectView) is only
// the read-only mapping of a same-host owner's object.
//
// Ownership: Runtime, Ref, Fetch, Write, Prepared and ObjectView own one C
// handle each and free it in their destructors; there is no way to obtain
// an owning raw handle except release(), which is [[nodiscard]]. capi()
// lends the raw handle for calls the wrapper does not cover.
//
// Errors: every call checks its rdt_status and throws rdt::Error carrying
// the status and the library's message for this thread. Two calls report
// "not yet" as a value instead: Pending::wait(timeout) (of a Fetch or a Write) and
// Runtime::wait_tensor_freed(ptr, timeout) return false when time runs out.
//
// Transports: derive from rdt::Transport and register it with
// rdt::register_transport(). Every callback trampoline is noexcept and
// catches everything: an exception becomes RDT_ERR_USER (an rdt::Error keeps
// its own status) with its message, set through rdt_set_error(); nothing
// ever unwinds into the library.
//
// Thread safety: as rdt.h, every call may be made from any thread. One
// wrapper object must not be used by one thread while another moves from,
// assigns to or destroys it.
#ifndef RDT_HPP
#define RDT_HPP

#include <rdt.h>

#include <algorithm>
#include <chrono>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#if __has_include(<version>)
#include <version>
#endif
#if defined(__cpp_lib_span)
#include <span>
#endif

namespace rdt {

// ---- errors -----------------------------------------------------------------

/// A failed rdt call: its status code and the library's detailed message.
/// what() is "RDT_ERR_NAME: message".
class Error : public std::runtime_error {
 public:
  Error(rdt_status status, const std::string &message)
      : std::runtime_error(std::string(rdt_status_string(status)) + ": " + message),
        status_(status),
        message_(message) {}
  /// The rdt_status (negative; <= RDT_ERR_USER for a transport's own code).
  rdt_status status() const noexcept { return status_; }
  /// The message alone, without the status name.
  const std::string &message() const noexcept { return message_; }

 private:
  rdt_status status_;
  std::string message_;
};

/// Throws rdt::Error with this thread's rdt_last_error() unless `status` is
/// RDT_OK. Use it around raw C calls made through capi() handles.
inline void check(rdt_status status) {
  if (status != RDT_OK) throw Error(status, rdt_last_error());
}

/// The library's version, "MAJOR.MINOR.PATCH" (the header's is
/// RDT_VERSION_MAJOR/MINOR/PATCH).
inline std::string version() { return rdt_version(); }

/// Waits forever when given as a timeout.
constexpr std::chrono::milliseconds forever{-1};

/// How long Runtime::deserialize() waits for the owner unless told.
constexpr std::chrono::milliseconds deserialize_timeout{RDT_DESERIALIZE_TIMEOUT_DEFAULT_MS};

// ---- spans over borrowed memory ---------------------------------------------

/// A non-owning span of `size` contiguous T (std::span for C++17). Spans
/// handed to transport callbacks are valid only during the callback.
template <class T>
class Span {
 public:
  constexpr Span() noexcept = default;
  constexpr Span(T *data, std::size_t size) noexcept : data_(data), size_(size) {}
  template <class U, class = std::enable_if_t<std::is_same_v<std::remove_const_t<T>, U> && std::is_const_v<T>>>
  Span(const std::vector<U> &v) noexcept : data_(v.data()), size_(v.size()) {}  // NOLINT: implicit by design

  constexpr T *data() const noexcept { return data_; }
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr bool empty() const noexcept { return size_ == 0; }
  constexpr T *begin() const noexcept { return data_; }
  constexpr T *end() const noexcept { return data_ + size_; }
  constexpr T &operator[](std::size_t i) const noexcept { return data_[i]; }
  /// An owning copy.
  std::vector<std::remove_const_t<T>> to_vector() const { return {begin(), end()}; }

 private:
  T *data_ = nullptr;
  std::size_t size_ = 0;
};

/// Tensors as rdt hands them to callbacks (rdt_tensor is DLPack-compatible).
using Tensors = Span<const rdt_tensor>;
/// Metadata bytes as rdt hands them to callbacks.
using Bytes = Span<const uint8_t>;

/// Size in bytes of a tensor: prod(shape) * ceil(bits * lanes / 8).
inline uint64_t nbytes(const rdt_tensor &t) noexcept {
  uint64_t n = (uint64_t(t.dtype.bits) * t.dtype.lanes + 7) / 8;
  for (int32_t i = 0; i < t.ndim; i++) n *= uint64_t(t.shape[i]);
  return n;
}

/// The first byte of a tensor: data + byte_offset. Transports must use this,
/// not `data`, since rdt may hand them tensors with a byte offset.
inline void *bytes_of(const rdt_tensor &t) noexcept {
  return static_cast<char *>(t.data) + t.byte_offset;
}

// ---- tensors ----------------------------------------------------------------

/// The rdt dtype of a C++ element type (integers, floating point, bool,
/// std::byte, std::complex<float/double>).
template <class T>
constexpr rdt_dtype dtype_of() noexcept {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, bool>) {
    return rdt_dtype{RDT_DTYPE_BOOL, 8, 1};
  } else if constexpr (std::is_same_v<U, std::byte>) {
    return rdt_dtype{RDT_DTYPE_UINT, 8, 1};
  } else if constexpr (std::is_same_v<U, std::complex<float>> || std::is_same_v<U, std::complex<double>>) {
    return rdt_dtype{RDT_DTYPE_COMPLEX, uint8_t(8 * sizeof(U)), 1};
  } else if constexpr (std::is_floating_point_v<U>) {
    static_assert(sizeof(U) <= 8, "long double has no DLPack dtype");
    return rdt_dtype{RDT_DTYPE_FLOAT, uint8_t(8 * sizeof(U)), 1};
  } else if constexpr (std::is_integral_v<U>) {
    return rdt_dtype{uint8_t(std::is_signed_v<U> ? RDT_DTYPE_INT : RDT_DTYPE_UINT), uint8_t(8 * sizeof(U)), 1};
  } else {
    static_assert(sizeof(U) == 0, "no rdt dtype for this type: build a Tensor with an explicit rdt_dtype");
    return rdt_dtype{};
  }
}

/// Host memory (RDT_DEVICE_CPU, device 0).
constexpr rdt_device cpu{RDT_DEVICE_CPU, 0};

/// A contiguous (row-major) tensor, the C++ form of rdt_tensor: where its
/// bytes are, its shape, dtype and device. It does not own the memory; keep
/// that alive and unmodified as long as rdt uses it (see Runtime::put and
/// Runtime::get_start). Make one with rdt::tensor().
struct Tensor {
  void *data = nullptr;
  std::vector<int64_t> shape;
  rdt_dtype dtype{RDT_DTYPE_UINT, 8, 1};
  rdt_device device = cpu;

  Tensor() = default;
  Tensor(void *data_, std::vector<int64_t> shape_, rdt_dtype dtype_, rdt_device device_ = cpu)
      : data(data_), shape(std::move(shape_)), dtype(dtype_), device(device_) {}
  /// A copy of a C tensor's description (byte_offset is folded into data;
  /// strides must be compact, as everywhere in rdt).
  explicit Tensor(const rdt_tensor &t)
      : data(bytes_of(t)), shape(t.shape, t.shape + t.ndim), dtype(t.dtype), device(t.device) {}

  /// Host memory of T with any shape.
  template <class T>
  static Tensor of(T *data, std::vector<int64_t> shape) {
    return Tensor(const_cast<std::remove_cv_t<T> *>(data), std::move(shape), dtype_of<T>());
  }
  /// Memory on a device, for example CUDA memory of GPU `device_id`
  /// (device_type RDT_DEVICE_CUDA).
  static Tensor device_memory(void *ptr, std::vector<int64_t> shape, rdt_dtype dtype, int32_t device_type,
                              int32_t device_id) {
    return Tensor(ptr, std::move(shape), dtype, rdt_device{device_type, device_id});
  }

  /// Number of elements: the product of the shape (1 for a scalar).
  uint64_t numel() const noexcept {
    uint64_t n = 1;
    for (int64_t d : shape) n *= uint64_t(d);
    return n;
  }
  uint64_t nbytes() const noexcept { return numel() * ((uint64_t(dtype.bits) * dtype.lanes + 7) / 8); }

  /// The C description; it points into this Tensor's shape, so it is valid
  /// while this Tensor lives and its shape is not changed.
  rdt_tensor capi() const noexcept {
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

namespace detail {
inline void check_numel(uint64_t have, const std::vector<int64_t> &shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error(RDT_ERR_INVALID_ARGUMENT, "rdt::tensor: negative dimension in shape");
    n *= uint64_t(d);
  }
  if (n != have)
    throw Error(RDT_ERR_INVALID_ARGUMENT, "rdt::tensor: the shape has " + std::to_string(n) +
                                              " elements but the buffer holds " + std::to_string(have));
}
}  // namespace detail

/// A 1-D tensor over a vector's elements.
template <class T>
Tensor tensor(std::vector<T> &v) {
  return Tensor::of(v.data(), {int64_t(v.size())});
}
/// A 1-D tensor over a const vector: for put (rdt never writes a put tensor).
template <class T>
Tensor tensor(const std::vector<T> &v) {
  return Tensor::of(v.data(), {int64_t(v.size())});
}
/// A tensor over a vector with a shape whose product must equal v.size().
template <class T>
Tensor tensor(std::vector<T> &v, std::vector<int64_t> shape) {
  detail::check_numel(v.size(), shape);
  return Tensor::of(v.data(), std::move(shape));
}
template <class T>
Tensor tensor(const std::vector<T> &v, std::vector<int64_t> shape) {
  detail::check_numel(v.size(), shape);
  return Tensor::of(v.data(), std::move(shape));
}
/// A tensor over host memory of T with a shape.
template <class T>
Tensor tensor(T *data, std::vector<int64_t> shape) {
  return Tensor::of(data, std::move(shape));
}
#if defined(__cpp_lib_span)
/// A 1-D tensor over a std::span (C++20).
template <class T, std::size_t N>
Tensor tensor(std::span<T, N> s) {
  return Tensor::of(s.data(), {int64_t(s.size())});
}
template <class T, std::size_t N>
Tensor tensor(std::span<T, N> s, std::vector<int64_t> shape) {
  detail::check_numel(s.size(), shape);
  return Tensor::of(s.data(), std::move(shape));
}
#endif

/// The earlier name of rdt::Tensor ("view" now means only rdt::ObjectView).
using TensorView [[deprecated("use rdt::Tensor")]] = Tensor;
/// The earlier name of rdt::tensor(), for each of its forms.
template <class T>
[[deprecated("use rdt::tensor")]] Tensor view(std::vector<T> &v) {
  return tensor(v);
}
template <class T>
[[deprecated("use rdt::tensor")]] Tensor view(const std::vector<T> &v) {
  return tensor(v);
}
template <class T>
[[deprecated("use rdt::tensor")]] Tensor view(std::vector<T> &v, std::vector<int64_t> shape) {
  return tensor(v, std::move(shape));
}
template <class T>
[[deprecated("use rdt::tensor")]] Tensor view(const std::vector<T> &v, std::vector<int64_t> shape) {
  return tensor(v, std::move(shape));
}
template <class T>
[[deprecated("use rdt::tensor")]] Tensor view(T *data, std::vector<int64_t> shape) {
  return tensor(data, std::move(shape));
}
#if defined(__cpp_lib_span)
template <class T, std::size_t N>
[[deprecated("use rdt::tensor")]] Tensor view(std::span<T, N> s) {
  return tensor(s);
}
template <class T, std::size_t N>
[[deprecated("use rdt::tensor")]] Tensor view(std::span<T, N> s, std::vector<int64_t> shape) {
  return tensor(s, std::move(shape));
}
#endif

namespace detail {
inline std::vector<rdt_tensor> c_tensors(const std::vector<Tensor> &ts) {
  std::vector<rdt_tensor> out;
  out.reserve(ts.size());
  for (auto &t : ts) out.push_back(t.capi());
  return out;
}
inline int64_t millis(std::chrono::milliseconds t) noexcept { return t.count() < 0 ? -1 : int64_t(t.count()); }
inline const char *opt(const std::string &s) noexcept { return s.empty() ? nullptr : s.c_str(); }
}  // namespace detail

// ---- references ---------------------------------------------------------------

/// A counted reference to an object. Copying clones the reference
/// (rdt_ref_clone), moving transfers it, destruction releases it. A
/// default-constructed or moved-from Ref is empty (false); using it throws
/// rdt::Error(RDT_ERR_INVALID_ARGUMENT).
class [[nodiscard]] Ref {
 public:
  Ref() noexcept = default;
  /// Takes ownership of a C reference.
  explicit Ref(rdt_ref *adopt) noexcept : ref_(adopt) {}
  Ref(const Ref &o) {
    if (o.ref_) check(rdt_ref_clone(o.ref_, &ref_));
  }
  Ref(Ref &&o) noexcept : ref_(std::exchange(o.ref_, nullptr)) {}
  Ref &operator=(const Ref &o) {
    if (this != &o) Ref(o).swap(*this);
    return *this;
  }
  Ref &operator=(Ref &&o) noexcept {
    Ref(std::move(o)).swap(*this);
    return *this;
  }
  ~Ref() { rdt_ref_release(ref_); }
  void swap(Ref &o) noexcept { std::swap(ref_, o.ref_); }

  explicit operator bool() const noexcept { return ref_ != nullptr; }
  /// The C handle, still owned by this Ref.
  rdt_ref *capi() const noexcept { return ref_; }
  /// Gives up ownership: the caller must rdt_ref_release() the result.
  [[nodiscard]] rdt_ref *release() noexcept { return std::exchange(ref_, nullptr); }
  /// Releases the reference now (the Ref becomes empty).
  void reset() noexcept { Ref().swap(*this); }
  /// Releases the reference now with RDT_RELEASE_* flags (rdt_ref_release_ex).
  /// In the owner, reset(RDT_RELEASE_REVOKE_LEASES) also revokes the leases
  /// of serialized refs nobody deserialized, so the object is freed once no
  /// reference and no borrow is left, not when the leases expire. Throws
  /// rdt::Error on failure (such as revoking through a borrowed reference),
  /// and the Ref then keeps its reference. An empty Ref stays empty.
  void reset(uint32_t release_flags) {
    check(rdt_ref_release_ex(ref_, release_flags));
    ref_ = nullptr;
  }

  /// The reference as bytes that any runtime can deserialize. The bytes hold
  /// the object for the owner's lease or until deserialized; serialize once
  /// per receiver.
  std::vector<uint8_t> serialize() const {
    void *raw = nullptr;
    size_t n = 0;
    check(rdt_ref_serialize(ref_, &raw, &n));
    std::unique_ptr<void, void (*)(void *)> owned(raw, rdt_bytes_free);
    auto *b = static_cast<const uint8_t *>(raw);
    return n ? std::vector<uint8_t>(b, b + n) : std::vector<uint8_t>();
  }

  rdt_object_info info() const {
    rdt_object_info i;
    rdt_object_info_init(&i);
    check(rdt_ref_info(ref_, &i));
    return i;
  }

  // ---- the owner's side of an exposed object (Runtime::expose) ----

  /// Takes the oldest notice of a write into this exposed object (the
  /// owner's Ref), waiting up to `timeout`; false when none came. Every
  /// write the owner admitted ends in exactly one notice: `status` RDT_OK
  /// when every byte landed, else why not (the bytes it covers may be torn).
  bool wait_notice(rdt_write_notice &out, std::chrono::milliseconds timeout = forever) {
    rdt_write_notice_init(&out);
    rdt_status st = rdt_write_notice_wait(ref_, detail::millis(timeout), &out);
    if (st == RDT_ERR_TIMEOUT) return false;
    check(st);
    return true;
  }
  /// A descriptor readable while notices wait (owned by the object).
  int notice_fd() const {
    int fd = -1;
    check(rdt_write_notice_event_fd(ref_, &fd));
    return fd;
  }
  /// Refuses every later write and waits up to `timeout` until no write is
  /// open; false when writes are still open (the revocation stays).
  bool revoke_writes(std::chrono::milliseconds timeout = forever) {
    rdt_status st = rdt_ref_revoke_writes(ref_, detail::millis(timeout));
    if (st == RDT_ERR_TIMEOUT) return false;
    check(st);
    return true;
  }
  /// The object id (32 hexadecimal characters).
  std::string id() const { return info().object_id; }
  /// The transport named at put, or "" when chosen per fetch.
  std::string transport() const { return info().transport; }
  uint32_t num_tensors() const { return info().num_tensors; }
  /// Total size of the object's tensors in bytes.
  uint64_t nbytes() const { return info().nbytes; }
  /// Whether this reference's runtime owns the object.
  bool is_owner() const { return info().is_owner != 0; }

  /// Shape, dtype, device and size of tensor `index` on the source.
  rdt_tensor_info tensor_info(uint32_t index) const {
    rdt_tensor_info i;
    rdt_tensor_info_init(&i);
    check(rdt_ref_tensor_info(ref_, index, &i));
    return i;
  }
  /// Descriptions of every tensor, with data == nullptr: point each `data`
  /// at a buffer of nbytes() (and adjust `device`) to make get targets.
  std::vector<Tensor> tensors() const {
    std::vector<Tensor> out;
    uint32_t n = num_tensors();
    out.reserve(n);
    for (uint32_t i = 0; i < n; i++) {
      rdt_tensor_info ti = tensor_info(i);
      out.emplace_back(nullptr, std::vector<int64_t>(ti.shape, ti.shape + ti.ndim), ti.dtype, ti.device);
    }
    return out;
  }

 private:
  rdt_ref *ref_ = nullptr;
};

inline void swap(Ref &a, Ref &b) noexcept { a.swap(b); }

/// The refs of one call, borrowed (not cloned) for the duration of a call:
/// a single Ref, a std::vector<Ref>, or a braced list {a, b, ...}.
class RefList {
 public:
  /// One element of a braced list.
  struct Item {
    Item(const Ref &r) noexcept : ref(r.capi()) {}  // NOLINT: implicit by design
    rdt_ref *ref;
  };
  RefList(const Ref &r) : refs_{r.capi()} {}  // NOLINT
  RefList(const std::vector<Ref> &rs) {       // NOLINT
    refs_.reserve(rs.size());
    for (auto &r : rs) refs_.push_back(r.capi());
  }
  RefList(std::initializer_list<Item> items) {
    refs_.reserve(items.size());
    for (auto &i : items) refs_.push_back(i.ref);
  }
  rdt_ref *const *data() const noexcept { return refs_.data(); }
  std::size_t size() const noexcept { return refs_.size(); }

 private:
  std::vector<rdt_ref *> refs_;
};

// ---- ranges: partial gets and writes ------------------------------------------

/// A byte range of one tensor of an object (rdt_range): `length` bytes from
/// byte `offset` of tensor `tensor` of the call's refs[`ref`]; by default,
/// that whole tensor. In a partial get, target i receives range i; in a
/// partial write, source i lands in range i. The local tensor needs the
/// object's tensor's dtype and device type and exactly that many bytes, in
/// any shape. rdt checks the range against the owner's description when the
/// get or write starts.
struct Range {
  uint32_t ref = 0;                        // index into the call's refs
  uint32_t tensor = 0;                     // index of the tensor in that ref's object
  uint64_t offset = 0;                     // first byte of the range in the tensor
  uint64_t length = RDT_REST_OF_TENSOR;    // bytes; RDT_REST_OF_TENSOR: to its end

  rdt_range capi() const noexcept { return rdt_range{ref, tensor, offset, length}; }
};

/// The earlier name of rdt::Range.
using Source [[deprecated("use rdt::Range")]] = Range;

/// Rows [begin, end) of tensor `tensor` of `ref`, which is refs[`ref_index`]
/// of the get or write: a row is one index of the first dimension (the
/// tensor is row-major). Asks `ref` for the tensor's shape once. Throws
/// rdt::Error(RDT_ERR_INVALID_ARGUMENT) for a 0-d tensor or end < begin;
/// rows past the last are refused when the get or write starts, which
/// knows the owner's description.
inline Range rows(uint32_t ref_index, const Ref &ref, uint32_t tensor, uint64_t begin, uint64_t end) {
  rdt_tensor_info ti = ref.tensor_info(tensor);
  if (ti.ndim == 0)
    throw Error(RDT_ERR_INVALID_ARGUMENT, "rdt::rows: tensor " + std::to_string(tensor) + " is 0-d: it has no rows");
  if (end < begin)
    throw Error(RDT_ERR_INVALID_ARGUMENT, "rdt::rows: rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                                              ") end before they begin");
  uint64_t row = (uint64_t(ti.dtype.bits) * ti.dtype.lanes + 7) / 8;
  for (int32_t i = 1; i < ti.ndim; i++) row *= uint64_t(ti.shape[i]);
  return Range{ref_index, tensor, begin * row, (end - begin) * row};
}

namespace detail {
// The C ranges of `ranges` (nullptr: none), kept in `c`.
inline const rdt_range *c_ranges(const std::vector<Range> *ranges, std::vector<rdt_range> &c) {
  if (!ranges) return nullptr;
  c.reserve(ranges->size());
  for (auto &r : *ranges) c.push_back(r.capi());
  return c.data();
}
// The options of a get, pointing into `c` (which must outlive them).
inline rdt_get_options get_options(const std::string &transport, const std::vector<Range> *sources,
                                   std::vector<rdt_range> &c) {
  rdt_get_options go;
  rdt_get_options_init(&go);
  go.transport = opt(transport);
  go.sources = c_ranges(sources, c);
  go.num_sources = sources ? sources->size() : 0;
  return go;
}
// The options of a write, pointing into `c` (which must outlive them).
inline rdt_write_options write_options(const std::string &transport, uint64_t tag,
                                       const std::vector<Range> *destinations, std::vector<rdt_range> &c) {
  rdt_write_options wo;
  rdt_write_options_init(&wo);
  wo.transport = opt(transport);
  wo.tag = tag;
  wo.destinations = c_ranges(destinations, c);
  wo.num_destinations = destinations ? destinations->size() : 0;
  return wo;
}
}  // namespace detail

// ---- pending gets and writes ----------------------------------------------------

/// A get or a write under way (RAII over rdt_pending), future-like and
/// move-only: what rdt::Fetch (Runtime::get_start) and rdt::Write
/// (Runtime::write_start) have in common. Destruction aborts what still
/// runs and returns only when nothing touches the local tensors any more
/// (for a transport that cannot abort: when it finished), so they may be
/// freed right after. Declare it after those buffers.
class Pending {
 public:
  Pending(const Pending &) = delete;
  Pending &operator=(const Pending &) = delete;

  /// Waits up to `timeout` (rdt::forever, the default, waits forever).
  /// true: every byte moved. false: the time ran out and the operation goes
  /// on (wait again, abort, or destroy it). Otherwise throws the first
  /// transfer error, once nothing touches the local tensors. After a final
  /// result, wait returns (or throws) the same again.
  bool wait(std::chrono::milliseconds timeout = forever) {
    rdt_status st = rdt_pending_wait(p_, detail::millis(timeout));
    if (st == RDT_ERR_TIMEOUT) return false;
    check(st);
    return true;
  }
  /// Whether it completed, without blocking (throws its error if it failed).
  bool ready() { return wait(std::chrono::milliseconds(0)); }
  /// Asks every transfer to stop and returns at once; a later wait() throws
  /// rdt::Error(RDT_ERR_ABORTED) (or returns true if all had completed).
  void abort() { check(rdt_pending_abort(p_)); }

  explicit operator bool() const noexcept { return p_ != nullptr; }
  /// The C handle, still owned by this object.
  rdt_pending *capi() const noexcept { return p_; }
  /// Gives up ownership: the caller must rdt_pending_free() the result.
  [[nodiscard]] rdt_pending *release() noexcept { return std::exchange(p_, nullptr); }

 protected:
  Pending() noexcept = default;
  explicit Pending(rdt_pending *adopt) noexcept : p_(adopt) {}
  Pending(Pending &&o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  Pending &operator=(Pending &&o) noexcept {
    if (this != &o) {
      rdt_pending_free(p_);
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  ~Pending() { rdt_pending_free(p_); }

 private:
  rdt_pending *p_ = nullptr;
};

class Write;

/// A get in progress, made by Runtime::get_start(): wait() returns true once
/// every target holds its object's bytes.
class [[nodiscard]] Fetch : public Pending {
 public:
  Fetch() noexcept = default;
  /// Takes ownership of a C pending get.
  explicit Fetch(rdt_pending *adopt) noexcept : Pending(adopt) {}
  Fetch(Fetch &&) noexcept = default;
  Fetch &operator=(Fetch &&) noexcept = default;
  /// write_start() used to return a Fetch; it returns an rdt::Write now.
  [[deprecated("write_start returns an rdt::Write")]] Fetch(Write &&w) noexcept;
};

/// A write in progress, made by Runtime::write_start(): wait() returns true
/// once every byte landed in the owners' objects. Keep the sources
/// unmodified until then.
class [[nodiscard]] Write : public Pending {
 public:
  Write() noexcept = default;
  /// Takes ownership of a C pending write.
  explicit Write(rdt_pending *adopt) noexcept : Pending(adopt) {}
  Write(Write &&) noexcept = default;
  Write &operator=(Write &&) noexcept = default;
};

inline Fetch::Fetch(Write &&w) noexcept : Pending(w.release()) {}

/// A get or a write resolved once and run many times (RAII over
/// rdt_prepare_get / rdt_prepare_write / rdt_prepared_free), move-only.
/// The first run() is an ordinary get or write; later runs only start the
/// transports. It holds its own handles on the refs; the tensors' memory
/// must outlive it. Destruction waits for a run in progress.
class [[nodiscard]] Prepared {
 public:
  Prepared() noexcept = default;
  /// Takes ownership of a C prepared transfer.
  explicit Prepared(rdt_prepared *adopt) noexcept : p_(adopt) {}
  Prepared(const Prepared &) = delete;
  Prepared &operator=(const Prepared &) = delete;
  Prepared(Prepared &&o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  Prepared &operator=(Prepared &&o) noexcept {
    if (this != &o) {
      rdt_prepared_free(p_);
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  ~Prepared() { rdt_prepared_free(p_); }

  /// Runs it once (a write's notice carries `tag`; a get ignores it) and
  /// returns when it ended; throws rdt::Error, with RDT_ERR_TIMEOUT when
  /// `timeout` passed (the run was aborted and stopped).
  void run(uint64_t tag = 0, std::chrono::milliseconds timeout = forever) {
    check(rdt_prepared_run(p_, tag, detail::millis(timeout)));
  }

  explicit operator bool() const noexcept { return p_ != nullptr; }
  /// The C handle, still owned by this Prepared.
  rdt_prepared *capi() const noexcept { return p_; }

 private:
  rdt_prepared *p_ = nullptr;
};

/// An object's tensors read where they lie (RAII over rdt_view_open /
/// rdt_view_release), move-only: for an object of another runtime on this
/// host, the owner's staged copy mapped read-only (or, private,
/// copy-on-write) and shared by every reader; for the runtime's own object,
/// its put tensors. It holds its own handle on the object until destroyed,
/// and its bytes never change, even after the owner is gone.
class [[nodiscard]] ObjectView {
 public:
  ObjectView() noexcept = default;
  /// Takes ownership of a C view; `ref` describes its tensors.
  ObjectView(rdt_view *adopt, const Ref &ref) : v_(adopt) {
    tensors_ = ref.tensors();
    std::vector<void *> data(tensors_.size());
    std::vector<uint64_t> held(tensors_.size());
    int mapped = 0;
    check(rdt_view_data(v_, data.data(), data.size(), &mapped));
    check(rdt_view_sizes(v_, held.data(), held.size()));
    mapped_ = mapped != 0;
    for (std::size_t i = 0; i < tensors_.size(); i++) {
      // The view's sizes are the owner's; a ref that disagrees was refused
      // at rdt_view_open, so this holds unless the ref changed since.
      if (held[i] != tensors_[i].nbytes()) {
        rdt_view_release(std::exchange(v_, nullptr));
        throw Error(RDT_ERR_CORRUPT, "tensor " + std::to_string(i) + " of the view holds " + std::to_string(held[i]) +
                                         " bytes, the ref describes " + std::to_string(tensors_[i].nbytes()));
      }
      tensors_[i].data = data[i];
      if (mapped_) tensors_[i].device = cpu;
    }
  }
  ObjectView(const ObjectView &) = delete;
  ObjectView &operator=(const ObjectView &) = delete;
  ObjectView(ObjectView &&o) noexcept
      : v_(std::exchange(o.v_, nullptr)), tensors_(std::move(o.tensors_)), mapped_(o.mapped_) {}
  ObjectView &operator=(ObjectView &&o) noexcept {
    if (this != &o) {
      rdt_view_release(v_);
      v_ = std::exchange(o.v_, nullptr);
      tensors_ = std::move(o.tensors_);
      mapped_ = o.mapped_;
    }
    return *this;
  }
  ~ObjectView() { rdt_view_release(v_); }

  /// The object's tensors in this process, valid while the view lives.
  const std::vector<Tensor> &tensors() const noexcept { return tensors_; }
  /// Whether the view maps another process's object (false: own tensors).
  bool mapped() const noexcept { return mapped_; }

  explicit operator bool() const noexcept { return v_ != nullptr; }
  /// The C handle, still owned by this ObjectView.
  rdt_view *capi() const noexcept { return v_; }

 private:
  rdt_view *v_ = nullptr;
  std::vector<Tensor> tensors_;
  bool mapped_ = false;
};

// ---- transports ---------------------------------------------------------------

/// One transfer as a transport's callbacks see it. Only valid during the
/// callback (the strings are copied on access).
class Transfer {
 public:
  explicit Transfer(const rdt_transfer *c) noexcept : c_(c) {}
  /// RDT_ROLE_SOURCE or RDT_ROLE_DESTINATION: the side this callback runs on.
  bool is_source() const noexcept { return c_->role == RDT_ROLE_SOURCE; }
  bool is_destination() const noexcept { return c_->role == RDT_ROLE_DESTINATION; }
  /// Unique per transfer and the same on both sides.
  uint64_t id() const noexcept { return c_->transfer_id; }
  std::string object_id() const { return str(c_->object_id); }
  std::string transport() const { return str(c_->transport); }
  std::string source_runtime() const { return str(c_->source_runtime); }
  std::string source_address() const { return str(c_->source_address); }
  std::string destination_runtime() const { return str(c_->destination_runtime); }
  std::string destination_address() const { return str(c_->destination_address); }
  /// A partial get's ranges, for a transport that serves_ranges(): the
  /// i-th target receives ranges()[i] (ref 0, length resolved); a two-sided
  /// source sends those bytes of its tensors, in that order; in a partial
  /// write, source i lands in ranges()[i] of the owner's object. Empty:
  /// every tensor whole, target (or source) i being tensor i.
  Span<const rdt_range> ranges() const noexcept {
    return c_->ranges ? Span<const rdt_range>(c_->ranges, c_->num_ranges) : Span<const rdt_range>();
  }
  const rdt_transfer *capi() const noexcept { return c_; }

 private:
  static std::string str(const char *s) { return s ? s : ""; }
  const rdt_transfer *c_;
};

/// A transport written in C++; its virtual methods mirror
/// rdt_transport_vtable. Override what your transport does. The runtime owns
/// the object after rdt::register_transport() and deletes it when it is
/// destroyed, after the last callback. Methods run on rdt's threads,
/// possibly several at once, and may call rdt. A method that throws fails
/// its operation: RDT_ERR_USER with what() as the message (an rdt::Error
/// keeps its own status), reported to the caller of get()/wait().
class Transport {
 public:
  /// An asynchronous receive started by fetch(), or write started by
  /// write_start(); see asynchronous().
  class Request {
   public:
    virtual ~Request() = default;
    /// Blocks until the receive or write completed (return true) or
    /// `timeout` passed (return false; rdt normally passes rdt::forever and
    /// interrupts with Transport::abort). Throws if it failed; a write that
    /// throws lands no byte any more.
    virtual bool wait(std::chrono::milliseconds timeout) = 0;
  };

  virtual ~Transport() = default;

  /// Required. One-sided: the destination reads alone (recv/fetch).
  /// Two-sided: the source runtime calls send() when a destination asks.
  virtual bool one_sided() const = 0;
  /// Whether abort() makes a pending recv/send/wait return soon, with
  /// nothing more written into the targets. Otherwise rdt lets transfers
  /// finish before it frees a fetch.
  virtual bool can_abort() const { return false; }
  /// true: the destination receives through fetch() and Request::wait()
  /// instead of recv(), and a transport that writes() writes through
  /// write_start() and Request::wait() instead of write().
  virtual bool asynchronous() const { return false; }
  /// true: it serves partial fetches, moving only Transfer::ranges()
  /// (RDT_TRANSPORT_RANGES). rdt refuses a partial fetch over one that
  /// does not.
  virtual bool serves_ranges() const { return false; }
  /// true: it writes into objects other runtimes exposed with it
  /// (RDT_TRANSPORT_WRITES): override write() (or write_start() when
  /// asynchronous()). Requires one_sided(): the owner runs none of its
  /// methods during a write.
  virtual bool writes() const { return false; }

  /// Source, at put: metadata that travels in every serialized ref (for
  /// example registered-memory keys). Default: none.
  virtual std::vector<uint8_t> extract_metadata(const std::string &object_id, Tensors tensors) {
    (void)object_id, (void)tensors;
    return {};
  }
  /// Destination, once per transfer before anything moves: metadata passed
  /// to recv/fetch here and to send on the source. Default: none.
  virtual std::vector<uint8_t> communicator_metadata(const Transfer &transfer) {
    (void)transfer;
    return {};
  }
  /// Source of a two-sided transport: send the tensors; return when done.
  virtual void send(const Transfer &transfer, Tensors tensors, Bytes tmeta, Bytes cmeta) {
    (void)transfer, (void)tensors, (void)tmeta, (void)cmeta;
    throw std::logic_error("this transport does not implement send()");
  }
  /// Destination: receive every tensor into `targets` (shapes, dtypes and
  /// sizes already checked; write at bytes_of(target)); return when done.
  /// Required unless asynchronous().
  virtual void recv(const Transfer &transfer, Tensors targets, Bytes tmeta, Bytes cmeta) {
    (void)transfer, (void)targets, (void)tmeta, (void)cmeta;
    throw std::logic_error("this transport does not implement recv()");
  }
  /// Destination, when asynchronous(): start receiving and return at once.
  /// The transfer and targets stay valid until the request is destroyed.
  virtual std::unique_ptr<Request> fetch(const Transfer &transfer, Tensors targets, Bytes tmeta, Bytes cmeta) {
    (void)transfer, (void)targets, (void)tmeta, (void)cmeta;
    throw std::logic_error("this transport does not implement fetch()");
  }
  /// Writer, when writes(): write `sources` into the object the owner
  /// exposed, alone (transfer.is_source(); destination_* name the owner).
  /// `tmeta` is what extract_metadata made for the exposed tensors on the
  /// owner, `cmeta` what communicator_metadata made here. Source i lands in
  /// exposed tensor i, whole, or, in a partial write (serves_ranges()), in
  /// transfer.ranges()[i] and nowhere else. Return when every byte is in
  /// place; throw once no byte of the write can land any more (the owner's
  /// notice then says it failed). After abort(transfer, nullptr), return
  /// soon. Required when writes() and not asynchronous().
  virtual void write(const Transfer &transfer, Tensors sources, Bytes tmeta, Bytes cmeta) {
    (void)transfer, (void)sources, (void)tmeta, (void)cmeta;
    throw std::logic_error("this transport does not implement write()");
  }
  /// Writer, when writes() and asynchronous(): start the write and return
  /// at once. The transfer and sources stay valid until the request is
  /// destroyed; when its wait() returns true every byte is in place.
  virtual std::unique_ptr<Request> write_start(const Transfer &transfer, Tensors sources, Bytes tmeta,
                                               Bytes cmeta) {
    (void)transfer, (void)sources, (void)tmeta, (void)cmeta;
    throw std::logic_error("this transport does not implement write_start()");
  }
  /// Source: the object was freed; undo what extract_metadata set up.
  /// Exceptions are reported on stderr (there is no caller to fail).
  virtual void garbage_collect(const std::string &object_id, Tensors tensors, Bytes tmeta) {
    (void)object_id, (void)tensors, (void)tmeta;
  }
  /// Either side: make the pending recv/send/write (request == nullptr) or
  /// the request's wait return soon. May run while they run on other
  /// threads.
  virtual void abort(const Transfer &transfer, Request *request) { (void)transfer, (void)request; }
};

namespace detail {

// Runs f; turns any exception into a status and rdt_set_error(). noexcept:
// nothing unwinds into rdt.
template <class F>
rdt_status guard(F &&f) noexcept {
  try {
    return f();
  } catch (const Error &e) {
    rdt_set_error(e.message().c_str());
    return e.status() < 0 ? e.status() : RDT_ERR_USER;
  } catch (const std::exception &e) {
    rdt_set_error(e.what());
    return RDT_ERR_USER;
  } catch (...) {
    rdt_set_error("a C++ transport threw an exception that is not a std::exception");
    return RDT_ERR_USER;
  }
}

inline void report(const char *where) noexcept {
  try {
    throw;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "rdt: exception in %s: %s\n", where, e.what());
  } catch (...) {
    std::fprintf(stderr, "rdt: exception in %s\n", where);
  }
}

// The transport's user_data. `alive` is shared with register_transport so
// that it knows, after a failed registration, whether rdt freed it already.
struct TransportBox {
  std::unique_ptr<Transport> transport;
  std::shared_ptr<bool> alive;
};

inline Transport &self(void *ud) noexcept { return *static_cast<TransportBox *>(ud)->transport; }
inline Bytes bytes(const void *p, size_t n) noexcept { return Bytes(static_cast<const uint8_t *>(p), p ? n : 0); }

struct Trampolines {
  static void free_user_data(void *ud) noexcept {
    auto *box = static_cast<TransportBox *>(ud);
    *box->alive = false;
    try {
      delete box;
    } catch (...) {
      report("a transport's destructor");
    }
  }
  static rdt_status extract_metadata(void *ud, const char *obj, const rdt_tensor *ts, size_t n,
                                     rdt_buffer *out) noexcept {
    return guard([&] {
      std::vector<uint8_t> m = self(ud).extract_metadata(obj, Tensors(ts, n));
      check(rdt_buffer_set(out, m.data(), m.size()));
      return RDT_OK;
    });
  }
  static rdt_status communicator_metadata(void *ud, const rdt_transfer *x, rdt_buffer *out) noexcept {
    return guard([&] {
      std::vector<uint8_t> m = self(ud).communicator_metadata(Transfer(x));
      check(rdt_buffer_set(out, m.data(), m.size()));
      return RDT_OK;
    });
  }
  static rdt_status send(void *ud, const rdt_transfer *x, const rdt_tensor *ts, size_t n, const void *tm,
                         size_t tn, const void *cm, size_t cn) noexcept {
    return guard([&] {
      self(ud).send(Transfer(x), Tensors(ts, n), bytes(tm, tn), bytes(cm, cn));
      return RDT_OK;
    });
  }
  static rdt_status recv(void *ud, const rdt_transfer *x, const rdt_tensor *ts, size_t n, const void *tm,
                         size_t tn, const void *cm, size_t cn) noexcept {
    return guard([&] {
      self(ud).recv(Transfer(x), Tensors(ts, n), bytes(tm, tn), bytes(cm, cn));
      return RDT_OK;
    });
  }
  static rdt_status fetch(void *ud, const rdt_transfer *x, const rdt_tensor *ts, size_t n, const void *tm,
                          size_t tn, const void *cm, size_t cn, void **request) noexcept {
    return guard([&] {
      std::unique_ptr<Transport::Request> r = self(ud).fetch(Transfer(x), Tensors(ts, n), bytes(tm, tn), bytes(cm, cn));
      if (!r) throw std::logic_error("fetch() returned no request");
      *request = r.release();
      return RDT_OK;
    });
  }
  static rdt_status write(void *ud, const rdt_transfer *x, const rdt_tensor *ts, size_t n, const void *tm,
                          size_t tn, const void *cm, size_t cn) noexcept {
    return guard([&] {
      self(ud).write(Transfer(x), Tensors(ts, n), bytes(tm, tn), bytes(cm, cn));
      return RDT_OK;
    });
  }
  static rdt_status write_start(void *ud, const rdt_transfer *x, const rdt_tensor *ts, size_t n, const void *tm,
                                size_t tn, const void *cm, size_t cn, void **request) noexcept {
    return guard([&] {
      std::unique_ptr<Transport::Request> r =
          self(ud).write_start(Transfer(x), Tensors(ts, n), bytes(tm, tn), bytes(cm, cn));
      if (!r) throw std::logic_error("write_start() returned no request");
      *request = r.release();
      return RDT_OK;
    });
  }
  static rdt_status wait(void *, void *request, int64_t timeout_ms) noexcept {
    return guard([&] {
      if (static_cast<Transport::Request *>(request)->wait(std::chrono::milliseconds(timeout_ms))) return RDT_OK;
      rdt_set_error("the request did not complete in time");
      return RDT_ERR_TIMEOUT;
    });
  }
  static void release_request(void *, void *request) noexcept {
    try {
      delete static_cast<Transport::Request *>(request);
    } catch (...) {
      report("a transport request's destructor");
    }
  }
  static void garbage_collect(void *ud, const char *obj, const rdt_tensor *ts, size_t n, const void *tm,
                              size_t tn) noexcept {
    try {
      self(ud).garbage_collect(obj, Tensors(ts, n), bytes(tm, tn));
    } catch (...) {
      report("a transport's garbage_collect()");
    }
  }
  static rdt_status abort(void *ud, const rdt_transfer *x, void *request) noexcept {
    return guard([&] {
      self(ud).abort(Transfer(x), static_cast<Transport::Request *>(request));
      return RDT_OK;
    });
  }
};

inline void on_free_trampoline(void *ud) noexcept {
  std::unique_ptr<std::function<void()>> f(static_cast<std::function<void()> *>(ud));
  try {
    (*f)();
  } catch (...) {
    report("a put's on_free callback");
  }
}

}  // namespace detail

// ---- runtimes -------------------------------------------------------------------

/// Options for a Runtime; empty and zero fields take the library's defaults
/// (see rdt_runtime_options in rdt.h).
struct Options {
  std::string name;                          // for log lines; "": "rdt-<pid>"
  int32_t log_level = RDT_LOG_DEFAULT;       // RDT_LOG_*; default: $RDT_LOG, else warn
  uint32_t flags = 0;                        // RDT_RUNTIME_IN_PROCESS, RDT_RUNTIME_NO_BUILTIN_TRANSPORTS
  std::chrono::milliseconds lease{0};        // serialized refs keep objects alive this long; 0: 2 min
  std::chrono::milliseconds peer_timeout{0}; // a silent peer counts as gone after this; 0: 5 s
  std::string listen_tcp;                    // "host:port" to accept peers on other hosts
  std::string auth_token;                    // shared secret for TCP peers
  std::string advertise_host;                // host name peers dial
  std::string socket_dir;                    // directory for Unix sockets
  std::string host_id;                       // overrides the detected host identity
};

/// An rdt runtime: an object store, its transports and a control-plane
/// endpoint. Move-only; destruction aborts its gets and writes (waiting
/// until nothing touches their local tensors), frees its objects and
/// deletes its transports. Refs, Fetches and Writes may outlive it (their
/// calls then throw RDT_ERR_CLOSED) and are released as usual.
class Runtime {
 public:
  explicit Runtime(const Options &o = Options()) {
    rdt_runtime_options c;
    rdt_runtime_options_init(&c);
    c.name = detail::opt(o.name);
    c.log_level = o.log_level;
    c.flags = o.flags;
    c.lease_ms = o.lease.count();
    c.peer_timeout_ms = o.peer_timeout.count();
    c.listen_tcp = detail::opt(o.listen_tcp);
    c.auth_token = detail::opt(o.auth_token);
    c.advertise_host = detail::opt(o.advertise_host);
    c.socket_dir = detail::opt(o.socket_dir);
    c.host_id = detail::opt(o.host_id);
    check(rdt_runtime_create(&c, &rt_));
  }
  /// Takes ownership of a C runtime.
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

  explicit operator bool() const noexcept { return rt_ != nullptr; }
  /// The C handle, still owned by this Runtime.
  rdt_runtime *capi() const noexcept { return rt_; }
  /// Gives up ownership: the caller must rdt_runtime_destroy() the result.
  [[nodiscard]] rdt_runtime *release() noexcept { return std::exchange(rt_, nullptr); }

  /// Where peers reach this runtime ("unix://...", "inproc://...").
  std::string address() const {
    const char *a = nullptr;
    check(rdt_runtime_address(rt_, &a));
    return a;
  }

  /// Puts tensors as one object and returns the first reference to it.
  /// Nothing is copied: keep the memory valid and unmodified until the
  /// object is freed, which `on_free` (run once, on an rdt thread) or
  /// wait_tensor_freed() tell. Capture a shared_ptr in on_free to tie a
  /// buffer's lifetime to the object. `transport` "" lets each fetch choose.
  Ref put(const std::vector<Tensor> &tensors, const std::string &transport = std::string(),
          std::function<void()> on_free = nullptr) {
    std::vector<rdt_tensor> c = detail::c_tensors(tensors);
    std::unique_ptr<std::function<void()>> cb;
    if (on_free) cb = std::make_unique<std::function<void()>>(std::move(on_free));
    rdt_ref *r = nullptr;
    check(rdt_put(rt_, c.data(), c.size(), detail::opt(transport), cb ? &detail::on_free_trampoline : nullptr,
                  cb.get(), &r));
    cb.release();  // rdt calls on_free_trampoline exactly once, which deletes it
    return Ref(r);
  }

  /// Exposes tensors for other runtimes to write into and returns the
  /// first (writable) reference: arguments and lifetime as put(). Hand its
  /// serialized bytes only to writers; take the notices of their writes
  /// with Ref::wait_notice().
  Ref expose(const std::vector<Tensor> &tensors, const std::string &transport = std::string(),
             std::function<void()> on_free = nullptr) {
    std::vector<rdt_tensor> c = detail::c_tensors(tensors);
    std::unique_ptr<std::function<void()>> cb;
    if (on_free) cb = std::make_unique<std::function<void()>>(std::move(on_free));
    rdt_ref *r = nullptr;
    check(rdt_expose(rt_, c.data(), c.size(), detail::opt(transport), cb ? &detail::on_free_trampoline : nullptr,
                     cb.get(), &r));
    cb.release();  // rdt calls on_free_trampoline exactly once, which deletes it
    return Ref(r);
  }

  /// Starts writing `sources` (one per tensor of each writable ref, ref
  /// after ref; or, with `destinations`, source i into destinations[i])
  /// into the refs' objects and returns an rdt::Write to wait on: true once
  /// every byte landed. The owner's notice of each ref's write carries `tag`.
  Write write_start(const RefList &refs, const std::vector<Tensor> &sources, uint64_t tag = 0,
                    const std::vector<Range> *destinations = nullptr, const std::string &transport = std::string()) {
    std::vector<rdt_tensor> c = detail::c_tensors(sources);
    std::vector<rdt_range> cd;
    rdt_write_options wo = detail::write_options(transport, tag, destinations, cd);
    rdt_pending *w = nullptr;
    check(rdt_write_start(rt_, refs.data(), refs.size(), c.data(), c.size(), &wo, &w));
    return Write(w);
  }
  /// write_start() and wait(timeout) in one call; throws rdt::Error, with
  /// RDT_ERR_TIMEOUT when the time ran out (the write was aborted).
  void write(const RefList &refs, const std::vector<Tensor> &sources, uint64_t tag = 0,
             std::chrono::milliseconds timeout = forever, const std::vector<Range> *destinations = nullptr,
             const std::string &transport = std::string()) {
    std::vector<rdt_tensor> c = detail::c_tensors(sources);
    std::vector<rdt_range> cd;
    rdt_write_options wo = detail::write_options(transport, tag, destinations, cd);
    check(rdt_write(rt_, refs.data(), refs.size(), c.data(), c.size(), &wo, detail::millis(timeout)));
  }

  /// A get of `refs` into `targets` prepared to run many times (see
  /// rdt::Prepared and rdt_prepare_get); `sources` as get_start()'s partial
  /// form.
  Prepared prepare_get(const RefList &refs, const std::vector<Tensor> &targets,
                       const std::vector<Range> *sources = nullptr, const std::string &transport = std::string()) {
    std::vector<rdt_tensor> c = detail::c_tensors(targets);
    std::vector<rdt_range> cs;
    rdt_get_options go = detail::get_options(transport, sources, cs);
    rdt_prepared *p = nullptr;
    check(rdt_prepare_get(rt_, refs.data(), refs.size(), c.data(), c.size(), &go, &p));
    return Prepared(p);
  }
  /// A write of `sources` into writable refs prepared to run many times;
  /// each run gives its tag.
  Prepared prepare_write(const RefList &refs, const std::vector<Tensor> &sources,
                         const std::vector<Range> *destinations = nullptr,
                         const std::string &transport = std::string()) {
    std::vector<rdt_tensor> c = detail::c_tensors(sources);
    std::vector<rdt_range> cd;
    rdt_write_options wo = detail::write_options(transport, 0, destinations, cd);
    rdt_prepared *p = nullptr;
    check(rdt_prepare_write(rt_, refs.data(), refs.size(), c.data(), c.size(), &wo, &p));
    return Prepared(p);
  }

  /// A view of `ref`'s object (see rdt::ObjectView and rdt_view_open): no
  /// copy per reader. `private_writes` maps copy-on-write. Throws rdt::Error,
  /// RDT_ERR_UNSUPPORTED where only a copy can do (another host, device
  /// memory).
  ObjectView view(const Ref &ref, bool private_writes = false, std::chrono::milliseconds timeout = forever,
                  const std::string &transport = std::string()) {
    rdt_view_options vo;
    rdt_view_options_init(&vo);
    vo.flags = private_writes ? RDT_VIEW_PRIVATE : 0;
    vo.transport = transport.empty() ? nullptr : transport.c_str();
    rdt_view *v = nullptr;
    check(rdt_view_open(rt_, ref.capi(), &vo, detail::millis(timeout), &v));
    try {
      return ObjectView(v, ref);
    } catch (...) {
      rdt_view_release(v);
      throw;
    }
  }

  /// A reference of this runtime from serialized bytes (a borrow the owner
  /// counts, unless this runtime is the owner). It waits for the owner only
  /// when this runtime has no connection to it yet, up to `timeout`
  /// (rdt::forever: no deadline of the caller's, though a connection attempt
  /// still gives up after the handshake timeout); then it throws
  /// rdt::Error(RDT_ERR_TIMEOUT) and keeps nothing.
  Ref deserialize(const void *bytes, size_t size, std::chrono::milliseconds timeout = deserialize_timeout) {
    rdt_deserialize_options o;
    rdt_deserialize_options_init(&o);
    // 0 in the options means "the default"; here it means "do not wait".
    o.timeout_ms = timeout.count() < 0 ? -1 : std::max<int64_t>(1, int64_t(timeout.count()));
    rdt_ref *r = nullptr;
    check(rdt_ref_deserialize_ex(rt_, bytes, size, &o, &r));
    return Ref(r);
  }
  Ref deserialize(const std::vector<uint8_t> &bytes, std::chrono::milliseconds timeout = deserialize_timeout) {
    return deserialize(bytes.data(), bytes.size(), timeout);
  }

  /// Starts a get of `refs` into `targets` (one per source tensor, ref after
  /// ref) and returns at once with an rdt::Fetch. The targets' memory must
  /// stay valid until the Fetch returned from wait() with a final result or
  /// was destroyed. `transport` overrides each ref's own for this get.
  Fetch get_start(const RefList &refs, const std::vector<Tensor> &targets,
                  const std::string &transport = std::string()) {
    return start(refs, targets, nullptr, transport);
  }
  /// A partial get: targets[i] receives sources[i] (see rdt::Range and
  /// rdt::rows): any tensors of any of the refs, in any order, whole or a
  /// byte range. A ref no range names is not moved. Only transports that
  /// serve ranges (RDT_TRANSPORT_RANGES) take it.
  Fetch get_start(const RefList &refs, const std::vector<Tensor> &targets, const std::vector<Range> &sources,
                  const std::string &transport = std::string()) {
    return start(refs, targets, &sources, transport);
  }
  /// The earlier name of get_start().
  [[deprecated("use get_start")]] Fetch fetch(const RefList &refs, const std::vector<Tensor> &targets,
                                              const std::string &transport = std::string()) {
    return start(refs, targets, nullptr, transport);
  }
  [[deprecated("use get_start")]] Fetch fetch(const RefList &refs, const std::vector<Tensor> &targets,
                                              const std::vector<Range> &sources,
                                              const std::string &transport = std::string()) {
    return start(refs, targets, &sources, transport);
  }

  /// get_start() and wait(timeout) in one call; throws rdt::Error, with
  /// RDT_ERR_TIMEOUT when the time ran out (the transfers were aborted).
  void get(const RefList &refs, const std::vector<Tensor> &targets, std::chrono::milliseconds timeout = forever,
           const std::string &transport = std::string()) {
    get_impl(refs, targets, nullptr, timeout, transport);
  }
  /// The partial get_start() and wait(timeout) in one call.
  void get(const RefList &refs, const std::vector<Tensor> &targets, const std::vector<Range> &sources,
           std::chrono::milliseconds timeout = forever, const std::string &transport = std::string()) {
    get_impl(refs, targets, &sources, timeout, transport);
  }

  /// Blocks until no object of this runtime holds a tensor whose data
  /// pointer is `data`. false if `timeout` passed first.
  bool wait_tensor_freed(const void *data, std::chrono::milliseconds timeout = forever) {
    rdt_status st = rdt_wait_tensor_freed(rt_, data, detail::millis(timeout));
    if (st == RDT_ERR_TIMEOUT) return false;
    check(st);
    return true;
  }

  /// Forms this runtime's rank of the collective group `name` (see
  /// rdt_group_create): every rank calls it; ranks other than 0 pass rank
  /// 0's address(). Returns once every rank joined and the communicator is
  /// formed on CUDA device `device`. Prefer rdt::Group, which destroys it.
  void create_group(const std::string &name, int world_size, int rank, const std::string &rank0_address = "",
                    int device = 0, std::chrono::milliseconds timeout = std::chrono::minutes(5),
                    const std::string &backend = "") {
    rdt_group_options o;
    rdt_group_options_init(&o);
    o.backend = backend.empty() ? nullptr : backend.c_str();
    check(rdt_group_create(rt_, name.c_str(), world_size, rank, rank0_address.empty() ? nullptr : rank0_address.c_str(),
                           device, &o, detail::millis(timeout)));
  }
  /// Destroys this runtime's rank of a group (rdt_group_destroy).
  void destroy_group(const std::string &name) { check(rdt_group_destroy(rt_, name.c_str())); }

  /// The runtime's counters.
  rdt_stats stats() const {
    rdt_stats s;
    rdt_stats_init(&s);
    check(rdt_runtime_stats(rt_, &s));
    return s;
  }

  /// The registered transports, sorted by name, with their counters.
  std::vector<rdt_transport_info> transports() const {
    size_t n = 0;
    for (;;) {
      check(rdt_transport_list(rt_, nullptr, 0, &n));
      std::vector<rdt_transport_info> out(n);
      for (auto &i : out) rdt_transport_info_init(&i);
      size_t now = 0;
      check(rdt_transport_list(rt_, out.data(), out.size(), &now));
      if (now <= n) {  // else one was registered meanwhile: ask again
        out.resize(now);
        return out;
      }
    }
  }
  /// Fetch latency histograms, one per transport and object size class
  /// that saw a fetch or a failure, sorted by transport and size class
  /// (rdt_runtime_fetch_histograms: buckets[] are per bucket, not
  /// cumulative).
  std::vector<rdt_fetch_histogram> fetch_histograms() const {
    size_t n = 0;
    for (;;) {
      check(rdt_runtime_fetch_histograms(rt_, nullptr, 0, &n));
      std::vector<rdt_fetch_histogram> out(n);
      for (auto &h : out) rdt_fetch_histogram_init(&h);
      size_t now = 0;
      check(rdt_runtime_fetch_histograms(rt_, out.data(), out.size(), &now));
      if (now <= n) {  // else a transport or size class appeared meanwhile: ask again
        out.resize(now);
        return out;
      }
    }
  }
  /// Whether a transport of that name (case-insensitive) is registered.
  bool has_transport(const std::string &name) const {
    std::string lower(name);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char ch) { return char(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch); });
    for (auto &t : transports())
      if (lower == t.name) return true;
    return false;
  }

 private:
  Fetch start(const RefList &refs, const std::vector<Tensor> &targets, const std::vector<Range> *sources,
              const std::string &transport) {
    std::vector<rdt_tensor> c = detail::c_tensors(targets);
    std::vector<rdt_range> cs;
    rdt_get_options go = detail::get_options(transport, sources, cs);
    rdt_pending *f = nullptr;
    check(rdt_get_start(rt_, refs.data(), refs.size(), c.data(), c.size(), &go, &f));
    return Fetch(f);
  }
  void get_impl(const RefList &refs, const std::vector<Tensor> &targets, const std::vector<Range> *sources,
                std::chrono::milliseconds timeout, const std::string &transport) {
    std::vector<rdt_tensor> c = detail::c_tensors(targets);
    std::vector<rdt_range> cs;
    rdt_get_options go = detail::get_options(transport, sources, cs);
    check(rdt_get(rt_, refs.data(), refs.size(), c.data(), c.size(), &go, detail::millis(timeout)));
  }

  rdt_runtime *rt_ = nullptr;
};

/// One rank of a collective group, destroyed with the object (RAII over
/// rdt_group_create / rdt_group_destroy). Movable, not copyable; the
/// runtime must outlive it.
class Group {
 public:
  Group(Runtime &rt, std::string name, int world_size, int rank, const std::string &rank0_address = "",
        int device = 0, std::chrono::milliseconds timeout = std::chrono::minutes(5), const std::string &backend = "")
      : rt_(&rt), name_(std::move(name)) {
    rt.create_group(name_, world_size, rank, rank0_address, device, timeout, backend);
  }
  Group(Group &&o) noexcept : rt_(o.rt_), name_(std::move(o.name_)) { o.rt_ = nullptr; }
  Group &operator=(Group &&o) noexcept {
    if (this != &o) {
      reset();
      rt_ = o.rt_;
      name_ = std::move(o.name_);
      o.rt_ = nullptr;
    }
    return *this;
  }
  Group(const Group &) = delete;
  Group &operator=(const Group &) = delete;
  ~Group() { reset(); }

  const std::string &name() const noexcept { return name_; }

  /// Destroys the group now (errors are ignored here, as in the destructor).
  void reset() noexcept {
    if (rt_) rdt_group_destroy(rt_->capi(), name_.c_str());
    rt_ = nullptr;
  }

 private:
  Runtime *rt_;
  std::string name_;
};

/// Registers a C++ transport with `rt` under `name` for the RDT_DEVICE_*
/// types in `devices`. The runtime owns it from then on (also when this
/// throws, the transport is deleted). Register it under the same name in
/// every runtime that uses it.
inline void register_transport(Runtime &rt, const std::string &name, const std::vector<int32_t> &devices,
                               std::unique_ptr<Transport> transport) {
  if (!transport) throw Error(RDT_ERR_INVALID_ARGUMENT, "rdt::register_transport: the transport is null");
  rdt_transport_vtable vt;
  rdt_transport_vtable_init(&vt);
  vt.flags = (transport->one_sided() ? RDT_TRANSPORT_ONE_SIDED : 0u) |
             (transport->can_abort() ? RDT_TRANSPORT_CAN_ABORT : 0u) |
             (transport->serves_ranges() ? RDT_TRANSPORT_RANGES : 0u) |
             (transport->writes() ? RDT_TRANSPORT_WRITES : 0u);
  using T = detail::Trampolines;
  vt.free_user_data = &T::free_user_data;
  vt.extract_metadata = &T::extract_metadata;
  vt.communicator_metadata = &T::communicator_metadata;
  vt.send = &T::send;
  if (transport->asynchronous()) {
    vt.fetch = &T::fetch;
    vt.wait = &T::wait;
    vt.release_request = &T::release_request;
  } else {
    vt.recv = &T::recv;
  }
  if (transport->writes()) {
    if (transport->asynchronous()) {
      vt.write_start = &T::write_start;
    } else {
      vt.write = &T::write;
    }
  }
  vt.garbage_collect = &T::garbage_collect;
  vt.abort = &T::abort;
  auto alive = std::make_shared<bool>(true);
  auto *box = new detail::TransportBox{std::move(transport), alive};
  vt.user_data = box;
  rdt_status st = rdt_register_transport(rt.capi(), name.c_str(), devices.data(), devices.size(), &vt);
  if (st != RDT_OK) {
    Error e(st, rdt_last_error());
    if (*alive) delete box;  // rdt promises to free it on failure; never leak if it did not
    throw e;
  }
}

}  // namespace rdt

#endif  // RDT_HPP
