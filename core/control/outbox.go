package control

import (
	"context"
	"net"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
)

// A connection's frames are written by one writer goroutine, from the
// connection's outbox; nothing else writes to its socket after the
// handshake. The reader only ever queues (answers, pongs) and never waits
// for the writer, so two runtimes that keep each other busy in both
// directions cannot deadlock: each side's reader keeps draining the other
// side's writes. When the reader answered inline under the write lock, two
// readers each blocked writing an answer into the other's full socket
// buffer, neither read again, and both declared a live peer gone once the
// write deadline passed.
//
// Memory stays bounded without making the reader wait:
//   - callers (requests, notices, answers of handler goroutines) wait
//     while maxOutboxBytes are queued: back-pressure falls on them;
//   - a requester keeps at most MaxUnanswered requests awaiting an answer
//     (it waits for a slot), so an honest peer never makes our reader
//     queue more answers than that; a peer that does asks without reading
//     its answers, and the connection is closed;
//   - at most one ping and one pong are queued at a time.
//
// Liveness is judged on whether the peer reads and writes: see
// liveness.go.

const (
	// maxOutboxBytes bounds what callers may queue on one connection
	// (frames being written count until written); past it they wait. A
	// frame larger than the bound is queued once the outbox is empty.
	maxOutboxBytes = 4 << 20
	// MaxUnanswered bounds the requests that await an answer on one
	// connection, in each direction.
	MaxUnanswered = 4096
	// keepFrames bounds the frame arrays kept between batches.
	keepFrames = 1024
)

// frame is one encoded message waiting in the outbox.
type frame struct {
	b []byte
	// inline: an answer the reader queued, counted against MaxUnanswered
	// until the writer takes it.
	inline bool
	// flag, when set, is cleared once the frame is written (the one ping
	// or pong allowed in the outbox).
	flag *atomic.Bool
	// done, when set, is closed once the frame is written (flush).
	done chan struct{}
}

// sender is a connection's writing half: its outbox, the writer goroutine
// that drains it, and the callers that write for it (write). It writes for
// sc: sc's socket, liveness counters and end.
type sender struct {
	sc  *sconn
	mu  sync.Mutex // guards box
	box outbox
	wmu sync.Mutex // held around each write to the socket
	// One token per request of ours awaiting an answer (MaxUnanswered).
	slots chan struct{}
}

func newSender(sc *sconn) sender {
	return sender{sc: sc, box: newOutbox(), slots: make(chan struct{}, MaxUnanswered)}
}

// outbox is the queue the writer goroutine drains.
type outbox struct {
	head    []frame // the rest of a batch a flush began: written first
	urgent  []frame // pings and pongs: written before the queue
	queue   []frame // everything else, in the order it was queued
	bytes   int     // queued or being written
	inline  int     // inline answers queued, not yet taken by the writer
	room    chan struct{}
	wake    chan struct{} // holds a token while the writer has work
	stopped bool          // the writer ended: nothing is queued any more
	writing bool          // a batch is being written, by the writer goroutine or a flush
}

func newOutbox() outbox {
	return outbox{room: make(chan struct{}), wake: make(chan struct{}, 1)}
}

func (o *outbox) signal() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// post queues m behind everything queued before it, waiting for room
// while the outbox is full until ctx ends or the connection closes.
func (s *sender) post(ctx context.Context, m *Message) error {
	return s.enqueue(ctx, m.Kind, m.Encode(), nil)
}

// enqueue is post of the frame b (of kind k); done, when set, is closed
// once it is written.
func (s *sender) enqueue(ctx context.Context, k Kind, b []byte, done chan struct{}) error {
	for {
		s.mu.Lock()
		o := &s.box
		if o.stopped || s.sc.isClosed() {
			s.mu.Unlock()
			return s.sc.gone()
		}
		if o.bytes == 0 || o.bytes+len(b) <= maxOutboxBytes {
			o.queue = append(o.queue, frame{b: b, done: done})
			o.bytes += len(b)
			o.signal()
			s.mu.Unlock()
			return nil
		}
		room := o.room
		s.mu.Unlock()
		select {
		case <-room:
		case <-s.sc.done:
			return s.sc.gone()
		case <-ctx.Done():
			return transport.ContextError(ctx, "%s to %s waited for the connection to drain", k, s.sc.Info())
		}
	}
}

// postNow queues m without waiting for room: for the closing notice, and
// for cancels (one per request given up, so within the window).
func (s *sender) postNow(m *Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.box.stopped {
		return
	}
	b := m.Encode()
	s.box.queue = append(s.box.queue, frame{b: b})
	s.box.bytes += len(b)
	s.box.signal()
}

// answerInline queues the reader's answer to a request without waiting.
// More than MaxUnanswered of them unwritten means the peer sends requests
// beyond its window without reading the answers: the connection is closed.
func (s *sender) answerInline(m *Message) {
	b := m.Encode()
	s.mu.Lock()
	o := &s.box
	if o.stopped {
		s.mu.Unlock()
		return
	}
	if o.inline >= MaxUnanswered {
		s.mu.Unlock()
		s.sc.ep.cfg.Log.Warnf("control plane: peer %s sent more than %d requests without reading their answers, closing the connection", s.sc.Info(), MaxUnanswered)
		s.sc.close(transport.Errorf(transport.ErrCorrupt, "peer %s sent more than %d requests without reading their answers", s.sc.Info(), MaxUnanswered))
		return
	}
	o.queue = append(o.queue, frame{b: b, inline: true})
	o.bytes += len(b)
	o.inline++
	o.signal()
	s.mu.Unlock()
}

// postUrgent queues a ping or pong ahead of the queue unless one is
// queued or being written already: liveness needs only one, and a peer
// that pings without reading must not grow the outbox. Either tells the
// peer how much we have read of what it sent (see liveness.go).
func (s *sender) postUrgent(flag *atomic.Bool, k Kind) {
	if !flag.CompareAndSwap(false, true) {
		return
	}
	b := (&Message{Kind: k, Count: s.sc.readBytes.Load()}).Encode()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.box.stopped {
		return
	}
	s.box.urgent = append(s.box.urgent, frame{b: b, flag: flag})
	s.box.bytes += len(b)
	s.box.signal()
}

// writeLoop writes the outbox until the connection closes; a failed write
// closes it. Frames queued together go out in one system call. Writes
// have no deadline: a peer that stops reading stops reporting that it
// reads, and the heartbeat closes the connection, which ends a blocked
// write. While a caller's flush writes, the loop leaves the outbox to it;
// the flush wakes the loop again for what it did not write.
func (s *sender) writeLoop() {
	defer func() {
		s.mu.Lock()
		s.box.stopped = true
		s.box.head, s.box.urgent, s.box.queue = nil, nil, nil
		close(s.box.room)
		s.mu.Unlock()
	}()
	var batch []frame
	var iov [][]byte // kept between batches; WriteTo consumes a copy of it
	for {
		select {
		case <-s.box.wake:
		case <-s.sc.done:
			return
		}
		s.mu.Lock()
		if s.box.writing {
			s.mu.Unlock()
			continue
		}
		batch, iov = s.box.takeLocked(batch, iov)
		s.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		bufs := net.Buffers(iov)
		s.wmu.Lock()
		_, err := bufs.WriteTo(s.sc.c)
		s.wmu.Unlock()
		s.wrote(batch, err == nil, nil, 0)
		clear(iov)
		clear(batch)
		if cap(batch) > keepFrames {
			batch, iov = nil, nil
		}
		if err != nil {
			s.sc.close(transport.Errorf(transport.ErrPeerUnavailable, "writing to %s: %v", s.sc.Info(), err))
			return
		}
	}
}

// takeLocked takes everything queued, in the order it goes out (the rest
// of a caller's batch, pings and pongs, the queue), into batch and iov,
// and marks a write under way (when there is anything to write).
func (o *outbox) takeLocked(batch []frame, iov [][]byte) ([]frame, [][]byte) {
	batch = append(append(append(batch[:0], o.head...), o.urgent...), o.queue...)
	clear(o.head)
	clear(o.urgent)
	clear(o.queue)
	o.head, o.urgent, o.queue = o.head[:0], o.urgent[:0], o.queue[:0]
	if cap(o.queue) > keepFrames { // a burst's array is not kept for the connection's life
		o.queue = nil
	}
	iov = iov[:0]
	for _, f := range batch {
		iov = append(iov, f.b)
		if f.inline {
			// Taken before it is written: the peer can see the answer,
			// free its slot and ask again only afterwards, so an honest
			// peer keeps o.inline within its window.
			o.inline--
		}
	}
	o.writing = len(batch) > 0
	return batch, iov
}

// wrote ends the write of batch: its frames' flags are cleared and their
// waiters woken (when written), their bytes leave the outbox, and callers
// waiting for room may queue again. rest is what a flush did not write
// (cut bytes of its first frame were written): it goes out first, placed
// before the write counts as over, so that nothing overtakes it.
func (s *sender) wrote(batch []frame, ok bool, rest []frame, cut int) {
	size := cut
	for _, f := range batch {
		size += len(f.b)
		if f.flag != nil {
			f.flag.Store(false)
		}
		if f.done != nil && ok {
			close(f.done)
		}
	}
	if ok {
		s.sc.written.Add(uint64(size))
	}
	s.mu.Lock()
	o := &s.box
	o.bytes -= size
	if len(rest) > 0 {
		o.head = append(rest, o.head...)
	}
	o.writing = false
	close(o.room)
	o.room = make(chan struct{})
	if len(o.head)+len(o.urgent)+len(o.queue) > 0 {
		o.signal()
	}
	s.mu.Unlock()
}

// maxFlushFrames bounds the frames a caller's flush writes in one system
// call (IOV_MAX is 1024); with more queued, the writer goroutine writes.
const maxFlushFrames = 64

// flush writes m to the socket before it returns, behind everything
// queued before it: see write. A ctx already ended with nothing written
// returns its error at once, with nothing queued.
func (s *sender) flush(ctx context.Context, m *Message) error {
	return s.write(ctx, m, true)
}

// postDirect is post, written at once when the connection is idle (see
// write): for one-way messages sent on a caller's hot path.
func (s *sender) postDirect(m *Message) {
	s.write(context.Background(), m, false)
}

// write sends m behind everything queued before it. When no write is
// under way the caller writes itself, with one non-blocking system call,
// what is queued and m: no hand-off to the writer goroutine, whose
// wake-up costs more than a small write. What the socket does not take
// then (it is full), or everything while another write is under way, the
// writer goroutine writes; with wait, the caller waits under ctx until m
// is written, else (post) only for room in the outbox.
func (s *sender) write(ctx context.Context, m *Message, wait bool) error {
	b := m.Encode()
	s.mu.Lock()
	o := &s.box
	if o.stopped || s.sc.isClosed() {
		s.mu.Unlock()
		return s.sc.gone()
	}
	direct := !o.writing && s.sc.watch.raw != nil && len(o.head)+len(o.urgent)+len(o.queue) < maxFlushFrames
	if !direct {
		s.mu.Unlock()
		if !wait {
			return s.enqueue(ctx, m.Kind, b, nil)
		}
		if ctx.Err() != nil {
			return transport.ContextError(ctx, "%s to %s waited for the connection's writer", m.Kind, s.sc.Info())
		}
		return s.postAndWait(ctx, m.Kind, b)
	}
	var done chan struct{}
	if wait {
		done = make(chan struct{})
	}
	o.queue = append(o.queue, frame{b: b, done: done})
	o.bytes += len(b)
	batch, iov := o.takeLocked(nil, make([][]byte, 0, len(o.head)+len(o.urgent)+len(o.queue)))
	s.mu.Unlock()
	n, err := s.writeNow(iov)
	if err != nil {
		s.wrote(batch, false, nil, 0)
		s.sc.close(transport.Errorf(transport.ErrPeerUnavailable, "writing to %s: %v", s.sc.Info(), err))
		return s.sc.gone()
	}
	// What the socket did not take (it is full) the writer goroutine
	// writes first; m itself not at all for a caller that cannot wait,
	// when none of it went.
	written, rest, cut := splitWritten(batch, n)
	dropped := 0
	if wait && ctx.Err() != nil && len(rest) > 0 && len(rest[len(rest)-1].b) == len(b) { // m is last, and whole
		rest, dropped = rest[:len(rest)-1], len(b)
	}
	s.wrote(written, true, rest, cut)
	switch {
	case dropped > 0:
		s.mu.Lock()
		o.bytes -= dropped
		s.mu.Unlock()
		return transport.ContextError(ctx, "%s to %s waited for the connection's writer", m.Kind, s.sc.Info())
	case len(rest) == 0 || !wait:
		return nil
	}
	return s.waitWritten(ctx, m.Kind, done)
}

// postAndWait queues the frame b (of kind k) as post does, and waits
// under ctx until the writer goroutine wrote it.
func (s *sender) postAndWait(ctx context.Context, k Kind, b []byte) error {
	done := make(chan struct{})
	if err := s.enqueue(ctx, k, b, done); err != nil {
		return err
	}
	return s.waitWritten(ctx, k, done)
}

// writeNow makes one non-blocking attempt to write iov and returns how
// much the socket took (0 where the writer goroutine is to write, as while
// a test holds writes).
func (s *sender) writeNow(iov [][]byte) (int, error) {
	if !s.wmu.TryLock() {
		return 0, nil
	}
	defer s.wmu.Unlock()
	n, werr := 0, error(nil)
	err := s.sc.watch.raw.Write(func(fd uintptr) bool {
		n, werr = unix.Writev(int(fd), iov)
		return true // one attempt: a full socket is the writer goroutine's to wait on
	})
	switch {
	case err != nil:
		return 0, err
	case werr == unix.EAGAIN || werr == unix.EINTR:
		return 0, nil
	case werr != nil:
		return 0, werr
	}
	return n, nil
}

// splitWritten splits batch after its first n bytes: the frames written
// whole, the rest (the first of them cut to what is left of it), and how
// many bytes of that first were written.
func splitWritten(batch []frame, n int) (written, rest []frame, cut int) {
	for i, f := range batch {
		if n < len(f.b) {
			left := f
			left.b = f.b[n:]
			return batch[:i], append([]frame{left}, batch[i+1:]...), n
		}
		n -= len(f.b)
	}
	return batch, nil, 0
}

// waitWritten waits under ctx until the writer goroutine wrote the frame
// whose done channel is done.
func (s *sender) waitWritten(ctx context.Context, k Kind, done chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-s.sc.done:
		select {
		case <-done:
			return nil
		default:
		}
		return s.sc.gone()
	case <-ctx.Done():
		return transport.ContextError(ctx, "%s to %s waited for the connection's writer", k, s.sc.Info())
	}
}

// acquireSlot takes one of the MaxUnanswered request slots, waiting until
// an answer frees one, ctx ends or the connection closes.
func (s *sender) acquireSlot(ctx context.Context, k Kind) error {
	select {
	case s.slots <- struct{}{}:
		return nil
	default:
	}
	select {
	case s.slots <- struct{}{}:
		return nil
	case <-s.sc.done:
		return s.sc.gone()
	case <-ctx.Done():
		return transport.ContextError(ctx, "%s to %s waited for one of its %d unanswered requests to be answered", k, s.sc.Info(), MaxUnanswered)
	}
}

func (s *sender) releaseSlot() { <-s.slots }
