package engine

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"encoding/binary"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

func socketRuntime(t *testing.T, name string, opts ...func(*Options)) *Runtime {
	dir := t.TempDir()
	return newRuntime(t, name, append([]func(*Options){func(o *Options) {
		o.Network = control.Sockets{}
		o.SocketDir = dir
	}}, opts...)...)
}

func TestSocketsBorrowFetchAndRelease(t *testing.T) {
	owner := socketRuntime(t, "owner")
	borrower := socketRuntime(t, "borrower")
	require.True(t, strings.HasPrefix(owner.Address(), "unix://"))
	src, dst := newMemTransport("mem"), newMemTransport("mem")
	dst.mailbox = src.mailbox
	require.NoError(t, owner.RegisterTransport(src))
	require.NoError(t, borrower.RegisterTransport(dst))

	var released atomic.Int64
	ref, buf := putOne(t, owner, "mem", &released)
	b, err := ref.Serialize()
	require.NoError(t, err)
	require.NoError(t, ref.Release())
	bref, err := borrower.Deserialize(b)
	require.NoError(t, err)
	// The borrow is registered without waiting for the owner's answer.
	eventually(t, func() bool { return owner.Stats().Borrows == 1 }, "the borrow arrives")
	assert.Equal(t, uint64(1), owner.Stats().Peers)

	out := newHostBuf(t, len(buf.b))
	require.NoError(t, borrower.Get([]*Ref{bref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{}, 5*time.Second))
	assert.Equal(t, buf.b, out.b)

	// Re-serialized by the borrower: the owner grants the lease over the wire.
	b2, err := bref.Serialize()
	require.NoError(t, err)
	assert.Equal(t, uint64(1), owner.Stats().RefsInTransit)
	require.NoError(t, bref.Release())
	eventually(t, func() bool { return owner.Stats().Borrows == 0 }, "unborrow arrives")
	assert.Equal(t, int64(0), released.Load(), "the lease still holds it")
	bref2, err := borrower.Deserialize(b2)
	require.NoError(t, err)
	require.NoError(t, bref2.Release())
	eventually(t, func() bool { return released.Load() == 1 }, "freed")
}

func TestSocketsTwoSidedSend(t *testing.T) {
	owner := socketRuntime(t, "owner")
	borrower := socketRuntime(t, "borrower")
	src, dst := newMemTransport("mem"), newMemTransport("mem")
	src.oneSided, dst.oneSided = false, false
	dst.mailbox = src.mailbox
	require.NoError(t, owner.RegisterTransport(src))
	require.NoError(t, borrower.RegisterTransport(dst))
	var released atomic.Int64
	ref, buf := putOne(t, owner, "mem", &released)
	b, _ := ref.Serialize()
	bref, err := borrower.Deserialize(b)
	require.NoError(t, err)
	out := newHostBuf(t, len(buf.b))
	require.NoError(t, borrower.Get([]*Ref{bref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{}, 5*time.Second))
	assert.Equal(t, buf.b, out.b)
	assert.Equal(t, int64(1), src.sends.Load())

	// A send that blocks is cancelled over the wire when the fetch aborts.
	gate := make(chan struct{})
	dst.gate = gate
	f, err := borrower.StartFetch([]*Ref{bref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{})
	require.NoError(t, err)
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
	ref, _ := putOne(t, owner, "", &released)
	b, _ := ref.Serialize()
	require.NoError(t, ref.Release())
	_, err := borrower.Deserialize(b)
	require.NoError(t, err)
	borrower.Destroy()
	eventually(t, func() bool { return released.Load() == 1 }, "freed once the borrower disconnected")
	// The borrow may come back (unborrow at destroy) before the owner has
	// seen the connection close.
	eventually(t, func() bool { return owner.Stats().Peers == 0 }, "the peer is dropped")
}

func TestSocketsOwnerGoneFailsPromptly(t *testing.T) {
	owner := socketRuntime(t, "owner")
	borrower := socketRuntime(t, "borrower")
	src, dst := newMemTransport("mem"), newMemTransport("mem")
	dst.gate = make(chan struct{})
	require.NoError(t, owner.RegisterTransport(src))
	require.NoError(t, borrower.RegisterTransport(dst))
	var released atomic.Int64
	ref, buf := putOne(t, owner, "mem", &released)
	b, _ := ref.Serialize()
	bref, err := borrower.Deserialize(b)
	require.NoError(t, err)
	out := newHostBuf(t, len(buf.b))
	f, err := borrower.StartFetch([]*Ref{bref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{})
	require.NoError(t, err)
	owner.Destroy()
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(f.Wait(5*time.Second)))
	f.Free()
	_, err = bref.Serialize()
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
		owner := socketRuntime(t, "owner")
		borrower := socketRuntime(t, "borrower")
		require.NoError(t, owner.RegisterTransport(newMemTransport("mem")))
		require.NoError(t, borrower.RegisterTransport(newMemTransport("mem")))
		var released atomic.Int64
		ref, buf := putOne(t, owner, "mem", &released)
		b, err := ref.Serialize()
		require.NoError(t, err)
		bref, err := borrower.Deserialize(b)
		require.NoError(t, err)
		out := newHostBuf(t, len(buf.b))
		require.NoError(t, borrower.Get([]*Ref{bref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{}, 5*time.Second))

		owner.Destroy()
		require.Equal(t, int64(1), released.Load(), "destroy frees the borrowed object")
		buf.fill(0xee) // the memory is reused at once
		err = borrower.Get([]*Ref{bref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{}, 5*time.Second)
		require.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "round %d: %v", round, err)
		require.NoError(t, bref.Release())
	}
}

// rawConn speaks the handshake by hand, as a hostile or broken peer would
// after it, so tests can send anything.
func rawConn(t *testing.T, rt *Runtime) (net.Conn, *bufio.Reader) {
	path := strings.TrimPrefix(strings.Split(rt.Address(), ",")[0], "unix://")
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	rd, err := rawHandshake(c, newRawPeer(), "")
	require.NoError(t, err)
	return c, rd
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

func TestSocketsCorruptFramesCloseOnlyThatConnection(t *testing.T) {
	rt := socketRuntime(t, "victim")
	var released atomic.Int64
	ref, _ := putOne(t, rt, "", &released)
	defer ref.Release()
	cases := map[string][]byte{
		"oversized frame": binary.LittleEndian.AppendUint32(nil, control.MaxFrame+1),
		"tiny frame":      binary.LittleEndian.AppendUint32(nil, 2),
		"unknown kind":    append(binary.LittleEndian.AppendUint32(nil, 9), append([]byte{200}, make([]byte, 8)...)...),
		"truncated borrow": func() []byte {
			f := (&control.Message{Kind: control.KindBorrow, ID: 1, Object: transport.ID{1}}).Encode()
			binary.LittleEndian.PutUint32(f, uint32(len(f)-4-3))
			return f[:len(f)-3]
		}(),
		"handshake again": (&control.Message{Kind: control.KindHello, Nonce: transport.NewNonce()}).Encode(),
	}
	for name, frame := range cases {
		c, rd := rawConn(t, rt)
		_, err := c.Write(frame)
		require.NoError(t, err, name)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = control.ReadFrame(rd, nil, control.MaxFrame)
		assert.Error(t, err, "%s: the runtime closes the connection", name)
	}
	// Still serving: a well-behaved request on a fresh connection works.
	c, rd := rawConn(t, rt)
	_, err := c.Write((&control.Message{Kind: control.KindLease, ID: 7, Object: ref.Desc().ID}).Encode())
	require.NoError(t, err)
	resp, err := control.Expect(rd, control.KindResponse)
	require.NoError(t, err)
	assert.Equal(t, transport.OK, resp.Status)
	assert.Equal(t, uint64(7), resp.ID)
	// And a request for an unknown object gets an error reply, not a hang.
	_, err = c.Write((&control.Message{Kind: control.KindBorrow, ID: 8, Object: transport.ID{9, 9}}).Encode())
	require.NoError(t, err)
	resp, err = control.Expect(rd, control.KindResponse)
	require.NoError(t, err)
	assert.Equal(t, transport.ErrNotFound, resp.Status)
}

// rawBorrower puts an object in rt and has a raw peer borrow it, so that
// the object lives only as long as rt counts that peer's borrow; released
// counts its release.
func rawBorrower(t *testing.T, rt *Runtime, released *atomic.Int64) net.Conn {
	ref, _ := putOne(t, rt, "", released)
	b, _ := ref.Serialize()
	desc, token, _ := DecodeRef(b)
	require.NoError(t, ref.Release())
	c, rd := rawConn(t, rt)
	_, err := c.Write((&control.Message{Kind: control.KindBorrow, ID: 1, Object: desc.ID, Token: token}).Encode())
	require.NoError(t, err)
	resp, err := control.Expect(rd, control.KindResponse)
	require.NoError(t, err)
	require.Equal(t, transport.OK, resp.Status)
	require.Equal(t, uint64(1), rt.Stats().Borrows)
	return c
}

func TestSocketsSilentPeerTimesOut(t *testing.T) {
	rt := socketRuntime(t, "watcher", func(o *Options) { o.PeerTimeout = 200 * time.Millisecond })
	var released atomic.Int64
	rawBorrower(t, rt, &released)
	// The raw peer never answers pings: it is declared gone, and its borrow
	// with it.
	eventually(t, func() bool { return released.Load() == 1 }, "silent borrower dropped")
}

// Over sockets the owner answers a borrow after Deserialize returned: bytes
// of an object freed meanwhile make a ref whose fetch reports the refusal,
// and whose release returns nothing (the owner counted nothing).
func TestSocketsBorrowOfFreedObjectFailsAtFetch(t *testing.T) {
	owner := socketRuntime(t, "owner", func(o *Options) { o.Lease = 30 * time.Millisecond })
	borrower := socketRuntime(t, "borrower")
	src, dst := newMemTransport("mem"), newMemTransport("mem")
	dst.mailbox = src.mailbox
	require.NoError(t, owner.RegisterTransport(src))
	require.NoError(t, borrower.RegisterTransport(dst))

	var released atomic.Int64
	ref, _ := putOne(t, owner, "mem", &released)
	b, err := ref.Serialize()
	require.NoError(t, err)
	require.NoError(t, ref.Release())
	eventually(t, func() bool { return released.Load() == 1 }, "freed when the lease expired")

	late, err := borrower.Deserialize(b)
	require.NoError(t, err)
	out := newHostBuf(t, 4096)
	err = borrower.Get([]*Ref{late}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{}, 5*time.Second)
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "refused the borrow")
	assert.NotContains(t, strings.Join(dst.Events(), " "), "fetch", "the transport was never asked")
	require.NoError(t, late.Release())
	assert.Equal(t, uint64(0), borrower.Stats().BorrowedObjects)
	assert.Equal(t, uint64(0), owner.Stats().Borrows)
}

// A peer that keeps writing (pings) but never reads is not alive as far as
// the control plane goes: its pings prove nothing about ours, which stay
// unanswered. It is dropped within about the peer timeout and counted as
// lost, with its borrow.
func TestSocketsPeerThatPingsButNeverReadsIsDropped(t *testing.T) {
	rt := socketRuntime(t, "watcher", func(o *Options) { o.PeerTimeout = 300 * time.Millisecond })
	var released atomic.Int64
	c := rawBorrower(t, rt, &released)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		ping := (&control.Message{Kind: control.KindPing}).Encode()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if _, err := c.Write(ping); err != nil {
				return
			}
		}
	}()
	eventually(t, func() bool { return released.Load() == 1 }, "the deaf borrower is dropped")
	eventually(t, func() bool { s := rt.Stats(); return s.PeersLost == 1 && s.Peers == 0 }, "counted as lost")
}

// A peer that sends more requests than its window of MaxUnanswered without
// reading the answers is closed; the runtime's memory does not follow the
// flood.
func TestSocketsPeerAskingPastItsWindowIsClosed(t *testing.T) {
	rt := socketRuntime(t, "owner")
	var released atomic.Int64
	ref, _ := putOne(t, rt, "", &released)
	defer ref.Release()
	before := settledRSS(t)
	c, _ := rawConn(t, rt)
	const asks = 8 * control.MaxUnanswered
	w := bufio.NewWriter(c)
	written := 0
	for i := 1; i <= asks; i++ {
		m := &control.Message{Kind: control.KindIdentity, ID: uint64(i)}
		if _, err := w.Write(m.Encode()); err != nil {
			break
		}
		written++
	}
	w.Flush()
	eventually(t, func() bool { s := rt.Stats(); return s.PeersLost == 1 && s.Peers == 0 }, "the peer is closed")
	assert.Less(t, rssBytes(t, os.Getpid())-before, int64(memoryBound))
	t.Logf("wrote %d of %d requests before the runtime closed the connection", written, asks)
}

// Two runtimes that keep each other's readers busy in both directions stay
// connected: neither reader waits on a write (the deadlock this once was is
// in tests/multiprocess's two-way tests, under load).
func TestSocketsTwoWayBorrowFlood(t *testing.T) {
	a := socketRuntime(t, "a", func(o *Options) { o.PeerTimeout = time.Second })
	b := socketRuntime(t, "b", func(o *Options) { o.PeerTimeout = time.Second })
	var released atomic.Int64
	refA, _ := putOne(t, a, "", &released)
	defer refA.Release()
	refB, _ := putOne(t, b, "", &released)
	defer refB.Release()
	bytesA, err := refA.Serialize()
	require.NoError(t, err)
	bytesB, err := refB.Serialize()
	require.NoError(t, err)
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	loop := func(rt *Runtime, b []byte) {
		defer wg.Done()
		for time.Now().Before(stop) {
			r, err := rt.Deserialize(b)
			if err == nil {
				err = r.Release()
			}
			if err != nil {
				errs <- err
				return
			}
		}
	}
	for i := 0; i < 2; i++ {
		wg.Add(2)
		go loop(a, bytesB)
		go loop(b, bytesA)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Zero(t, a.Stats().PeersLost)
	assert.Zero(t, b.Stats().PeersLost)
	eventually(t, func() bool { return a.Stats().Borrows == 0 && b.Stats().Borrows == 0 }, "every borrow returned")
}

// Every asynchronous borrow is answered exactly once, whatever the
// connection does meanwhile: by the owner, by the connection's end, or by
// the caller's deadline. (An answer twice would count a refused borrow
// twice in the borrower's books.)
func TestSocketsBorrowAnsweredOnce(t *testing.T) {
	var twice, never atomic.Int64
	for round := 0; round < 200; round++ {
		owner := socketRuntime(t, "owner")
		borrower := socketRuntime(t, "borrower")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		peer, err := borrower.ep.Connect(ctx, owner.Address())
		require.NoError(t, err)
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 300; i++ {
					var calls atomic.Int32
					answered := make(chan struct{})
					peer.BorrowAsync(ctx, transport.RandomID(), 1, func(error) {
						if calls.Add(1) == 1 {
							close(answered)
						} else {
							twice.Add(1)
						}
					})
					select {
					case <-answered:
					case <-time.After(10 * time.Second):
						never.Add(1)
					}
				}
			}()
		}
		time.Sleep(time.Duration(round%5) * time.Millisecond)
		owner.Destroy()
		wg.Wait()
		cancel()
	}
	assert.Zero(t, twice.Load(), "borrows answered twice")
	assert.Zero(t, never.Load(), "borrows never answered")
}
