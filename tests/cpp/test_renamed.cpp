// The wrapper's renamed names still compile and work (built with
// -Wno-deprecated-declarations): rdt::view and rdt::TensorView (now
// rdt::tensor and rdt::Tensor), rdt::Source (rdt::Range), Runtime::fetch
// (get_start), and a write_start() kept in an rdt::Fetch (it returns an
// rdt::Write now).
#include "test_util.hpp"

using namespace rdt_test;

TEST(RenamedNames, StillGetAndWrite) {
  rdt::Runtime owner(quiet("cpp-owner")), other(quiet("cpp-other"));
  std::vector<uint32_t> src = pattern(64, 5);
  rdt::Ref ref = owner.put({rdt::view(src, {8, 8})});
  rdt::Ref theirs = other.deserialize(ref.serialize());

  std::vector<uint32_t> rows(16, 0);
  std::vector<rdt::TensorView> targets{rdt::view(rows)};
  std::vector<rdt::Source> ranges{rdt::Source{0, 0, 6 * 8 * 4, 2 * 8 * 4}};
  rdt::Fetch f = other.fetch(theirs, targets, ranges);
  ASSERT_TRUE(f.wait(std::chrono::seconds(30)));
  EXPECT_EQ(rows, std::vector<uint32_t>(src.begin() + 48, src.end()));

  std::vector<uint32_t> whole(64, 0);
  rdt::Fetch g = other.fetch(theirs, {rdt::view(whole, {8, 8})});
  ASSERT_TRUE(g.wait(std::chrono::seconds(30)));
  EXPECT_EQ(whole, src);

  std::vector<uint32_t> slot(64, 0);
  rdt::Ref exposed = owner.expose({rdt::TensorView::of(slot.data(), {64})});
  rdt::Ref w = other.deserialize(exposed.serialize());
  rdt::Fetch wf = other.write_start(w, {rdt::view(src)}, 9);
  ASSERT_TRUE(wf.wait(std::chrono::seconds(30)));
  rdt_write_notice note;
  ASSERT_TRUE(exposed.wait_notice(note, std::chrono::seconds(30)));
  EXPECT_EQ(note.status, RDT_OK) << note.message;
  EXPECT_EQ(note.tag, 9u);
  EXPECT_EQ(slot, src);
}
