package engine

import (
	"bufio"
	"crypto/ed25519"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// socketRuntime is a runtime whose control plane is Unix sockets in a
// directory of the test's own.
func socketRuntime(t *testing.T, name string, opts ...func(*Options)) *Runtime {
	t.Helper()
	dir := t.TempDir()
	return newRuntime(t, name, append([]func(*Options){func(o *Options) {
		o.Network = control.Sockets{}
		o.SocketDir = dir
	}}, opts...)...)
}

// socketPair is a pair whose runtimes speak over Unix sockets; ownerOpts
// set the owner up.
func socketPair(t *testing.T, configure func(*memTransport), ownerOpts ...func(*Options)) *pair {
	t.Helper()
	return pairOf(t, socketRuntime(t, "owner", ownerOpts...), socketRuntime(t, "borrower"), configure)
}

func TestSocketsBorrowFetchAndRelease(t *testing.T) {
	p := socketPair(t, nil)
	owner, borrower := p.owner, p.borrower
	require.True(t, strings.HasPrefix(owner.Address(), "unix://"))

	var released atomic.Int64
	b, buf := lendOne(t, owner, "mem", &released)
	bref := deserialized(t, borrower, b)
	// The borrow is registered without waiting for the owner's answer.
	eventually(t, func() bool { return owner.Stats().Borrows == 1 }, "the borrow arrives")
	assert.Equal(t, uint64(1), owner.Stats().Peers)

	requireGets(t, borrower, bref, buf)

	// Re-serialized by the borrower: the owner grants the lease over the wire.
	b2 := serialized(t, bref)
	assert.Equal(t, uint64(1), owner.Stats().RefsInTransit)
	require.NoError(t, bref.Release())
	eventually(t, func() bool { return owner.Stats().Borrows == 0 }, "unborrow arrives")
	assert.Equal(t, int64(0), released.Load(), "the lease still holds it")
	require.NoError(t, deserialized(t, borrower, b2).Release())
	eventually(t, func() bool { return released.Load() == 1 }, "freed")
}

func TestSocketsTwoSidedSend(t *testing.T) {
	p := socketPair(t, func(m *memTransport) { m.oneSided = false })
	src, dst := p.src, p.dst
	var released atomic.Int64
	ref, buf := putOne(t, p.owner, "mem", &released)
	bref := deserialized(t, p.borrower, serialized(t, ref))
	out := requireGets(t, p.borrower, bref, buf)
	assert.Equal(t, int64(1), src.sends.Load())

	// A send that blocks is cancelled over the wire when the fetch aborts.
	gate := make(chan struct{})
	dst.gate = gate
	f := p.startFetch(t, []*Ref{bref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{})
	eventually(t, func() bool { return src.sends.Load() == 2 }, "the source is sending") // start runs in the background
	f.Abort()
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(f.Wait(5*time.Second)))
	f.Free()
	close(gate)
	require.NoError(t, bref.Release())
	require.NoError(t, ref.Release())
}

func TestSocketsPeerGoneReturnsBorrows(t *testing.T) {
	owner := socketRuntime(t, "owner")
	borrower := socketRuntime(t, "borrower")
	var released atomic.Int64
	b, _ := lendOne(t, owner, "", &released)
	deserialized(t, borrower, b)
	borrower.Destroy()
	eventually(t, func() bool { return released.Load() == 1 }, "freed once the borrower disconnected")
	// The borrow may come back (unborrow at destroy) before the owner has
	// seen the connection close.
	eventually(t, func() bool { return owner.Stats().Peers == 0 }, "the peer is dropped")
}

func TestSocketsOwnerGoneFailsPromptly(t *testing.T) {
	p := socketPair(t, nil)
	owner, borrower := p.owner, p.borrower
	p.dst.gate = make(chan struct{})
	var released atomic.Int64
	ref, buf := putOne(t, owner, "mem", &released)
	b := serialized(t, ref)
	bref := deserialized(t, borrower, b)
	out := newHostBuf(t, len(buf.b))
	f := p.startFetch(t, []*Ref{bref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{})
	owner.Destroy()
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(f.Wait(5*time.Second)))
	f.Free()
	_, err := bref.Serialize()
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err))
	_, err = borrower.Deserialize(b)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err))
}

// A transport that cannot tell freed memory (one-sided, without
// DetectsFreedObjects) relies on the owner keeping borrowed objects alive.
// An owner destroyed while a borrower holds a ref frees them: destroy tells
// its peers first and waits until they closed their ends, so a get right
// after it fails, and never returns the bytes the memory holds next.
func TestSocketsDestroyedOwnerIsSeenBeforeItFrees(t *testing.T) {
	for round := 0; round < 5; round++ {
		p := socketPair(t, nil)
		owner, borrower := p.owner, p.borrower
		var released atomic.Int64
		ref, buf := putOne(t, owner, "mem", &released)
		bref := deserialized(t, borrower, serialized(t, ref))
		out := requireGets(t, borrower, bref, buf)

		owner.Destroy()
		require.Equal(t, int64(1), released.Load(), "destroy frees the borrowed object")
		buf.fill(0xee) // the memory is reused at once
		err := borrower.Get([]*Ref{bref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{}, 5*time.Second)
		require.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "round %d: %v", round, err)
		require.NoError(t, bref.Release())
	}
}

// rawPeer is an identity a test speaks for by hand: a key and what it
// claims in its handshake (by default, what it can prove).
type rawPeer struct {
	key  ed25519.PrivateKey
	info transport.PeerInfo
}

func newRawPeer() *rawPeer {
	key, id := control.NewIdentityKey()
	return &rawPeer{key: key, info: transport.PeerInfo{RuntimeID: id, Name: "raw", Address: "unix:///nonexistent", Pid: os.Getpid()}}
}

// rawHandshake is the client side of the handshake, proving token and
// signing with p's key whatever p claims; it returns the reader positioned
// after the welcome, or the refusal.
func rawHandshake(c net.Conn, p *rawPeer, token string) (*bufio.Reader, error) {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	nonce := transport.NewNonce()
	if _, err := c.Write((&control.Message{Kind: control.KindHello, Nonce: nonce}).Encode()); err != nil {
		return nil, err
	}
	rd := bufio.NewReader(c)
	ch, err := control.Expect(rd, control.KindChallenge)
	if err != nil {
		return nil, err
	}
	auth := &control.Message{Kind: control.KindAuth, Proof: transport.AuthProof(token, control.ProofClient, ch.Nonce), Peer: p.info,
		Key: p.key.Public().(ed25519.PublicKey), Sig: ed25519.Sign(p.key, control.IdentityTranscript(control.SignClient, nonce, ch.Nonce, ch.Key))}
	if _, err := c.Write(auth.Encode()); err != nil {
		return nil, err
	}
	if _, err := control.Expect(rd, control.KindWelcome); err != nil {
		return nil, err
	}
	return rd, nil
}

// Over sockets the owner answers a borrow after Deserialize returned: bytes
// of an object freed meanwhile make a ref whose fetch reports the refusal,
// and whose release returns nothing (the owner counted nothing).
func TestSocketsBorrowOfFreedObjectFailsAtFetch(t *testing.T) {
	p := socketPair(t, nil, func(o *Options) { o.Lease = 30 * time.Millisecond })
	owner, borrower, dst := p.owner, p.borrower, p.dst

	var released atomic.Int64
	b, _ := lendOne(t, owner, "mem", &released)
	eventually(t, func() bool { return released.Load() == 1 }, "freed when the lease expired")

	late := deserialized(t, borrower, b)
	_, err := getWhole(t, borrower, late, 4096)
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "refused the borrow")
	assert.NotContains(t, strings.Join(dst.Events(), " "), "fetch", "the transport was never asked")
	require.NoError(t, late.Release())
	assert.Equal(t, uint64(0), borrower.Stats().BorrowedObjects)
	assert.Equal(t, uint64(0), owner.Stats().Borrows)
}
