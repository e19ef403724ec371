// Every failure surfaces as rdt::Error with the library's status and
// message; exceptions in C++ transport callbacks never unwind into rdt.
#include "test_util.hpp"

#include <sys/wait.h>
#include <unistd.h>

using namespace rdt_test;

// check() maps every status to an rdt::Error with that status.
TEST(Errors, CheckMapsEveryStatus) {
  EXPECT_NO_THROW(rdt::check(RDT_OK));
  for (rdt_status st : {RDT_ERR_INVALID_ARGUMENT, RDT_ERR_NOT_FOUND, RDT_ERR_ALREADY_EXISTS, RDT_ERR_TIMEOUT,
                        RDT_ERR_ABORTED, RDT_ERR_PEER_UNAVAILABLE, RDT_ERR_CORRUPT, RDT_ERR_UNSUPPORTED,
                        RDT_ERR_PERMISSION_DENIED, RDT_ERR_TRANSPORT, RDT_ERR_NO_MEMORY, RDT_ERR_ABI_MISMATCH,
                        RDT_ERR_FORKED, RDT_ERR_CLOSED, RDT_ERR_INTERNAL, RDT_ERR_USER, rdt_status(-123)}) {
    try {
      rdt::check(st);
      ADD_FAILURE() << "no exception for " << st;
    } catch (const rdt::Error &e) {
      EXPECT_EQ(e.status(), st);
      EXPECT_EQ(std::string(e.what()).rfind(rdt_status_string(st), 0), 0u) << e.what();
    }
  }
  const std::exception &base = rdt::Error(RDT_ERR_TIMEOUT, "x");
  EXPECT_STREQ(base.what(), "RDT_ERR_TIMEOUT: x");
  EXPECT_EQ(rdt::version(), std::to_string(RDT_VERSION_MAJOR) + "." + std::to_string(RDT_VERSION_MINOR) + "." +
                                std::to_string(RDT_VERSION_PATCH));
}

TEST(Errors, InvalidArguments) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  std::vector<float> src(8), small(4);
  std::vector<int32_t> wrong_type(8);
  rdt::Ref ref = a.put({rdt::tensor(src)});
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  rdt::Ref empty;
  EXPECT_EQ(status_of([&] { b.get(borrowed, {rdt::tensor(small)}); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { b.get(borrowed, {rdt::tensor(wrong_type)}); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { b.get(borrowed, {}); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { (void)b.get_start(borrowed, {rdt::tensor(src), rdt::tensor(src)}); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { b.get(empty, {rdt::tensor(src)}); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { (void)empty.serialize(); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { (void)empty.info(); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { (void)ref.tensor_info(5); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { register_mem({&a}, "bad name!", std::make_shared<Probe>()); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { rdt::register_transport(a, "x", {}, std::make_unique<FileTransport>()); }),
            RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { rdt::register_transport(a, "x", {RDT_DEVICE_CPU}, nullptr); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { rdt::Fetch().abort(); }), RDT_ERR_INVALID_ARGUMENT);
  rdt::Options bad = quiet("bad");
  bad.listen_tcp = "not an address";
  EXPECT_EQ(status_of([&] { rdt::Runtime r(bad); }), RDT_ERR_INVALID_ARGUMENT);
  bad = quiet("bad");
  bad.lease = std::chrono::milliseconds(-5);
  EXPECT_EQ(status_of([&] { rdt::Runtime r(bad); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_FALSE(a.wait_tensor_freed(src.data(), 10ms)) << "still held: a timeout is a value, not an error";
}

TEST(Errors, NotFoundAlreadyExistsUnsupported) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  std::vector<float> src(8), dst(8);
  EXPECT_EQ(status_of([&] { (void)a.put({rdt::tensor(src)}, "nope"); }), RDT_ERR_NOT_FOUND);
  rdt::Ref ref = a.put({rdt::tensor(src)});
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  EXPECT_EQ(status_of([&] { b.get(borrowed, {rdt::tensor(dst)}, 10s, "nope"); }), RDT_ERR_NOT_FOUND);
  auto probe = std::make_shared<Probe>();
  register_mem({&a}, "mem", probe);
  EXPECT_EQ(status_of([&] { register_mem({&a}, "mem", probe); }), RDT_ERR_ALREADY_EXISTS);
  // A CPU-only transport refuses device memory.
  float *device_ptr = reinterpret_cast<float *>(uintptr_t(0x10000));
  auto gpu = rdt::Tensor::device_memory(device_ptr, {4}, rdt::dtype_of<float>(), RDT_DEVICE_CUDA, 0);
  EXPECT_EQ(status_of([&] { (void)a.put({gpu}, "mem"); }), RDT_ERR_UNSUPPORTED);
  // This runtime lacks the transport the fetch asks for; then the peer does.
  EXPECT_EQ(status_of([&] { b.get(borrowed, {rdt::tensor(dst)}, 10s, "mem"); }), RDT_ERR_NOT_FOUND);
  register_mem({&b}, "only-b", probe);
  EXPECT_EQ(status_of([&] { b.get(borrowed, {rdt::tensor(dst)}, 10s, "only-b"); }), RDT_ERR_UNSUPPORTED);
}

TEST(Errors, CorruptBytes) {
  rdt::Runtime a(quiet("a"));
  EXPECT_EQ(status_of([&] { (void)a.deserialize(std::vector<uint8_t>{1, 2, 3}); }), RDT_ERR_CORRUPT);
  std::vector<float> src(8);
  rdt::Ref ref = a.put({rdt::tensor(src)});
  auto bytes = ref.serialize();
  bytes[bytes.size() / 2] ^= 0x55;
  EXPECT_EQ(status_of([&] { (void)a.deserialize(bytes); }), RDT_ERR_CORRUPT);
  bytes.resize(bytes.size() / 3);
  EXPECT_EQ(status_of([&] { (void)a.deserialize(bytes); }), RDT_ERR_CORRUPT);
}

TEST(Errors, TimeoutAbortsTheGet) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  auto probe = mem_probe(a, b, {true, true, false});
  probe->open = false;
  std::vector<float> src(8), dst(8);
  rdt::Ref ref = a.put({rdt::tensor(src)}, "mem");
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  EXPECT_EQ(status_of([&] { b.get(borrowed, {rdt::tensor(dst)}, 30ms); }), RDT_ERR_TIMEOUT);
  EXPECT_GE(probe->aborts, 1);
  EXPECT_EQ(b.stats().fetches_active, 0u);
}

TEST(Errors, PeerUnavailableAndClosed) {
  rdt::Runtime b(quiet("b"));
  std::vector<float> src(8), dst(8);
  std::vector<uint8_t> bytes;
  rdt::Ref borrowed, owned;
  {
    rdt::Runtime a(quiet("a"));
    owned = a.put({rdt::tensor(src)});
    bytes = owned.serialize();
    borrowed = b.deserialize(owned.serialize());
  }
  await_no_peers(b);
  EXPECT_EQ(status_of([&] { b.get(borrowed, {rdt::tensor(dst)}, 10s); }), RDT_ERR_PEER_UNAVAILABLE);
  EXPECT_EQ(status_of([&] { (void)b.deserialize(bytes); }), RDT_ERR_PEER_UNAVAILABLE);
  EXPECT_EQ(status_of([&] { (void)owned.serialize(); }), RDT_ERR_CLOSED);
  EXPECT_EQ(status_of([&] { rdt::Ref copy = owned; }), RDT_ERR_CLOSED);
}

TEST(Errors, AbiMismatchThroughCapi) {
  rdt_runtime_options o;
  rdt_runtime_options_init(&o);
  o.abi_version = RDT_ABI_VERSION + 1;
  rdt_runtime *raw = nullptr;
  EXPECT_EQ(status_of([&] { rdt::check(rdt_runtime_create(&o, &raw)); }), RDT_ERR_ABI_MISMATCH);
  EXPECT_EQ(raw, nullptr);
}

// A child forked without exec cannot use rdt: every call is RDT_ERR_FORKED.
TEST(Errors, ForkedChildGetsForked) {
  rdt::Runtime a(quiet("a"));
  std::vector<float> src(4);
  rdt::Ref ref = a.put({rdt::tensor(src)});
  pid_t pid = fork();
  if (pid == 0) {
    int code = 0;
    if (status_of([&] { rdt::Runtime r(quiet("child")); }) != RDT_ERR_FORKED) code |= 1;
    if (status_of([&] { (void)ref.serialize(); }) != RDT_ERR_FORKED) code |= 2;
    (void)ref.release();  // its destructor would be another FORKED call
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// ---- exceptions thrown by C++ transports -------------------------------------------

struct Throw {
  const char *callback;
  bool one_sided;
  bool asynchronous;
};
void PrintTo(const Throw &t, std::ostream *os) { *os << t.callback; }

class CallbackThrows : public ::testing::TestWithParam<Throw> {};

// The exception reaches the caller as RDT_ERR_USER with what() in the
// message, and nothing is left behind.
TEST_P(CallbackThrows, BecomesUserErrorWithItsMessage) {
  const Throw &p = GetParam();
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  auto probe = mem_probe(a, b, {p.one_sided, true, p.asynchronous});
  probe->throw_in = p.callback;
  std::vector<uint32_t> src = pattern(64, 1), dst(64);
  auto put_and_get = [&] {
    rdt::Ref ref = a.put({rdt::tensor(src)}, "mem");
    rdt::Ref borrowed = b.deserialize(ref.serialize());
    b.get(borrowed, {rdt::tensor(dst)}, 10s);
  };
  try {
    put_and_get();
    ADD_FAILURE() << "no error";
  } catch (const rdt::Error &e) {
    EXPECT_EQ(e.status(), RDT_ERR_USER) << e.what();
    EXPECT_NE(e.message().find(std::string("boom from C++ ") + p.callback), std::string::npos) << e.message();
  }
  EXPECT_EQ(b.stats().fetches_active, 0u);
  EXPECT_EQ(b.stats().refs, 0u);
  EXPECT_EQ(probe->requests_made, probe->requests_freed);
}

INSTANTIATE_TEST_SUITE_P(Transports, CallbackThrows,
                         ::testing::Values(Throw{"extract_metadata", true, false},
                                           Throw{"communicator_metadata", true, false}, Throw{"recv", true, false},
                                           Throw{"send", false, false}, Throw{"fetch", true, true},
                                           Throw{"wait", true, true}),
                         [](const ::testing::TestParamInfo<Throw> &i) {
                           return std::string(i.param.callback) + (i.param.one_sided ? "" : "_two_sided");
                         });

// An rdt::Error keeps its status; a non-std exception still becomes
// RDT_ERR_USER; an rdt::Error "with status OK" cannot pass for success.
TEST(CallbackExceptions, StatusesOfOtherExceptionKinds) {
  for (auto kind : {std::make_pair("rdt", RDT_ERR_TRANSPORT), std::make_pair("nonstd", RDT_ERR_USER),
                    std::make_pair("rdt_ok", RDT_ERR_USER)}) {
    rdt::Runtime a(quiet("a")), b(quiet("b"));
    auto probe = mem_probe(a, b);
    probe->throw_in = "recv";
    probe->throw_kind = kind.first;
    std::vector<float> src(4), dst(4);
    rdt::Ref ref = a.put({rdt::tensor(src)}, "mem");
    rdt::Ref borrowed = b.deserialize(ref.serialize());
    std::string msg = message_of([&] { b.get(borrowed, {rdt::tensor(dst)}, 10s); });
    EXPECT_EQ(status_of([&] { b.get(borrowed, {rdt::tensor(dst)}, 10s); }), kind.second) << kind.first << ": " << msg;
    if (std::string(kind.first) == "nonstd")
      EXPECT_NE(msg.find("not a std::exception"), std::string::npos) << msg;
    else
      EXPECT_NE(msg.find("boom from C++ recv"), std::string::npos) << msg;
  }
}

// Callbacks without a caller to fail (garbage_collect, abort) may throw too:
// the process goes on and the objects are still freed.
TEST(CallbackExceptions, GarbageCollectAndAbortMayThrow) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  auto probe = mem_probe(a, b, {true, true, false});
  std::vector<float> src(4), dst(4);
  probe->throw_in = "garbage_collect";
  {
    rdt::Ref ref = a.put({rdt::tensor(src)}, "mem");
  }
  EXPECT_TRUE(a.wait_tensor_freed(src.data(), 10s));
  EXPECT_EQ(probe->gcs, 1);
  probe->throw_in = "abort";
  probe->open = false;
  rdt::Ref ref = a.put({rdt::tensor(src)}, "mem");
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  EXPECT_EQ(status_of([&] { b.get(borrowed, {rdt::tensor(dst)}, 20ms); }), RDT_ERR_TIMEOUT);
  EXPECT_GE(probe->aborts, 1);
}
