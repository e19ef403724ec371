package core

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Sockets is the control plane between processes: a Unix socket in a
// private directory for peers on the same host, and optionally TCP for
// peers on other hosts. Every connection starts with a handshake that
// exchanges identities and, on TCP, proves the shared token both ways. After
// it, requests are multiplexed on the one connection per pair of runtimes,
// and heartbeats notice a peer that vanished without closing its sockets.
type Sockets struct{}

const (
	unixScheme = "unix://"
	tcpScheme  = "tcp://"
	// Labels that keep a proof for one direction from being replayed in the
	// other.
	proofServer = "rdt-control-server"
	proofClient = "rdt-control-client"
	maxUnixPath = 107
)

type sockEndpoint struct {
	cfg      ListenConfig
	id       RuntimeID
	unixPath string
	unixLn   net.Listener
	tcpLn    net.Listener
	address  string

	mu      sync.Mutex
	closed  bool
	conns   map[*sconn]struct{}
	byAddr  map[string]*sconn
	perPeer map[RuntimeID]int
	dialing map[string]*dialCall
	stop    chan struct{}
	wg      sync.WaitGroup
}

type dialCall struct {
	done chan struct{}
	sc   *sconn
	err  error
}

// Listen implements Network.
func (Sockets) Listen(cfg ListenConfig) (Endpoint, error) {
	ep := &sockEndpoint{
		cfg: cfg, id: cfg.Service.Identity().RuntimeID,
		conns: map[*sconn]struct{}{}, byAddr: map[string]*sconn{},
		perPeer: map[RuntimeID]int{}, dialing: map[string]*dialCall{},
		stop: make(chan struct{}),
	}
	if ep.cfg.PeerTimeout <= 0 {
		ep.cfg.PeerTimeout = DefaultPeerTimeout
	}
	if err := EnsurePrivateDir(cfg.SocketDir); err != nil {
		return nil, err
	}
	ep.unixPath = filepath.Join(cfg.SocketDir, "rt-"+ep.id.String()+".sock")
	if len(ep.unixPath) > maxUnixPath {
		return nil, Errorf(ErrInvalidArgument, "socket path %s is longer than the %d bytes Unix sockets allow; choose a shorter socket_dir", ep.unixPath, maxUnixPath)
	}
	os.Remove(ep.unixPath)
	ln, err := net.Listen("unix", ep.unixPath)
	if err != nil {
		return nil, Errorf(ErrPermissionDenied, "listening on %s: %v", ep.unixPath, err)
	}
	os.Chmod(ep.unixPath, 0o600)
	ep.unixLn = ln
	ep.address = unixScheme + ep.unixPath
	if cfg.ListenTCP != "" {
		host, _, err := net.SplitHostPort(cfg.ListenTCP)
		if err != nil {
			ln.Close()
			return nil, Errorf(ErrInvalidArgument, "listen address %q: want host:port", cfg.ListenTCP)
		}
		if cfg.AuthToken == "" && !isLoopback(host) {
			ln.Close()
			return nil, Errorf(ErrPermissionDenied, "listening on %s needs an auth token (RDT_AUTH_TOKEN or the auth_token option); without one rdt listens on loopback only", cfg.ListenTCP)
		}
		tl, err := net.Listen("tcp", cfg.ListenTCP)
		if err != nil {
			ln.Close()
			return nil, Errorf(ErrPermissionDenied, "listening on %s: %v", cfg.ListenTCP, err)
		}
		ep.tcpLn = tl
		advertise := host
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			advertise = cfg.AdvertiseHost
		}
		port := tl.Addr().(*net.TCPAddr).Port
		ep.address += "," + tcpScheme + net.JoinHostPort(advertise, fmt.Sprint(port))
	}
	ep.wg.Add(2)
	go ep.acceptLoop(ep.unixLn, false)
	go ep.heartbeat()
	if ep.tcpLn != nil {
		ep.wg.Add(1)
		go ep.acceptLoop(ep.tcpLn, true)
	}
	go sweepStaleSockets(cfg.SocketDir, ep.unixPath)
	return ep, nil
}

// sweepStaleSockets removes socket files of runtimes that exited without
// cleaning up (killed processes): old files nobody accepts connections on.
func sweepStaleSockets(dir, own string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if path == own || !strings.HasSuffix(e.Name(), ".sock") || e.Type()&os.ModeSocket == 0 {
			continue
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < 30*time.Second {
			continue // may be a socket being set up right now
		}
		c, err := net.DialTimeout("unix", path, 100*time.Millisecond)
		if err == nil {
			c.Close()
			continue
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			os.Remove(path)
		}
	}
}

func (ep *sockEndpoint) Address() string { return ep.address }

func (ep *sockEndpoint) NumPeers() int {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return len(ep.perPeer)
}

func (ep *sockEndpoint) handshakeTimeout() time.Duration {
	return max(ep.cfg.PeerTimeout, 10*time.Second)
}

func (ep *sockEndpoint) acceptLoop(ln net.Listener, isTCP bool) {
	defer ep.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			select {
			case <-ep.stop:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			ep.cfg.Log.Warnf("control plane: accept: %v", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		ep.wg.Add(1)
		go func() {
			defer ep.wg.Done()
			if err := ep.serverHandshake(c, isTCP); err != nil {
				ep.cfg.Log.Warnf("control plane: refused a connection from %s: %v", c.RemoteAddr(), err)
				c.Close()
			}
		}()
	}
}

// token is the secret a connection proves: none on Unix sockets, whose
// directory only this user can enter.
func (ep *sockEndpoint) token(isTCP bool) string {
	if isTCP {
		return ep.cfg.AuthToken
	}
	return ""
}

func (ep *sockEndpoint) serverHandshake(c net.Conn, isTCP bool) error {
	c.SetDeadline(time.Now().Add(ep.handshakeTimeout()))
	rd := bufio.NewReaderSize(c, 64<<10)
	hello, err := expect(rd, kindHello)
	if err != nil {
		return err
	}
	token := ep.token(isTCP)
	nonce := NewNonce()
	ch := &message{kind: kindChallenge, nonce: nonce, proof: AuthProof(token, proofServer, hello.nonce)}
	if _, err := c.Write(ch.encode()); err != nil {
		return err
	}
	auth, err := expect(rd, kindAuth)
	if err != nil {
		return err
	}
	if !CheckAuthProof(token, proofClient, nonce, auth.proof) {
		refuse := &message{kind: kindRefused, status: ErrPermissionDenied, text: "wrong auth token: the runtime at " + c.LocalAddr().String() + " requires the shared token (RDT_AUTH_TOKEN)"}
		c.Write(refuse.encode())
		return Errorf(ErrPermissionDenied, "peer %s failed to prove the auth token", hello.peer)
	}
	welcome := &message{kind: kindWelcome, peer: ep.cfg.Service.Identity()}
	if _, err := c.Write(welcome.encode()); err != nil {
		return err
	}
	c.SetDeadline(time.Time{})
	sc := ep.newConn(c, rd, hello.peer)
	if sc == nil {
		return Errorf(ErrClosed, "runtime is shutting down")
	}
	ep.cfg.Log.Debugf("control plane: peer %s connected", hello.peer)
	return nil
}

// expect reads one frame of the given kind (the handshake is in lock-step).
func expect(rd *bufio.Reader, k kind) (*message, error) {
	b, err := readFrame(rd, nil)
	if err != nil {
		return nil, err
	}
	m, err := decodeMessage(b)
	if err != nil {
		return nil, err
	}
	if m.kind == kindRefused {
		return nil, Errorf(m.status, "peer refused the connection: %s", m.text)
	}
	if m.kind != k {
		return nil, Errorf(ErrCorrupt, "control plane: expected %s, got %s", k, m.kind)
	}
	return m, nil
}

// Connect implements Endpoint: the cached connection to the runtime at
// address, or a new one. The dial is shared by every caller that wants the
// same peer, so it runs on its own (bounded by the handshake timeout and the
// endpoint's life) and each caller waits for it only as long as its ctx
// allows: a caller with a short deadline neither waits past it nor cuts the
// dial short for the others.
func (ep *sockEndpoint) Connect(ctx context.Context, address string) (Peer, error) {
	for {
		ep.mu.Lock()
		if ep.closed {
			ep.mu.Unlock()
			return nil, Errorf(ErrClosed, "runtime is destroyed")
		}
		if sc := ep.byAddr[address]; sc != nil && !sc.isClosed() {
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
			return nil, ContextError(ctx, "connecting to %s", address)
		}
		if d.err != nil {
			return nil, d.err
		}
		if !d.sc.isClosed() {
			return d.sc, nil
		}
	}
}

// runDial dials address for everyone waiting on d.
func (ep *sockEndpoint) runDial(d *dialCall, address string) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-ep.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	d.sc, d.err = ep.dial(ctx, address)
	cancel()
	ep.mu.Lock()
	delete(ep.dialing, address)
	if d.sc != nil && ep.byAddr[address] == nil {
		ep.byAddr[address] = d.sc
	}
	ep.mu.Unlock()
	close(d.done)
}

// dial tries each endpoint of an address: the Unix socket if it exists on
// this host, then TCP.
func (ep *sockEndpoint) dial(ctx context.Context, address string) (*sconn, error) {
	var errs []string
	for _, part := range strings.Split(address, ",") {
		var network, target string
		var isTCP bool
		switch {
		case strings.HasPrefix(part, unixScheme):
			network, target = "unix", strings.TrimPrefix(part, unixScheme)
			if _, err := os.Stat(target); err != nil {
				errs = append(errs, fmt.Sprintf("%s: not on this host or gone", part))
				continue
			}
		case strings.HasPrefix(part, tcpScheme):
			network, target, isTCP = "tcp", strings.TrimPrefix(part, tcpScheme), true
		case strings.HasPrefix(part, inprocScheme):
			errs = append(errs, fmt.Sprintf("%s: an in-process runtime of another process cannot be reached", part))
			continue
		default:
			return nil, Errorf(ErrInvalidArgument, "address %q has an unknown scheme", part)
		}
		dctx, cancel := context.WithTimeout(ctx, ep.handshakeTimeout())
		c, err := (&net.Dialer{}).DialContext(dctx, network, target)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", part, err))
			continue
		}
		sc, err := ep.clientHandshake(c, isTCP)
		if err != nil {
			c.Close()
			if st := StatusOf(err); st == ErrPermissionDenied || st == ErrCorrupt {
				return nil, Wrap(err, "%s", part)
			}
			errs = append(errs, fmt.Sprintf("%s: %v", part, err))
			continue
		}
		return sc, nil
	}
	return nil, Errorf(ErrPeerUnavailable, "no runtime reachable at %s (%s)", address, strings.Join(errs, "; "))
}

func (ep *sockEndpoint) clientHandshake(c net.Conn, isTCP bool) (*sconn, error) {
	c.SetDeadline(time.Now().Add(ep.handshakeTimeout()))
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	token := ep.token(isTCP)
	nonce := NewNonce()
	hello := &message{kind: kindHello, nonce: nonce, peer: ep.cfg.Service.Identity()}
	if _, err := c.Write(hello.encode()); err != nil {
		return nil, err
	}
	rd := bufio.NewReaderSize(c, 64<<10)
	ch, err := expect(rd, kindChallenge)
	if err != nil {
		return nil, err
	}
	if !CheckAuthProof(token, proofServer, nonce, ch.proof) {
		return nil, Errorf(ErrPermissionDenied, "the peer at %s does not hold our auth token (RDT_AUTH_TOKEN differs)", c.RemoteAddr())
	}
	auth := &message{kind: kindAuth, proof: AuthProof(token, proofClient, ch.nonce)}
	if _, err := c.Write(auth.encode()); err != nil {
		return nil, err
	}
	welcome, err := expect(rd, kindWelcome)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Time{})
	sc := ep.newConn(c, rd, welcome.peer)
	if sc == nil {
		return nil, Errorf(ErrClosed, "runtime is destroyed")
	}
	return sc, nil
}

// newConn registers an authenticated connection and starts reading it.
func (ep *sockEndpoint) newConn(c net.Conn, rd *bufio.Reader, remote PeerInfo) *sconn {
	sc := &sconn{
		ep: ep, c: c, rd: rd, remote: remote,
		pending: map[uint64]chan *message{}, replies: map[uint64]func(*message){},
		handlers: map[uint64]context.CancelFunc{}, done: make(chan struct{}),
	}
	sc.ctx, sc.cancel = context.WithCancel(context.Background())
	sc.lastSeen.Store(time.Now().UnixNano())
	ep.mu.Lock()
	if ep.closed {
		ep.mu.Unlock()
		c.Close()
		return nil
	}
	ep.conns[sc] = struct{}{}
	ep.perPeer[remote.RuntimeID]++
	if remote.Address != "" && ep.byAddr[remote.Address] == nil {
		ep.byAddr[remote.Address] = sc
	}
	ep.mu.Unlock()
	ep.wg.Add(1)
	go func() {
		defer ep.wg.Done()
		sc.readLoop()
	}()
	return sc
}

// removeConn forgets a closed connection; the peer is gone once its last
// connection is.
func (ep *sockEndpoint) removeConn(sc *sconn) {
	ep.mu.Lock()
	if _, ok := ep.conns[sc]; !ok {
		ep.mu.Unlock()
		return
	}
	delete(ep.conns, sc)
	for addr, c := range ep.byAddr {
		if c == sc {
			delete(ep.byAddr, addr)
		}
	}
	remote := sc.remote
	id := remote.RuntimeID
	ep.perPeer[id]--
	gone := ep.perPeer[id] <= 0
	if gone {
		delete(ep.perPeer, id)
	}
	closed := ep.closed
	ep.mu.Unlock()
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
			silent := now.Sub(time.Unix(0, sc.lastSeen.Load()))
			if silent > ep.cfg.PeerTimeout {
				sc.close(Errorf(ErrPeerUnavailable, "peer %s was silent for %v", sc.remote, silent.Round(time.Millisecond)))
				continue
			}
			go sc.send(&message{kind: kindPing})
		}
	}
}

// Close implements Endpoint.
func (ep *sockEndpoint) Close() error {
	ep.mu.Lock()
	if ep.closed {
		ep.mu.Unlock()
		return nil
	}
	ep.closed = true
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
	for _, sc := range conns {
		sc.close(Errorf(ErrPeerUnavailable, "runtime shut down"))
	}
	ep.wg.Wait()
	os.Remove(ep.unixPath)
	return nil
}

// sconn is one authenticated connection to a peer runtime, usable in both
// directions. It implements Peer.
type sconn struct {
	ep     *sockEndpoint
	c      net.Conn
	rd     *bufio.Reader
	wmu    sync.Mutex
	nextID atomic.Uint64

	mu       sync.Mutex
	remote   PeerInfo
	pending  map[uint64]chan *message
	replies  map[uint64]func(*message) // asynchronous requests; nil: connection closed
	handlers map[uint64]context.CancelFunc
	closeErr error

	lastSeen  atomic.Int64
	done      chan struct{}
	closeOnce sync.Once
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

func (sc *sconn) close(err error) {
	sc.closeOnce.Do(func() {
		sc.mu.Lock()
		sc.closeErr = err
		pending, replies := sc.pending, sc.replies
		sc.pending, sc.replies = map[uint64]chan *message{}, map[uint64]func(*message){}
		sc.mu.Unlock()
		sc.c.Close()
		sc.cancel()
		close(sc.done)
		for _, ch := range pending {
			close(ch)
		}
		for _, reply := range replies {
			reply(nil)
		}
		sc.ep.cfg.Log.Debugf("control plane: connection to %s closed: %v", sc.remote, err)
		sc.ep.removeConn(sc)
	})
}

// send writes one frame; a write that cannot complete within the peer
// timeout means the peer is gone.
func (sc *sconn) send(m *message) error {
	b := m.encode()
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	if sc.isClosed() {
		return sc.gone()
	}
	sc.c.SetWriteDeadline(time.Now().Add(sc.ep.cfg.PeerTimeout))
	if _, err := sc.c.Write(b); err != nil {
		sc.close(Errorf(ErrPeerUnavailable, "writing to %s: %v", sc.remote, err))
		return sc.gone()
	}
	return nil
}

func (sc *sconn) gone() error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return Errorf(ErrPeerUnavailable, "peer %s is gone: %v", sc.remote, sc.closeErr)
}

// call sends a request and waits for its response.
func (sc *sconn) call(ctx context.Context, m *message) (*message, error) {
	m.id = sc.nextID.Add(1)
	ch := make(chan *message, 1)
	sc.mu.Lock()
	if sc.isClosed() {
		sc.mu.Unlock()
		return nil, sc.gone()
	}
	sc.pending[m.id] = ch
	sc.mu.Unlock()
	if err := sc.send(m); err != nil {
		return nil, err
	}
	select {
	case resp, ok := <-ch:
		if !ok {
			return nil, sc.gone()
		}
		if resp.status != OK {
			return nil, &Error{Status: resp.status, Msg: resp.text}
		}
		return resp, nil
	case <-ctx.Done():
		sc.mu.Lock()
		delete(sc.pending, m.id)
		sc.mu.Unlock()
		if m.kind == kindSend || m.kind == kindGroupJoin {
			sc.send(&message{kind: kindCancel, target: m.id})
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, Errorf(ErrTimeout, "%s request to %s timed out", m.kind, sc.remote)
		}
		return nil, Errorf(ErrAborted, "%s request to %s was cancelled", m.kind, sc.remote)
	}
}

func (sc *sconn) respond(id uint64, resp *message, err error) {
	if resp == nil {
		resp = &message{}
	}
	resp.kind, resp.id = kindResponse, id
	if err != nil {
		resp.status = StatusOf(err)
		if resp.status == OK {
			resp.status = ErrInternal
		}
		resp.text = err.Error()
		if len(resp.text) > maxMessageText {
			resp.text = resp.text[:maxMessageText]
		}
	}
	sc.send(resp)
}

func (sc *sconn) readLoop() {
	var buf []byte
	svc := sc.ep.cfg.Service
	for {
		b, err := readFrame(sc.rd, buf)
		if err != nil {
			if StatusOf(err) == ErrCorrupt {
				sc.ep.cfg.Log.Warnf("control plane: peer %s sent a malformed frame, closing the connection: %v", sc.remote, err)
			}
			sc.close(Errorf(ErrPeerUnavailable, "reading from %s: %v", sc.remote, err))
			return
		}
		buf = b
		m, err := decodeMessage(b)
		if err != nil {
			sc.ep.cfg.Log.Warnf("control plane: peer %s sent a corrupt message, closing the connection: %v", sc.remote, err)
			sc.close(err)
			return
		}
		sc.lastSeen.Store(time.Now().UnixNano())
		from := sc.Info()
		switch m.kind {
		case kindResponse:
			sc.mu.Lock()
			ch := sc.pending[m.id]
			delete(sc.pending, m.id)
			reply := sc.replies[m.id]
			delete(sc.replies, m.id)
			sc.mu.Unlock()
			if ch != nil {
				ch <- m
			} else if reply != nil {
				reply(m)
			}
		case kindPing:
			go sc.send(&message{kind: kindPong})
		case kindPong:
		case kindIdentity:
			sc.respond(m.id, &message{peer: svc.Identity()}, nil)
		case kindBorrow:
			sc.respond(m.id, nil, svc.Borrow(from, m.object, m.token))
		case kindUnborrow:
			svc.Unborrow(from.RuntimeID, m.object, m.count)
		case kindLease:
			token, err := svc.Lease(from.RuntimeID, m.object)
			sc.respond(m.id, &message{token: token}, err)
		case kindMetadata:
			go func() {
				data, err := svc.Metadata(from.RuntimeID, m.object, m.transport)
				sc.respond(m.id, &message{data: data}, err)
			}()
		case kindSend:
			ctx, cancel := context.WithCancel(sc.ctx)
			sc.mu.Lock()
			sc.handlers[m.id] = cancel
			sc.mu.Unlock()
			go func() {
				err := svc.Send(ctx, from, SendRequest{Object: m.object, TransferID: m.transferID, Transport: m.transport, CMeta: m.data})
				sc.mu.Lock()
				delete(sc.handlers, m.id)
				sc.mu.Unlock()
				cancel()
				sc.respond(m.id, nil, err)
			}()
		case kindGroupJoin:
			// Rank 0 answers once every rank joined: a long wait, on its own
			// goroutine, cancelled like a send.
			ctx, cancel := context.WithCancel(sc.ctx)
			sc.mu.Lock()
			sc.handlers[m.id] = cancel
			sc.mu.Unlock()
			go func() {
				data, err := svc.JoinGroup(ctx, from, m.group)
				sc.mu.Lock()
				delete(sc.handlers, m.id)
				sc.mu.Unlock()
				cancel()
				sc.respond(m.id, &message{data: data}, err)
			}()
		case kindCancel:
			sc.mu.Lock()
			cancel := sc.handlers[m.target]
			sc.mu.Unlock()
			if cancel != nil {
				cancel()
			}
		default:
			sc.ep.cfg.Log.Warnf("control plane: peer %s sent an unexpected %s message, closing the connection", sc.remote, m.kind)
			sc.close(Errorf(ErrCorrupt, "unexpected %s message", m.kind))
			return
		}
	}
}

// Peer implementation.

func (sc *sconn) Info() PeerInfo {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.remote
}

func (sc *sconn) Refresh(ctx context.Context) (PeerInfo, error) {
	resp, err := sc.call(ctx, &message{kind: kindIdentity})
	if err != nil {
		return PeerInfo{}, err
	}
	if resp.peer.RuntimeID != sc.Info().RuntimeID {
		return PeerInfo{}, Errorf(ErrCorrupt, "peer %s changed its identity", sc.remote)
	}
	sc.mu.Lock()
	sc.remote = resp.peer
	sc.mu.Unlock()
	return resp.peer, nil
}

func (sc *sconn) Borrow(ctx context.Context, obj ObjectID, token uint64) error {
	_, err := sc.call(ctx, &message{kind: kindBorrow, object: obj, token: token})
	return err
}

func (sc *sconn) BorrowAsync(obj ObjectID, token uint64, done func(error)) {
	m := &message{kind: kindBorrow, object: obj, token: token, id: sc.nextID.Add(1)}
	sc.mu.Lock()
	if sc.isClosed() {
		sc.mu.Unlock()
		done(sc.gone())
		return
	}
	sc.replies[m.id] = func(resp *message) {
		switch {
		case resp == nil:
			done(sc.gone())
		case resp.status != OK:
			done(&Error{Status: resp.status, Msg: resp.text})
		default:
			done(nil)
		}
	}
	sc.mu.Unlock()
	// A failed write closes the connection, which answers the reply.
	sc.send(m)
}

func (sc *sconn) Unborrow(obj ObjectID, n uint64) {
	sc.send(&message{kind: kindUnborrow, object: obj, count: n})
}

func (sc *sconn) Lease(ctx context.Context, obj ObjectID) (uint64, error) {
	resp, err := sc.call(ctx, &message{kind: kindLease, object: obj})
	if err != nil {
		return 0, err
	}
	return resp.token, nil
}

func (sc *sconn) Metadata(ctx context.Context, obj ObjectID, transport string) ([]byte, error) {
	resp, err := sc.call(ctx, &message{kind: kindMetadata, object: obj, transport: transport})
	if err != nil {
		return nil, err
	}
	return resp.data, nil
}

func (sc *sconn) Send(ctx context.Context, req SendRequest) error {
	_, err := sc.call(ctx, &message{kind: kindSend, object: req.Object, transferID: req.TransferID, transport: req.Transport, data: req.CMeta})
	return err
}

func (sc *sconn) JoinGroup(ctx context.Context, req GroupJoin) ([]byte, error) {
	resp, err := sc.call(ctx, &message{kind: kindGroupJoin, group: req})
	if err != nil {
		return nil, err
	}
	return resp.data, nil
}

func (sc *sconn) Done() <-chan struct{} { return sc.done }
