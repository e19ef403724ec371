// Collective groups through the wrapper: argument errors, UNSUPPORTED
// naming NCCL where it is not installed, and where it is, rdt::Group's
// life (transfers over groups are tested in transports/nccl).
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

TEST(Groups, GroupOfOneWithNccl) {
  rdt::Runtime rt(quiet("g"));
  bool nccl = false;
  for (auto &t : rt.transports()) nccl = nccl || std::string(t.name) == "nccl";
  if (!nccl) GTEST_SKIP() << "no NCCL or no CUDA device here";
  {
    rdt::Group g(rt, "solo", 1, 0);
    EXPECT_EQ(g.name(), "solo");
    try {
      rt.create_group("solo", 1, 0);
      FAIL() << "a second group of the same name formed";
    } catch (const rdt::Error &e) {
      EXPECT_EQ(e.status(), RDT_ERR_ALREADY_EXISTS);
    }
    rdt::Group moved = std::move(g);
    EXPECT_EQ(moved.name(), "solo");
  }  // destroyed here, once
  rdt::Group again(rt, "solo", 1, 0);
  again.reset();
  try {
    rt.destroy_group("solo");
    FAIL() << "the group outlived reset()";
  } catch (const rdt::Error &e) {
    EXPECT_EQ(e.status(), RDT_ERR_NOT_FOUND);
  }
  try {
    rdt::Group pair(rt, "pair", 2, 0, "", 0, std::chrono::milliseconds(300));
    FAIL() << "a group of two formed alone";
  } catch (const rdt::Error &e) {
    EXPECT_EQ(e.status(), RDT_ERR_TIMEOUT);
    EXPECT_NE(e.message().find("ranks [1] of 2"), std::string::npos) << e.message();
  }
}
