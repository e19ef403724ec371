// Prepared transfers through the wrapper: Runtime::prepare_get and
// prepare_write run many times over cma and tcp, each run moving what the
// source holds then, each write run making one notice with its tag; a
// failed run throws and the next one works; the Prepared outlives the
// caller's refs.
#include "test_util.hpp"

using namespace rdt_test;

TEST(Prepared, GetRunsManyTimes) {
  for (const char *name : {"cma", "tcp"}) {
    SCOPED_TRACE(name);
    rdt::Runtime owner(quiet("cpp-owner")), reader(quiet("cpp-reader"));
    std::vector<uint32_t> src = pattern(4096, 1), dst(4096, 0);
    rdt::Prepared p;
    {
      rdt::Ref ref = owner.put({rdt::Tensor::of(src.data(), {64, 64})}, name);
      rdt::Ref theirs = reader.deserialize(ref.serialize());
      p = reader.prepare_get(theirs, {rdt::Tensor::of(dst.data(), {64, 64})});
    }  // both refs released: the prepared get holds its own
    for (uint32_t run = 0; run < 10; run++) {
      std::vector<uint32_t> now = pattern(4096, run * 7);
      std::copy(now.begin(), now.end(), src.begin());  // in place: rdt holds its address
      p.run(0, std::chrono::seconds(30));
      ASSERT_EQ(dst, src) << "run " << run;
    }
    EXPECT_EQ(owner.stats().objects_freed, 0u) << "still borrowed by the prepared get";
  }
}

TEST(Prepared, WriteRunsWithTheirTags) {
  for (const char *name : {"cma", "tcp"}) {
    SCOPED_TRACE(name);
    rdt::Runtime owner(quiet("cpp-owner")), writer(quiet("cpp-writer"));
    std::vector<uint32_t> slot(4096, 0), src(4096, 0);
    rdt::Ref exposed = owner.expose({rdt::Tensor::of(slot.data(), {64, 64})}, name);
    rdt::Ref w = writer.deserialize(exposed.serialize());
    rdt::Prepared p = writer.prepare_write(w, {rdt::Tensor::of(src.data(), {64, 64})});
    for (uint64_t tag = 1; tag <= 5; tag++) {
      std::vector<uint32_t> now = pattern(4096, static_cast<uint32_t>(tag));
      std::copy(now.begin(), now.end(), src.begin());  // in place: rdt holds its address
      p.run(tag, std::chrono::seconds(30));
      rdt_write_notice note;
      ASSERT_TRUE(exposed.wait_notice(note, std::chrono::seconds(30)));
      EXPECT_EQ(note.status, RDT_OK) << note.message;
      EXPECT_EQ(note.tag, tag);
      EXPECT_EQ(slot, src);
    }
    ASSERT_TRUE(exposed.revoke_writes(std::chrono::seconds(30)));
    try {
      p.run(6, std::chrono::seconds(30));
      ADD_FAILURE() << "a revoked object was written";
    } catch (const rdt::Error &e) {
      EXPECT_EQ(e.status(), RDT_ERR_PERMISSION_DENIED) << e.what();
    }
  }
}
