// C++ transports between runtimes of this process: one-sided, two-sided,
// asynchronous (fetch + Request::wait), aborted.
#include "test_util.hpp"

using namespace rdt_test;

struct Kind {
  const char *name;
  MemTransport::Config config;
};
void PrintTo(const Kind &k, std::ostream *os) { *os << k.name; }

class CppTransport : public ::testing::TestWithParam<Kind> {};

// Moves a multi-tensor object, calls every callback it should and frees the
// object (garbage_collect once) when the last reference is gone.
TEST_P(CppTransport, MovesAnObjectAndCleansUp) {
  const Kind &k = GetParam();
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  auto probe = mem_probe(a, b, k.config);
  auto p0 = pattern(100000, 1), p1 = pattern(3, 2);
  std::vector<uint32_t> d0(p0.size()), d1(p1.size());
  {
    rdt::Ref ref = a.put({rdt::tensor(p0), rdt::tensor(p1)}, "mem");
    EXPECT_EQ(ref.transport(), "mem");
    EXPECT_EQ(probe->extracts, 1);
    rdt::Ref borrowed = b.deserialize(ref.serialize());
    b.get(borrowed, {rdt::tensor(d0), rdt::tensor(d1)}, 10s);
    EXPECT_EQ(d0, p0);
    EXPECT_EQ(d1, p1);
    EXPECT_EQ(probe->comms, 1);
    EXPECT_EQ(probe->recvs, 1);
    EXPECT_EQ(probe->sends, k.config.one_sided ? 0 : 1);
  }
  EXPECT_TRUE(a.wait_tensor_freed(p0.data(), 10s));
  for (int i = 0; i < 1000 && probe->gcs == 0; i++) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(probe->gcs, 1);
  EXPECT_EQ(probe->requests_made, k.config.asynchronous ? 1 : 0);
  EXPECT_EQ(probe->requests_freed, probe->requests_made);
  // The transport's counters are visible through the runtime.
  for (auto &t : b.transports())
    if (std::string(t.name) == "mem") {
      EXPECT_EQ(t.transfers_completed, 1u);
      EXPECT_EQ(t.flags & RDT_TRANSPORT_ONE_SIDED, k.config.one_sided ? RDT_TRANSPORT_ONE_SIDED : 0u);
      EXPECT_EQ(t.flags & RDT_TRANSPORT_BUILTIN, 0u);
    }
}

// Aborting reaches the transport's abort() (with the request for an
// asynchronous one), and the fetch reports RDT_ERR_ABORTED.
TEST_P(CppTransport, AbortReachesTheTransport) {
  Kind k = GetParam();
  k.config.can_abort = true;
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  auto probe = mem_probe(a, b, k.config);
  probe->open = false;
  std::vector<uint32_t> src(100), dst(100);
  rdt::Ref ref = a.put({rdt::tensor(src)}, "mem");
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  rdt::Fetch f = b.get_start(borrowed, {rdt::tensor(dst)});
  EXPECT_FALSE(f.wait(20ms));
  f.abort();
  EXPECT_EQ(status_of([&] { f.wait(10s); }), RDT_ERR_ABORTED);
  EXPECT_GE(probe->aborts, 1);
  EXPECT_EQ(probe->abort_saw_request, k.config.asynchronous);
  EXPECT_EQ(probe->finished, 0);
  f = rdt::Fetch();
  EXPECT_EQ(probe->requests_freed, probe->requests_made);
}

INSTANTIATE_TEST_SUITE_P(Kinds, CppTransport,
                         ::testing::Values(Kind{"one_sided", {true, false, false}},
                                           Kind{"two_sided", {false, false, false}},
                                           Kind{"asynchronous", {true, false, true}}),
                         [](const ::testing::TestParamInfo<Kind> &i) { return std::string(i.param.name); });

// Transfer describes both ends to the callbacks.
TEST(CppTransportCallbacks, TransferNamesBothEnds) {
  struct Recorder : rdt::Transport {
    explicit Recorder(std::shared_ptr<std::vector<std::string>> s) : seen(std::move(s)) {}
    bool one_sided() const override { return true; }
    void recv(const rdt::Transfer &x, rdt::Tensors targets, rdt::Bytes, rdt::Bytes) override {
      *seen = {x.object_id(), x.transport(), x.source_runtime(), x.source_address(), x.destination_runtime(),
               x.destination_address(), x.is_destination() ? "destination" : "source"};
      std::memset(rdt::bytes_of(targets[0]), 0x7f, rdt::nbytes(targets[0]));
    }
    std::shared_ptr<std::vector<std::string>> seen;
  };
  auto seen = std::make_shared<std::vector<std::string>>();
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  rdt::register_transport(a, "Recorder", {RDT_DEVICE_CPU}, std::make_unique<Recorder>(seen));
  rdt::register_transport(b, "recorder", {RDT_DEVICE_CPU}, std::make_unique<Recorder>(seen));
  std::vector<uint8_t> src(5), dst(5);
  rdt::Ref ref = a.put({rdt::tensor(src)}, "RECORDER");
  b.get(b.deserialize(ref.serialize()), {rdt::tensor(dst)}, 10s);
  ASSERT_EQ(seen->size(), 7u);
  EXPECT_EQ((*seen)[0], ref.id());
  EXPECT_EQ((*seen)[1], "recorder");
  EXPECT_EQ((*seen)[2].size(), 32u);
  EXPECT_EQ((*seen)[3], a.address());
  EXPECT_EQ((*seen)[5], b.address());
  EXPECT_EQ((*seen)[6], "destination");
  EXPECT_EQ(dst, std::vector<uint8_t>(5, 0x7f));
}
