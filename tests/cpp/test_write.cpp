// Writes into exposed objects through the wrapper: Runtime::expose, write()
// and write_start(), whole and into a range, over every built-in transport
// that writes, with the owner's notices, a refusal and revoking.
#include "test_util.hpp"

using namespace rdt_test;

TEST(Write, IntoAnExposedObjectOverEachTransport) {
  rdt::Runtime owner(quiet("cpp-owner")), writer(quiet("cpp-writer"));
  std::vector<std::string> names = builtin_host_transports(writer, RDT_TRANSPORT_WRITES);
  ASSERT_FALSE(names.empty()) << "no built-in transport writes";
  uint64_t tag = 0;
  for (const std::string &name : names) {
    SCOPED_TRACE(name);
    std::vector<uint32_t> buf(4096, 0);
    rdt::Ref exposed = owner.expose({rdt::Tensor::of(buf.data(), {64, 64})}, name);
    ASSERT_EQ(exposed.info().is_writable, 1);
    rdt::Ref w = writer.deserialize(exposed.serialize());

    std::vector<uint32_t> src = pattern(4096, 3);
    writer.write(w, {rdt::Tensor::of(src.data(), {64, 64})}, ++tag, std::chrono::seconds(30));
    rdt_write_notice note;
    ASSERT_TRUE(exposed.wait_notice(note, std::chrono::seconds(30)));
    EXPECT_EQ(note.status, RDT_OK) << note.message;
    EXPECT_EQ(note.tag, tag);
    EXPECT_EQ(buf, src);

    // Rows 10..11 only, started and waited on.
    std::vector<uint32_t> rows(128, 0xABCDu);
    std::vector<rdt::Range> dest{rdt::rows(0, w, 0, 10, 12)};
    rdt::Write f = writer.write_start(w, {rdt::Tensor::of(rows.data(), {2, 64})}, ++tag, &dest);
    ASSERT_TRUE(f.wait(std::chrono::seconds(30)));
    ASSERT_TRUE(exposed.wait_notice(note, std::chrono::seconds(30)));
    EXPECT_EQ(note.status, RDT_OK) << note.message;
    EXPECT_EQ(note.nbytes, 128u * 4);
    for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], i >= 640 && i < 768 ? 0xABCDu : src[i]) << i;

    // A writable ref is not fetched; a revoked one is not written.
    EXPECT_THROW(writer.get(w, {rdt::Tensor::of(src.data(), {64, 64})}), rdt::Error);
    ASSERT_TRUE(exposed.revoke_writes(std::chrono::seconds(30)));
    try {
      writer.write(w, {rdt::Tensor::of(src.data(), {64, 64})}, ++tag, std::chrono::seconds(30));
      ADD_FAILURE() << "a revoked object was written";
    } catch (const rdt::Error &e) {
      EXPECT_EQ(e.status(), RDT_ERR_PERMISSION_DENIED) << e.what();
    }
    EXPECT_FALSE(exposed.wait_notice(note, std::chrono::milliseconds(0))) << "refused writes make no notice";
  }
}

namespace {

// What a test sees of the WritingTransports it registered.
struct WriteProbe {
  std::atomic<int> writes{0}, ranged{0}, requests{0};
  std::atomic<bool> fail{false};  // the next writes throw
};

// A one-sided transport for runtimes of one process that writes: the
// owner's metadata holds the exposed tensors' addresses, and write() (or a
// request's thread, when asynchronous) copies the sources there.
class WritingTransport : public rdt::Transport {
 public:
  WritingTransport(std::shared_ptr<WriteProbe> p, bool async) : p_(std::move(p)), async_(async) {}
  bool one_sided() const override { return true; }
  bool asynchronous() const override { return async_; }
  bool serves_ranges() const override { return true; }
  bool writes() const override { return true; }

  std::vector<uint8_t> extract_metadata(const std::string &, rdt::Tensors ts) override {
    std::vector<uint8_t> m(ts.size() * sizeof(void *));
    for (size_t i = 0; i < ts.size(); i++) {
      void *a = rdt::bytes_of(ts[i]);
      std::memcpy(&m[i * sizeof a], &a, sizeof a);
    }
    return m;
  }
  void recv(const rdt::Transfer &, rdt::Tensors, rdt::Bytes, rdt::Bytes) override {
    throw std::logic_error("this test only writes");
  }
  std::unique_ptr<Request> fetch(const rdt::Transfer &, rdt::Tensors, rdt::Bytes, rdt::Bytes) override {
    throw std::logic_error("this test only writes");
  }
  void write(const rdt::Transfer &x, rdt::Tensors sources, rdt::Bytes tmeta, rdt::Bytes) override {
    copy(x, sources, tmeta);
  }
  std::unique_ptr<Request> write_start(const rdt::Transfer &x, rdt::Tensors sources, rdt::Bytes tmeta,
                                       rdt::Bytes) override {
    p_->requests++;
    return std::make_unique<Req>(this, x, sources, tmeta.to_vector());
  }

 private:
  // A write running on its own thread; the transfer and the sources stay
  // valid until the request is destroyed.
  class Req : public ThreadRequest {
   public:
    Req(WritingTransport *t, const rdt::Transfer &x, rdt::Tensors sources, std::vector<uint8_t> tmeta)
        : ThreadRequest([t, x, sources, tmeta = std::move(tmeta)] {
            t->copy(x, sources, rdt::Bytes(tmeta.data(), tmeta.size()));
          }) {}
  };

  void copy(const rdt::Transfer &x, rdt::Tensors sources, rdt::Bytes tmeta) {
    p_->writes++;
    if (!x.is_source()) throw std::logic_error("a write runs on the writer, the transfer's source");
    if (p_->fail) throw std::runtime_error("boom from a C++ write");
    size_t n = tmeta.size() / sizeof(void *);
    if (!x.ranges().empty()) p_->ranged++;
    for (size_t i = 0; i < sources.size(); i++) {
      rdt_range r{0, uint32_t(i), 0, rdt::nbytes(sources[i])};
      if (!x.ranges().empty()) r = x.ranges()[i];
      if (r.tensor >= n) throw std::runtime_error("a destination the metadata lacks");
      char *dst;
      std::memcpy(&dst, &tmeta[r.tensor * sizeof dst], sizeof dst);
      std::memcpy(dst + r.offset, rdt::bytes_of(sources[i]), r.length);
    }
  }

  std::shared_ptr<WriteProbe> p_;
  bool async_;
};

class CppWritingTransport : public ::testing::TestWithParam<bool> {};

}  // namespace

// A transport written in C++ writes: whole and into a range, each write
// ending in a notice with its tag; a write that throws fails the writer's
// call with the exception's message and makes a failure notice.
TEST_P(CppWritingTransport, WritesIntoAnExposedObject) {
  bool async = GetParam();
  rdt::Runtime owner(quiet("cpp-owner")), writer(quiet("cpp-writer"));
  auto probe = std::make_shared<WriteProbe>();
  for (rdt::Runtime *rt : {&owner, &writer})
    rdt::register_transport(*rt, "memwrite", {RDT_DEVICE_CPU}, std::make_unique<WritingTransport>(probe, async));
  bool listed = false;
  for (auto &t : writer.transports())
    if (std::string(t.name) == "memwrite") listed = (t.flags & RDT_TRANSPORT_WRITES) != 0;
  EXPECT_TRUE(listed);

  std::vector<uint32_t> buf(1024, 0);
  rdt::Ref exposed = owner.expose({rdt::tensor(buf)}, "memwrite");
  rdt::Ref w = writer.deserialize(exposed.serialize());
  std::vector<uint32_t> src = pattern(1024, 5);
  writer.write(w, {rdt::tensor(src)}, 31, std::chrono::seconds(30));
  rdt_write_notice note;
  ASSERT_TRUE(exposed.wait_notice(note, std::chrono::seconds(30)));
  EXPECT_EQ(note.status, RDT_OK) << note.message;
  EXPECT_EQ(note.tag, 31u);
  EXPECT_EQ(buf, src);

  std::vector<uint32_t> rows(64, 0x5A5Au);
  std::vector<rdt::Range> dest{rdt::rows(0, w, 0, 100, 164)};
  rdt::Write f = writer.write_start(w, {rdt::tensor(rows)}, 32, &dest);
  ASSERT_TRUE(f.wait(std::chrono::seconds(30)));
  ASSERT_TRUE(exposed.wait_notice(note, std::chrono::seconds(30)));
  EXPECT_EQ(note.status, RDT_OK) << note.message;
  EXPECT_EQ(note.tag, 32u);
  for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], i >= 100 && i < 164 ? 0x5A5Au : src[i]) << i;
  EXPECT_EQ(probe->ranged, 1);

  probe->fail = true;
  try {
    writer.write(w, {rdt::tensor(src)}, 33, std::chrono::seconds(30));
    ADD_FAILURE() << "a write that threw succeeded";
  } catch (const rdt::Error &e) {
    EXPECT_EQ(e.status(), RDT_ERR_USER) << e.what();
    EXPECT_NE(std::string(e.what()).find("boom from a C++ write"), std::string::npos) << e.what();
  }
  ASSERT_TRUE(exposed.wait_notice(note, std::chrono::seconds(30)));
  EXPECT_EQ(note.status, RDT_ERR_USER);
  EXPECT_EQ(note.tag, 33u);
  EXPECT_NE(std::string(note.message).find("boom from a C++ write"), std::string::npos) << note.message;
  EXPECT_EQ(probe->writes, 3);
  EXPECT_EQ(probe->requests, async ? 3 : 0);
}

INSTANTIATE_TEST_SUITE_P(Kinds, CppWritingTransport, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool> &i) {
                           return std::string(i.param ? "asynchronous" : "synchronous");
                         });

// Writes are one-sided: a two-sided transport that says it writes is
// refused at registration, with the reason.
TEST(CppWritingTransportRefused, WhenTwoSided) {
  struct TwoSided : WritingTransport {
    TwoSided() : WritingTransport(std::make_shared<WriteProbe>(), false) {}
    bool one_sided() const override { return false; }
  };
  rdt::Runtime rt(quiet("cpp-refused"));
  try {
    rdt::register_transport(rt, "twosided", {RDT_DEVICE_CPU}, std::make_unique<TwoSided>());
    ADD_FAILURE() << "a two-sided transport that writes was registered";
  } catch (const rdt::Error &e) {
    EXPECT_EQ(e.status(), RDT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("RDT_TRANSPORT_ONE_SIDED"), std::string::npos) << e.what();
  }
}
