package engine

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

// getWhole fetches ref whole into a new buffer of n bytes, within five
// seconds.
func getWhole(t *testing.T, rt *Runtime, ref *Ref, n int) (*hostBuf, error) {
	t.Helper()
	out := newHostBuf(t, n)
	err := rt.Get([]*Ref{ref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{}, 5*time.Second)
	return out, err
}

// requireGets fetches ref whole in rt and requires that it brings src's
// bytes; it returns the target, for fetching into again.
func requireGets(t *testing.T, rt *Runtime, ref *Ref, src *hostBuf) *hostBuf {
	t.Helper()
	out, err := getWhole(t, rt, ref, len(src.b))
	require.NoError(t, err)
	assert.Equal(t, src.b, out.b)
	return out
}

// assertLanded asserts that every target buffer holds its source's bytes.
func assertLanded(t *testing.T, src, dst []*hostBuf) {
	t.Helper()
	for i := range src {
		assert.True(t, bytes.Equal(src[i].b, dst[i].b), "tensor %d", i)
	}
}

func TestFetchMovesBytesOneSided(t *testing.T) {
	p := newPair(t, nil)
	refs, targets, src, dst := p.shareToFetch(t, 3, 1<<16)
	require.NoError(t, p.borrower.Get(refs, targets, FetchOptions{}, 5*time.Second))
	assertLanded(t, src, dst)
	s := p.borrower.Stats()
	assert.Equal(t, uint64(3), s.TransfersCompleted)
	assert.Equal(t, uint64(3<<16), s.BytesReceived)
	assert.Equal(t, int64(3), p.dst.released.Load(), "every request released")
	assert.Equal(t, uint64(0), s.FetchesActive)
}

func TestFetchStartsAllBeforeWaitingAny(t *testing.T) {
	p := newPair(t, nil)
	refs, targets, _, _ := p.shareToFetch(t, 4, 4096)
	require.NoError(t, p.borrower.Get(refs, targets, FetchOptions{}, 5*time.Second))
	ev := p.dst.Events()
	require.Len(t, ev, 12)
	for i := 0; i < 4; i++ {
		assert.Equal(t, "fetch", ev[i], "events %v", ev)
	}
}

func TestFetchSecondGetFetchesAgain(t *testing.T) {
	p := newPair(t, nil)
	refs, targets, src, dst := p.shareToFetch(t, 1, 4096)
	require.NoError(t, p.borrower.Get(refs, targets, FetchOptions{}, time.Second))
	src[0].fill(99) // the source mutates; a second get sees it
	require.NoError(t, p.borrower.Get(refs, targets, FetchOptions{}, time.Second))
	assert.True(t, bytes.Equal(src[0].b, dst[0].b))
	assert.Equal(t, int64(2), p.dst.fetched.Load())
}

func TestFetchOneDeadlineForAll(t *testing.T) {
	p, gate := gatedPair(t, nil)
	refs, targets, src, dst := p.shareToFetch(t, 3, 4096)
	f := p.startFetch(t, refs, targets, FetchOptions{})
	start := time.Now()
	err := f.Wait(150 * time.Millisecond)
	elapsed := time.Since(start)
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err))
	// Three blocked transfers share the one deadline: not three times it.
	assert.Less(t, elapsed, 400*time.Millisecond)
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(f.Wait(0)), "still running after a timeout")
	close(gate)
	require.NoError(t, f.Wait(5*time.Second))
	require.NoError(t, f.Wait(0), "the result stays")
	f.Free()
	assertLanded(t, src, dst)
}

func TestFetchFirstErrorAbortsAndReleasesOthers(t *testing.T) {
	p := newPair(t, nil)
	refs, targets, _, _ := p.shareToFetch(t, 4, 4096)
	// One transfer fails; the others block like a transport that notices an
	// abort only at its next chunk, until we let them go.
	blocker := make(chan struct{})
	var failed atomic.Bool
	p.dst.waitErr = func(x *transport.Transfer) error {
		if failed.CompareAndSwap(false, true) {
			return transport.Errorf(transport.ErrTransport, "link down")
		}
		<-blocker
		return nil
	}
	f := p.startFetch(t, refs, targets, FetchOptions{})
	eventually(t, func() bool { return p.dst.aborts.Load() == 3 }, "the other three are aborted")
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(f.Wait(0)), "does not return while transfers may still write")
	close(blocker)
	err := f.Wait(5 * time.Second)
	assert.Equal(t, transport.ErrTransport, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "link down")
	assert.Equal(t, int64(4), p.dst.released.Load(), "every request released")
	f.Free()
	assert.Equal(t, uint64(0), p.borrower.Stats().FetchesActive)
}

func TestFetchStartFailureCleansUp(t *testing.T) {
	p := newPair(t, func(m *memTransport) { m.failFetchIdx = 3 })
	p.dst.gate = make(chan struct{}) // started transfers only end by abort
	refs, targets, _, _ := p.shareToFetch(t, 4, 4096)
	f, err := p.borrower.StartFetch(refs, targets, FetchOptions{})
	require.NoError(t, err, "starting waits for nothing; a failure to start is the fetch's result")
	err = f.Wait(5 * time.Second)
	assert.Equal(t, transport.ErrTransport, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "fetch 3 refused")
	assert.Regexp(t, `ref \d`, err.Error())
	f.Free()
	// The transfers start concurrently: those the transport started before
	// the failure aborted the fetch were aborted and released; those after
	// it never called the transport.
	started := p.dst.fetched.Load() - 1
	assert.GreaterOrEqual(t, started, int64(2))
	assert.Equal(t, started, p.dst.released.Load(), "every started request was released")
	assert.Equal(t, started, p.dst.aborts.Load())
	assert.Equal(t, uint64(0), p.borrower.Stats().FetchesActive)
	// The borrower's refs are intact: only the fetch's own handles went.
	assert.Equal(t, uint64(4), p.owner.Stats().Borrows)
}

func TestFetchAbort(t *testing.T) {
	p, _ := gatedPair(t, nil)
	refs, targets, _, _ := p.shareToFetch(t, 2, 4096)
	f := p.startFetch(t, refs, targets, FetchOptions{})
	eventually(t, func() bool { return p.dst.fetched.Load() == 2 }, "both transfers started")
	f.Abort()
	err := f.Wait(5 * time.Second)
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(err))
	assert.Equal(t, int64(2), p.dst.released.Load())
	assert.Equal(t, int64(2), p.dst.aborts.Load())
	f.Free()
	f.Free() // idempotent
	assert.Equal(t, uint64(0), p.borrower.Stats().FetchesActive)
}

func TestFreeWaitsForTransportThatCannotAbort(t *testing.T) {
	p, gate := gatedPair(t, func(m *memTransport) { m.canAbort = false })
	refs, targets, src, dst := p.shareToFetch(t, 1, 4096)
	f := p.startFetch(t, refs, targets, FetchOptions{})
	eventually(t, func() bool { return p.dst.fetched.Load() == 1 }, "the transfer started")
	freed := make(chan struct{})
	go func() { f.Free(); close(freed) }()
	select {
	case <-freed:
		t.Fatal("free returned while a non-abortable transfer could still write")
	case <-time.After(50 * time.Millisecond):
	}
	assert.Equal(t, int64(0), p.dst.aborts.Load(), "abort is not called on a transport that cannot abort")
	close(gate)
	<-freed
	assert.Equal(t, src[0].b, dst[0].b, "it finished writing before free returned")
}

func TestFetchTwoSided(t *testing.T) {
	p := newPair(t, func(m *memTransport) { m.oneSided = false })
	refs, targets, src, dst := p.shareToFetch(t, 3, 1<<12)
	require.NoError(t, p.borrower.Get(refs, targets, FetchOptions{}, 5*time.Second))
	assertLanded(t, src, dst)
	assert.Equal(t, int64(3), p.src.sends.Load(), "the source runtime sent")
	assert.Equal(t, int64(0), p.dst.sends.Load())
	eventually(t, func() bool { return p.owner.Stats().SendsCompleted == 3 }, "sends counted")
}

func TestFetchOwnerGoneMidTransfer(t *testing.T) {
	p, _ := gatedPair(t, nil)
	refs, targets, _, _ := p.shareToFetch(t, 2, 4096)
	f := p.startFetch(t, refs, targets, FetchOptions{})
	go p.owner.Destroy()
	err := f.Wait(5 * time.Second)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
	f.Free()
}

func TestFetchValidatesTargets(t *testing.T) {
	p := newPair(t, nil)
	refs, targets, _, _ := p.shareToFetch(t, 2, 4096)

	_, err := p.borrower.StartFetch(refs, targets[:1], FetchOptions{})
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err))

	bad := append([]transport.Tensor(nil), targets...)
	bad[1].Shape = []int64{7}
	_, err = p.borrower.StartFetch(refs, bad, FetchOptions{})
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "shape")

	bad = append([]transport.Tensor(nil), targets...)
	bad[0].DType = transport.DType{Code: 0, Bits: 32, Lanes: 1}
	_, err = p.borrower.StartFetch(refs, bad, FetchOptions{})
	assert.Contains(t, err.Error(), "dtype")

	bad = append([]transport.Tensor(nil), targets...)
	bad[0].Device = transport.Device{Type: transport.DeviceROCM} // not between host and CUDA memory
	_, err = p.borrower.StartFetch(refs, bad, FetchOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "device")

	_, err = p.borrower.StartFetch(refs, targets, FetchOptions{Transport: "nope"})
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err))

	// A ref of another runtime.
	other := newRuntime(t, "other")
	buf := newHostBuf(t, 4096)
	oref, err := other.Put([]transport.Tensor{tensorOf(t, buf)}, "", nil)
	require.NoError(t, err)
	defer oref.Release()
	_, err = p.borrower.StartFetch([]*Ref{oref}, targets[:1], FetchOptions{})
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err))
	assert.Equal(t, int64(0), p.dst.fetched.Load(), "nothing started")
}

func TestFetchPeerLacksTransport(t *testing.T) {
	p := newPair(t, nil)
	owner, borrower := p.owner, p.borrower
	require.NoError(t, borrower.RegisterTransport(newMemTransport("only_here")))
	buf := newHostBuf(t, 64)
	ref, err := owner.Put([]transport.Tensor{tensorOf(t, buf)}, "mem", nil)
	require.NoError(t, err)
	bref := deserialized(t, borrower, serialized(t, ref))
	out := newHostBuf(t, 64)
	err = borrower.Get([]*Ref{bref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{Transport: "only_here"}, time.Second)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "has no transport")
	// Registered on the owner later: the borrower notices.
	require.NoError(t, owner.RegisterTransport(newMemTransport("only_here")))
	require.NoError(t, borrower.Get([]*Ref{bref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{Transport: "only_here"}, time.Second))
	assert.Equal(t, buf.b, out.b)
}

func TestFetchOwnObjectCopiesWithoutTransport(t *testing.T) {
	rt := newRuntime(t, "a")
	mt := newMemTransport("mem")
	require.NoError(t, rt.RegisterTransport(mt))
	buf := newHostBuf(t, 3*localChunk+8)
	buf.fill(9)
	ref, err := rt.Put([]transport.Tensor{tensorOf(t, buf)}, "mem", nil)
	require.NoError(t, err)
	defer ref.Release()
	out := newHostBuf(t, len(buf.b))
	require.NoError(t, rt.Get([]*Ref{ref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{}, time.Second))
	assert.True(t, bytes.Equal(buf.b, out.b))
	assert.Equal(t, int64(0), mt.fetched.Load())
	assert.Equal(t, uint64(1), rt.Stats().LocalCopies)
}

func TestFetchAutoWithoutBuiltinsExplains(t *testing.T) {
	owner := newRuntime(t, "owner")
	borrower := newRuntime(t, "borrower")
	buf := newHostBuf(t, 64)
	ref, err := owner.Put([]transport.Tensor{tensorOf(t, buf)}, "", nil)
	require.NoError(t, err)
	bref := deserialized(t, borrower, serialized(t, ref))
	out := newHostBuf(t, 64)
	err = borrower.Get([]*Ref{bref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{}, time.Second)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "no transport in this runtime is chosen automatically for cpu memory")
}

func TestFetchEmptyObjectsNeedNoTransport(t *testing.T) {
	p := newPair(t, nil)
	d, err := transport.NewTensorDesc(transport.Device{Type: transport.DeviceCPU}, transport.DType{Code: 2, Bits: 32, Lanes: 1}, []int64{0, 5})
	require.NoError(t, err)
	ref, err := p.owner.Put([]transport.Tensor{{TensorDesc: d}}, "mem", nil)
	require.NoError(t, err)
	bref := deserialized(t, p.borrower, serialized(t, ref))
	require.NoError(t, p.borrower.Get([]*Ref{bref}, []transport.Tensor{{TensorDesc: d}}, FetchOptions{}, time.Second))
	assert.Equal(t, int64(0), p.dst.fetched.Load())
}

func TestManyConcurrentFetches(t *testing.T) {
	p := newPair(t, nil)
	refs, src := p.share(t, 8, 1024, "mem")
	errs := make(chan error, 64)
	for g := 0; g < 64; g++ {
		go func() {
			i := g % len(refs)
			out := newHostBuf(t, 1024)
			err := p.borrower.Get(refs[i:i+1], []transport.Tensor{tensorOf(t, out)}, FetchOptions{}, 5*time.Second)
			if err == nil && !bytes.Equal(out.b, src[i].b) {
				err = fmt.Errorf("goroutine %d: contents differ", g)
			}
			errs <- err
		}()
	}
	for g := 0; g < 64; g++ {
		require.NoError(t, <-errs)
	}
}
