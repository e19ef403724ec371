package engine

import (
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// Fetch latency histograms, kept per transport and per object size class
// (rdt.h: RDT_FETCH_SIZE_CLASSES, RDT_FETCH_LATENCY_BUCKETS; the C side
// checks that both agree with these).
const (
	// FetchSizeClasses is how many size classes there are: class c < 5
	// holds objects of at most 4 KiB * 16^c bytes (4 KiB, 64 KiB, 1 MiB,
	// 16 MiB, 256 MiB), the last class every larger one.
	FetchSizeClasses = 6
	// FetchLatencyBuckets is how many latency buckets a histogram has:
	// bucket b < 24 counts fetches that took at most 2^b microseconds (and
	// more than the bound of bucket b-1), the last bucket the slower ones.
	FetchLatencyBuckets = 25
)

// FetchSizeClassMaxBytes is the largest object size class c holds (c <
// FetchSizeClasses-1; the last class has no bound).
func FetchSizeClassMaxBytes(c int) uint64 { return 1 << (12 + 4*c) }

// FetchLatencyBucketMax is the upper bound of bucket b (b <
// FetchLatencyBuckets-1; the last bucket has none).
func FetchLatencyBucketMax(b int) time.Duration { return time.Duration(1<<b) * time.Microsecond }

// fetchSizeClass is the size class of an object of n bytes (n > 0).
func fetchSizeClass(n uint64) int {
	if n <= 4<<10 {
		return 0
	}
	// The smallest c with n <= 2^(12+4c).
	return min((bits.Len64(n-1)-12+3)/4, FetchSizeClasses-1)
}

// fetchLatencyBucket is the bucket of a fetch that took d.
func fetchLatencyBucket(d time.Duration) int {
	if d <= time.Microsecond {
		return 0
	}
	// The smallest b with d <= 2^b µs, i.e. ceil(d in µs) <= 2^b.
	us := (uint64(d) + uint64(time.Microsecond) - 1) / uint64(time.Microsecond)
	return min(bits.Len64(us-1), FetchLatencyBuckets-1)
}

// fetchHistogram is one transport's record of one size class: counters
// only, so recording is a few atomic adds, without locks or allocation.
type fetchHistogram struct {
	buckets  [FetchLatencyBuckets]atomic.Uint64
	sumNanos atomic.Uint64
	bytes    atomic.Uint64
	failures atomic.Uint64
}

// fetchHistograms is a transport's record, by size class.
type fetchHistograms [FetchSizeClasses]fetchHistogram

// recordFetch counts a completed fetch of an object of nbytes that took d.
func (h *fetchHistograms) recordFetch(nbytes uint64, d time.Duration) {
	c := &h[fetchSizeClass(nbytes)]
	c.buckets[fetchLatencyBucket(d)].Add(1)
	c.sumNanos.Add(uint64(max(d, 0)))
	c.bytes.Add(nbytes)
}

// recordFailure counts a failed fetch of an object of nbytes.
func (h *fetchHistograms) recordFailure(nbytes uint64) {
	h[fetchSizeClass(nbytes)].failures.Add(1)
}

// FetchHistogram is a snapshot of one transport's fetches of one size
// class. Buckets are per bucket, not cumulative; Count is their sum. Each
// counter is read atomically but not all at one instant, so a snapshot
// taken during fetches may hold a fetch in Buckets but not yet in SumNanos.
type FetchHistogram struct {
	Transport string
	Direction transport.Direction
	SizeClass int
	Buckets   [FetchLatencyBuckets]uint64
	Count     uint64 // completed fetches: the sum of Buckets
	SumNanos  uint64 // their latencies added up
	Bytes     uint64 // their bytes added up
	Failures  uint64 // failed fetches (in no bucket)
}

// FetchHistograms snapshots the histograms of every registered transport,
// reads and writes alike, in name, direction and size class order, leaving
// out those with neither a transfer nor a failure.
func (r *Registry) FetchHistograms() []FetchHistogram {
	var out []FetchHistogram
	for _, e := range r.all() {
		for dir := range e.hist {
			out = e.hist[dir].snapshot(out, e.desc.Name, transport.Direction(dir))
		}
	}
	return out
}

// snapshot appends the size classes with a transfer or a failure.
func (h *fetchHistograms) snapshot(out []FetchHistogram, name string, dir transport.Direction) []FetchHistogram {
	for c := range h {
		hc := &h[c]
		s := FetchHistogram{Transport: name, Direction: dir, SizeClass: c}
		for b := range hc.buckets {
			s.Buckets[b] = hc.buckets[b].Load()
			s.Count += s.Buckets[b]
		}
		s.SumNanos, s.Bytes, s.Failures = hc.sumNanos.Load(), hc.bytes.Load(), hc.failures.Load()
		if s.Count != 0 || s.Failures != 0 {
			out = append(out, s)
		}
	}
	return out
}
