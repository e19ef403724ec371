package tcp

import (
	"context"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/peerpool"
	"golang.org/x/sys/unix"
)

// The receiver's data connections: idle ones pooled per source endpoint
// and checked before reuse, new ones dialed and authenticated.

// newPool makes the pool of a receiver's idle data connections: at most
// maxIdle per key, closed after idleTimeout unused.
func newPool() *peerpool.Pool[poolKey, net.Conn] {
	return peerpool.New(peerpool.Config[poolKey, net.Conn]{
		Max:         maxIdle,
		Close:       func(c net.Conn) { c.Close() },
		Peer:        func(k poolKey) transport.RuntimeID { return k.source },
		IdleTimeout: idleTimeout,
	})
}

// poolKey says which pooled connections a fetch may reuse: those to the
// same endpoint of the same source runtime, authenticated with the same key.
type poolKey struct {
	endpoint string
	source   transport.RuntimeID // zero for a client without a runtime
	key      string
}

// idleConn takes a pooled connection, or returns nil. The most recently
// used goes first, so connections beyond what is needed age out. A pooled
// connection must hold nothing unread: one with bytes waiting (a source
// that sent what nobody asked for) or an end of stream (a source that hung
// up) is closed, and the next one tried.
func (cl *client) idleConn(k poolKey) net.Conn {
	for {
		c, ok := cl.pool.Take(k)
		if !ok {
			return nil
		}
		why := unread(c)
		if why == "" {
			return c
		}
		cl.h.Log().Debugf("closing a pooled data connection to %s: %s", k.endpoint, why)
		c.Close()
	}
}

// unread checks, without blocking, that nothing is waiting to be read on
// an idle connection: it returns "" when the connection is clean, else
// what is wrong with it.
func unread(c net.Conn) string {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return ""
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err.Error()
	}
	var n int
	var rerr error
	if err := rc.Control(func(fd uintptr) {
		var b [1]byte
		for {
			n, _, rerr = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			if rerr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return err.Error()
	}
	switch {
	case rerr == unix.EAGAIN:
		return ""
	case rerr != nil:
		return rerr.Error()
	case n == 0:
		return "the source closed it"
	default:
		return "the source sent bytes nobody asked for"
	}
}

// conn takes a pooled connection or dials and authenticates one.
func (cl *client) conn(ctx context.Context, k poolKey) (net.Conn, error) {
	cl.mu.Lock()
	closed := cl.closed
	cl.mu.Unlock()
	if closed {
		return nil, transport.Errorf(transport.ErrClosed, "the transport is closed")
	}
	if c := cl.idleConn(k); c != nil {
		return c, nil
	}
	ep := k.endpoint
	// A transient failure (no route to the source's host, say, right after
	// a partition healed) is dialed again until ctx ends, which the engine
	// sees to at the caller's deadline, or for authTimeout.
	c, err := transport.Redial(ctx, authTimeout, cl.h.Log(), "dialing "+ep, func(ctx context.Context) (net.Conn, error) {
		d := net.Dialer{Timeout: dialTimeout}
		return d.DialContext(ctx, "tcp", ep)
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, transport.Errorf(transport.ErrAborted, "dialing %s was cancelled", ep)
		}
		return nil, transport.Errorf(transport.ErrPeerUnavailable, "cannot reach the source's data endpoint %s: %v", ep, err)
	}
	tune(c)
	// Cancelling ctx (an abort) also cuts a handshake with a source that
	// accepted but does not answer.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	err = cl.authenticate(c, ep, k.key)
	if !stop() {
		c.Close()
		return nil, transport.Errorf(transport.ErrAborted, "the handshake with %s was cancelled", ep)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// clientKey is the key to prove to the source of m: the one in its
// metadata, else our configured token.
func (cl *client) clientKey(m *metadata) string {
	if m.Key != "" {
		return m.Key
	}
	return cl.h.AuthToken()
}

func (cl *client) authenticate(c net.Conn, ep, key string) error {
	c.SetDeadline(time.Now().Add(authTimeout))
	defer c.SetDeadline(time.Time{})
	hello := make([]byte, helloLen)
	n, err := io.ReadFull(c, hello)
	if m := min(n, len(helloMagic)); string(hello[:m]) != helloMagic[:m] {
		return transport.Errorf(transport.ErrCorrupt, "data connection to %s: not an rdt data endpoint", ep)
	}
	if err != nil {
		return transport.Errorf(transport.ErrPeerUnavailable, "data connection to %s: handshake failed: %v", ep, err)
	}
	if v := hello[len(helloMagic)]; v != protoVersion {
		return transport.Errorf(transport.ErrUnsupported, "data connection to %s: it speaks data protocol version %d, this build speaks %d", ep, v, protoVersion)
	}
	id := cl.h.Identity().RuntimeID
	answer := append(transport.AuthProof(key, authPurpose, hello[len(helloMagic)+1:]), id[:]...)
	if _, err := c.Write(answer); err != nil {
		return transport.Errorf(transport.ErrPeerUnavailable, "data connection to %s: handshake failed: %v", ep, err)
	}
	st, tag, msg, err := readResponse(c)
	if err == nil && tag != 0 {
		err = transport.Errorf(transport.ErrCorrupt, "data connection to %s: the handshake's answer carries tag %#x, not 0", ep, tag)
	}
	if err != nil {
		// A server that refuses the key says so (below); a connection
		// that ends without an answer means the peer went away, say
		// killed while we connected.
		if transport.StatusOf(err) == transport.ErrPeerUnavailable {
			return transport.Errorf(transport.ErrPeerUnavailable, "data connection to %s: the peer closed the connection during authentication: %v", ep, err)
		}
		return err
	}
	if st == transport.OK {
		return nil
	}
	return transport.Errorf(st, "data connection to %s: %s", ep, msg)
}

// readResponse reads one response header and its message, and returns the
// tag the header carries for the caller to check (handshake only; pulls
// read theirs in stream.advance).
func readResponse(c net.Conn) (transport.Status, uint64, string, error) {
	var hdr [responseLen]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return 0, 0, "", transport.Errorf(transport.ErrPeerUnavailable, "reading from %s: %v", c.RemoteAddr(), err)
	}
	st, n, tag, err := decodeResponseHeader(hdr[:])
	if err != nil {
		return 0, 0, "", err
	}
	if n == 0 {
		return st, tag, "", nil
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(c, msg); err != nil {
		return 0, 0, "", transport.Errorf(transport.ErrPeerUnavailable, "reading from %s: %v", c.RemoteAddr(), err)
	}
	return st, tag, string(msg), nil
}
