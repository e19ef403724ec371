package engine

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

func TestCloneReleaseFreesOnce(t *testing.T) {
	rt := newRuntime(t, "a")
	mt := newMemTransport("mem")
	require.NoError(t, rt.RegisterTransport(mt))
	var released atomic.Int64
	ref, _ := putOne(t, rt, "MEM", &released)

	clones := make([]*Ref, 16)
	for i := range clones {
		c, err := ref.Clone()
		require.NoError(t, err)
		clones[i] = c
	}
	require.NoError(t, ref.Release())
	assert.Equal(t, uint64(1), rt.Stats().Objects)
	// Release the clones concurrently: the object is freed exactly once.
	var wg sync.WaitGroup
	for _, c := range clones {
		wg.Add(1)
		go func() { defer wg.Done(); assert.NoError(t, c.Release()) }()
	}
	wg.Wait()
	eventually(t, func() bool { return released.Load() == 1 }, "release callback")
	time.Sleep(10 * time.Millisecond)
	assert.Equal(t, int64(1), released.Load(), "release callback runs once")
	assert.Equal(t, int64(1), mt.gcCount.Load(), "garbage_collect runs once")
	s := rt.Stats()
	assert.Equal(t, uint64(0), s.Objects)
	assert.Equal(t, uint64(1), s.ObjectsFreed)
	assert.Equal(t, uint64(0), s.Refs)
	assert.Equal(t, []string{"gc"}, mt.Events())
}

func TestDoubleReleaseIsAnError(t *testing.T) {
	rt := newRuntime(t, "a")
	var released atomic.Int64
	ref, _ := putOne(t, rt, "", &released)
	require.NoError(t, ref.Release())
	err := ref.Release()
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err))
	_, err = ref.Clone()
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err))
	_, err = ref.Serialize()
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err))
	eventually(t, func() bool { return released.Load() == 1 }, "freed once")
}

func TestBorrowKeepsObjectAlive(t *testing.T) {
	owner := newRuntime(t, "owner")
	borrower := newRuntime(t, "borrower")
	var released atomic.Int64
	ref, _ := putOne(t, owner, "", &released)

	b := serialized(t, ref)
	assert.Equal(t, uint64(1), owner.Stats().RefsInTransit)
	require.NoError(t, ref.Release())
	// The serialized bytes hold the object.
	assert.Equal(t, uint64(1), owner.Stats().Objects)

	bref := deserialized(t, borrower, b)
	assert.False(t, bref.IsOwner())
	s := owner.Stats()
	assert.Equal(t, uint64(0), s.RefsInTransit, "deserializing consumes the lease")
	assert.Equal(t, uint64(1), s.Borrows)
	assert.Equal(t, uint64(1), borrower.Stats().BorrowedObjects)

	// Clones in the borrower are counted locally; the owner sees one borrow.
	c, err := bref.Clone()
	require.NoError(t, err)
	assert.Equal(t, uint64(1), owner.Stats().Borrows)
	require.NoError(t, bref.Release())
	assert.Equal(t, int64(0), released.Load())
	require.NoError(t, c.Release())
	eventually(t, func() bool { return released.Load() == 1 }, "freed after the last borrow")
	assert.Equal(t, uint64(0), owner.Stats().Borrows)
	assert.Equal(t, uint64(0), borrower.Stats().BorrowedObjects)
}

func TestDeserializeTwiceWhileAlive(t *testing.T) {
	owner := newRuntime(t, "owner")
	borrower := newRuntime(t, "borrower")
	var released atomic.Int64
	ref, _ := putOne(t, owner, "", &released)
	b := serialized(t, ref)
	r1 := deserialized(t, borrower, b)
	r2 := deserialized(t, borrower, b)
	assert.Equal(t, uint64(2), owner.Stats().Borrows)
	require.NoError(t, ref.Release())
	require.NoError(t, r1.Release())
	assert.Equal(t, int64(0), released.Load())
	require.NoError(t, r2.Release())
	eventually(t, func() bool { return released.Load() == 1 }, "freed")
	// Once freed, the bytes no longer resolve: the owner refuses the borrow
	// and the first fetch says so.
	assertFreedWhenFetched(t, borrower, b)
}

// assertFreedWhenFetched deserializes bytes of a freed object: the ref is
// made (the owner's answer is not awaited), its fetch fails with NotFound,
// and releasing it returns nothing to the owner.
func assertFreedWhenFetched(t *testing.T, rt *Runtime, b []byte) {
	t.Helper()
	late := deserialized(t, rt, b)
	_, err := getWhole(t, rt, late, 4096) // the shape putOne puts
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "refused the borrow")
	require.NoError(t, late.Release())
	assert.Equal(t, uint64(0), rt.Stats().BorrowedObjects)
}

func TestReserializedByBorrowerReachesThirdRuntime(t *testing.T) {
	owner := newRuntime(t, "owner")
	b1 := newRuntime(t, "b1")
	b2 := newRuntime(t, "b2")
	var released atomic.Int64
	bytes1, _ := lendOne(t, owner, "", &released)
	r1 := deserialized(t, b1, bytes1)
	bytes2 := serialized(t, r1)
	require.NoError(t, r1.Release()) // b1 lets go before b2 deserializes
	assert.Equal(t, int64(0), released.Load(), "the borrower's lease keeps it")
	r2 := deserialized(t, b2, bytes2)
	assert.Equal(t, owner.ID(), r2.Desc().Owner.RuntimeID)
	require.NoError(t, r2.Release())
	eventually(t, func() bool { return released.Load() == 1 }, "freed")
}

func TestOwnerDeserializesItsOwnBytes(t *testing.T) {
	rt := newRuntime(t, "a")
	var released atomic.Int64
	b, _ := lendOne(t, rt, "", &released)
	r := deserialized(t, rt, b)
	assert.True(t, r.IsOwner())
	assert.Equal(t, uint64(0), rt.Stats().RefsInTransit)
	require.NoError(t, r.Release())
	eventually(t, func() bool { return released.Load() == 1 }, "freed")
}

func TestLeaseExpiryFreesUndeserializedObject(t *testing.T) {
	rt := newRuntime(t, "a", func(o *Options) { o.Lease = 30 * time.Millisecond })
	other := newRuntime(t, "b")
	var released atomic.Int64
	b, _ := lendOne(t, rt, "", &released)
	assert.Equal(t, int64(0), released.Load(), "held by the lease")
	eventually(t, func() bool { return released.Load() == 1 }, "freed when the lease expired")
	assert.Equal(t, uint64(1), rt.Stats().LeasesExpired)
	assertFreedWhenFetched(t, other, b)
}

func TestBorrowerDestroyedReturnsBorrows(t *testing.T) {
	owner := newRuntime(t, "owner")
	borrower := newRuntime(t, "borrower")
	var released atomic.Int64
	b, _ := lendOne(t, owner, "", &released)
	deserialized(t, borrower, b) // never released by the application
	assert.Equal(t, uint64(1), owner.Stats().Borrows)
	borrower.Destroy()
	eventually(t, func() bool { return released.Load() == 1 }, "freed once the borrower is gone")
}

func TestOwnerDestroyedFreesAndFailsBorrowers(t *testing.T) {
	p := newPair(t, nil)
	owner, borrower := p.owner, p.borrower
	var released atomic.Int64
	ref, buf := putOne(t, owner, "mem", &released)
	b := serialized(t, ref)
	bref := deserialized(t, borrower, b)
	owner.Destroy()
	assert.Equal(t, int64(1), released.Load(), "destroy runs release callbacks before returning")
	assert.Equal(t, int64(1), p.src.gcCount.Load())
	out := newHostBuf(t, len(buf.b))
	err := borrower.Get([]*Ref{bref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{}, time.Second)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
	_, err = borrower.Deserialize(b)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err))
	// The owner's own handle now reports the closed runtime.
	_, err = ref.Clone()
	assert.Equal(t, transport.ErrClosed, transport.StatusOf(err))
	assert.NoError(t, ref.Release())
	assert.NoError(t, bref.Release())
}

func TestWaitTensorFreed(t *testing.T) {
	owner := newRuntime(t, "owner")
	borrower := newRuntime(t, "borrower")
	var released atomic.Int64
	b, buf := lendOne(t, owner, "", &released)
	bref := deserialized(t, borrower, b)

	err := owner.WaitTensorFreed(buf.addr(), 20*time.Millisecond)
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "1 borrows")

	done := make(chan error, 1)
	go func() { done <- owner.WaitTensorFreed(buf.addr(), -1) }()
	select {
	case <-done:
		t.Fatal("returned while a borrow is held")
	case <-time.After(20 * time.Millisecond):
	}
	require.NoError(t, bref.Release())
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("did not wake when the tensor was freed")
	}
	assert.Equal(t, int64(1), released.Load(), "the release callback ran before waiters woke")
	// Nothing holds it any more: returns at once.
	assert.NoError(t, owner.WaitTensorFreed(buf.addr(), 0))
	assert.NoError(t, owner.WaitTensorFreed(12345, 0))
}
