// Views through the wrapper: Runtime::view maps another runtime's object
// (no copy, the put's bytes even after the source buffer changes), keeps
// it borrowed until the ObjectView goes, and views the runtime's own
// object in place; a view that cannot be made throws.
#include "test_util.hpp"

using namespace rdt_test;

TEST(ObjectViews, MapAnotherRuntimesObjectAndHoldIt) {
  rdt::Runtime owner(quiet("cpp-owner")), reader(quiet("cpp-reader"));
  std::vector<uint32_t> src = pattern(1 << 20, 3);
  const std::vector<uint32_t> want = src;
  rdt::ObjectView v;
  {
    rdt::Ref ref = owner.put({rdt::Tensor::of(src.data(), {1024, 1024})});
    rdt::Ref theirs = reader.deserialize(ref.serialize());
    v = reader.view(theirs, false, std::chrono::seconds(30));
  }  // both refs released: the view holds its own
  ASSERT_TRUE(v.mapped());
  ASSERT_EQ(v.tensors().size(), 1u);
  const rdt::Tensor &t = v.tensors()[0];
  EXPECT_EQ(t.shape, (std::vector<int64_t>{1024, 1024}));
  EXPECT_NE(t.data, static_cast<void *>(src.data()));
  src[5] = 0;  // staged at the first view: the view keeps the put's bytes
  EXPECT_EQ(std::memcmp(t.data, want.data(), want.size() * 4), 0);
  EXPECT_EQ(reader.stats().views_open, 1u);
  EXPECT_EQ(reader.stats().transfers_completed, 0u);
  EXPECT_EQ(owner.stats().objects_freed, 0u) << "the view's borrow keeps the object";
  v = rdt::ObjectView();
  EXPECT_EQ(reader.stats().views_open, 0u);
}

TEST(ObjectViews, OwnObjectInPlaceAndRefusals) {
  rdt::Runtime rt(quiet("cpp-alone"));
  std::vector<float> x(16, 1.0f);
  rdt::Ref ref = rt.put({rdt::Tensor::of(x.data(), {16})});
  rdt::ObjectView v = rt.view(ref, false, std::chrono::seconds(1));
  EXPECT_FALSE(v.mapped());
  EXPECT_EQ(v.tensors()[0].data, static_cast<void *>(x.data()));
  try {
    (void)rt.view(ref, false, std::chrono::seconds(1), "no-such-transport");
    ADD_FAILURE() << "an unknown transport viewed an object";
  } catch (const rdt::Error &e) {
    EXPECT_EQ(e.status(), RDT_ERR_NOT_FOUND) << e.what();
  }
}
