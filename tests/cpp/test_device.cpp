// Device memory through the wrapper: a CUDA view is described without being
// touched, and moving it needs a CUDA transport.
#include "test_util.hpp"

using namespace rdt_test;

// A view of device memory is described, not touched: put and tensor_info
// work anywhere; moving it needs a CUDA transport, which a machine without
// CUDA lacks, and then the fetch says so.
TEST(DeviceMemory, ACudaViewIsDescribedAndRefusedWithoutACudaTransport) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  for (const auto &t : b.transports())
    if (std::string(t.name) == "cuda_ipc") GTEST_SKIP() << "this machine has a CUDA transport";
  void *fake = reinterpret_cast<void *>(uintptr_t(0x7f0000001000));  // never dereferenced
  auto dev = rdt::TensorView::device_memory(fake, {4, 8}, rdt::dtype_of<float>(), RDT_DEVICE_CUDA, 1);
  rdt::Ref ref = a.put({dev});
  rdt_tensor_info ti = ref.tensor_info(0);
  EXPECT_EQ(ti.device.device_type, RDT_DEVICE_CUDA);
  EXPECT_EQ(ti.device.device_id, 1);
  EXPECT_EQ(ti.ndim, 2);
  EXPECT_EQ(ti.nbytes, 128u);
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  void *fake_dst = reinterpret_cast<void *>(uintptr_t(0x7f0000100000));
  auto target = rdt::TensorView::device_memory(fake_dst, {4, 8}, rdt::dtype_of<float>(), RDT_DEVICE_CUDA, 1);
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
    b.get(borrowed, {rdt::TensorView(host.data(), {4, 8}, rdt::dtype_of<float>())});
    FAIL() << "a CPU target for a CUDA tensor was accepted";
  } catch (const rdt::Error &e) {
    EXPECT_NE(e.status(), RDT_OK);
  }
}
