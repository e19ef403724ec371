package cma

import (
	"os"
	"testing"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Small tensors are read many to a call: at most maxIovecs spans and
// chunkSize bytes a batch, every byte once, in order.
func TestBatchesBoundCallsByIovecsAndBytes(t *testing.T) {
	var spans []span
	for i := 0; i < 2*maxIovecs+5; i++ {
		spans = append(spans, span{remote: uintptr(i) << 20, local: uintptr(i) << 20, n: 4096})
	}
	spans = append(spans, span{remote: 1 << 40, local: 1 << 40, n: 2*chunkSize + 7})
	batches := batch(spans)
	var total, want uint64
	for _, s := range spans {
		want += s.n
	}
	var flat []span
	for _, b := range batches {
		require.LessOrEqual(t, len(b), maxIovecs)
		var n uint64
		for _, s := range b {
			n += s.n
		}
		require.LessOrEqual(t, n, uint64(chunkSize))
		total += n
		flat = append(flat, b...)
	}
	assert.Equal(t, want, total)
	assert.Len(t, batches[0], maxIovecs, "small tensors fill a call")
	// The pieces of the large span follow each other.
	last := flat[len(flat)-1]
	assert.Equal(t, uintptr(1<<40)+uintptr(2*chunkSize+7), last.remote+uintptr(last.n))
	assert.Equal(t, last.remote-uintptr(last.local), uintptr(0))
}

// 1,500 small tensors from another process arrive whole through vectored
// reads (more than one call's worth of iovecs).
func TestManySmallTensorsFromAnotherProcess(t *testing.T) {
	sizes := make([]int, 1500)
	for i := range sizes {
		sizes[i] = 4096 + i%3*1000 // uneven sizes, no alignment to lean on
	}
	src := transporttest.StartSource(t, sizes...)
	tr := newTransport(t)
	var targets []transport.Tensor
	var got [][]byte
	for _, n := range sizes {
		b, x := buffer(t, n)
		targets, got = append(targets, x), append(got, b)
	}
	require.NoError(t, fetchFrom(t, tr, from(childObject, src.Cmd.Process.Pid), src.Meta, targets))
	for i := range sizes {
		require.Equal(t, src.Want[i], got[i], "tensor %d", i)
	}
	// The source is killed: the next fetch of the same object fails clearly.
	src.Kill()
	err := fetchFrom(t, tr, from(childObject, src.Cmd.Process.Pid), src.Meta, targets)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
}

// A tensor in the middle of a vectored read that can no longer be read
// stops the call short; the read is not taken as whole, and the error
// says the memory is gone.
func TestUnreadableTensorInABatchIsAClearError(t *testing.T) {
	tr := newTransport(t)
	var srcs, dsts []transport.Tensor
	var bad []byte
	for i := 0; i < 64; i++ {
		b, s := buffer(t, 4096)
		_, d := buffer(t, 4096)
		if i == 40 {
			bad = b
		}
		srcs, dsts = append(srcs, s), append(dsts, d)
	}
	obj := transport.ObjectID{12}
	meta, err := tr.ExtractMetadata(obj, srcs)
	require.NoError(t, err)
	require.NoError(t, unix.Mprotect(bad[:cap(bad)], unix.PROT_NONE))
	t.Cleanup(func() { _ = unix.Mprotect(bad[:cap(bad)], unix.PROT_READ|unix.PROT_WRITE) })
	err = fetch(t, tr, obj, meta, dsts)
	assert.Equal(t, transport.ErrInternal, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "no longer mapped")
}

// An object of many tensors that its owner freed is refused, not read.
func TestFreedObjectOfManyTensors(t *testing.T) {
	tr := newTransport(t)
	var srcs, dsts []transport.Tensor
	for i := 0; i < 2000; i++ {
		_, s := buffer(t, 512)
		_, d := buffer(t, 512)
		srcs, dsts = append(srcs, s), append(dsts, d)
	}
	obj := transport.ObjectID{13}
	meta, err := tr.ExtractMetadata(obj, srcs)
	require.NoError(t, err)
	require.NoError(t, fetch(t, tr, obj, meta, dsts))
	tr.GarbageCollect(obj, srcs, meta)
	err = fetch(t, tr, obj, meta, dsts)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "freed")
}

// An abort before the first batch stops a many-tensor read: no call is
// made and Wait says aborted.
func TestAbortStopsAManyTensorRead(t *testing.T) {
	tr := newTransport(t)
	var regions []region
	var dsts []transport.Tensor
	for i := 0; i < 3000; i++ {
		_, s := buffer(t, 4096)
		_, d := buffer(t, 4096)
		regions = append(regions, region{Addr: uint64(s.Data), Size: 4096})
		dsts = append(dsts, d)
	}
	src, err := tr.source(os.Getpid(), tr.startTime)
	require.NoError(t, err)
	req := &request{Completion: transport.NewCompletion(), t: tr, pid: os.Getpid(), startTime: tr.startTime, src: src}
	defer req.Release()
	req.aborted.Store(true)
	err = req.copyAll(&transport.Transfer{}, regions, dsts, 2)
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(err))
}

// A 1 MiB object is read inside Fetch, on the caller's thread: the
// request is complete when Fetch returns, with no goroutine to wait for.
func TestMidSizeFetchCompletesInsideFetch(t *testing.T) {
	tr := newTransport(t)
	sb, src := buffer(t, 1<<20)
	fill(sb, 9)
	got, dst := buffer(t, 1<<20)
	obj := transport.ObjectID{14}
	meta, err := tr.ExtractMetadata(obj, []transport.Tensor{src})
	require.NoError(t, err)
	req, err := tr.Fetch(from(obj, os.Getpid()), []transport.Tensor{dst}, meta, nil)
	require.NoError(t, err)
	defer req.Release()
	assert.True(t, req.(transport.CompletedRequest).Completed(), "complete when Fetch returns")
	require.NoError(t, req.Wait())
	assert.Equal(t, sb, got)
}

// Spans that follow each other in memory become one iovec on that side,
// each side on its own: the bytes still land in order.
func TestAdjacentSpansShareAnIovec(t *testing.T) {
	var v vectors
	v.fill([]span{
		{remote: 0x1000, local: 0x9000, n: 0x100},
		{remote: 0x1100, local: 0xa000, n: 0x100}, // remote follows, local does not
		{remote: 0x3000, local: 0xa100, n: 0x200}, // local follows, remote does not
		{remote: 0x3200, local: 0xa300, n: 0x10},  // both follow
	})
	require.Len(t, v.remote, 2)
	assert.Equal(t, unix.RemoteIovec{Base: 0x1000, Len: 0x200}, v.remote[0])
	assert.Equal(t, unix.RemoteIovec{Base: 0x3000, Len: 0x210}, v.remote[1])
	require.Len(t, v.local, 2)
	assert.Equal(t, uint64(0x100), uint64(v.local[0].Len))
	assert.Equal(t, uint64(0x310), uint64(v.local[1].Len))
}

// Tensors that are views of one buffer on one side and scattered on the
// other arrive whole, in both directions.
func TestViewsOfOneBufferRoundTrip(t *testing.T) {
	const count, n = 300, 1000
	tr := newTransport(t)
	whole, _ := buffer(t, count*n)
	fill(whole, 5)
	var views, scattered []transport.Tensor
	var scatteredBytes [][]byte
	for i := 0; i < count; i++ {
		_, x := buffer(t, n)
		view := x
		view.Data = uintptr(unsafePointer(whole[i*n:]))
		view.Orig = view.Data
		b, s := buffer(t, n)
		views, scattered, scatteredBytes = append(views, view), append(scattered, s), append(scatteredBytes, b)
	}
	meta, err := tr.ExtractMetadata(transport.ObjectID{15}, views)
	require.NoError(t, err)
	require.NoError(t, fetch(t, tr, transport.ObjectID{15}, meta, scattered))
	for i := range scatteredBytes {
		require.Equal(t, whole[i*n:(i+1)*n], scatteredBytes[i], "tensor %d", i)
	}
	// Back again: scattered sources into views of one buffer.
	back, _ := buffer(t, count*n)
	for i := range views {
		views[i].Data = uintptr(unsafePointer(back[i*n:]))
		views[i].Orig = views[i].Data
	}
	meta, err = tr.ExtractMetadata(transport.ObjectID{16}, scattered)
	require.NoError(t, err)
	require.NoError(t, fetch(t, tr, transport.ObjectID{16}, meta, views))
	assert.Equal(t, whole, back)
}
