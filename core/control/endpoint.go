package control

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// Sockets is the control plane between processes: a Unix socket in a
// private directory for peers on the same host, and optionally TCP for
// peers on other hosts. Every connection starts with a handshake in which
// both sides prove their identity keys and, on TCP, the shared token (or,
// without one, the listening runtime's secret from its address). After it,
// requests are multiplexed on the one connection per pair of runtimes, and
// heartbeats notice a peer that vanished without closing its sockets.
type Sockets struct{}

const (
	// The schemes of the two kinds of address a socket endpoint has.
	UnixScheme = "unix://"
	TCPScheme  = "tcp://"
)

type sockEndpoint struct {
	cfg      ListenConfig
	id       transport.RuntimeID
	pub      ed25519.PublicKey // id is derived from it
	tcpToken string            // what TCP peers prove: the token, else our secret
	unixPath string
	unixLn   net.Listener
	tcpLn    net.Listener
	address  string
	refusals *transport.FloodLog

	mu      sync.Mutex
	closed  bool
	conns   map[*sconn]struct{}
	byAddr  map[string]*sconn
	perPeer map[transport.RuntimeID]int
	dialing map[string]*dialCall
	lost    atomic.Uint64 // see PeersLost
	closing atomic.Bool   // Close began: connections end cleanly
	stop    chan struct{}
	wg      sync.WaitGroup
}

type dialCall struct {
	done chan struct{}
	sc   *sconn
	err  error
	// The tries that failed so far and the last one's error (under ep.mu),
	// for a caller that stops waiting to say what was tried.
	failed int
	last   error
}

func (ep *sockEndpoint) Address() string { return ep.address }

func (ep *sockEndpoint) NumPeers() int {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return len(ep.perPeer)
}

func (ep *sockEndpoint) PeersLost() uint64 { return ep.lost.Load() }

// Connect implements Endpoint: the cached connection to the runtime at
// address, or a new one. Connections are cached by the address without its
// keys, as peers name themselves over TCP. The dial is shared by every
// caller that wants the same peer, so it runs on its own (bounded by the
// handshake timeout and the endpoint's life) and each caller waits for it
// only as long as its ctx allows: a caller with a short deadline neither
// waits past it nor cuts the dial short for the others. A try that fails
// with a transient network error (no route to the host, say, right after
// a partition healed) is made again with backoff (transport.Redial), so a
// caller that waits long enough gets the connection once the network is
// back, or the dial's error once the handshake timeout has passed.
func (ep *sockEndpoint) Connect(ctx context.Context, address string) (Peer, error) {
	cacheKey := transport.StripAddressKeys(address)
	for {
		ep.mu.Lock()
		if ep.closed {
			ep.mu.Unlock()
			return nil, transport.Errorf(transport.ErrClosed, "runtime is destroyed")
		}
		if sc := ep.byAddr[cacheKey]; sc != nil && !sc.isClosed() {
			ep.mu.Unlock()
			return sc, nil
		}
		d := ep.dialing[address]
		if d == nil {
			d = &dialCall{done: make(chan struct{})}
			ep.dialing[address] = d
			go ep.runDial(d, address)
		}
		ep.mu.Unlock()
		select {
		case <-d.done:
		case <-ctx.Done():
			ep.mu.Lock()
			failed, last := d.failed, d.last
			ep.mu.Unlock()
			if failed > 0 {
				return nil, transport.ContextError(ctx, "connecting to %s: %s", address, transport.Tried(failed, last))
			}
			return nil, transport.ContextError(ctx, "connecting to %s", address)
		}
		if d.err != nil {
			return nil, d.err
		}
		// Loop: the cached connection is the one to use, whether ours or
		// one the peer made to us while we dialed, so that every caller
		// gets the same connection (requests on one are served in order).
	}
}

// runDial dials address for everyone waiting on d: again after a transient
// failure, for up to the handshake timeout in all.
func (ep *sockEndpoint) runDial(d *dialCall, address string) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-ep.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	// The handshake timeout bounds the dial, every try included.
	limit := ep.handshakeTimeout()
	end := time.Now().Add(limit)
	d.sc, d.err = transport.Redial(ctx, limit, ep.cfg.Log, "connecting to "+address,
		func(ctx context.Context) (*sconn, error) {
			ctx, cancel := context.WithDeadline(ctx, end)
			defer cancel()
			sc, err := ep.dial(ctx, address)
			if err != nil {
				ep.mu.Lock()
				d.failed, d.last = d.failed+1, err
				ep.mu.Unlock()
			}
			return sc, err
		})
	cancel()
	cacheKey := transport.StripAddressKeys(address)
	ep.mu.Lock()
	if d.err == nil {
		delete(ep.dialing, address)
	} else {
		// A failed dial still answers the callers that come within
		// failedDialKept, as it would have had they been waiting. A binding
		// that waits in slices (Python's are 100 ms, the handshake timeout
		// a whole number of them) would otherwise often miss its verdict
		// between two slices, and dial again.
		time.AfterFunc(failedDialKept, func() {
			ep.mu.Lock()
			if ep.dialing[address] == d {
				delete(ep.dialing, address)
			}
			ep.mu.Unlock()
		})
	}
	if cur := ep.byAddr[cacheKey]; d.sc != nil && (cur == nil || cur.isClosed()) {
		ep.byAddr[cacheKey] = d.sc
	}
	ep.mu.Unlock()
	close(d.done)
}

// failedDialKept is how long a failed dial answers those who connect to its
// address afterwards.
const failedDialKept = time.Second

// dial tries each endpoint of an address: the Unix socket if it exists on
// this host, then TCP. A key in a TCP part (tcp://key@host:port) is what
// that endpoint requires; without one, our configured token is proved.
// The error keeps each part's dial error reachable, for runDial to tell a
// transient one, but not a handshake's: a peer that answered is there.
func (ep *sockEndpoint) dial(ctx context.Context, address string) (*sconn, error) {
	var errs partErrors
	for _, part := range strings.Split(address, ",") {
		var network, target, token string
		var isTCP bool
		switch {
		case strings.HasPrefix(part, UnixScheme):
			network, target = "unix", strings.TrimPrefix(part, UnixScheme)
			if _, err := os.Stat(target); err != nil {
				errs = append(errs, fmt.Errorf("%s: not on this host or gone", part))
				continue
			}
		case strings.HasPrefix(part, TCPScheme):
			network, isTCP = "tcp", true
			token, target = transport.SplitTCPKey(strings.TrimPrefix(part, TCPScheme))
			if token == "" {
				token = ep.cfg.AuthToken
			}
		case strings.HasPrefix(part, inprocScheme):
			errs = append(errs, fmt.Errorf("%s: an in-process runtime of another process cannot be reached", part))
			continue
		default:
			return nil, transport.Errorf(transport.ErrInvalidArgument, "address %q has an unknown scheme", part)
		}
		dctx, cancel := context.WithTimeout(ctx, ep.handshakeTimeout())
		c, err := (&net.Dialer{}).DialContext(dctx, network, target)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", part, dialCause(err)))
			continue
		}
		sc, err := ep.clientHandshake(c, isTCP, token)
		if err != nil {
			c.Close()
			if st := transport.StatusOf(err); st == transport.ErrPermissionDenied || st == transport.ErrCorrupt {
				return nil, transport.Wrap(err, "%s", part)
			}
			errs = append(errs, fmt.Errorf("%s: %v", part, err))
			continue
		}
		return sc, nil
	}
	// Each endpoint is named once, with why it did not answer.
	return nil, transport.Errorf(transport.ErrPeerUnavailable, "no runtime reachable at %w", errs)
}

// dialCause is why a dial failed, without the address the caller names
// already ("dial unix /path: connect: connection refused" says the path
// again).
func dialCause(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}

// partErrors are the failures of an address's parts, in order.
type partErrors []error

func (e partErrors) Error() string {
	s := make([]string, len(e))
	for i, err := range e {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

func (e partErrors) Unwrap() []error { return e }

// socketName is the file name of a runtime's Unix socket: it names the
// runtime, so an address can be checked against a proven identity.
func socketName(id transport.RuntimeID) string { return "rt-" + id.String() + ".sock" }

// AddressNames reports whether an address a peer claims is bound to the
// runtime id it proved: its Unix socket is named after that id. Only such
// addresses are cached for a connection the peer made, so a peer cannot
// take the place of another runtime by claiming its address (a peer that
// has none, or names only TCP, is reached by dialing it).
func AddressNames(address string, id transport.RuntimeID) bool {
	for _, part := range strings.Split(address, ",") {
		if path, ok := strings.CutPrefix(part, UnixScheme); ok {
			return filepath.Base(path) == socketName(id)
		}
	}
	return false
}

// Close implements Endpoint.
func (ep *sockEndpoint) Close() error {
	ep.mu.Lock()
	if ep.closed {
		ep.mu.Unlock()
		return nil
	}
	ep.closed = true
	ep.closing.Store(true)
	close(ep.stop)
	conns := make([]*sconn, 0, len(ep.conns))
	for sc := range ep.conns {
		conns = append(conns, sc)
	}
	ep.mu.Unlock()
	ep.unixLn.Close()
	if ep.tcpLn != nil {
		ep.tcpLn.Close()
	}
	ep.tellClosing(conns)
	for _, sc := range conns {
		sc.closeClean(transport.Errorf(transport.ErrPeerUnavailable, "runtime shut down"))
	}
	ep.wg.Wait()
	ep.refusals.Close()
	os.Remove(ep.unixPath)
	return nil
}

// closingWait bounds how long a closing runtime waits for its peers to
// close their ends after its notice; a live peer does at once.
const closingWait = time.Second

// tellClosing sends every connection the closing notice and waits, within
// closingWait, until each peer closed its end. The runtime frees its
// objects after Close returns: a peer whose one-sided transfer from them
// completes after that finds its connection closed and fails the transfer
// (the engine checks), so it never returns bytes of freed memory. A peer
// that does not answer in time (stopped, unreachable) is closed on anyway.
func (ep *sockEndpoint) tellClosing(conns []*sconn) {
	if len(conns) == 0 {
		return
	}
	for _, sc := range conns {
		sc.snd.postNow(&Message{Kind: KindClosing})
	}
	deadline := time.NewTimer(min(closingWait, ep.cfg.PeerTimeout))
	defer deadline.Stop()
	for _, sc := range conns {
		select {
		case <-sc.done:
		case <-deadline.C:
			return
		}
	}
}
