// Writes into exposed objects through the wrapper: Runtime::expose, write()
// and write_start(), whole and into a range, over every built-in transport
// that writes, with the owner's notices, a refusal and revoking.
#include "test_util.hpp"

using namespace rdt_test;

namespace {

// The built-in transports that write host memory (cuda_ipc writes device
// memory only).
std::vector<std::string> writing_transports(rdt::Runtime &rt) {
  std::vector<std::string> out;
  for (auto &t : rt.transports()) {
    bool host = false;
    for (uint32_t i = 0; i < t.num_devices; i++) host = host || t.devices[i] == RDT_DEVICE_CPU;
    if ((t.flags & RDT_TRANSPORT_BUILTIN) && (t.flags & RDT_TRANSPORT_WRITES) && host) out.push_back(t.name);
  }
  return out;
}

}  // namespace

TEST(Write, IntoAnExposedObjectOverEachTransport) {
  rdt::Runtime owner(quiet("cpp-owner")), writer(quiet("cpp-writer"));
  std::vector<std::string> names = writing_transports(writer);
  ASSERT_FALSE(names.empty()) << "no built-in transport writes";
  uint64_t tag = 0;
  for (const std::string &name : names) {
    SCOPED_TRACE(name);
    std::vector<uint32_t> buf(4096, 0);
    rdt::Ref exposed = owner.expose({rdt::TensorView::of(buf.data(), {64, 64})}, name);
    ASSERT_EQ(exposed.info().is_writable, 1);
    rdt::Ref w = writer.deserialize(exposed.serialize());

    std::vector<uint32_t> src = pattern(4096, 3);
    writer.write(w, {rdt::TensorView::of(src.data(), {64, 64})}, ++tag, std::chrono::seconds(30));
    rdt_write_notice note;
    ASSERT_TRUE(exposed.wait_notice(note, std::chrono::seconds(30)));
    EXPECT_EQ(note.status, RDT_OK) << note.message;
    EXPECT_EQ(note.tag, tag);
    EXPECT_EQ(buf, src);

    // Rows 10..11 only, started and waited on.
    std::vector<uint32_t> rows(128, 0xABCDu);
    std::vector<rdt::Source> dest{rdt::rows(0, w, 0, 10, 12)};
    rdt::Fetch f = writer.write_start(w, {rdt::TensorView::of(rows.data(), {2, 64})}, ++tag, &dest);
    ASSERT_TRUE(f.wait(std::chrono::seconds(30)));
    ASSERT_TRUE(exposed.wait_notice(note, std::chrono::seconds(30)));
    EXPECT_EQ(note.status, RDT_OK) << note.message;
    EXPECT_EQ(note.nbytes, 128u * 4);
    for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], i >= 640 && i < 768 ? 0xABCDu : src[i]) << i;

    // A writable ref is not fetched; a revoked one is not written.
    EXPECT_THROW(writer.get(w, {rdt::TensorView::of(src.data(), {64, 64})}), rdt::Error);
    ASSERT_TRUE(exposed.revoke_writes(std::chrono::seconds(30)));
    try {
      writer.write(w, {rdt::TensorView::of(src.data(), {64, 64})}, ++tag, std::chrono::seconds(30));
      ADD_FAILURE() << "a revoked object was written";
    } catch (const rdt::Error &e) {
      EXPECT_EQ(e.status(), RDT_ERR_PERMISSION_DENIED) << e.what();
    }
    EXPECT_FALSE(exposed.wait_notice(note, std::chrono::milliseconds(0))) << "refused writes make no notice";
  }
}
