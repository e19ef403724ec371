package control

import (
	"context"
	"net"
	"sync/atomic"

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
}

// outbox is the queue the writer goroutine drains.
type outbox struct {
	urgent  []frame // pings and pongs: written before the queue
	queue   []frame // everything else, in the order it was queued
	bytes   int     // queued or being written
	inline  int     // inline answers queued, not yet taken by the writer
	room    chan struct{}
	wake    chan struct{} // holds a token while the writer has work
	stopped bool          // the writer ended: nothing is queued any more
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
func (sc *sconn) post(ctx context.Context, m *Message) error {
	b := m.Encode()
	for {
		sc.omu.Lock()
		o := &sc.out
		if o.stopped || sc.isClosed() {
			sc.omu.Unlock()
			return sc.gone()
		}
		if o.bytes == 0 || o.bytes+len(b) <= maxOutboxBytes {
			o.queue = append(o.queue, frame{b: b})
			o.bytes += len(b)
			o.signal()
			sc.omu.Unlock()
			return nil
		}
		room := o.room
		sc.omu.Unlock()
		select {
		case <-room:
		case <-sc.done:
			return sc.gone()
		case <-ctx.Done():
			return transport.ContextError(ctx, "%s to %s waited for the connection to drain", m.Kind, sc.Info())
		}
	}
}

// postNow queues m without waiting for room: for the closing notice, and
// for cancels (one per request given up, so within the window).
func (sc *sconn) postNow(m *Message) {
	sc.omu.Lock()
	defer sc.omu.Unlock()
	if sc.out.stopped {
		return
	}
	b := m.Encode()
	sc.out.queue = append(sc.out.queue, frame{b: b})
	sc.out.bytes += len(b)
	sc.out.signal()
}

// answerInline queues the reader's answer to a request without waiting.
// More than MaxUnanswered of them unwritten means the peer sends requests
// beyond its window without reading the answers: the connection is closed.
func (sc *sconn) answerInline(m *Message) {
	b := m.Encode()
	sc.omu.Lock()
	o := &sc.out
	if o.stopped {
		sc.omu.Unlock()
		return
	}
	if o.inline >= MaxUnanswered {
		sc.omu.Unlock()
		sc.ep.cfg.Log.Warnf("control plane: peer %s sent more than %d requests without reading their answers, closing the connection", sc.Info(), MaxUnanswered)
		sc.close(transport.Errorf(transport.ErrCorrupt, "peer %s sent more than %d requests without reading their answers", sc.Info(), MaxUnanswered))
		return
	}
	o.queue = append(o.queue, frame{b: b, inline: true})
	o.bytes += len(b)
	o.inline++
	o.signal()
	sc.omu.Unlock()
}

// postUrgent queues a ping or pong ahead of the queue unless one is
// queued or being written already: liveness needs only one, and a peer
// that pings without reading must not grow the outbox. Either tells the
// peer how much we have read of what it sent (see liveness.go).
func (sc *sconn) postUrgent(flag *atomic.Bool, k Kind) {
	if !flag.CompareAndSwap(false, true) {
		return
	}
	b := (&Message{Kind: k, Count: sc.readBytes.Load()}).Encode()
	sc.omu.Lock()
	defer sc.omu.Unlock()
	if sc.out.stopped {
		return
	}
	sc.out.urgent = append(sc.out.urgent, frame{b: b, flag: flag})
	sc.out.bytes += len(b)
	sc.out.signal()
}

// writeLoop writes the outbox until the connection closes; a failed write
// closes it. Frames queued together go out in one system call. Writes
// have no deadline: a peer that stops reading stops reporting that it
// reads, and the heartbeat closes the connection, which ends a blocked
// write.
func (sc *sconn) writeLoop() {
	defer func() {
		sc.omu.Lock()
		sc.out.stopped = true
		sc.out.urgent, sc.out.queue = nil, nil
		close(sc.out.room)
		sc.omu.Unlock()
	}()
	var batch []frame
	var iov [][]byte // kept between batches; WriteTo consumes a copy of it
	for {
		select {
		case <-sc.out.wake:
		case <-sc.done:
			return
		}
		sc.omu.Lock()
		batch = append(append(batch[:0], sc.out.urgent...), sc.out.queue...)
		clear(sc.out.urgent)
		clear(sc.out.queue)
		sc.out.urgent, sc.out.queue = sc.out.urgent[:0], sc.out.queue[:0]
		if cap(sc.out.queue) > keepFrames { // a burst's array is not kept for the connection's life
			sc.out.queue = nil
		}
		iov = iov[:0]
		size := 0
		for _, f := range batch {
			iov = append(iov, f.b)
			size += len(f.b)
			if f.inline {
				// Taken before it is written: the peer can see the
				// answer, free its slot and ask again only afterwards,
				// so an honest peer keeps o.inline within its window.
				sc.out.inline--
			}
		}
		sc.omu.Unlock()
		if len(batch) == 0 {
			continue
		}
		bufs := net.Buffers(iov)
		sc.wmu.Lock()
		_, err := bufs.WriteTo(sc.c)
		sc.wmu.Unlock()
		clear(iov)
		for _, f := range batch {
			if f.flag != nil {
				f.flag.Store(false)
			}
		}
		clear(batch)
		if cap(batch) > keepFrames {
			batch, iov = nil, nil
		}
		if err == nil {
			sc.written.Add(uint64(size))
		}
		sc.omu.Lock()
		sc.out.bytes -= size
		close(sc.out.room)
		sc.out.room = make(chan struct{})
		sc.omu.Unlock()
		if err != nil {
			sc.close(transport.Errorf(transport.ErrPeerUnavailable, "writing to %s: %v", sc.Info(), err))
			return
		}
	}
}

// acquireSlot takes one of the MaxUnanswered request slots, waiting until
// an answer frees one, ctx ends or the connection closes.
func (sc *sconn) acquireSlot(ctx context.Context, k Kind) error {
	select {
	case sc.slots <- struct{}{}:
		return nil
	default:
	}
	select {
	case sc.slots <- struct{}{}:
		return nil
	case <-sc.done:
		return sc.gone()
	case <-ctx.Done():
		return transport.ContextError(ctx, "%s to %s waited for one of its %d unanswered requests to be answered", k, sc.Info(), MaxUnanswered)
	}
}

func (sc *sconn) releaseSlot() { <-sc.slots }
