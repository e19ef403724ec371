// Real processes: this program re-executes itself as the source (fork +
// exec), and the contents that arrive are checked word by word.
#include "test_util.hpp"

using namespace rdt_test;

class AcrossProcesses : public ::testing::TestWithParam<std::string> {};

// Every transport this build lists, plus the suite's own one-sided (file)
// and two-sided (socket) C++ transports, between two processes.
TEST_P(AcrossProcesses, PutInOneProcessGetInAnother) {
  const size_t n = 300000;
  Child child({"source", GetParam(), std::to_string(n), "2"});
  std::string hex0 = child.read_line(), hex1 = child.read_line();
  ASSERT_FALSE(hex1.empty()) << "the source process said nothing";
  rdt::Runtime rt(quiet("cpp-reader"));
  register_process_transports(rt);
  std::vector<uint32_t> got0(n), got1(n);  // preallocated: rdt writes straight into them
  {
    rdt::Ref r0 = rt.deserialize(from_hex(hex0)), r1 = rt.deserialize(from_hex(hex1));
    rt.get(r0, {rdt::tensor(got0)}, 30s);
    EXPECT_EQ(got0, pattern(n, 0));
    rdt::Fetch f = rt.get_start({r0, r1}, {rdt::tensor(got0), rdt::tensor(got1)});  // two objects at once
    EXPECT_TRUE(f.wait(30s));
  }
  EXPECT_EQ(got1, pattern(n, 1));
  rdt_stats s = rt.stats();
  EXPECT_EQ(s.refs, 0u);
  EXPECT_EQ(s.fetches_active, 0u);
  EXPECT_EQ(s.transfers_completed, 3u);
  EXPECT_EQ(s.bytes_received, 3 * n * 4);
}

INSTANTIATE_TEST_SUITE_P(Transports, AcrossProcesses, ::testing::ValuesIn(process_transports()),
                         [](const ::testing::TestParamInfo<std::string> &i) { return i.param; });

// Runtime::fetch_histograms after known fetches from another process: one
// entry per transport and size class, with exact counts and bytes.
TEST(AcrossProcessesMetrics, FetchHistogramsCountEachFetch) {
  rdt::Runtime rt(quiet("cpp-metrics"));
  EXPECT_TRUE(rt.fetch_histograms().empty());
  struct Batch {
    const char *transport;
    size_t words;
    int objects;
  };
  for (Batch batch : {Batch{"shm", 256, 3}, Batch{"tcp", 25600, 2}}) {  // 1 KiB, 100 KiB
    Child child({"source", batch.transport, std::to_string(batch.words), std::to_string(batch.objects)});
    std::vector<uint32_t> got(batch.words);
    for (int i = 0; i < batch.objects; i++) {
      std::string hex = child.read_line();
      ASSERT_FALSE(hex.empty()) << "the source process said nothing";
      rdt::Ref ref = rt.deserialize(from_hex(hex));
      rt.get(ref, {rdt::tensor(got)}, 30s);
      EXPECT_EQ(got, pattern(batch.words, uint32_t(i)));
    }
  }
  std::vector<rdt_fetch_histogram> hs = rt.fetch_histograms();
  ASSERT_EQ(hs.size(), 2u);
  EXPECT_STREQ(hs[0].transport, "shm");
  EXPECT_EQ(hs[0].size_class, 0u);
  EXPECT_EQ(hs[0].count, 3u);
  EXPECT_EQ(hs[0].bytes, 3u * 1024);
  EXPECT_STREQ(hs[1].transport, "tcp");
  EXPECT_EQ(hs[1].size_class, 2u);
  EXPECT_EQ(hs[1].count, 2u);
  EXPECT_EQ(hs[1].bytes, 2u * 102400);
  for (auto &h : hs) {
    uint64_t in_buckets = 0;
    for (uint64_t n : h.buckets) in_buckets += n;
    EXPECT_EQ(in_buckets, h.count) << h.transport;
    EXPECT_GT(h.sum_ns, 0u);
    EXPECT_EQ(h.failures, 0u);
  }
}

// The consumer's release frees the producer's object: distributed reference
// counting through RAII on both sides.
TEST(AcrossProcessesRefcount, TheLastReleaseFreesTheSource) {
  Child child({"await-free", "auto", "1000"});
  std::string hex = child.read_line();
  ASSERT_FALSE(hex.empty());
  rdt::Runtime rt(quiet("cpp-reader"));
  std::vector<uint32_t> got(1000);
  {
    rdt::Ref ref = rt.deserialize(from_hex(hex));
    rt.get(ref, {rdt::tensor(got)}, 30s);
  }
  EXPECT_EQ(got, pattern(1000, 0));
  EXPECT_EQ(child.read_line(), "freed");
}

// An owner that dies makes the fetch fail promptly, not hang.
TEST(AcrossProcessesRefcount, OwnerDeathIsPeerUnavailable) {
  Child child({"source", "auto", "1000", "1"});
  std::string hex = child.read_line();
  ASSERT_FALSE(hex.empty());
  rdt::Runtime rt(quiet("cpp-reader"));
  rdt::Ref ref = rt.deserialize(from_hex(hex));
  child.kill_now();
  std::vector<uint32_t> got(1000);
  EXPECT_EQ(status_of([&] { rt.get(ref, {rdt::tensor(got)}, 60s); }), RDT_ERR_PEER_UNAVAILABLE);
}

// An owner that stopped (SIGSTOP) accepts connections and requests but
// answers nothing: the caller's deadline still holds, for deserialize (a
// new connection) and for get (metadata the owner must send).
TEST(AcrossProcessesDeadlines, AStoppedOwnerCostsTheTimeoutAndNoMore) {
  const auto limit = 1000ms, margin = 1500ms;
  Child child({"source", "shm", "1000", "2"});
  std::string hex0 = child.read_line(), hex1 = child.read_line();
  ASSERT_FALSE(hex1.empty());
  rdt::Runtime connected(quiet("cpp-connected")), fresh(quiet("cpp-fresh"));
  rdt::Ref ref = connected.deserialize(from_hex(hex0));
  child.stop();

  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(status_of([&] { (void)fresh.deserialize(from_hex(hex1), limit); }), RDT_ERR_TIMEOUT);
  EXPECT_LT(std::chrono::steady_clock::now() - start, limit + margin);

  std::vector<uint32_t> got(1000);
  start = std::chrono::steady_clock::now();
  // Put with shm: fetching over cma needs its metadata from the owner.
  EXPECT_EQ(status_of([&] { connected.get(ref, {rdt::tensor(got)}, limit, "cma"); }), RDT_ERR_TIMEOUT);
  EXPECT_LT(std::chrono::steady_clock::now() - start, limit + margin);
  EXPECT_EQ(connected.stats().fetches_active, 0u);

  child.resume();
  rdt::Ref ref1 = fresh.deserialize(from_hex(hex1));
  fresh.get(ref1, {rdt::tensor(got)}, 30s, "cma");
  EXPECT_EQ(got, pattern(1000, 1));
}

int main(int argc, char **argv) {
  if (argc > 1 && std::string(argv[1]) == "--child") return rdt_test::child_main(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
