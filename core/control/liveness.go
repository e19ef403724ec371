package control

import (
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
)

// A connection's liveness is judged from what each side reports, not from
// how long a round trip takes. A round trip waits behind whatever both
// sides queued before it: under load, a ping behind a flood of borrows was
// answered after the peer timeout by a peer that was reading all along,
// and two live runtimes declared each other gone.
//
// So every ping and pong carries how many bytes of frames its sender has
// read from this connection, and each side pings on its own heartbeat. The
// peer is
//   - silent when nothing arrived from it for the peer timeout: it stopped
//     writing, or its host or process stopped;
//   - deaf when, for the peer timeout, it reported reading none of the
//     bytes we wrote it: it stopped reading. A peer that reads slowly, far
//     behind a flood, reports progress and stays.
//
// Both judgements assume we read what arrives. While our own reader is
// behind (busy with a frame, or the kernel holds bytes it has not read
// yet), the peer's latest report may wait among them, so neither is made:
// the clocks start again once our reader waits on an empty socket.

// socketWatch is the connection as its reader sees it: it notes whether
// the reader waits on the socket and asks the kernel what waits unread.
type socketWatch struct {
	net.Conn
	raw     syscall.RawConn // nil when the connection is not a socket
	waiting atomic.Bool     // the reader is blocked reading the socket
}

func newSocketWatch(c net.Conn) *socketWatch {
	w := &socketWatch{Conn: c}
	if s, ok := c.(syscall.Conn); ok {
		if raw, err := s.SyscallConn(); err == nil {
			w.raw = raw
		}
	}
	return w
}

func (w *socketWatch) Read(p []byte) (int, error) {
	w.waiting.Store(true)
	n, err := w.Conn.Read(p)
	w.waiting.Store(false)
	return n, err
}

// behind reports whether the reader has not yet read everything that
// arrived: it is busy, or the kernel holds unread bytes.
func (w *socketWatch) behind() bool {
	if !w.waiting.Load() {
		return true
	}
	if w.raw == nil {
		return false
	}
	unread := 0
	w.raw.Control(func(fd uintptr) {
		if n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ); err == nil {
			unread = n
		}
	})
	return unread > 0
}

// peerReports notes a ping's or pong's report of what the peer read of
// ours. Only the reader calls it.
func (sc *sconn) peerReports(read uint64) {
	// A report may run ahead of written: the peer can read a frame before
	// our writer has counted it.
	if seen := sc.peerRead.Load(); read > seen || read >= sc.written.Load() {
		sc.peerRead.Store(max(read, seen))
		sc.progress.Store(time.Now().UnixNano())
	}
}

// checkLiveness closes the connection when the peer is silent or deaf (see
// above) and otherwise pings it. Only the heartbeat calls it; it reports
// whether the connection lives on.
func (sc *sconn) checkLiveness(now time.Time) bool {
	timeout := sc.ep.cfg.PeerTimeout
	if sc.watch.behind() {
		sc.behindAt = now.UnixNano()
	}
	since := func(t int64) time.Duration {
		return now.Sub(time.Unix(0, max(t, sc.behindAt))).Round(time.Millisecond)
	}
	if silent := since(sc.lastSeen.Load()); silent > timeout {
		sc.close(transport.Errorf(transport.ErrPeerUnavailable, "peer %s sent nothing for %v", sc.Info(), silent))
		return false
	}
	if deaf := since(sc.progress.Load()); deaf > timeout {
		unread := sc.written.Load() - min(sc.peerRead.Load(), sc.written.Load())
		sc.close(transport.Errorf(transport.ErrPeerUnavailable, "peer %s read none of the %d bytes sent to it for %v: it stopped reading", sc.Info(), unread, deaf))
		return false
	}
	sc.snd.postUrgent(&sc.pinging, KindPing)
	return true
}

// heartbeat checks every connection's liveness four times per
// PeerTimeout until the endpoint stops.
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
