// Device memory through the wrapper: a CUDA view is described without being
// touched, and moving it needs a CUDA transport.
#include "test_util.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>

using namespace rdt_test;

// A view of device memory is described, not touched: put and tensor_info
// work anywhere; moving it needs a CUDA transport, which a machine without
// CUDA lacks, and then the fetch says so.
TEST(DeviceMemory, ACudaViewIsDescribedAndRefusedWithoutACudaTransport) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  for (const auto &t : b.transports())
    if (std::string(t.name) == "cuda_ipc") GTEST_SKIP() << "this machine has a CUDA transport";
  void *fake = reinterpret_cast<void *>(uintptr_t(0x7f0000001000));  // never dereferenced
  auto dev = rdt::Tensor::device_memory(fake, {4, 8}, rdt::dtype_of<float>(), RDT_DEVICE_CUDA, 1);
  rdt::Ref ref = a.put({dev});
  rdt_tensor_info ti = ref.tensor_info(0);
  EXPECT_EQ(ti.device.device_type, RDT_DEVICE_CUDA);
  EXPECT_EQ(ti.device.device_id, 1);
  EXPECT_EQ(ti.ndim, 2);
  EXPECT_EQ(ti.nbytes, 128u);
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  void *fake_dst = reinterpret_cast<void *>(uintptr_t(0x7f0000100000));
  auto target = rdt::Tensor::device_memory(fake_dst, {4, 8}, rdt::dtype_of<float>(), RDT_DEVICE_CUDA, 1);
  try {
    b.get(borrowed, {target});
    FAIL() << "a CUDA fetch without a CUDA transport succeeded";
  } catch (const rdt::Error &e) {
    EXPECT_EQ(e.status(), RDT_ERR_UNSUPPORTED);
    EXPECT_NE(e.message().find("cuda"), std::string::npos) << e.message();
  }
  // A CPU buffer for CUDA source memory is a mismatch, said before any transfer.
  std::vector<float> host(32);
  try {
    b.get(borrowed, {rdt::Tensor(host.data(), {4, 8}, rdt::dtype_of<float>())});
    FAIL() << "a CPU target for a CUDA tensor was accepted";
  } catch (const rdt::Error &e) {
    EXPECT_NE(e.status(), RDT_OK);
  }
}

// The few CUDA driver calls the next test makes itself, from the library rdt
// loads (RDT_CUDA_LIBRARY, else libcuda.so.1: the driver, or the test double
// of it in tests/fakecuda), with GPU 0's primary context current on this
// thread, as a framework would have it.
struct Driver {
  int (*init)(unsigned) = nullptr;
  int (*retain)(void **, int) = nullptr;
  int (*set_current)(void *) = nullptr;
  int (*alloc)(unsigned long long *, size_t) = nullptr;
  int (*free_)(unsigned long long) = nullptr;
  int (*copy)(unsigned long long, unsigned long long, size_t) = nullptr;

  std::string load() {
    const char *env = std::getenv("RDT_CUDA_LIBRARY");
    const char *path = env && *env ? env : "libcuda.so.1";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);  // rdt's handle: the same library, the same state
    if (!h) return dlerror();
    const std::pair<const char *, void **> syms[] = {
        {"cuInit", reinterpret_cast<void **>(&init)},
        {"cuDevicePrimaryCtxRetain", reinterpret_cast<void **>(&retain)},
        {"cuCtxSetCurrent", reinterpret_cast<void **>(&set_current)},
        {"cuMemAlloc_v2", reinterpret_cast<void **>(&alloc)},
        {"cuMemFree_v2", reinterpret_cast<void **>(&free_)},
        {"cuMemcpy", reinterpret_cast<void **>(&copy)}};
    for (const auto &s : syms)
      if (!(*s.second = dlsym(h, s.first))) return std::string("no ") + s.first;
    void *ctx = nullptr;
    if (init(0) != 0 || retain(&ctx, 0) != 0 || set_current(ctx) != 0) return "no context on device 0";
    return "";
  }
  unsigned long long device_copy(const std::vector<uint32_t> &v) {
    unsigned long long p = 0;
    EXPECT_EQ(alloc(&p, v.size() * 4), 0);
    EXPECT_EQ(copy(p, reinterpret_cast<uintptr_t>(v.data()), v.size() * 4), 0);
    return p;
  }
  std::vector<uint32_t> host_copy(unsigned long long p, size_t n) {
    std::vector<uint32_t> v(n);
    EXPECT_EQ(copy(reinterpret_cast<uintptr_t>(v.data()), p, n * 4), 0);
    return v;
  }
};

// Device memory through the C++ wrapper and cuda_ipc: another runtime of the
// process fetches it, and its owner copies it into new device buffers. Runs
// where rdt has a cuda_ipc transport: on a GPU, or on the driver double
// (ctest's cpp.device_on_driver_double).
TEST(DeviceMemory, MovesThroughCudaIpc) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  if (!b.has_transport("cuda_ipc")) GTEST_SKIP() << "no cuda_ipc transport (no CUDA device)";
  Driver d;
  std::string why = d.load();
  ASSERT_EQ(why, "");
  const size_t n = 1 << 18;
  std::vector<uint32_t> want = pattern(n, 7);
  unsigned long long src = d.device_copy(want);
  auto view = [](unsigned long long p, size_t len) {
    return rdt::Tensor::device_memory(reinterpret_cast<void *>(uintptr_t(p)), {int64_t(len)},
                                          rdt::dtype_of<uint32_t>(), RDT_DEVICE_CUDA, 0);
  };
  {
    rdt::Ref ref = a.put({view(src, n)}, "cuda_ipc");
    rdt::Ref borrowed = b.deserialize(ref.serialize());
    unsigned long long dst = d.device_copy(std::vector<uint32_t>(n));
    b.get(borrowed, {view(dst, n)}, 30s);
    EXPECT_EQ(d.host_copy(dst, n), want);
    unsigned long long own = d.device_copy(std::vector<uint32_t>(n));
    a.get(ref, {view(own, n)}, 30s);
    EXPECT_EQ(d.host_copy(own, n), want);
    // A target on a device this process does not have is the caller's mistake.
    EXPECT_EQ(status_of([&] {
                b.get(borrowed, {rdt::Tensor::device_memory(reinterpret_cast<void *>(uintptr_t(dst)), {int64_t(n)},
                                                                rdt::dtype_of<uint32_t>(), RDT_DEVICE_CUDA, 4096)},
                      30s);
              }),
              RDT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(d.free_(dst), 0);
    EXPECT_EQ(d.free_(own), 0);
  }
  a.wait_tensor_freed(reinterpret_cast<void *>(uintptr_t(src)), 30s);
  EXPECT_EQ(d.free_(src), 0);
}
