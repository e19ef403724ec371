// Collective groups through the wrapper: argument errors, and UNSUPPORTED
// naming NCCL where it is not installed (forming real NCCL groups needs
// GPUs; the GPU suite does that).
#include "test_util.hpp"

using namespace rdt_test;
TEST(Groups, ArgumentErrorsAndUnsupportedWithoutNccl) {
  rdt::Runtime rt(quiet("g"));
  auto status_of = [](auto &&f) {
    try {
      f();
    } catch (const rdt::Error &e) {
      return e.status();
    }
    return RDT_OK;
  };
  EXPECT_EQ(status_of([&] { rt.create_group("g", 0, 0); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { rt.create_group("g", 2, 5, rt.address()); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { rt.create_group("g", 2, 1); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { rt.create_group("g", 1, 0, "", 0, std::chrono::milliseconds(1000), "tcp"); }),
            RDT_ERR_UNSUPPORTED);
  EXPECT_EQ(status_of([&] { rt.destroy_group("nope"); }), RDT_ERR_NOT_FOUND);
  bool nccl = false;
  for (auto &t : rt.transports()) nccl = nccl || std::string(t.name) == "nccl";
  if (nccl) GTEST_SKIP() << "NCCL and a CUDA device are available here";
  try {
    rdt::Group g(rt, "g", 1, 0);
    FAIL() << "a group formed without NCCL";
  } catch (const rdt::Error &e) {
    EXPECT_EQ(e.status(), RDT_ERR_UNSUPPORTED);
    EXPECT_NE(e.message().find("libnccl.so.2"), std::string::npos) << e.message();
  }
}
