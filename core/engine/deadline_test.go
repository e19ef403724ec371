package engine

import (
	"context"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// margin is how late a deadline may be kept on a loaded machine.
const margin = 1500 * time.Millisecond

// silentOwner is a Unix socket that accepts connections and never says a
// word, as a stopped (SIGSTOP) runtime's socket does: the kernel completes
// the connection, nobody answers the handshake.
func silentOwner(t *testing.T) (address string, accepted *atomic.Int64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "silent.sock")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	accepted = new(atomic.Int64)
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return control.UnixScheme + path, accepted
}

// refOwnedAt is b with the owner's address replaced by address.
func refOwnedAt(t *testing.T, b []byte, address string) []byte {
	t.Helper()
	desc, token, err := DecodeRef(b)
	require.NoError(t, err)
	desc.Owner.Address = address
	return EncodeRef(desc, desc.Meta, token)
}

func TestDeserializeKeepsItsDeadlineWithASilentOwner(t *testing.T) {
	owner := socketRuntime(t, "owner")
	require.NoError(t, owner.RegisterTransport(newMemTransport("mem")))
	ref, _ := putOne(t, owner, "mem", new(atomic.Int64))
	defer ref.Release()
	b, err := ref.Serialize()
	require.NoError(t, err)
	address, accepted := silentOwner(t)
	b = refOwnedAt(t, b, address)
	borrower := socketRuntime(t, "borrower")

	for i := 0; i < 2; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		start := time.Now()
		_, err = borrower.DeserializeContext(ctx, b)
		elapsed := time.Since(start)
		cancel()
		assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
		assert.Less(t, elapsed, 300*time.Millisecond+margin, "the deadline is kept while the handshake hangs")
	}
	// The second call waited for the first call's dial, still under way,
	// rather than dialing again.
	assert.Equal(t, int64(1), accepted.Load())

	// Cancelled rather than timed out.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err = borrower.DeserializeContext(ctx, b)
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "%v", err)

	s := borrower.Stats()
	assert.Equal(t, uint64(0), s.Refs, "nothing is kept by a deserialize that gave up")
}

// stallNetwork wraps a network so that every peer's metadata requests go
// unanswered until release is closed (or their context ends), as with an
// owner that stopped after this runtime connected to it.
type stallNetwork struct {
	control.Network
	release chan struct{}
}

func (n stallNetwork) Listen(cfg control.ListenConfig) (control.Endpoint, error) {
	ep, err := n.Network.Listen(cfg)
	if err != nil {
		return nil, err
	}
	return stallEndpoint{ep, n.release}, nil
}

type stallEndpoint struct {
	control.Endpoint
	release chan struct{}
}

func (e stallEndpoint) Connect(ctx context.Context, address string) (control.Peer, error) {
	p, err := e.Endpoint.Connect(ctx, address)
	if err != nil {
		return nil, err
	}
	return stallPeer{p, e.release}, nil
}

type stallPeer struct {
	control.Peer
	release chan struct{}
}

func (p stallPeer) Metadata(ctx context.Context, obj transport.ObjectID, transportName string) ([]byte, error) {
	select {
	case <-p.release:
		return p.Peer.Metadata(ctx, obj, transportName)
	case <-ctx.Done():
		return nil, transport.ContextError(ctx, "metadata request")
	}
}

// stalledPair is an owner whose object is fetched with a transport whose
// metadata is not in the ref, by a borrower whose metadata requests stall.
func stalledPair(t *testing.T) (borrower *Runtime, ref *Ref, target transport.Tensor, release chan struct{}) {
	release = make(chan struct{})
	owner := newRuntime(t, "owner")
	borrower = newRuntime(t, "borrower", func(o *Options) { o.Network = stallNetwork{control.InProcess{}, release} })
	for _, rt := range []*Runtime{owner, borrower} {
		require.NoError(t, rt.RegisterTransport(newMemTransport("mem")))
		require.NoError(t, rt.RegisterTransport(newMemTransport("other")))
	}
	oref, buf := putOne(t, owner, "mem", new(atomic.Int64))
	t.Cleanup(func() { oref.Release() })
	ref = borrowIn(t, borrower, oref)
	return borrower, ref, tensorOf(t, newHostBuf(t, len(buf.b))), release
}

func TestStartFetchWaitsForNothingAndAbortEndsTheStartPhase(t *testing.T) {
	borrower, ref, target, _ := stalledPair(t)
	start := time.Now()
	f, err := borrower.StartFetch([]*Ref{ref}, []transport.Tensor{target}, FetchOptions{Transport: "other"})
	require.NoError(t, err)
	assert.Less(t, time.Since(start), margin, "start does not wait for the owner")

	start = time.Now()
	err = f.Wait(300 * time.Millisecond)
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
	assert.Less(t, time.Since(start), 300*time.Millisecond+margin)
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(f.Wait(0)), "the fetch stays valid after a timeout")

	start = time.Now()
	f.Abort()
	err = f.Wait(-1)
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "%v", err)
	f.Free()
	assert.Less(t, time.Since(start), margin, "abort ends the wait for the owner's metadata")
	assert.Equal(t, uint64(0), borrower.Stats().FetchesActive)
}

func TestGetKeepsItsDeadlineInTheStartPhase(t *testing.T) {
	borrower, ref, target, release := stalledPair(t)
	start := time.Now()
	err := borrower.Get([]*Ref{ref}, []transport.Tensor{target}, FetchOptions{Transport: "other"}, 300*time.Millisecond)
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
	assert.Less(t, time.Since(start), 300*time.Millisecond+margin)
	assert.Equal(t, uint64(0), borrower.Stats().FetchesActive)

	// Freeing a fetch stuck in its start phase is prompt too.
	f, err := borrower.StartFetch([]*Ref{ref}, []transport.Tensor{target}, FetchOptions{Transport: "other"})
	require.NoError(t, err)
	start = time.Now()
	f.Free()
	assert.Less(t, time.Since(start), margin)

	// Once the owner answers, the same ref is fetched.
	close(release)
	require.NoError(t, borrower.Get([]*Ref{ref}, []transport.Tensor{target}, FetchOptions{Transport: "other"}, 5*time.Second))
}
