package control

import (
	"bufio"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// One connection to a peer runtime (sconn) is split by role: this file
// holds its state, its registration with the endpoint, its reader and its
// end; calls.go our requests awaiting their answers; serve.go the peer's
// requests and their answers; outbox.go its writer; liveness.go its
// heartbeats; peer.go the Peer methods, one request each.

const (
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
	}
	sc.snd = newSender(sc)
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
		sc.snd.writeLoop()
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

// sconn is one authenticated connection to a peer runtime, usable in both
// directions. It implements Peer.
type sconn struct {
	ep     *sockEndpoint
	c      net.Conn
	rd     *bufio.Reader
	isTCP  bool
	nextID atomic.Uint64

	// The writing half (outbox.go): the outbox, its writer goroutine,
	// the request slots.
	snd sender

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
	// Where the answers to our requests go (calls.go): calls' channels,
	// asynchronous requests' callbacks. Both nil once the connection
	// closed (and close answered what they held).
	pending map[uint64]chan *Message
	replies map[uint64]func(*Message)
	// The cancels of the peer's long requests in progress, by id.
	handlers map[uint64]context.CancelFunc
	closeErr error
	// The peer's requests served on their own goroutines (serve.go): how
	// many run, and those waiting for one of them to finish (see
	// MaxHandlers).
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

func (sc *sconn) gone() error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return transport.Errorf(transport.ErrPeerUnavailable, "peer %s is gone: %v", sc.remote, sc.closeErr)
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

// HoldWrites stops every write to a socket peer until resume is called, so
// that a test can have a request made but not yet sent; ok is false for a
// peer of another network.
func HoldWrites(p Peer) (resume func(), ok bool) {
	sc, ok := p.(*sconn)
	if !ok {
		return nil, false
	}
	sc.snd.wmu.Lock()
	return sc.snd.wmu.Unlock, true
}
