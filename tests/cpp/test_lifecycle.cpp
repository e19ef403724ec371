// RAII and value semantics: Runtime, Ref, Fetch, Write, Tensor.
#include "test_util.hpp"

using namespace rdt_test;

// Every handle a scope made is gone when it exits: refs, borrows, fetches
// and finally the object itself.
TEST(Raii, ScopeExitReleasesEveryHandle) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  std::vector<float> src(1000, 1.5f), dst(1000), dst2(1000);
  {
    rdt::Ref ref = a.put({rdt::tensor(src)});
    rdt::Ref borrowed = b.deserialize(ref.serialize());
    b.get(borrowed, {rdt::tensor(dst)}, 10s);
    rdt::Fetch f = b.get_start(borrowed, {rdt::tensor(dst2)});
    rdt::Ref copy = borrowed;
    // A running fetch holds a handle of its own: count once it finished.
    EXPECT_TRUE(f.wait(10s));
    EXPECT_EQ(a.stats().refs, 1u);
    EXPECT_EQ(b.stats().refs, 2u);
    EXPECT_EQ(b.stats().fetches_active, 1u);
    EXPECT_EQ(b.stats().borrowed_objects, 1u);
  }
  EXPECT_TRUE(a.wait_tensor_freed(src.data(), 10s));
  rdt_stats sa = a.stats(), sb = b.stats();
  EXPECT_EQ(sa.refs, 0u);
  EXPECT_EQ(sa.objects, 0u);
  EXPECT_EQ(sa.objects_freed, 1u);
  EXPECT_EQ(sa.borrows, 0u);
  EXPECT_EQ(sb.refs, 0u);
  EXPECT_EQ(sb.fetches_active, 0u);
  EXPECT_EQ(sb.borrowed_objects, 0u);
  EXPECT_EQ(dst, src);
  EXPECT_EQ(dst2, src);
}

// on_free runs exactly once, after the last reference anywhere is gone, and
// then drops what it captured.
TEST(Raii, OnFreeRunsOnceAfterTheLastReference) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  auto buffer = std::make_shared<std::vector<int64_t>>(64, 7);
  std::weak_ptr<std::vector<int64_t>> watch = buffer;
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  rdt::Ref borrowed;
  {
    rdt::Ref ref = a.put({rdt::tensor(*buffer)}, "", [keep = buffer, &mu, &cv, &calls] {
      std::lock_guard<std::mutex> g(mu);
      calls++;
      cv.notify_all();
    });
    borrowed = b.deserialize(ref.serialize());
  }
  buffer.reset();
  EXPECT_FALSE(watch.expired()) << "the object still holds the buffer through on_free";
  EXPECT_FALSE(a.wait_tensor_freed(watch.lock()->data(), 20ms)) << "b still borrows it";
  borrowed.reset();
  std::unique_lock<std::mutex> l(mu);
  ASSERT_TRUE(cv.wait_for(l, 10s, [&] { return calls > 0; }));
  l.unlock();
  std::this_thread::sleep_for(20ms);  // a second call would come now
  EXPECT_EQ(calls, 1);
  // The callback is deleted right after it ran; wait for that to happen.
  for (int i = 0; i < 1000 && !watch.expired(); i++) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(watch.expired());
}

// A put that fails keeps nothing: on_free is not called, and what it
// captured is freed at once.
TEST(Raii, FailedPutDropsOnFree) {
  rdt::Runtime a(quiet("a"));
  auto token = std::make_shared<int>(1);
  bool called = false;
  std::vector<float> src(4);
  EXPECT_EQ(status_of([&] { (void)a.put({rdt::tensor(src)}, "no-such-transport", [token, &called] { called = true; }); }),
            RDT_ERR_NOT_FOUND);
  EXPECT_EQ(token.use_count(), 1);
  EXPECT_FALSE(called);
  EXPECT_EQ(a.stats().objects, 0u);
}

// The runtime owns registered transports and deletes each exactly once: at
// destruction, or at once when registration fails.
TEST(Raii, RuntimeDeletesItsTransports) {
  auto probe = std::make_shared<Probe>();
  {
    rdt::Runtime a(quiet("a"));
    register_mem({&a}, "mem", probe);
    EXPECT_EQ(status_of([&] { register_mem({&a}, "MEM", probe); }), RDT_ERR_ALREADY_EXISTS);
    EXPECT_EQ(probe->destroyed, 1) << "the rejected duplicate is deleted";
    EXPECT_EQ(status_of([&] { register_mem({&a}, "bad name!", probe); }), RDT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(probe->destroyed, 2);
    EXPECT_TRUE(a.has_transport("Mem"));
  }
  EXPECT_EQ(probe->destroyed, 3);
  EXPECT_EQ(probe.use_count(), 1);
}

// Runtime is move-only; assigning over one destroys the old runtime.
TEST(Raii, RuntimeMoves) {
  auto probe = std::make_shared<Probe>();
  rdt::Runtime a(quiet("a"));
  register_mem({&a}, "mem", probe);
  std::string addr = a.address();
  rdt::Runtime b(std::move(a));
  EXPECT_FALSE(a);
  EXPECT_EQ(b.address(), addr);
  EXPECT_EQ(status_of([&] { (void)a.address(); }), RDT_ERR_INVALID_ARGUMENT);
  b = rdt::Runtime(quiet("c"));
  EXPECT_EQ(probe->destroyed, 1);
  EXPECT_NE(b.address(), addr);
  static_assert(!std::is_copy_constructible_v<rdt::Runtime> && !std::is_copy_assignable_v<rdt::Runtime>);
  static_assert(std::is_nothrow_move_constructible_v<rdt::Runtime> && std::is_nothrow_move_assignable_v<rdt::Runtime>);
}

// Refs and fetches may outlive their runtime: calls fail with RDT_ERR_CLOSED
// and destruction still frees the handles.
TEST(Raii, RefsAndFetchesMayOutliveTheirRuntime) {
  std::vector<float> src(16, 2.0f), dst(16);
  rdt::Ref ref, borrowed;
  rdt::Fetch f;
  rdt::Runtime b(quiet("b"));
  {
    rdt::Runtime a(quiet("a"));
    ref = a.put({rdt::tensor(src)});
    borrowed = b.deserialize(ref.serialize());
    f = b.get_start(borrowed, {rdt::tensor(dst)});
    EXPECT_TRUE(f.wait(10s));
  }
  EXPECT_EQ(status_of([&] { (void)ref.serialize(); }), RDT_ERR_CLOSED);
  await_no_peers(b);
  EXPECT_EQ(status_of([&] { b.get(borrowed, {rdt::tensor(dst)}, 10s); }), RDT_ERR_PEER_UNAVAILABLE);
  ref.reset();
  borrowed.reset();
  f = rdt::Fetch();
  EXPECT_EQ(b.stats().refs, 0u);
  EXPECT_EQ(b.stats().fetches_active, 0u);
}

// Destroying a Fetch whose transport can abort aborts it and waits.
TEST(Raii, FetchDestructorAbortsAndWaits) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  auto probe = mem_probe(a, b, {true, true, false});
  probe->open = false;
  std::vector<int32_t> src(10, 1), dst(10);
  rdt::Ref ref = a.put({rdt::tensor(src)}, "mem");
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  {
    rdt::Fetch f = b.get_start(borrowed, {rdt::tensor(dst)});
    EXPECT_FALSE(f.wait(30ms));
  }
  EXPECT_GE(probe->aborts, 1);
  EXPECT_EQ(probe->finished, 0);
  EXPECT_EQ(b.stats().fetches_active, 0u);
}

// Destroying a Fetch whose transport cannot abort waits until the transfer
// finished, so the buffer may be freed right after: nothing writes into it
// any more.
TEST(Raii, FetchDestructorWaitsForATransportThatCannotAbort) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  auto probe = mem_probe(a, b);
  probe->delay_ms = 150;
  std::vector<uint32_t> src = pattern(4096, 5);
  rdt::Ref ref = a.put({rdt::tensor(src)}, "mem");
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  auto dst = std::make_unique<std::vector<uint32_t>>(src.size());
  {
    rdt::Fetch f = b.get_start(borrowed, {rdt::tensor(*dst)});
    EXPECT_FALSE(f.ready());
    // The transfer starts in the background; free it once it runs.
    for (int i = 0; i < 10000 && probe->recvs == 0; i++) std::this_thread::sleep_for(1ms);
    ASSERT_EQ(probe->recvs, 1);
  }
  EXPECT_EQ(probe->finished, 1) << "the Fetch was freed while its transfer still ran";
  dst.reset();  // safe now
  EXPECT_EQ(b.stats().fetches_active, 0u);
}

TEST(RefSemantics, CopyClonesAndMoveTransfers) {
  rdt::Runtime a(quiet("a"));
  std::vector<double> src(4, 2.0);
  rdt::Ref r1 = a.put({rdt::tensor(src)});
  rdt::Ref r2 = r1;  // clone
  EXPECT_EQ(a.stats().refs, 2u);
  EXPECT_EQ(r1.id(), r2.id());
  rdt::Ref r3 = std::move(r1);  // no new handle
  EXPECT_EQ(a.stats().refs, 2u);
  EXPECT_FALSE(r1);
  EXPECT_TRUE(r3);
  r2 = r3;  // copy-assign releases the old handle and clones
  EXPECT_EQ(a.stats().refs, 2u);
  const rdt::Ref &alias = r2;
  r2 = alias;  // self-assignment keeps it
  EXPECT_TRUE(r2);
  EXPECT_EQ(a.stats().refs, 2u);
  r2 = std::move(r3);  // move-assign releases r2's old handle
  EXPECT_EQ(a.stats().refs, 1u);
  swap(r1, r2);
  EXPECT_TRUE(r1);
  EXPECT_FALSE(r2);
  rdt::Ref empty_copy = r2;  // copying an empty Ref makes no call
  EXPECT_FALSE(empty_copy);
  r1.reset();
  EXPECT_EQ(a.stats().refs, 0u);
  EXPECT_EQ(status_of([&] { (void)r1.serialize(); }), RDT_ERR_INVALID_ARGUMENT);
  static_assert(std::is_nothrow_move_constructible_v<rdt::Ref> && std::is_nothrow_move_assignable_v<rdt::Ref>);
  static_assert(sizeof(rdt::Ref) == sizeof(rdt_ref *), "a Ref is just the handle");
}

// release() hands the handle to C, which must release it itself.
TEST(RefSemantics, ReleaseAndAdopt) {
  rdt::Runtime a(quiet("a"));
  std::vector<uint8_t> src(3);
  rdt::Ref r = a.put({rdt::tensor(src)});
  rdt_ref *raw = r.release();
  EXPECT_FALSE(r);
  EXPECT_EQ(a.stats().refs, 1u);
  {
    rdt::Ref adopted(raw);
    EXPECT_TRUE(adopted.is_owner());
  }
  EXPECT_EQ(a.stats().refs, 0u);
}

// reset(RDT_RELEASE_REVOKE_LEASES) in the owner frees the object at once,
// although serialized bytes were never deserialized (their lease is two
// minutes by default); a borrower cannot revoke, and keeps its reference.
TEST(RefSemantics, ResetRevokingLeases) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  std::vector<float> src(100, 2.5f), dst(100);
  std::atomic<int> freed{0};
  rdt::Ref ref = a.put({rdt::tensor(src)}, "", [&freed] { freed++; });
  std::vector<std::vector<uint8_t>> sent{ref.serialize(), ref.serialize(), ref.serialize()};
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  // Its borrow request is answered asynchronously: revoke once it is counted.
  for (int i = 0; i < 5000 && a.stats().borrows == 0; i++) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(a.stats().borrows, 1u);
  EXPECT_EQ(a.stats().refs_in_transit, 3u);

  EXPECT_EQ(status_of([&] { borrowed.reset(RDT_RELEASE_REVOKE_LEASES); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(borrowed) << "a refused reset keeps the reference";
  ref.reset(RDT_RELEASE_REVOKE_LEASES);
  EXPECT_FALSE(ref);
  rdt_stats s = a.stats();
  EXPECT_EQ(s.refs_in_transit, 0u);
  EXPECT_EQ(s.objects, 1u) << "the counted borrow keeps the object";
  b.get(borrowed, {rdt::tensor(dst)}, 10s);
  EXPECT_EQ(dst, src);
  borrowed.reset(0);
  EXPECT_TRUE(a.wait_tensor_freed(src.data(), 10s)) << "the bytes nobody deserialized no longer hold it";
  EXPECT_EQ(freed.load(), 1);
  EXPECT_EQ(a.stats().objects, 0u);
  for (auto &bytes : sent) {
    rdt::Ref late = b.deserialize(bytes);
    EXPECT_EQ(status_of([&] { b.get(late, {rdt::tensor(dst)}, 10s); }), RDT_ERR_NOT_FOUND);
  }
  ref.reset(RDT_RELEASE_REVOKE_LEASES);  // empty: nothing to do
}

TEST(RefSemantics, DescribesItsObject) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  std::vector<float> m(6);
  std::vector<int64_t> labels(5);
  rdt::Ref ref = a.put({rdt::tensor(m, {2, 3}), rdt::tensor(labels)});
  EXPECT_EQ(ref.id().size(), size_t(RDT_OBJECT_ID_LEN));
  EXPECT_EQ(ref.num_tensors(), 2u);
  EXPECT_EQ(ref.nbytes(), 6 * 4u + 5 * 8u);
  EXPECT_EQ(ref.transport(), "");
  EXPECT_TRUE(ref.is_owner());
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  EXPECT_FALSE(borrowed.is_owner());
  EXPECT_EQ(borrowed.id(), ref.id());
  auto ts = borrowed.tensors();
  ASSERT_EQ(ts.size(), 2u);
  EXPECT_EQ(ts[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ts[0].dtype.code, RDT_DTYPE_FLOAT);
  EXPECT_EQ(ts[0].dtype.bits, 32);
  EXPECT_EQ(ts[1].shape, (std::vector<int64_t>{5}));
  EXPECT_EQ(ts[1].dtype.code, RDT_DTYPE_INT);
  EXPECT_EQ(ts[1].nbytes(), 40u);
  EXPECT_EQ(ts[0].data, nullptr);
  EXPECT_EQ(borrowed.tensor_info(1).nbytes, 40u);
  // The descriptions make targets once pointed at buffers.
  std::vector<float> m2(6);
  std::vector<int64_t> l2(5);
  ts[0].data = m2.data();
  ts[1].data = l2.data();
  for (size_t i = 0; i < m.size(); i++) m[i] = float(i) / 2;
  for (size_t i = 0; i < labels.size(); i++) labels[i] = int64_t(i) - 2;
  b.get(borrowed, ts, 10s);
  EXPECT_EQ(m2, m);
  EXPECT_EQ(l2, labels);
}

// The owner's own serialized bytes give it a reference of its own.
TEST(RefSemantics, OwnerDeserializesItsOwnBytes) {
  rdt::Runtime a(quiet("a"));
  std::vector<uint16_t> src{1, 2, 3}, dst(3);
  rdt::Ref ref = a.put({rdt::tensor(src)});
  rdt::Ref again = a.deserialize(ref.serialize());
  EXPECT_TRUE(again.is_owner());
  EXPECT_EQ(again.id(), ref.id());
  a.get(again, {rdt::tensor(dst)}, 10s);
  EXPECT_EQ(dst, src);
}

// A fetch names its refs by a single Ref, a vector or a braced list.
TEST(FetchSemantics, SeveralRefsInOneFetch) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  auto p0 = pattern(1000, 1), p1 = pattern(10, 2), p2 = pattern(77, 3);
  rdt::Ref r0 = a.put({rdt::tensor(p0)});
  rdt::Ref r1 = a.put({rdt::tensor(p1), rdt::tensor(p2)});
  std::vector<rdt::Ref> borrowed{b.deserialize(r0.serialize()), b.deserialize(r1.serialize())};
  std::vector<uint32_t> d0(p0.size()), d1(p1.size()), d2(p2.size());
  b.get({borrowed[0], borrowed[1]}, {rdt::tensor(d0), rdt::tensor(d1), rdt::tensor(d2)}, 10s);
  EXPECT_EQ(d0, p0);
  EXPECT_EQ(d1, p1);
  EXPECT_EQ(d2, p2);
  std::fill(d0.begin(), d0.end(), 0);
  std::fill(d2.begin(), d2.end(), 0);
  rdt::Fetch f = b.get_start(borrowed, {rdt::tensor(d0), rdt::tensor(d1), rdt::tensor(d2)});
  EXPECT_TRUE(f.wait(10s));
  EXPECT_TRUE(f.ready());
  EXPECT_TRUE(f.wait());  // a final result stays
  EXPECT_EQ(d0, p0);
  EXPECT_EQ(d2, p2);
  EXPECT_EQ(b.stats().refs, 2u) << "the fetch borrowed the refs, it did not clone them";
}

TEST(FetchSemantics, WaitTimesOutThenCompletes) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  auto probe = mem_probe(a, b);
  probe->open = false;
  std::vector<uint32_t> src = pattern(100, 9), dst(100);
  rdt::Ref ref = a.put({rdt::tensor(src)}, "mem");
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  rdt::Fetch f = b.get_start(borrowed, {rdt::tensor(dst)});
  EXPECT_FALSE(f.wait(20ms));
  EXPECT_FALSE(f.ready());
  probe->set_open(true);
  EXPECT_TRUE(f.wait(10s));
  EXPECT_TRUE(f.ready());
  EXPECT_EQ(dst, src);
}

TEST(FetchSemantics, AbortThenWaitThrowsAborted) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  auto probe = mem_probe(a, b, {true, true, false});
  probe->open = false;
  std::vector<uint32_t> src(100), dst(100);
  rdt::Ref ref = a.put({rdt::tensor(src)}, "mem");
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  rdt::Fetch f = b.get_start(borrowed, {rdt::tensor(dst)});
  f.abort();
  EXPECT_EQ(status_of([&] { f.wait(10s); }), RDT_ERR_ABORTED);
  EXPECT_EQ(status_of([&] { f.wait(10s); }), RDT_ERR_ABORTED) << "a final result stays";
  EXPECT_EQ(probe->finished, 0);
}

TEST(FetchSemantics, MovesAndMoveAssignFreesThePrevious) {
  rdt::Runtime a(quiet("a"));
  std::vector<int8_t> src(8, 3), d1(8), d2(8);
  rdt::Ref ref = a.put({rdt::tensor(src)});
  rdt::Fetch f1 = a.get_start(ref, {rdt::tensor(d1)});
  rdt::Fetch f2 = std::move(f1);
  EXPECT_FALSE(f1);
  EXPECT_EQ(status_of([&] { f1.wait(); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(a.stats().fetches_active, 1u);
  f2 = a.get_start(ref, {rdt::tensor(d2)});
  EXPECT_EQ(a.stats().fetches_active, 1u);
  EXPECT_TRUE(f2.wait(10s));
  EXPECT_EQ(d2, src);
  rdt_pending *raw = f2.release();
  EXPECT_EQ(rdt_pending_free(raw), RDT_OK);
  EXPECT_EQ(a.stats().fetches_active, 0u);
  static_assert(!std::is_copy_constructible_v<rdt::Fetch> && !std::is_copy_assignable_v<rdt::Fetch>);
}

TEST(Views, DtypesShapesAndSizes) {
  static_assert(rdt::dtype_of<float>().code == RDT_DTYPE_FLOAT && rdt::dtype_of<float>().bits == 32);
  static_assert(rdt::dtype_of<double>().bits == 64);
  static_assert(rdt::dtype_of<int16_t>().code == RDT_DTYPE_INT && rdt::dtype_of<int16_t>().bits == 16);
  static_assert(rdt::dtype_of<uint64_t>().code == RDT_DTYPE_UINT && rdt::dtype_of<uint64_t>().bits == 64);
  static_assert(rdt::dtype_of<bool>().code == RDT_DTYPE_BOOL && rdt::dtype_of<bool>().bits == 8);
  static_assert(rdt::dtype_of<std::byte>().code == RDT_DTYPE_UINT);
  static_assert(rdt::dtype_of<std::complex<float>>().code == RDT_DTYPE_COMPLEX &&
                rdt::dtype_of<std::complex<float>>().bits == 64);
  static_assert(rdt::dtype_of<const int32_t>().code == RDT_DTYPE_INT);

  std::vector<float> v(12);
  rdt::Tensor t = rdt::tensor(v, {3, 4});
  EXPECT_EQ(t.numel(), 12u);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.device.device_type, RDT_DEVICE_CPU);
  rdt_tensor c = t.capi();
  EXPECT_EQ(c.ndim, 2);
  EXPECT_EQ(c.shape[1], 4);
  EXPECT_EQ(c.strides, nullptr);
  EXPECT_EQ(rdt::nbytes(c), 48u);
  EXPECT_EQ(status_of([&] { (void)rdt::tensor(v, {5, 5}); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { (void)rdt::tensor(v, {-1, -12}); }), RDT_ERR_INVALID_ARGUMENT);

  // A scalar and an empty tensor.
  double x = 3.25, y = 0;
  std::vector<float> none;
  rdt::Runtime a(quiet("a"));
  rdt::Ref ref = a.put({rdt::tensor(&x, {}), rdt::tensor(none)});
  EXPECT_EQ(ref.nbytes(), 8u);
  a.get(ref, {rdt::tensor(&y, {}), rdt::tensor(none)}, 10s);
  EXPECT_EQ(y, 3.25);

  // byte_offset is honoured when a C tensor becomes a view.
  c.byte_offset = 8;
  EXPECT_EQ(rdt::Tensor(c).data, static_cast<void *>(v.data() + 2));
  EXPECT_EQ(rdt::bytes_of(c), static_cast<void *>(v.data() + 2));
}

// Many threads share runtimes and refs.
TEST(Threads, ConcurrentGetsAndClones) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  auto src = pattern(10000, 4);
  rdt::Ref ref = a.put({rdt::tensor(src)});
  rdt::Ref borrowed = b.deserialize(ref.serialize());
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++)
    threads.emplace_back([&] {
      std::vector<uint32_t> dst(src.size());
      for (int i = 0; i < 25; i++) {
        rdt::Ref mine = borrowed;  // clones concurrently
        b.get(mine, {rdt::tensor(dst)}, 10s);
        if (dst != src) bad++;
      }
    });
  for (auto &t : threads) t.join();
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(b.stats().refs, 1u);
}
