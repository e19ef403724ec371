// Partial fetches through the wrapper: rdt::Range and rdt::rows with
// get() and fetch(), from another process over every built-in transport
// that serves ranges, between runtimes of this process, from an object the
// runtime owns, and over C++ transports that serve ranges or do not.
#include "test_util.hpp"

using namespace rdt_test;

namespace {

std::vector<uint32_t> part(const std::vector<uint32_t> &v, size_t begin, size_t end) {
  return std::vector<uint32_t>(v.begin() + long(begin), v.begin() + long(end));
}

}  // namespace

// Ranges of two objects of a source process, in another order than put,
// into targets of their own shapes; only those bytes move.
TEST(PartialFetch, RangesFromAnotherProcessOverEachTransport) {
  const size_t n = 50000;
  Child child({"source", "auto", std::to_string(n), "2"});
  std::string hex0 = child.read_line(), hex1 = child.read_line();
  ASSERT_FALSE(hex1.empty()) << "the source process said nothing";
  rdt::Runtime rt(quiet("cpp-partial"));
  rdt::Ref r0 = rt.deserialize(from_hex(hex0)), r1 = rt.deserialize(from_hex(hex1));
  std::vector<std::string> names = builtin_host_transports(rt, RDT_TRANSPORT_RANGES);
  ASSERT_FALSE(names.empty()) << "no built-in transport serves ranges";
  const auto p0 = pattern(n, 0), p1 = pattern(n, 1);
  for (const std::string &name : names) {
    SCOPED_TRACE(name);
    std::vector<uint32_t> tail(5), mid(1000, 0), one(1, 0);
    uint64_t before = rt.stats().bytes_received;
    rt.get({r0, r1}, {rdt::tensor(mid, {10, 100}), rdt::tensor(tail), rdt::tensor(one)},
           {rdt::rows(1, r1, 0, 20000, 21000), rdt::rows(0, r0, 0, n - 5, n), rdt::Range{0, 0, 4 * 7, 4}}, 30s,
           name);
    EXPECT_EQ(mid, part(p1, 20000, 21000));
    EXPECT_EQ(tail, part(p0, n - 5, n));
    EXPECT_EQ(one[0], p0[7]);
    EXPECT_EQ(rt.stats().bytes_received - before, (1000 + 5 + 1) * 4u);

    // fetch(): one ref named, the other left out (not fetched).
    std::vector<uint32_t> head(3);
    uint64_t transfers = rt.stats().transfers_completed;
    rdt::Fetch f = rt.get_start({r0, r1}, {rdt::tensor(head)}, {rdt::rows(1, r1, 0, 0, 3)}, name);
    EXPECT_TRUE(f.wait(30s));
    EXPECT_EQ(head, part(p1, 0, 3));
    EXPECT_EQ(rt.stats().transfers_completed - transfers, 1u);
  }
}

// Rows of a matrix between two runtimes of this process; every refusal is
// RDT_ERR_INVALID_ARGUMENT and leaves the target as it was.
TEST(PartialFetch, RowsOfAMatrixAndRefusals) {
  rdt::Runtime a(quiet("a")), b(quiet("b"));
  std::vector<float> m(8 * 5), scalar{2.5f};
  for (size_t i = 0; i < m.size(); i++) m[i] = float(i);
  rdt::Ref owned = a.put({rdt::tensor(m, {8, 5}), rdt::tensor(scalar.data(), {})});
  rdt::Ref ref = b.deserialize(owned.serialize());

  std::vector<float> rows(3 * 5, -1);
  b.get(ref, {rdt::tensor(rows, {3, 5})}, {rdt::rows(0, ref, 0, 2, 5)}, 10s);
  EXPECT_EQ(rows, std::vector<float>(m.begin() + 10, m.begin() + 25));
  std::vector<float> whole(1);
  b.get(ref, {rdt::tensor(whole)}, {rdt::Range{0, 1}}, 10s);  // a whole tensor: length RDT_REST_OF_TENSOR
  EXPECT_EQ(whole[0], 2.5f);

  std::vector<float> keep(3 * 5, -7), target = keep;
  std::vector<double> wrong(15, -7);
  EXPECT_EQ(status_of([&] { b.get(ref, {rdt::tensor(target)}, {rdt::rows(0, ref, 0, 6, 9)}, 10s); }),
            RDT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(message_of([&] { b.get(ref, {rdt::tensor(target)}, {rdt::rows(0, ref, 0, 6, 9)}, 10s); })
                .find("outside the tensor's 160 bytes"),
            std::string::npos);
  EXPECT_EQ(status_of([&] { b.get(ref, {rdt::tensor(wrong)}, {rdt::rows(0, ref, 0, 0, 3)}, 10s); }),
            RDT_ERR_INVALID_ARGUMENT);  // dtype
  EXPECT_EQ(status_of([&] { b.get(ref, {rdt::tensor(target)}, {rdt::rows(0, ref, 0, 0, 2)}, 10s); }),
            RDT_ERR_INVALID_ARGUMENT);  // 10 elements' range, 15 elements' target
  EXPECT_EQ(status_of([&] {
              b.get(ref, {rdt::tensor(target.data(), {10}), rdt::tensor(target.data() + 5, {10})},
                    {rdt::rows(0, ref, 0, 0, 2), rdt::rows(0, ref, 0, 2, 4)}, 10s);
            }),
            RDT_ERR_INVALID_ARGUMENT);  // overlapping targets
  EXPECT_EQ(status_of([&] { b.get(ref, {rdt::tensor(target)}, {rdt::Range{1, 0, 0, 60}}, 10s); }),
            RDT_ERR_INVALID_ARGUMENT);  // refs[1] of a fetch of one ref
  EXPECT_EQ(target, keep);
  EXPECT_EQ(status_of([&] { (void)rdt::rows(0, ref, 1, 0, 1); }), RDT_ERR_INVALID_ARGUMENT);  // 0-d
  EXPECT_EQ(status_of([&] { (void)rdt::rows(0, ref, 0, 3, 2); }), RDT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([&] { (void)rdt::rows(0, ref, 2, 0, 1); }), RDT_ERR_INVALID_ARGUMENT);  // no tensor 2

  // The owner's own object: copied locally.
  std::vector<float> last(5);
  uint64_t copies = a.stats().local_copies;
  a.get(owned, {rdt::tensor(last)}, {rdt::rows(0, owned, 0, 7, 8)}, 10s);
  EXPECT_EQ(last, std::vector<float>(m.end() - 5, m.end()));
  EXPECT_EQ(a.stats().local_copies - copies, 1u);
}

// A C++ transport that says serves_ranges() gets Transfer::ranges() and
// moves only them, one-sided and two-sided; one that does not is refused.
TEST(PartialFetch, CppTransportsServeRangesOrAreRefused) {
  for (bool one_sided : {true, false}) {
    SCOPED_TRACE(one_sided ? "one-sided" : "two-sided");
    rdt::Runtime a(quiet("a")), b(quiet("b"));
    auto probe = std::make_shared<Probe>(), plain = std::make_shared<Probe>();
    MemTransport::Config c;
    c.one_sided = one_sided;
    c.ranges = true;
    register_mem({&a, &b}, "memranges", probe, c);
    c.ranges = false;
    register_mem({&a, &b}, "memplain", plain, c);
    for (auto &t : b.transports()) {
      if (t.flags & RDT_TRANSPORT_BUILTIN) continue;
      EXPECT_EQ(t.flags & RDT_TRANSPORT_RANGES, std::string(t.name) == "memranges" ? RDT_TRANSPORT_RANGES : 0u)
          << t.name;
    }

    auto p0 = pattern(1000, 3), p1 = pattern(64, 4);
    rdt::Ref ref = a.put({rdt::tensor(p0), rdt::tensor(p1, {16, 4})}, "memranges");
    rdt::Ref borrowed = b.deserialize(ref.serialize());
    std::vector<uint32_t> x(8), y(100);
    b.get(borrowed, {rdt::tensor(x), rdt::tensor(y)}, {rdt::rows(0, borrowed, 1, 14, 16), rdt::rows(0, borrowed, 0, 900, 1000)},
          10s);
    EXPECT_EQ(x, part(p1, 56, 64));
    EXPECT_EQ(y, part(p0, 900, 1000));
    EXPECT_EQ(probe->ranged, 1);
    EXPECT_EQ(probe->sends, one_sided ? 0 : 1);

    EXPECT_EQ(status_of([&] { b.get(borrowed, {rdt::tensor(x)}, {rdt::rows(0, borrowed, 1, 0, 2)}, 10s, "memplain"); }),
              RDT_ERR_UNSUPPORTED);
    EXPECT_EQ(plain->recvs, 0);
  }
}
