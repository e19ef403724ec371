package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

func TestFetchSizeClassBounds(t *testing.T) {
	for _, c := range []struct {
		n    uint64
		want int
	}{
		{1, 0}, {4 << 10, 0}, {4<<10 + 1, 1}, {64 << 10, 1}, {64<<10 + 1, 2}, {100 << 10, 2},
		{1 << 20, 2}, {1<<20 + 1, 3}, {16 << 20, 3}, {256 << 20, 4}, {256<<20 + 1, 5}, {1 << 40, 5},
	} {
		assert.Equal(t, c.want, fetchSizeClass(c.n), "%d bytes", c.n)
	}
	for c := 0; c < FetchSizeClasses-1; c++ {
		assert.Equal(t, c, fetchSizeClass(FetchSizeClassMaxBytes(c)), "the bound belongs to its class")
		assert.Equal(t, c+1, fetchSizeClass(FetchSizeClassMaxBytes(c)+1))
	}
}

func TestFetchLatencyBucketBounds(t *testing.T) {
	assert.Equal(t, 0, fetchLatencyBucket(0))
	assert.Equal(t, 0, fetchLatencyBucket(time.Microsecond))
	assert.Equal(t, 1, fetchLatencyBucket(time.Microsecond+1))
	assert.Equal(t, 10, fetchLatencyBucket(1000*time.Microsecond))
	for b := 0; b < FetchLatencyBuckets-1; b++ {
		assert.Equal(t, b, fetchLatencyBucket(FetchLatencyBucketMax(b)), "the bound belongs to its bucket")
		assert.Equal(t, b+1, fetchLatencyBucket(FetchLatencyBucketMax(b)+1))
	}
	assert.Equal(t, FetchLatencyBuckets-1, fetchLatencyBucket(time.Hour), "slower than every bound: the last bucket")
}

// histogramsByClass indexes a runtime's histograms of one transport.
func histogramsByClass(rt *Runtime, name string) map[int]FetchHistogram {
	out := map[int]FetchHistogram{}
	for _, h := range rt.Registry().FetchHistograms() {
		if h.Transport == name {
			out[h.SizeClass] = h
		}
	}
	return out
}

func TestFetchHistogramsCountBySizeClass(t *testing.T) {
	p := newPair(t, nil)
	small, smallSrc := p.share(t, 3, 1<<10, "mem")
	large, largeSrc := p.share(t, 2, 100<<10, "mem")
	for i := range small {
		targets, _ := targetsFor(t, smallSrc[i:i+1])
		require.NoError(t, p.borrower.Get(small[i:i+1], targets, FetchOptions{}, 5*time.Second))
	}
	targets, _ := targetsFor(t, largeSrc)
	require.NoError(t, p.borrower.Get(large, targets, FetchOptions{}, 5*time.Second))

	hs := p.borrower.Registry().FetchHistograms()
	require.Len(t, hs, 2, "one entry per size class fetched: %+v", hs)
	byClass := histogramsByClass(p.borrower, "mem")
	assert.Equal(t, uint64(3), byClass[0].Count)
	assert.Equal(t, uint64(3<<10), byClass[0].Bytes)
	assert.Equal(t, uint64(2), byClass[2].Count)
	assert.Equal(t, uint64(200<<10), byClass[2].Bytes)
	for _, h := range hs {
		var sum uint64
		for _, n := range h.Buckets {
			sum += n
		}
		assert.Equal(t, h.Count, sum, "count is the sum of the buckets")
		assert.NotZero(t, h.SumNanos)
		assert.Zero(t, h.Failures)
	}
	assert.Empty(t, p.owner.Registry().FetchHistograms(), "the source's histograms count nothing it served")
}

func TestFetchHistogramBucketHoldsTheLatency(t *testing.T) {
	const delay = 20 * time.Millisecond
	p := newPair(t, nil)
	p.dst.waitErr = func(*transport.Transfer) error { time.Sleep(delay); return nil }
	refs, src := p.share(t, 1, 4096, "mem")
	targets, _ := targetsFor(t, src)
	began := time.Now()
	require.NoError(t, p.borrower.Get(refs, targets, FetchOptions{}, 5*time.Second))
	elapsed := time.Since(began)

	h := histogramsByClass(p.borrower, "mem")[0]
	require.Equal(t, uint64(1), h.Count)
	latency := time.Duration(h.SumNanos)
	assert.GreaterOrEqual(t, latency, delay, "from the fetch's start to the transfer's end")
	assert.LessOrEqual(t, latency, elapsed)
	b := fetchLatencyBucket(latency)
	assert.Equal(t, uint64(1), h.Buckets[b], "the one fetch is in the bucket of its latency: %v", h.Buckets)
	assert.Greater(t, FetchLatencyBucketMax(b), delay)
}

func TestFetchHistogramsCountFailuresApart(t *testing.T) {
	p := newPair(t, nil)
	p.dst.waitErr = func(*transport.Transfer) error { return transport.Errorf(transport.ErrTransport, "link down") }
	refs, src := p.share(t, 2, 2<<20, "mem")
	for i := range refs {
		targets, _ := targetsFor(t, src[i:i+1])
		err := p.borrower.Get(refs[i:i+1], targets, FetchOptions{}, 5*time.Second)
		require.Equal(t, transport.ErrTransport, transport.StatusOf(err))
	}
	hs := p.borrower.Registry().FetchHistograms()
	require.Len(t, hs, 1)
	assert.Equal(t, "mem", hs[0].Transport)
	assert.Equal(t, 3, hs[0].SizeClass)
	assert.Equal(t, uint64(2), hs[0].Failures)
	assert.Zero(t, hs[0].Count, "a failure is in no bucket")
	assert.Zero(t, hs[0].Bytes)
	assert.Equal(t, [FetchLatencyBuckets]uint64{}, hs[0].Buckets)
}

func TestFetchHistogramsLeaveOutLocalCopies(t *testing.T) {
	rt := newRuntime(t, "a")
	require.NoError(t, rt.RegisterTransport(newMemTransport("mem")))
	buf := newHostBuf(t, 4096)
	ref, err := rt.Put([]transport.Tensor{tensorOf(t, buf)}, "mem", nil)
	require.NoError(t, err)
	defer ref.Release()
	out := newHostBuf(t, 4096)
	require.NoError(t, rt.Get([]*Ref{ref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{}, time.Second))
	assert.Equal(t, uint64(1), rt.Stats().LocalCopies)
	assert.Empty(t, rt.Registry().FetchHistograms())
}
