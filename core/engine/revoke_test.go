package engine

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// The default lease is two minutes: every wait below is far shorter, so an
// object freed within it was freed by the revocation, not by expiry.

func TestReleaseRevokingLeasesFreesAtOnce(t *testing.T) {
	p := pairOf(t, newRuntime(t, "owner"), newRuntime(t, "other"), nil)
	owner, other := p.owner, p.borrower
	var released atomic.Int64
	ref, _ := putOne(t, owner, "mem", &released)

	var sent [][]byte
	for i := 0; i < 3; i++ {
		sent = append(sent, serialized(t, ref))
	}
	assert.Equal(t, uint64(3), owner.Stats().RefsInTransit)

	require.NoError(t, ref.ReleaseRevokingLeases())
	eventually(t, func() bool { return released.Load() == 1 }, "freed without waiting for the leases")
	assert.Equal(t, int64(1), p.src.gcCount.Load(), "garbage_collect ran")
	s := owner.Stats()
	assert.Zero(t, s.Objects)
	assert.Zero(t, s.RefsInTransit)
	assert.Zero(t, s.Refs)
	assert.Zero(t, s.LeasesExpired, "revoked, not expired")
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(ref.Release()), "the handle is released")

	for _, b := range sent {
		assertFreedWhenFetched(t, other, b)
		_, err := owner.Deserialize(b)
		assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "%v", err)
		assert.Contains(t, err.Error(), "already freed")
	}
}

func TestReleaseRevokingLeasesKeepsCountedBorrows(t *testing.T) {
	p := newPair(t, nil)
	owner, borrower := p.owner, p.borrower
	third := newRuntime(t, "third")
	require.NoError(t, third.RegisterTransport(newMemTransport("mem")))
	var released atomic.Int64
	ref, buf := putOne(t, owner, "mem", &released)

	forBorrower := serialized(t, ref)
	unused := serialized(t, ref)
	bref := deserialized(t, borrower, forBorrower)
	eventually(t, func() bool { return owner.Stats().Borrows == 1 }, "the owner counts the borrow")
	// The borrower passes the ref on: a lease the owner holds for it.
	passedOn := serialized(t, bref)
	assert.Equal(t, uint64(2), owner.Stats().RefsInTransit)

	require.NoError(t, ref.ReleaseRevokingLeases())
	s := owner.Stats()
	assert.Equal(t, uint64(1), s.Objects, "the counted borrow keeps the object")
	assert.Equal(t, uint64(1), s.Borrows)
	assert.Zero(t, s.RefsInTransit, "every lease is revoked, the borrower's too")
	owner.store.mu.Lock()
	assert.Empty(t, owner.store.peerLeases, "the borrower's lease count went with its lease")
	owner.store.mu.Unlock()
	assert.Zero(t, released.Load())

	// The borrower still fetches, and its release frees the object: the
	// bytes nobody deserialized no longer hold it.
	requireGets(t, borrower, bref, buf)
	require.NoError(t, bref.Release())
	eventually(t, func() bool { return released.Load() == 1 }, "freed with the last borrow")
	assert.Zero(t, owner.Stats().Objects)
	for _, b := range [][]byte{unused, passedOn} {
		assertFreedWhenFetched(t, third, b)
	}
}

func TestReleaseRevokingLeasesOfBorrowedRefIsRefused(t *testing.T) {
	owner := newRuntime(t, "owner")
	borrower := newRuntime(t, "borrower")
	var released atomic.Int64
	ref, _ := putOne(t, owner, "", &released)
	bref := deserialized(t, borrower, serialized(t, ref))

	err := bref.ReleaseRevokingLeases()
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "only its owner")
	c, err := bref.Clone()
	require.NoError(t, err, "the refused handle is still valid")
	require.NoError(t, c.Release())
	require.NoError(t, bref.Release())

	// A released owner handle is refused like any released handle.
	require.NoError(t, ref.Release())
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(ref.ReleaseRevokingLeases()))
	eventually(t, func() bool { return released.Load() == 1 }, "freed")
}

func TestReleaseRevokingLeasesOtherLocalHandlesKeepObject(t *testing.T) {
	rt := newRuntime(t, "owner")
	var released atomic.Int64
	ref, _ := putOne(t, rt, "", &released)
	keep, err := ref.Clone()
	require.NoError(t, err)
	b := serialized(t, ref)
	require.NoError(t, ref.ReleaseRevokingLeases())
	assert.Equal(t, uint64(1), rt.Stats().Objects, "a local handle still holds it")
	assert.Zero(t, rt.Stats().RefsInTransit)
	require.NoError(t, keep.Release())
	eventually(t, func() bool { return released.Load() == 1 }, "freed with the last handle, not held by the bytes")
	_, err = rt.Deserialize(b)
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "already freed")
}

// A borrower deserialized the bytes, but its borrow request reaches the
// owner only after the owner revoked the lease. If that freed the object,
// the owner refuses the borrow and the borrower's fetch fails with
// NotFound; if another borrower keeps it, the late borrow is counted like
// one made from expired bytes. Either way nothing leaks on either side.
func TestRevokeRacesBorrow(t *testing.T) {
	for _, keptAlive := range []bool{false, true} {
		name := "freed"
		if keptAlive {
			name = "kept"
		}
		t.Run(name, func(t *testing.T) {
			p := socketPair(t, nil)
			owner, borrower := p.owner, p.borrower
			var released atomic.Int64
			ref, buf := putOne(t, owner, "mem", &released)
			b := serialized(t, ref)

			var keeper *Ref
			if keptAlive {
				keeper = deserialized(t, socketRuntime(t, "keeper"), serialized(t, ref))
				eventually(t, func() bool { return owner.Stats().Borrows == 1 }, "the keeper's borrow is counted")
			}

			// Hold the borrower's connection to the owner: its borrow
			// request is made but cannot be written until we let go.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			peer, err := borrower.ep.Connect(ctx, owner.Address())
			require.NoError(t, err)
			resume, ok := control.HoldWrites(peer)
			require.True(t, ok, "a socket connection, got %T", peer)
			type result struct {
				ref *Ref
				err error
			}
			got := make(chan result, 1)
			go func() {
				r, err := borrower.Deserialize(b)
				got <- result{r, err}
			}()
			eventually(t, func() bool { return borrower.Stats().BorrowedObjects == 1 }, "the borrow is registered")

			require.NoError(t, ref.ReleaseRevokingLeases())
			if !keptAlive {
				eventually(t, func() bool { return released.Load() == 1 }, "freed by the revocation")
			}
			resume()

			var r result
			select {
			case r = <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("deserialize did not return")
			}
			require.NoError(t, r.err, "the answer is not awaited")
			out, err := getWhole(t, borrower, r.ref, len(buf.b))
			if keptAlive {
				require.NoError(t, err)
				assert.Equal(t, buf.b, out.b)
				assert.Equal(t, uint64(2), owner.Stats().Borrows, "the late borrow is counted")
			} else {
				assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "%v", err)
				assert.Contains(t, err.Error(), "refused the borrow")
				assert.Contains(t, err.Error(), "already freed")
			}
			require.NoError(t, r.ref.Release())
			assert.Zero(t, borrower.Stats().BorrowedObjects)
			assert.Zero(t, borrower.Stats().Refs)

			if keptAlive {
				eventually(t, func() bool { return owner.Stats().Borrows == 1 }, "the late borrow is returned")
				assert.Zero(t, released.Load())
				require.NoError(t, keeper.Release())
				eventually(t, func() bool { return released.Load() == 1 }, "freed with the keeper's borrow")
			}
			s := owner.Stats()
			assert.Zero(t, s.Objects)
			assert.Zero(t, s.Borrows)
			assert.Zero(t, s.RefsInTransit)
		})
	}
}

// Revoking frees at once: when release(revoke) returns having freed the
// object, no transport serves it any more. A receiver whose borrow has not
// reached the owner (its writes are held here) fetches with the bytes in
// the ref over a transport that detects freed objects, as cma, shm and tcp
// do, which starts without waiting for the owner's answer; the fetch must
// fail, never return the bytes. When garbage_collect ran after revoke
// returned, such fetches read the object.
func TestRevokedObjectIsNotServedAfterRevokeReturns(t *testing.T) {
	p := socketPair(t, func(m *memTransport) {
		m.describe = func(d *transport.Descriptor) { d.DetectsFreedObjects = true }
	})
	owner, borrower := p.owner, p.borrower
	p.dst.collected = p.src.collected
	p.src.gcDelay = 20 * time.Millisecond // the free takes a while, as unmapping does
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	peer, err := borrower.ep.Connect(ctx, owner.Address())
	require.NoError(t, err)
	served := 0
	for i := 0; i < 100; i++ {
		var released atomic.Int64
		ref, buf := putOne(t, owner, "mem", &released)
		b := serialized(t, ref)
		resume, ok := control.HoldWrites(peer)
		require.True(t, ok)
		late, err := borrower.Deserialize(b)
		if err != nil {
			resume()
			require.NoError(t, err)
		}
		require.NoError(t, ref.ReleaseRevokingLeases())
		out := newHostBuf(t, len(buf.b))
		// The transfer starts before the borrow can reach the owner; its
		// refusal arrives once writes resume.
		f, err := borrower.StartFetch([]*Ref{late}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{})
		resume()
		if err == nil {
			err = f.Wait(10 * time.Second)
			f.Free()
		}
		if err == nil {
			served++
		} else {
			assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "%v", err)
		}
		require.NoError(t, late.Release())
		eventually(t, func() bool { return released.Load() == 1 }, "freed")
	}
	assert.Zero(t, served, "fetches of a revoked object that succeeded after revoke returned")
}
