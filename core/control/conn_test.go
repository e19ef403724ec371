package control

import (
	"bufio"
	"context"
	"encoding/binary"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

const memoryBound = 64 << 20

func TestSocketsCorruptFramesCloseOnlyThatConnection(t *testing.T) {
	svc, ep := listenStub(t, "victim")
	obj := svc.put()
	cases := map[string][]byte{
		"oversized frame": binary.LittleEndian.AppendUint32(nil, MaxFrame+1),
		"tiny frame":      binary.LittleEndian.AppendUint32(nil, 2),
		"unknown kind":    append(binary.LittleEndian.AppendUint32(nil, 9), append([]byte{200}, make([]byte, 8)...)...),
		"truncated borrow": func() []byte {
			f := (&Message{Kind: KindBorrow, ID: 1, Object: transport.ID{1}}).Encode()
			binary.LittleEndian.PutUint32(f, uint32(len(f)-4-3))
			return f[:len(f)-3]
		}(),
		"handshake again": (&Message{Kind: KindHello, Nonce: transport.NewNonce()}).Encode(),
	}
	for name, frame := range cases {
		c, rd := rawConn(t, ep)
		_, err := c.Write(frame)
		require.NoError(t, err, name)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = ReadFrame(rd, nil, MaxFrame)
		assert.Error(t, err, "%s: the runtime closes the connection", name)
	}
	// Still serving: a well-behaved request on a fresh connection works.
	c, rd := rawConn(t, ep)
	resp := ask(t, c, rd, &Message{Kind: KindLease, ID: 7, Object: obj})
	assert.Equal(t, transport.OK, resp.Status)
	// And a request for an unknown object gets an error reply, not a hang.
	resp = ask(t, c, rd, &Message{Kind: KindBorrow, ID: 8, Object: transport.ID{9, 9}})
	assert.Equal(t, transport.ErrNotFound, resp.Status)
}

// rawBorrower puts an object in svc and has a raw peer borrow it, so that
// svc counts one borrow, which goes when the control plane reports that
// peer gone.
func rawBorrower(t *testing.T, svc *stubService, ep Endpoint) net.Conn {
	obj := svc.put()
	c, rd := rawConn(t, ep)
	resp := ask(t, c, rd, &Message{Kind: KindBorrow, ID: 1, Object: obj})
	require.Equal(t, transport.OK, resp.Status)
	require.Equal(t, uint64(1), svc.Borrows())
	return c
}

func TestSocketsSilentPeerTimesOut(t *testing.T) {
	svc, ep := listenStub(t, "watcher", func(c *ListenConfig) { c.PeerTimeout = 200 * time.Millisecond })
	rawBorrower(t, svc, ep)
	// The raw peer never answers pings: it is declared gone, and its borrow
	// with it.
	eventually(t, func() bool { return svc.Borrows() == 0 }, "silent borrower dropped")
}

// A peer that keeps writing (pings) but never reads is not alive as far as
// the control plane goes: its pings prove nothing about ours, which stay
// unanswered. It is dropped within about the peer timeout and counted as
// lost, with its borrow.
func TestSocketsPeerThatPingsButNeverReadsIsDropped(t *testing.T) {
	svc, ep := listenStub(t, "watcher", func(c *ListenConfig) { c.PeerTimeout = 300 * time.Millisecond })
	c := rawBorrower(t, svc, ep)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		ping := (&Message{Kind: KindPing}).Encode()
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
	eventually(t, func() bool { return svc.Borrows() == 0 }, "the deaf borrower is dropped")
	eventually(t, func() bool { return ep.PeersLost() == 1 && ep.NumPeers() == 0 }, "counted as lost")
}

// A peer that reads slowly, far behind what it asked for, is alive: it
// reports what it read in its pings, and it stays connected however long
// a round trip behind its backlog would take. (Judged by round trips, a
// ping waiting behind the answers below was "unanswered" after the peer
// timeout, and a live peer was dropped.)
func TestSocketsSlowReaderFarBehindStays(t *testing.T) {
	const timeout = 300 * time.Millisecond
	svc, ep := listenStub(t, "owner", func(c *ListenConfig) { c.PeerTimeout = timeout })
	svc.put()
	c, _ := rawConn(t, ep)
	// Requests first, the answers read afterwards at a trickle; each
	// answer names the owner, so they are some hundreds of KiB together.
	const asks = MaxUnanswered
	var batch []byte
	for i := 1; i <= asks; i++ {
		batch = append(batch, (&Message{Kind: KindIdentity, ID: uint64(i)}).Encode()...)
	}
	_, err := c.Write(batch)
	require.NoError(t, err)
	tr := &trickle{c: c, chunk: 4096, every: 10 * time.Millisecond}
	slow := bufio.NewReaderSize(tr, 4096)
	// The reader proves it is alive as a runtime's liveness loop does: on a
	// ticker of its own, saying how far it has read, however long one
	// answer takes to trickle in.
	stopPings := make(chan struct{})
	pinged := make(chan error, 1)
	go func() {
		tick := time.NewTicker(timeout / 4)
		defer tick.Stop()
		for {
			select {
			case <-stopPings:
				pinged <- nil
				return
			case <-tick.C:
				if _, err := c.Write((&Message{Kind: KindPing, Count: tr.read.Load()}).Encode()); err != nil {
					pinged <- err
					return
				}
			}
		}
	}()
	start := time.Now()
	answers := 0
	var buf []byte
	var read uint64
	for answers < asks {
		b, err := ReadFrame(slow, buf, MaxFrame)
		require.NoError(t, err, "after %d answers", answers)
		buf = b
		read += uint64(4 + len(b))
		m, err := DecodeMessage(b)
		require.NoError(t, err)
		if m.Kind == KindResponse {
			answers++
		}
	}
	close(stopPings)
	require.NoError(t, <-pinged, "a ping failed: the owner gave up on a reader that was alive")
	took := time.Since(start)
	t.Logf("read %d answers (%d bytes) in %v with a peer timeout of %v", answers, read, took.Round(time.Millisecond), timeout)
	require.Greater(t, took, 3*timeout, "the answers must take several peer timeouts to read for the test to mean anything")
	assert.Zero(t, ep.PeersLost())
	assert.Equal(t, 1, ep.NumPeers())
}

// trickle reads at most chunk bytes every so often: a reader far behind.
// read counts the bytes read from the connection.
type trickle struct {
	c     net.Conn
	chunk int
	every time.Duration
	read  atomic.Uint64
}

func (r *trickle) Read(p []byte) (int, error) {
	time.Sleep(r.every)
	n, err := r.c.Read(p[:min(len(p), r.chunk)])
	r.read.Add(uint64(n))
	return n, err
}

// A connection lost takes the peer with it, even while another connection
// to it lives: what the lost one carried (unborrows here) may be gone with
// it, and a peer kept on the other would keep borrows nobody returns.
func TestSocketsLostConnectionTakesThePeer(t *testing.T) {
	s := newTwoStubs(t, "b")
	a, epA, epB := s.owner, s.ownerEP, s.otherEP
	s.borrow(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	second, err := epB.(*sockEndpoint).dial(ctx, epA.Address())
	require.NoError(t, err)
	eventually(t, func() bool { return epA.(*sockEndpoint).numConns() == 2 }, "two connections from b to a")
	require.Equal(t, uint64(1), a.Borrows())
	second.c.Close() // lost, as a broken link is: no closing notice
	eventually(t, func() bool { return a.Borrows() == 0 }, "b's borrow dropped with it")
	eventually(t, func() bool { return epA.NumPeers() == 0 && epB.NumPeers() == 0 }, "both connections closed")
}

// A peer that sends more requests than its window of MaxUnanswered without
// reading the answers is closed; the runtime's memory does not follow the
// flood.
func TestSocketsPeerAskingPastItsWindowIsClosed(t *testing.T) {
	svc, ep := listenStub(t, "owner")
	svc.put()
	before := transporttest.SettledResidentBytes(t)
	c, _ := rawConn(t, ep)
	const asks = 8 * MaxUnanswered
	w := bufio.NewWriter(c)
	written := 0
	for i := 1; i <= asks; i++ {
		m := &Message{Kind: KindIdentity, ID: uint64(i)}
		if _, err := w.Write(m.Encode()); err != nil {
			break
		}
		written++
	}
	w.Flush()
	eventually(t, func() bool { return ep.PeersLost() == 1 && ep.NumPeers() == 0 }, "the peer is closed")
	assert.Less(t, transporttest.ResidentBytes(t, os.Getpid())-before, int64(memoryBound))
	t.Logf("wrote %d of %d requests before the runtime closed the connection", written, asks)
}

// Two runtimes that keep each other's readers busy in both directions stay
// connected: neither reader waits on a write (the deadlock this once was is
// in tests/multiprocess's two-way tests, under load). Each borrows the
// other's object and returns it, over and over, as deserializing a ref and
// releasing it does; waiting for each borrow's answer paces the loops
// about as a runtime's own work on each ref does.
func TestSocketsTwoWayBorrowFlood(t *testing.T) {
	second := func(c *ListenConfig) { c.PeerTimeout = time.Second }
	a, epA := listenStub(t, "a", second)
	b, epB := listenStub(t, "b", second)
	objA, objB := a.put(), b.put()
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	var sent atomic.Int64
	// As a runtime deserializing refs does: the borrow goes out without
	// waiting for its answer, and the unborrow right behind it.
	loop := func(ep Endpoint, address string, obj transport.ObjectID) {
		defer wg.Done()
		peer, err := connectTo(ep, address)
		if err != nil {
			errs <- err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var failed atomic.Pointer[error]
		for time.Now().Before(stop) && failed.Load() == nil {
			peer.BorrowAsync(ctx, obj, 0, func(err error) {
				if err != nil {
					failed.CompareAndSwap(nil, &err)
				}
			})
			peer.Unborrow(obj, 1)
			sent.Add(1)
		}
		if err := failed.Load(); err != nil {
			errs <- *err
		}
	}
	for i := 0; i < 2; i++ {
		wg.Add(2)
		go loop(epA, epB.Address(), objB)
		go loop(epB, epA.Address(), objA)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d borrows and unborrows sent", sent.Load())
	assert.Zero(t, epA.PeersLost())
	assert.Zero(t, epB.PeersLost())
	eventually(t, func() bool { return a.Borrows() == 0 && b.Borrows() == 0 }, "every borrow returned")
}

// A peer that keeps every handler of a connection busy does not stop the
// connection's reader: requests past the handlers wait, and what needs no
// handler (a lease here; heartbeats, cancels and answers alike) is served
// at once. Once the handlers finish, every waiting request is answered.
func TestBusyHandlersDoNotStopTheReader(t *testing.T) {
	svc, ep := listenStub(t, "owner")
	gate := make(chan struct{})
	svc.mu.Lock()
	svc.slowMeta = gate
	svc.mu.Unlock()
	var open sync.Once
	defer open.Do(func() { close(gate) }) // a failed check must not hang the runtime's end
	obj := svc.put()
	unixPath, _, _ := endpoints(t, ep)
	c, err := net.Dial("unix", unixPath)
	require.NoError(t, err)
	defer c.Close()
	rd, err := rawHandshake(c, newRawPeer(), "")
	require.NoError(t, err)

	const asks = MaxHandlers + 100
	for i := 1; i <= asks; i++ {
		_, err := c.Write((&Message{Kind: KindMetadata, ID: uint64(i), Object: obj, Transport: "slowmeta"}).Encode())
		require.NoError(t, err)
	}
	_, err = c.Write((&Message{Kind: KindLease, ID: asks + 1, Object: obj}).Encode())
	require.NoError(t, err)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := Expect(rd, KindResponse)
	require.NoError(t, err, "the lease is answered while every handler is busy")
	assert.Equal(t, uint64(asks+1), resp.ID)
	assert.Equal(t, transport.OK, resp.Status)

	open.Do(func() { close(gate) })
	answered := map[uint64]bool{}
	for len(answered) < asks {
		resp, err := Expect(rd, KindResponse)
		require.NoError(t, err, "after %d metadata answers", len(answered))
		assert.Equal(t, transport.OK, resp.Status, "%s", resp.Text)
		answered[resp.ID] = true
	}
}

// waitForEnds waits until owner was told n write ends, and returns them.
func waitForEnds(t *testing.T, owner *stubService, n int, msg string) []WriteEnd {
	owner.eventually(t, func() bool { return len(owner.writeEnds) == n }, msg)
	owner.mu.Lock()
	defer owner.mu.Unlock()
	return slices.Clone(owner.writeEnds)
}

func TestSocketsWriteOpenAndDoneReachTheOwner(t *testing.T) {
	s := newTwoStubs(t, "writer")
	owner, obj, peer := s.owner, s.obj, s.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	pieces := []transport.Piece{{Tensor: 2, Offset: 64, Length: 128}}
	wrong := WriteOpen{Object: obj, TransferID: 1, Transport: "cma", Key: [16]byte{'x'}, Tag: 9}
	adm, err := peer.OpenWrite(ctx, wrong)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "the owner's refusal comes back")
	assert.Nil(t, adm.Meta, "a refused write gets no metadata")
	req := WriteOpen{Object: obj, TransferID: 2, Transport: "cma", Key: stubWriteKey, Tag: 9, Pieces: pieces}
	adm, err = peer.OpenWrite(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, "meta of cma", string(adm.Meta), "the admission carries the object's metadata")
	assert.Zero(t, adm.Runs, "a write admitted on its own covers itself only")
	peer.WriteDone(WriteEnd{Object: obj, TransferID: 2, Err: transport.Errorf(transport.ErrAborted, "stopped")})

	owner.eventually(t, func() bool {
		_, done := owner.writesDone[2]
		return done
	}, "the done notice arrives")
	owner.mu.Lock()
	defer owner.mu.Unlock()
	got := owner.writes[2]
	assert.Equal(t, uint64(9), got.Tag)
	assert.Equal(t, pieces, got.Pieces)
	assert.Equal(t, transport.ErrAborted, owner.writesDone[2])
	assert.NotContains(t, owner.writes, uint64(1), "a refused write is not recorded")
}

func TestSocketsStandingAdmissionRunsAndWithdrawal(t *testing.T) {
	s := newTwoStubs(t, "writer")
	owner, writer, obj, peer := s.owner, s.other, s.obj, s.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	adm, err := peer.OpenWrite(ctx, WriteOpen{Object: obj, TransferID: 3, Transport: "cma", Key: stubWriteKey, Standing: true})
	require.NoError(t, err)
	assert.Equal(t, uint64(7), adm.Runs, "a standing admission says how many runs it covers")
	peer.WriteDone(WriteEnd{Object: obj, TransferID: 3, Tag: 41, Keep: true})
	peer.WriteDone(WriteEnd{Object: obj, TransferID: 3, Tag: 42, Err: transport.Errorf(transport.ErrTimeout, "late")})
	peer.WriteDone(WriteEnd{Object: obj, TransferID: 3, Close: true})
	ends := waitForEnds(t, owner, 3, "every end arrives, in order")
	owner.mu.Lock()
	assert.True(t, owner.writes[3].Standing, "the admission was asked to stand")
	owner.mu.Unlock()
	assert.Equal(t, WriteEnd{Object: obj, TransferID: 3, Tag: 41, Keep: true}, ends[0])
	assert.Equal(t, uint64(42), ends[1].Tag)
	assert.False(t, ends[1].Keep)
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(ends[1].Err), "a failed run's status travels")
	assert.Contains(t, ends[1].Err.Error(), "the writer reported: late")
	assert.True(t, ends[2].Close)

	// The owner reaches the writer over the connection the writer made.
	back, err := connectTo(s.ownerEP, writer.Identity().Address)
	require.NoError(t, err)
	back.WithdrawWrite(obj, 3, transport.Errorf(transport.ErrPermissionDenied, "revoked"))
	writer.eventually(t, func() bool {
		_, ok := writer.withdrawn[3]
		return ok
	}, "the withdrawal reaches the writer")
	writer.mu.Lock()
	defer writer.mu.Unlock()
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(writer.withdrawn[3]))
}

// A write run is in the socket when WriteRun returns, behind what was
// sent before it: on an idle connection the caller writes it itself, even
// a caller that cannot wait; while the connection is busy (its writes
// held, here) a caller that cannot wait is refused with nothing sent, and
// one that can waits under its deadline, the run going out once writes
// resume.
func TestSocketsWriteRunIsWrittenBeforeItReturns(t *testing.T) {
	s := newTwoStubs(t, "writer")
	owner, obj, peer := s.owner, s.obj, s.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := peer.OpenWrite(ctx, WriteOpen{Object: obj, TransferID: 3, Transport: "cma", Key: stubWriteKey, Tag: 40, Standing: true})
	require.NoError(t, err)

	ended, stop := context.WithCancel(context.Background())
	stop()
	peer.WriteDone(WriteEnd{Object: obj, TransferID: 3, Tag: 40, Keep: true})
	// Idle, the connection takes the run at once; while its writer
	// goroutine writes (a ping, the done above) the caller is refused with
	// nothing sent, and tries again.
	require.Eventually(t, func() bool { return peer.WriteRun(ended, obj, 3, 41) == nil }, 10*time.Second, time.Millisecond,
		"an idle connection takes the run at once")
	peer.WriteDone(WriteEnd{Object: obj, TransferID: 3, Tag: 41, Keep: true})

	resume, ok := HoldWrites(peer)
	require.True(t, ok)
	err = peer.WriteRun(ended, obj, 3, 99)
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "a caller that cannot wait is refused: %v", err)
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	err = peer.WriteRun(short, obj, 3, 42)
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "the deadline bounds the wait: %v", err)
	resume()
	require.NoError(t, peer.WriteRun(ctx, obj, 3, 43))

	owner.eventually(t, func() bool { return len(owner.writeOrder) == 5 }, "every run and end arrives")
	owner.mu.Lock()
	defer owner.mu.Unlock()
	assert.Equal(t, []string{"done 40", "run 41", "done 41", "run 42", "run 43"}, owner.writeOrder,
		"in the order sent; the refused run never went")
}

func TestPanicInAnswerIsInternal(t *testing.T) {
	svc, ep := listenStub(t, "owner")
	obj := svc.put()
	c, rd := rawConn(t, ep)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	// Answered inline by the reader, and on a handler's goroutine.
	for i, m := range []*Message{
		{Kind: KindBorrow, ID: 1, Object: obj, Token: panicToken},
		{Kind: KindMetadata, ID: 2, Object: obj, Transport: "panics"},
	} {
		resp := ask(t, c, rd, m)
		assert.Equal(t, transport.ErrInternal, resp.Status, "request %d: %s", i, resp.Text)
		assert.Contains(t, resp.Text, "panicked")
	}
	resp := ask(t, c, rd, &Message{Kind: KindLease, ID: 3, Object: obj})
	assert.Equal(t, transport.OK, resp.Status, "the connection serves on: %s", resp.Text)
}

// A writer that stops waiting for its admission may be admitted all the
// same: the admission is ended as soon as it arrives, so the owner does
// not hold it open (and its object pinned) for as long as the connection
// lives. A standing admission is closed the same way.
func TestAnAdmissionNobodyWaitsForIsEnded(t *testing.T) {
	s := newTwoStubs(t, "writer")
	owner, obj, peer := s.owner, s.obj, s.connect(t)
	gate := make(chan struct{})
	owner.mu.Lock()
	owner.slowOpen = gate
	owner.mu.Unlock()
	for i, standing := range []bool{false, true} {
		id := uint64(10 + i)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err := peer.OpenWrite(ctx, WriteOpen{Object: obj, TransferID: id, Transport: "cma", Key: stubWriteKey, Tag: 5, Standing: standing})
		cancel()
		assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
	}
	close(gate) // the owner admits both now
	for _, end := range waitForEnds(t, owner, 2, "both admissions are ended") {
		if end.TransferID == 10 {
			assert.Equal(t, transport.ErrAborted, transport.StatusOf(end.Err), "the write ends failed: nothing was written")
			assert.False(t, end.Close)
		} else {
			assert.True(t, end.Close, "the standing admission is closed without a run")
		}
	}
}
