package shm

import (
	"bytes"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// memfdWith is a memfd holding b.
func memfdWith(t *testing.T, b []byte) int {
	fd, err := unix.MemfdCreate("rdt-test", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	_, err = unix.Pwrite(fd, b, 0)
	require.NoError(t, err)
	return fd
}

// An object of many tensors is read with one call per run of up to chunk
// bytes and maxIovecs tensors, not one per tensor.
func TestManyTensorsAreReadInFewCalls(t *testing.T) {
	sizes := make([]int, 1024)
	for i := range sizes {
		sizes[i] = 4096
	}
	var tensors []transport.Tensor
	for range sizes {
		_, x := transporttest.Buffer(t, 4096)
		tensors = append(tensors, x)
	}
	regions, size := layout(tensors)
	runs := planRuns(regions, tensors, make([]byte, maxGap))
	assert.Len(t, runs, 2, "4 MiB of 4 KiB tensors: two runs (one chunk, and the iovec limit)")
	var total uint64
	for _, r := range runs {
		total += r.bytes
		assert.LessOrEqual(t, len(r.iovs), maxIovecs)
		assert.LessOrEqual(t, r.bytes, uint64(chunk))
	}
	assert.Equal(t, size, total)

	// Odd sizes leave alignment padding between tensors: still one run.
	tensors = tensors[:0]
	for _, n := range []int{1, 63, 65, 100, 0, 7} {
		_, x := transporttest.Buffer(t, n)
		tensors = append(tensors, x)
	}
	regions, _ = layout(tensors)
	assert.Len(t, planRuns(regions, tensors, make([]byte, maxGap)), 1)
}

// Targets that are views of one buffer, read from regions that follow
// each other in the segment, become one iovec per run: the kernel's cost
// is per iovec. The bytes still land in every view.
func TestTouchingTargetsCollapseIntoOneIovec(t *testing.T) {
	const n, size = 4096, 256 // 1 MiB of 256-byte views
	mem, whole := transporttest.Buffer(t, n*size)
	var views []transport.Tensor
	for i := 0; i < n; i++ {
		x := whole
		x.Data += uintptr(i * size)
		x.Orig = x.Data
		x.Nbytes, x.Shape = size, []int64{size}
		views = append(views, x)
	}
	regions, total := layout(views)
	require.Equal(t, uint64(n*size), total, "views of 256 bytes need no padding between them")
	runs := planRuns(regions, views, make([]byte, maxGap))
	require.Len(t, runs, 1)
	assert.Len(t, runs[0].iovs, 1, "4,096 touching targets, one iovec")
	assert.Equal(t, uint64(n*size), runs[0].bytes)

	src := make([]byte, n*size)
	transporttest.Fill(src, 9)
	fd := memfdWith(t, src)
	var aborted atomic.Bool
	require.NoError(t, readRegions(fd, regions, views, &aborted))
	assert.True(t, bytes.Equal(src, mem))

	// A gap in the targets keeps their iovecs apart.
	views[7].Data += 1
	assert.Len(t, planRuns(regions, views, make([]byte, maxGap))[0].iovs, 3)
}

// Regions in any order, far apart, overlapping or larger than a chunk
// all arrive intact, from one worker or two.
func TestRegionsInAnyOrderArriveIntact(t *testing.T) {
	seg := make([]byte, 3*chunk+parallelMin)
	transporttest.Fill(seg, 3)
	fd := memfdWith(t, seg)
	regions := []region{
		{Offset: 10 * maxGap, Size: 100},            // far from the next
		{Offset: 0, Size: 5},                        // before the previous
		{Offset: 2, Size: 10},                       // overlapping it
		{Offset: 20, Size: 0},                       // empty
		{Offset: 4096, Size: 2*chunk + 17},          // more than a chunk
		{Offset: 2*chunk + 4200, Size: parallelMin}, // enough for two workers
	}
	for _, regs := range [][]region{regions[:5], regions} {
		var targets []transport.Tensor
		var got [][]byte
		for _, r := range regs {
			b, x := transporttest.Buffer(t, int(r.Size))
			targets = append(targets, x)
			got = append(got, b)
		}
		var abort atomic.Bool
		require.NoError(t, readRegions(fd, regs, targets, &abort))
		for i, r := range regs {
			assert.True(t, bytes.Equal(seg[r.Offset:r.Offset+r.Size], got[i]), "region %d", i)
		}
	}
}

// A segment shorter than its regions say is an error, never a hang or a
// short copy reported as done; an abort stops the read.
func TestShortSegmentAndAbort(t *testing.T) {
	fd := memfdWith(t, make([]byte, 1000))
	_, x := transporttest.Buffer(t, 2000)
	var abort atomic.Bool
	err := readRegions(fd, []region{{0, 2000}}, []transport.Tensor{x}, &abort)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
	abort.Store(true)
	err = readRegions(fd, []region{{0, 1000}}, []transport.Tensor{x}, &abort)
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "%v", err)
}

// Targets at another address modulo align than their bytes in the segment
// (numpy's 16-byte-aligned arrays) are copied from a mapping; the bytes
// arrive the same, gaps, page-unaligned offsets and two workers included,
// and an abort still stops the read.
func TestMisalignedTargetsAreCopiedFromAMapping(t *testing.T) {
	seg := make([]byte, parallelMin+3*chunk)
	transporttest.Fill(seg, 9)
	fd := memfdWith(t, seg)
	regions := []region{
		{Offset: 64, Size: mappedCopyMin + 100},          // page-unaligned start
		{Offset: mappedCopyMin + 192, Size: 2*chunk + 1}, // after a gap, over a chunk
		{Offset: 3 * chunk, Size: parallelMin - 5},       // enough for two workers
	}
	var targets []transport.Tensor
	var got [][]byte
	for _, r := range regions {
		b, x := transporttest.Buffer(t, int(r.Size)+16)
		x.Data += 16 // 16 bytes off the segment's 64-byte alignment
		x.Orig = x.Data
		targets = append(targets, x)
		got = append(got, b[16:])
	}
	runs := planRuns(regions, targets, make([]byte, maxGap))
	for _, r := range runs {
		assert.True(t, r.misaligned(), "run at %d", r.off)
	}
	var abort atomic.Bool
	require.NoError(t, readRegions(fd, regions, targets, &abort))
	for i, r := range regions {
		assert.True(t, bytes.Equal(seg[r.Offset:r.Offset+r.Size], got[i]), "region %d", i)
	}

	// Aligned targets keep the kernel's copy.
	_, x := transporttest.Buffer(t, int(regions[0].Size))
	for _, r := range planRuns(regions[:1], []transport.Tensor{x}, make([]byte, maxGap)) {
		assert.False(t, r.misaligned())
	}

	abort.Store(true)
	err := readRegions(fd, regions, targets, &abort)
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "%v", err)
}
