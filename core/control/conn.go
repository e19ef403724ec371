package control

import (
	"bufio"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

const (
	// MaxHandlers bounds the requests of one connection served on their
	// own goroutines (metadata, sends, group joins). Past it requests wait
	// in a queue of at most maxQueued requests (maxQueuedBytes of payload)
	// and are refused with NO_MEMORY beyond that: the connection's reader
	// never waits for a handler, so heartbeats, cancels and answers to our
	// own requests keep flowing while a peer keeps us busy.
	MaxHandlers    = 256
	maxQueued      = 4096
	maxQueuedBytes = 16 << 20
	// keepFrameBuffer is the largest read buffer a connection keeps between
	// frames; a bigger one (a large metadata reply) is dropped after use.
	keepFrameBuffer = 1 << 20
	// connReadBuffer is the buffer an authenticated connection reads
	// through: many small frames (pings, borrows) to a read.
	connReadBuffer = 64 << 10

	// MaxConnsPerPeer bounds the connections a runtime accepts from one
	// peer runtime (a proven id), and maxConns all its connections
	// together: each holds two goroutines and up to about 100 KiB of
	// buffers, and with the token a new identity costs one handshake. Past
	// either, a handshake is refused with NO_MEMORY. Honest peers hold one
	// connection per pair of runtimes, two while both dial at once, a few
	// more when a peer is reached through addresses that differ.
	MaxConnsPerPeer = 8
)

var maxConns = 4096 // a variable for tests

// newConn registers an authenticated connection; run sets it going.
// An accepted one (accepted) is refused past MaxConnsPerPeer or maxConns.
func (ep *sockEndpoint) newConn(watch *socketWatch, rd *bufio.Reader, remote transport.PeerInfo, isTCP, accepted bool) (*sconn, error) {
	c := watch.Conn
	sc := &sconn{
		ep: ep, c: c, watch: watch, rd: rd, remote: remote, peerID: remote.RuntimeID, isTCP: isTCP,
		pending: map[uint64]chan *Message{}, replies: map[uint64]func(*Message){},
		handlers: map[uint64]context.CancelFunc{}, done: make(chan struct{}),
		out: newOutbox(), slots: make(chan struct{}, MaxUnanswered),
	}
	sc.ctx, sc.cancel = context.WithCancel(context.Background())
	sc.lastSeen.Store(time.Now().UnixNano())
	sc.progress.Store(time.Now().UnixNano())
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.closed {
		c.Close()
		return nil, transport.Errorf(transport.ErrClosed, "runtime is destroyed")
	}
	if accepted {
		if n := ep.perPeer[remote.RuntimeID]; n >= MaxConnsPerPeer {
			return nil, transport.Errorf(transport.ErrNoMemory, "runtime %s already holds %d connections from peer %s, the most one peer may open", ep.id, n, remote)
		}
		if len(ep.conns) >= maxConns {
			return nil, transport.Errorf(transport.ErrNoMemory, "runtime %s already holds %d connections, the most it keeps", ep.id, len(ep.conns))
		}
	}
	ep.conns[sc] = struct{}{}
	ep.perPeer[remote.RuntimeID]++
	if key := transport.StripAddressKeys(remote.Address); AddressNames(key, remote.RuntimeID) && ep.byAddr[key] == nil {
		ep.byAddr[key] = sc
	}
	return sc, nil
}

// run starts a registered connection's reader and writer. What was
// queued for it before goes out first.
func (sc *sconn) run() {
	sc.ep.wg.Add(2)
	go func() {
		defer sc.ep.wg.Done()
		sc.readLoop()
	}()
	go func() {
		defer sc.ep.wg.Done()
		sc.writeLoop()
	}()
}

// removeConn forgets a closed connection; the peer is gone once its last
// connection is. A lost connection takes the peer's others with it:
// notices it carried (unborrows) may be lost with it, and borrows are
// counted per runtime, so keeping the peer on another connection would
// keep borrows nobody returns.
func (ep *sockEndpoint) removeConn(sc *sconn, lost bool) {
	remote := sc.Info()
	ep.mu.Lock()
	if _, ok := ep.conns[sc]; !ok {
		ep.mu.Unlock()
		return
	}
	delete(ep.conns, sc)
	var others []*sconn
	if lost {
		for c := range ep.conns {
			if c.peerID == remote.RuntimeID {
				others = append(others, c)
			}
		}
	}
	for addr, c := range ep.byAddr {
		if c == sc {
			delete(ep.byAddr, addr)
		}
	}
	id := remote.RuntimeID
	ep.perPeer[id]--
	gone := ep.perPeer[id] <= 0
	if gone {
		delete(ep.perPeer, id)
	}
	closed := ep.closed
	ep.mu.Unlock()
	for _, c := range others {
		c.close(transport.Errorf(transport.ErrPeerUnavailable, "another connection to %s was lost", remote))
	}
	if gone && !closed {
		ep.cfg.Service.PeerGone(remote)
	}
}

func (ep *sockEndpoint) heartbeat() {
	defer ep.wg.Done()
	t := time.NewTicker(ep.cfg.PeerTimeout / 4)
	defer t.Stop()
	for {
		select {
		case <-ep.stop:
			return
		case <-t.C:
		}
		ep.mu.Lock()
		conns := make([]*sconn, 0, len(ep.conns))
		for sc := range ep.conns {
			conns = append(conns, sc)
		}
		ep.mu.Unlock()
		now := time.Now()
		for _, sc := range conns {
			sc.checkLiveness(now)
		}
	}
}

// sconn is one authenticated connection to a peer runtime, usable in both
// directions. It implements Peer.
type sconn struct {
	ep     *sockEndpoint
	c      net.Conn
	rd     *bufio.Reader
	isTCP  bool
	nextID atomic.Uint64

	// What the writer goroutine writes (outbox.go); wmu is held around
	// each write.
	omu sync.Mutex
	out outbox
	wmu sync.Mutex
	// One token per request of ours awaiting an answer (MaxUnanswered).
	slots chan struct{}

	// A ping or pong queued or being written: at most one of each per
	// connection, whatever the peer sends and however long it does not
	// read.
	pinging, ponging atomic.Bool
	// Liveness (liveness.go): bytes of frames our writer wrote and our
	// reader read; what the peer last reported reading of ours, and when
	// that last showed progress; when the heartbeat last saw our reader
	// behind (only the heartbeat uses behindAt).
	watch     *socketWatch
	written   atomic.Uint64
	readBytes atomic.Uint64
	peerRead  atomic.Uint64
	progress  atomic.Int64
	behindAt  int64

	peerID transport.RuntimeID // proven at the handshake: never changes
	mu     sync.Mutex
	remote transport.PeerInfo
	// Where the answers to our requests go: calls' channels, asynchronous
	// requests' callbacks. Both nil once the connection closed (and close
	// answered what they held).
	pending  map[uint64]chan *Message
	replies  map[uint64]func(*Message)
	handlers map[uint64]context.CancelFunc
	closeErr error
	// Requests served on their own goroutines: how many run, and those
	// waiting for one of them to finish (see MaxHandlers).
	running     int
	queued      []queuedRequest
	queuedBytes int

	lastSeen  atomic.Int64
	done      chan struct{}
	closeOnce sync.Once
	clean     atomic.Bool     // closed by either side's shutdown, not lost
	ctx       context.Context // cancelled when the connection closes
	cancel    context.CancelFunc
}

func (sc *sconn) isClosed() bool {
	select {
	case <-sc.done:
		return true
	default:
		return false
	}
}

// closeClean closes a connection that ends because either runtime shuts
// down: the peer was not lost.
func (sc *sconn) closeClean(err error) {
	sc.clean.Store(true)
	sc.close(err)
}

func (sc *sconn) close(err error) {
	sc.closeOnce.Do(func() {
		lost := !sc.clean.Load() && !sc.ep.closing.Load()
		sc.mu.Lock()
		sc.closeErr = err
		pending, replies := sc.pending, sc.replies
		sc.pending, sc.replies = nil, nil
		sc.mu.Unlock()
		// Done closes before the socket does: a runtime that told us it is
		// closing frees its objects once it sees our end close, and by then
		// every transfer that checks Done must see it closed (see
		// KindClosing).
		close(sc.done)
		// Counted once done is closed: whoever sees the count sees a
		// closed connection, and Connect dials anew.
		if lost {
			sc.ep.lost.Add(1)
		}
		sc.cancel()
		sc.c.Close()
		for _, ch := range pending {
			close(ch)
		}
		for _, reply := range replies {
			reply(nil)
		}
		sc.ep.cfg.Log.Debugf("control plane: connection to %s closed: %v", sc.remote, err)
		sc.ep.removeConn(sc, lost)
	})
}

// queuedRequest is a request waiting for a handler goroutine.
type queuedRequest struct {
	run  func()
	size int
}

// serve runs a request's handler on its own goroutine, or queues it while
// MaxHandlers run (see there). It never blocks the reader.
func (sc *sconn) serve(m *Message, run func()) {
	run = sc.protect(m, run)
	size := len(m.Data) + 64
	sc.mu.Lock()
	switch {
	case sc.running < MaxHandlers:
		sc.running++
		sc.mu.Unlock()
		go sc.handle(run)
	case len(sc.queued) < maxQueued && sc.queuedBytes+size <= maxQueuedBytes:
		sc.queued = append(sc.queued, queuedRequest{run, size})
		sc.queuedBytes += size
		sc.mu.Unlock()
	default:
		waiting := len(sc.queued)
		sc.mu.Unlock()
		sc.answerInline(response(m.ID, nil, transport.Errorf(transport.ErrNoMemory, "%d requests are in progress and %d wait on this connection; %s refused", MaxHandlers, waiting, m.Kind)))
	}
}

// handle runs handlers, the given one and then queued ones, until none
// waits.
func (sc *sconn) handle(run func()) {
	for run != nil {
		run()
		run = nil
		sc.mu.Lock()
		if len(sc.queued) > 0 && !sc.isClosed() {
			next := sc.queued[0]
			sc.queued[0] = queuedRequest{}
			sc.queued = sc.queued[1:]
			sc.queuedBytes -= next.size
			run = next.run
		} else {
			sc.running--
			sc.queued, sc.queuedBytes = nil, 0
		}
		sc.mu.Unlock()
	}
}

func (sc *sconn) gone() error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return transport.Errorf(transport.ErrPeerUnavailable, "peer %s is gone: %v", sc.remote, sc.closeErr)
}

// call sends a request and waits for its response. A call given up
// (ctx ended) keeps its slot until the answer arrives: the slots bound
// the answers in flight, which the peer counts on.
func (sc *sconn) call(ctx context.Context, m *Message) (*Message, error) {
	ch := make(chan *Message, 1)
	if err := sc.start(ctx, m, ch, nil); err != nil {
		return nil, err
	}
	select {
	case resp, ok := <-ch:
		return sc.answer(resp, ok)
	case <-ctx.Done():
		// The answer still comes (its channel has room for it) and
		// frees the slot.
		return nil, sc.givenUp(ctx, m)
	}
}

// callOr is call for a request whose answer matters even once its caller
// stopped waiting (an admission, which must then be ended): late gets the
// answer when it arrives, or nil when the connection ends first.
func (sc *sconn) callOr(ctx context.Context, m *Message, late func(*Message)) (*Message, error) {
	ch := make(chan *Message, 1)
	var mu sync.Mutex
	gaveUp := false
	err := sc.start(ctx, m, nil, func(resp *Message) {
		mu.Lock()
		defer mu.Unlock()
		if gaveUp {
			late(resp)
		} else {
			ch <- resp
		}
	})
	if err != nil {
		return nil, err
	}
	select {
	case resp := <-ch:
		return sc.answer(resp, resp != nil)
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case resp := <-ch: // answered as the wait ended: taken after all
		return sc.answer(resp, resp != nil)
	default:
		gaveUp = true
		return nil, sc.givenUp(ctx, m)
	}
}

// answer is a call's outcome: the response, the peer's error, or the
// connection's end (ok false).
func (sc *sconn) answer(resp *Message, ok bool) (*Message, error) {
	if !ok {
		return nil, sc.gone()
	}
	if resp.Status != transport.OK {
		return nil, &transport.Error{Status: resp.Status, Msg: resp.Text}
	}
	return resp, nil
}

// givenUp is the error of a call its caller gave up on when ctx ended; a
// long request is told to stop.
func (sc *sconn) givenUp(ctx context.Context, m *Message) error {
	if m.Kind == KindSend || m.Kind == KindGroupJoin {
		sc.postNow(&Message{Kind: KindCancel, Target: m.ID})
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return transport.Errorf(transport.ErrTimeout, "%s request to %s timed out", m.Kind, sc.Info())
	}
	return transport.Errorf(transport.ErrAborted, "%s request to %s was cancelled", m.Kind, sc.Info())
}

// start takes a slot for request m, registers where its answer goes (ch
// for a call, reply for an asynchronous request) and queues it. An error
// means nothing was registered and nothing will answer; after nil exactly
// one answer comes: the peer's, or nil (ch closed) when the connection
// ends first.
func (sc *sconn) start(ctx context.Context, m *Message, ch chan *Message, reply func(*Message)) error {
	if err := sc.acquireSlot(ctx, m.Kind); err != nil {
		return err
	}
	m.ID = sc.nextID.Add(1)
	sc.mu.Lock()
	if sc.pending == nil { // closed
		sc.mu.Unlock()
		sc.releaseSlot()
		return sc.gone()
	}
	if ch != nil {
		sc.pending[m.ID] = ch
	} else {
		sc.replies[m.ID] = reply
	}
	sc.mu.Unlock()
	if err := sc.post(ctx, m); err != nil && sc.forget(m.ID) {
		return err
	}
	// Queued, or the connection closed meanwhile and answered it.
	return nil
}

// forget drops a request that was never sent, and its slot. False: the
// connection closed first and answered it.
func (sc *sconn) forget(id uint64) bool {
	sc.mu.Lock()
	_, isCall := sc.pending[id]
	_, isAsync := sc.replies[id]
	delete(sc.pending, id)
	delete(sc.replies, id)
	sc.mu.Unlock()
	if isCall || isAsync {
		sc.releaseSlot()
		return true
	}
	return false
}

// response is the answer to request id: resp (nil: an empty one) or err.
func response(id uint64, resp *Message, err error) *Message {
	if resp == nil {
		resp = &Message{}
	}
	resp.Kind, resp.ID = KindResponse, id
	if err != nil {
		resp.Status = transport.StatusOf(err)
		if resp.Status == transport.OK {
			resp.Status = transport.ErrInternal
		}
		resp.Text = err.Error()
		if len(resp.Text) > maxMessageText {
			resp.Text = resp.Text[:maxMessageText]
		}
	}
	return resp
}

// answerLater queues a handler goroutine's answer, waiting for room while
// the connection lives.
func (sc *sconn) answerLater(id uint64, resp *Message, err error) {
	sc.post(sc.ctx, response(id, resp, err))
}

// readLoop reads the peer's messages until the connection fails or the
// peer breaks the protocol, and closes the connection then.
func (sc *sconn) readLoop() {
	var buf []byte
	for {
		m, ok := sc.readMessage(&buf)
		if !ok {
			return
		}
		sc.lastSeen.Store(time.Now().UnixNano())
		if !sc.dispatchProtected(m) {
			return
		}
	}
}

// readMessage reads and decodes one frame, reusing *buf; on failure it
// closes the connection and reports false.
func (sc *sconn) readMessage(buf *[]byte) (*Message, bool) {
	b, err := ReadFrame(sc.rd, *buf, MaxFrame)
	if err != nil {
		if transport.StatusOf(err) == transport.ErrCorrupt {
			sc.ep.cfg.Log.Warnf("control plane: peer %s sent a malformed frame, closing the connection: %v", sc.remote, err)
		}
		sc.close(transport.Errorf(transport.ErrPeerUnavailable, "reading from %s: %v", sc.remote, err))
		return nil, false
	}
	sc.readBytes.Add(uint64(4 + len(b)))
	*buf = b
	if cap(b) > keepFrameBuffer {
		*buf = nil // DecodeMessage copies what it keeps
	}
	m, err := DecodeMessage(b)
	if err != nil {
		sc.ep.cfg.Log.Warnf("control plane: peer %s sent a corrupt Message, closing the connection: %v", sc.remote, err)
		sc.close(err)
		return nil, false
	}
	return m, true
}

// dispatchProtected is dispatch; a panic in the handler of a request is
// answered as an internal error and the connection lives on (a peer must
// not be able to end this process, nor a bug leave a caller waiting).
func (sc *sconn) dispatchProtected(m *Message) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			err := transport.Panicked(sc.ep.cfg.Log, "handling a "+m.Kind.String()+" message of "+sc.remote.String(), r)
			if m.ID != 0 && m.Kind != KindResponse {
				sc.answerInline(response(m.ID, nil, err))
			}
			ok = true
		}
	}()
	return sc.dispatch(m)
}

// protect wraps the handler of request m run on a goroutine of its own: a
// panic in it is answered as an internal error.
func (sc *sconn) protect(m *Message, run func()) func() {
	return func() {
		defer func() {
			if r := recover(); r != nil {
				sc.answerLater(m.ID, nil, transport.Panicked(sc.ep.cfg.Log, "answering a "+m.Kind.String()+" request of "+sc.remote.String(), r))
			}
		}()
		run()
	}
}

// dispatch handles one message: answers a request (the long ones on their
// own goroutines) or delivers a response. An unexpected kind closes the
// connection and reports false.
func (sc *sconn) dispatch(m *Message) bool {
	svc := sc.ep.cfg.Service
	from := sc.Info()
	switch m.Kind {
	case KindResponse:
		sc.deliverResponse(m)
	case KindPing:
		sc.peerReports(m.Count)
		sc.postUrgent(&sc.ponging, KindPong)
	case KindPong:
		sc.peerReports(m.Count)
	case KindIdentity:
		sc.answerInline(response(m.ID, &Message{Peer: sc.ep.identity(sc.isTCP)}, nil))
	case KindBorrow:
		sc.answerInline(response(m.ID, nil, svc.Borrow(from, m.Object, m.Token)))
	case KindUnborrow:
		svc.Unborrow(from.RuntimeID, m.Object, m.Count)
	case KindLease:
		token, err := svc.Lease(from.RuntimeID, m.Object)
		sc.answerInline(response(m.ID, &Message{Token: token}, err))
	case KindMetadata:
		sc.serve(m, func() {
			data, err := svc.Metadata(from.RuntimeID, m.Object, m.Transport)
			sc.answerLater(m.ID, &Message{Data: data}, err)
		})
	case KindSend:
		sc.serveCancellable(m, func(ctx context.Context) (*Message, error) {
			return nil, svc.Send(ctx, from, SendRequest{Object: m.Object, TransferID: m.TransferID, Transport: m.Transport, CMeta: m.Data, Pieces: m.Pieces})
		})
	case KindGroupJoin:
		// Rank 0 answers once every rank joined: a long wait.
		sc.serveCancellable(m, func(ctx context.Context) (*Message, error) {
			data, err := svc.JoinGroup(ctx, from, m.Group)
			return &Message{Data: data}, err
		})
	case KindWriteOpen:
		adm, err := svc.OpenWrite(from, WriteOpen{Object: m.Object, TransferID: m.TransferID,
			Transport: m.Transport, Key: m.WriteKey, Tag: m.Token, Pieces: m.Pieces, Standing: m.Flags&WriteStanding != 0})
		sc.answerInline(response(m.ID, &Message{Data: adm.Meta, Token: adm.Runs}, err))
	case KindWriteDone:
		svc.WriteDone(from.RuntimeID, WriteEnd{Object: m.Object, TransferID: m.TransferID, Err: peerError(m, "the writer reported: "),
			Tag: m.Token, Keep: m.Flags&WriteKeep != 0, Close: m.Flags&WriteClose != 0})
	case KindWriteWithdrawn:
		svc.WriteWithdrawn(from.RuntimeID, m.Object, m.TransferID, peerError(m, "the owner withdrew the admission: "))
	case KindClosing:
		sc.closeClean(transport.Errorf(transport.ErrPeerUnavailable, "runtime %s shut down", sc.remote))
		return false
	case KindCancel:
		sc.mu.Lock()
		cancel := sc.handlers[m.Target]
		sc.mu.Unlock()
		if cancel != nil {
			cancel()
		}
	default:
		sc.ep.cfg.Log.Warnf("control plane: peer %s sent an unexpected %s Message, closing the connection", sc.remote, m.Kind)
		sc.close(transport.Errorf(transport.ErrCorrupt, "unexpected %s message", m.Kind))
		return false
	}
	return true
}

// deliverResponse hands a response to the call or callback waiting for it.
func (sc *sconn) deliverResponse(m *Message) {
	sc.mu.Lock()
	ch, isCall := sc.pending[m.ID]
	delete(sc.pending, m.ID)
	reply, isAsync := sc.replies[m.ID]
	delete(sc.replies, m.ID)
	sc.mu.Unlock()
	if isCall || isAsync {
		sc.releaseSlot()
	}
	if ch != nil {
		ch <- m
	} else if reply != nil {
		reply(m)
	}
}

// serveCancellable answers a long request on its own goroutine under a
// context the peer's KindCancel (or the connection's end) cancels.
func (sc *sconn) serveCancellable(m *Message, run func(ctx context.Context) (*Message, error)) {
	ctx, cancel := context.WithCancel(sc.ctx)
	sc.mu.Lock()
	sc.handlers[m.ID] = cancel
	sc.mu.Unlock()
	sc.serve(m, func() {
		var resp *Message
		var err error
		func() {
			defer func() { // also when run panics
				sc.mu.Lock()
				delete(sc.handlers, m.ID)
				sc.mu.Unlock()
				cancel()
			}()
			resp, err = run(ctx)
		}()
		sc.answerLater(m.ID, resp, err)
	})
}

// HoldWrites stops every write to a socket peer until resume is called, so
// that a test can have a request made but not yet sent; ok is false for a
// peer of another network.
func HoldWrites(p Peer) (resume func(), ok bool) {
	sc, ok := p.(*sconn)
	if !ok {
		return nil, false
	}
	sc.wmu.Lock()
	return sc.wmu.Unlock, true
}

// peerError is the error a one-way message reports (nil for OK): a peer's
// status other than an error's is never taken for success.
func peerError(m *Message, prefix string) error {
	if m.Status == transport.OK {
		return nil
	}
	status := m.Status
	if status > 0 {
		status = transport.ErrTransport
	}
	return &transport.Error{Status: status, Msg: prefix + m.Text}
}
