package control

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
	// Labels that keep a proof for one direction from being replayed in the
	// other.
	ProofServer = "rdt-control-server"
	ProofClient = "rdt-control-client"
	maxUnixPath = 107

	// MaxAuthenticating bounds the connections of one listener still in
	// their handshake: each holds a goroutine and a read buffer before the
	// peer proved anything. Past it, the listener stops accepting until one
	// finishes (within the handshake timeout): further connections wait in
	// the kernel's backlog, costing us nothing, and a burst of honest peers
	// is slowed down rather than refused.
	MaxAuthenticating = 64
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
)

// refusalLogInterval is how often refused connections are summarized in
// the log after the first one of a burst is written.
var refusalLogInterval = 10 * time.Second

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
}

// Listen implements Network.
func (Sockets) Listen(cfg ListenConfig) (Endpoint, error) {
	ep := &sockEndpoint{
		cfg: cfg, id: cfg.Service.Identity().RuntimeID,
		conns: map[*sconn]struct{}{}, byAddr: map[string]*sconn{},
		perPeer: map[transport.RuntimeID]int{}, dialing: map[string]*dialCall{},
		stop:     make(chan struct{}),
		refusals: transport.NewFloodLog(cfg.Log, transport.LogWarn, refusalLogInterval, "control plane: refused a connection", "control plane: refused %d more connections since %s"),
	}
	if ep.cfg.PeerTimeout <= 0 {
		ep.cfg.PeerTimeout = transport.DefaultPeerTimeout
	}
	if len(cfg.Key) != ed25519.PrivateKeySize || runtimeIDOf(cfg.Key.Public().(ed25519.PublicKey)) != ep.id {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "the control plane needs the runtime's identity key")
	}
	ep.pub = cfg.Key.Public().(ed25519.PublicKey)
	// Without a shared token, TCP peers prove the runtime's own secret,
	// which they learn only from the address inside its refs.
	ep.tcpToken = cfg.AuthToken
	if ep.tcpToken == "" {
		ep.tcpToken = cfg.Secret
	}
	if cfg.ListenTCP != "" && ep.tcpToken == "" {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "listening on TCP needs an auth token or the runtime's secret")
	}
	if err := EnsurePrivateDir(cfg.SocketDir); err != nil {
		return nil, err
	}
	ep.unixPath = filepath.Join(cfg.SocketDir, socketName(ep.id))
	if len(ep.unixPath) > maxUnixPath {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "socket path %s is longer than the %d bytes Unix sockets allow; choose a shorter socket_dir", ep.unixPath, maxUnixPath)
	}
	os.Remove(ep.unixPath)
	ln, err := net.Listen("unix", ep.unixPath)
	if err != nil {
		return nil, transport.Errorf(transport.ErrPermissionDenied, "listening on %s: %v", ep.unixPath, err)
	}
	os.Chmod(ep.unixPath, 0o600)
	ep.unixLn = ln
	ep.address = UnixScheme + ep.unixPath
	if cfg.ListenTCP != "" {
		host, _, err := net.SplitHostPort(cfg.ListenTCP)
		if err != nil {
			ln.Close()
			return nil, transport.Errorf(transport.ErrInvalidArgument, "listen address %q: want host:port", cfg.ListenTCP)
		}
		if cfg.AuthToken == "" && !IsLoopback(host) {
			ln.Close()
			return nil, transport.Errorf(transport.ErrPermissionDenied, "listening on %s needs an auth token (RDT_AUTH_TOKEN or the auth_token option); without one rdt listens on loopback only", cfg.ListenTCP)
		}
		tl, err := net.Listen("tcp", cfg.ListenTCP)
		if err != nil {
			ln.Close()
			return nil, transport.Errorf(transport.ErrPermissionDenied, "listening on %s: %v", cfg.ListenTCP, err)
		}
		ep.tcpLn = tl
		advertise := host
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			advertise = cfg.AdvertiseHost
		}
		port := tl.Addr().(*net.TCPAddr).Port
		key := ""
		if cfg.AuthToken == "" {
			key = cfg.Secret + "@"
		}
		ep.address += "," + TCPScheme + key + net.JoinHostPort(advertise, fmt.Sprint(port))
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
// A socket the kernel lists as listening is left alone without connecting
// to it, so live runtimes are not disturbed; any other old file is probed,
// and removed when connecting is refused.
func sweepStaleSockets(dir, own string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	var listening map[string]bool // read once, when a file is old enough to matter
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if path == own || !strings.HasSuffix(e.Name(), ".sock") || e.Type()&os.ModeSocket == 0 {
			continue
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < 30*time.Second {
			continue // may be a socket being set up right now
		}
		if listening == nil {
			listening = listeningUnixSockets()
		}
		if listening[path] {
			continue
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

// soAcceptConn is __SO_ACCEPTCON in /proc/net/unix's Flags: a listening socket.
const soAcceptConn = 1 << 16

// listeningUnixSockets is the set of paths of listening Unix sockets in
// this network namespace, from /proc/net/unix; empty when it cannot be
// read. Sockets of other namespaces are missing from it.
func listeningUnixSockets() map[string]bool {
	out := map[string]bool{}
	f, err := os.Open("/proc/net/unix")
	if err != nil {
		return out
	}
	defer f.Close()
	lines := bufio.NewScanner(f)
	lines.Scan() // Num RefCount Protocol Flags Type St Inode Path
	for lines.Scan() {
		fields := strings.Fields(lines.Text())
		if len(fields) < 8 {
			continue // unbound
		}
		flags, err := strconv.ParseUint(fields[3], 16, 32)
		if err == nil && flags&soAcceptConn != 0 {
			out[strings.Join(fields[7:], " ")] = true
		}
	}
	return out
}

func (ep *sockEndpoint) Address() string { return ep.address }

func (ep *sockEndpoint) NumPeers() int {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return len(ep.perPeer)
}

func (ep *sockEndpoint) PeersLost() uint64 { return ep.lost.Load() }

func (ep *sockEndpoint) handshakeTimeout() time.Duration {
	return max(ep.cfg.PeerTimeout, 10*time.Second)
}

func (ep *sockEndpoint) acceptLoop(ln net.Listener, isTCP bool) {
	defer ep.wg.Done()
	slots := make(chan struct{}, MaxAuthenticating)
	for {
		select {
		case slots <- struct{}{}:
		case <-ep.stop:
			return
		}
		c, err := ln.Accept()
		if err != nil {
			<-slots
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
			err := ep.serverHandshake(c, isTCP)
			<-slots
			if err != nil {
				if errors.Is(err, io.EOF) {
					// Closed between frames without a word: a runtime
					// checking that this socket is alive (sweepStaleSockets)
					// or a peer that gave up. Nothing was refused.
					ep.cfg.Log.Debugf("control plane: a connection from %s closed before the handshake ended", remoteName(c))
				} else {
					ep.refusals.Event(fmt.Sprintf("from %s: %v", remoteName(c), err))
				}
				c.Close()
			}
		}()
	}
}

// remoteName names the other end of a connection for the log: its address
// on TCP, its process on a Unix socket.
func remoteName(c net.Conn) string {
	if _, ok := c.(*net.UnixConn); ok {
		if pid, err := transport.UnixPeerPid(c); err == nil {
			return fmt.Sprintf("pid %d on the Unix socket", pid)
		}
		return "the Unix socket"
	}
	return c.RemoteAddr().String()
}

// token is the secret a connection proves: none on Unix sockets, whose
// directory only this user can enter.
func (ep *sockEndpoint) token(isTCP bool) string {
	if isTCP {
		return ep.tcpToken
	}
	return ""
}

// identity is what this runtime tells a peer about itself. Over TCP its
// address goes without its secret: a peer that dialed us knows it already,
// and one we dialed (its address came in a ref, maybe a crafted one) must
// not learn it.
func (ep *sockEndpoint) identity(isTCP bool) transport.PeerInfo {
	p := ep.cfg.Service.Identity()
	if isTCP {
		p.Address = transport.StripAddressKeys(p.Address)
	}
	return p
}

// The handshake, in lock-step, every frame bounded by MaxPreAuthFrame:
//
//	client -> server  hello:     magic, version, client nonce
//	server -> client  challenge: server nonce, token proof over the client
//	                             nonce, server key, its signature of both nonces
//	client -> server  auth:      token proof over the server nonce, client
//	                             key, its signature of both nonces and the
//	                             server key, client identity
//	server -> client  welcome:   server identity (or refused, with why)
//
// Each side checks the other's token proof (the token authorizes), that the
// runtime id claimed equals the hash of the key that signed (the key
// identifies) and, on a Unix socket, that the claimed pid is the process at
// the other end of the socket.
func (ep *sockEndpoint) serverHandshake(c net.Conn, isTCP bool) error {
	c.SetDeadline(time.Now().Add(ep.handshakeTimeout()))
	rd := bufio.NewReaderSize(c, 64<<10)
	hello, err := Expect(rd, KindHello)
	if err != nil {
		return err
	}
	token := ep.token(isTCP)
	nonce := transport.NewNonce()
	ch := &Message{Kind: KindChallenge, Nonce: nonce, Proof: transport.AuthProof(token, ProofServer, hello.Nonce),
		Key: ep.pub, Sig: ed25519.Sign(ep.cfg.Key, IdentityTranscript(SignServer, hello.Nonce, nonce, nil))}
	if _, err := c.Write(ch.Encode()); err != nil {
		return err
	}
	auth, err := Expect(rd, KindAuth)
	if err != nil {
		return err
	}
	refuse := func(text string, err error) error {
		c.Write((&Message{Kind: KindRefused, Status: transport.StatusOf(err), Text: text}).Encode())
		return err
	}
	if !transport.CheckAuthProof(token, ProofClient, nonce, auth.Proof) {
		return refuse("wrong auth token: the runtime at "+c.LocalAddr().String()+" requires the shared token (RDT_AUTH_TOKEN), or without one the key in its address",
			transport.Errorf(transport.ErrPermissionDenied, "a peer calling itself %s failed to prove the auth token", auth.Peer))
	}
	if err := checkIdentity(auth.Peer.RuntimeID, auth.Key, auth.Sig, IdentityTranscript(SignClient, hello.Nonce, nonce, ep.pub)); err != nil {
		return refuse(err.Error(), transport.Wrap(err, "peer %s", auth.Peer))
	}
	if !isTCP {
		if err := ep.checkPeerPid(c, auth.Peer); err != nil {
			return refuse(err.Error(), err)
		}
	}
	welcome := &Message{Kind: KindWelcome, Peer: ep.identity(isTCP)}
	if _, err := c.Write(welcome.Encode()); err != nil {
		return err
	}
	c.SetDeadline(time.Time{})
	sc := ep.newConn(c, rd, auth.Peer, isTCP)
	if sc == nil {
		return transport.Errorf(transport.ErrClosed, "runtime is shutting down")
	}
	ep.cfg.Log.Debugf("control plane: peer %s connected", auth.Peer)
	return nil
}

// checkPeerPid refuses a peer on a Unix socket that claims to share our
// host (boot and pid namespace, so its pid means the same to us) but is not
// the process the kernel puts at the other end of the socket: host-local
// transports act on that pid. A peer in another pid namespace claims
// another host, and its pid is used by nothing.
func (ep *sockEndpoint) checkPeerPid(c net.Conn, claimed transport.PeerInfo) error {
	if !claimed.SameHost(ep.cfg.Service.Identity()) {
		return nil
	}
	pid, err := transport.UnixPeerPid(c)
	if err != nil {
		return transport.Errorf(transport.ErrPermissionDenied, "cannot read the credentials of the peer claiming pid %d: %v", claimed.Pid, err)
	}
	if pid != claimed.Pid {
		return transport.Errorf(transport.ErrPermissionDenied, "peer %s claims pid %d, but the Unix socket's other end is pid %d", claimed, claimed.Pid, pid)
	}
	return nil
}

// Expect reads one handshake frame of the given kind.
func Expect(rd *bufio.Reader, k Kind) (*Message, error) {
	b, err := ReadFrame(rd, nil, MaxPreAuthFrame)
	if err != nil {
		return nil, err
	}
	m, err := DecodeMessage(b)
	if err != nil {
		return nil, err
	}
	if m.Kind == KindRefused {
		return nil, transport.Errorf(m.Status, "peer refused the connection: %s", m.Text)
	}
	if m.Kind != k {
		return nil, transport.Errorf(transport.ErrCorrupt, "control plane: expected %s, got %s", k, m.Kind)
	}
	return m, nil
}

// Connect implements Endpoint: the cached connection to the runtime at
// address, or a new one. Connections are cached by the address without its
// keys, as peers name themselves over TCP. The dial is shared by every
// caller that wants the same peer, so it runs on its own (bounded by the
// handshake timeout and the endpoint's life) and each caller waits for it
// only as long as its ctx allows: a caller with a short deadline neither
// waits past it nor cuts the dial short for the others.
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
	cacheKey := transport.StripAddressKeys(address)
	ep.mu.Lock()
	delete(ep.dialing, address)
	if cur := ep.byAddr[cacheKey]; d.sc != nil && (cur == nil || cur.isClosed()) {
		ep.byAddr[cacheKey] = d.sc
	}
	ep.mu.Unlock()
	close(d.done)
}

// dial tries each endpoint of an address: the Unix socket if it exists on
// this host, then TCP. A key in a TCP part (tcp://key@host:port) is what
// that endpoint requires; without one, our configured token is proved.
func (ep *sockEndpoint) dial(ctx context.Context, address string) (*sconn, error) {
	var errs []string
	for _, part := range strings.Split(address, ",") {
		var network, target, token string
		var isTCP bool
		switch {
		case strings.HasPrefix(part, UnixScheme):
			network, target = "unix", strings.TrimPrefix(part, UnixScheme)
			if _, err := os.Stat(target); err != nil {
				errs = append(errs, fmt.Sprintf("%s: not on this host or gone", part))
				continue
			}
		case strings.HasPrefix(part, TCPScheme):
			network, isTCP = "tcp", true
			token, target = transport.SplitTCPKey(strings.TrimPrefix(part, TCPScheme))
			if token == "" {
				token = ep.cfg.AuthToken
			}
		case strings.HasPrefix(part, inprocScheme):
			errs = append(errs, fmt.Sprintf("%s: an in-process runtime of another process cannot be reached", part))
			continue
		default:
			return nil, transport.Errorf(transport.ErrInvalidArgument, "address %q has an unknown scheme", part)
		}
		dctx, cancel := context.WithTimeout(ctx, ep.handshakeTimeout())
		c, err := (&net.Dialer{}).DialContext(dctx, network, target)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", part, err))
			continue
		}
		sc, err := ep.clientHandshake(c, isTCP, token)
		if err != nil {
			c.Close()
			if st := transport.StatusOf(err); st == transport.ErrPermissionDenied || st == transport.ErrCorrupt {
				return nil, transport.Wrap(err, "%s", part)
			}
			errs = append(errs, fmt.Sprintf("%s: %v", part, err))
			continue
		}
		return sc, nil
	}
	return nil, transport.Errorf(transport.ErrPeerUnavailable, "no runtime reachable at %s (%s)", address, strings.Join(errs, "; "))
}

// clientHandshake is the dialing side of the handshake (see
// serverHandshake); token is what the server requires.
func (ep *sockEndpoint) clientHandshake(c net.Conn, isTCP bool, token string) (*sconn, error) {
	c.SetDeadline(time.Now().Add(ep.handshakeTimeout()))
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	nonce := transport.NewNonce()
	hello := &Message{Kind: KindHello, Nonce: nonce}
	if _, err := c.Write(hello.Encode()); err != nil {
		return nil, err
	}
	rd := bufio.NewReaderSize(c, 64<<10)
	ch, err := Expect(rd, KindChallenge)
	if err != nil {
		return nil, err
	}
	if !transport.CheckAuthProof(token, ProofServer, nonce, ch.Proof) {
		return nil, transport.Errorf(transport.ErrPermissionDenied, "the peer at %s does not hold the token we Expect (RDT_AUTH_TOKEN, or the key in its address, differs)", c.RemoteAddr())
	}
	if len(ch.Key) != ed25519.PublicKeySize || !ed25519.Verify(ed25519.PublicKey(ch.Key), IdentityTranscript(SignServer, nonce, ch.Nonce, nil), ch.Sig) {
		return nil, transport.Errorf(transport.ErrPermissionDenied, "the peer at %s did not prove its identity key", c.RemoteAddr())
	}
	// Only now, talking to a server that proved the token, do we name
	// ourselves; the signature covers its key, so it cannot pass it on.
	auth := &Message{Kind: KindAuth, Proof: transport.AuthProof(token, ProofClient, ch.Nonce), Key: ep.pub,
		Sig: ed25519.Sign(ep.cfg.Key, IdentityTranscript(SignClient, nonce, ch.Nonce, ch.Key)), Peer: ep.identity(isTCP)}
	if _, err := c.Write(auth.Encode()); err != nil {
		return nil, err
	}
	welcome, err := Expect(rd, KindWelcome)
	if err != nil {
		return nil, err
	}
	if proven := runtimeIDOf(ch.Key); welcome.Peer.RuntimeID != proven {
		return nil, transport.Errorf(transport.ErrPermissionDenied, "the peer at %s claims runtime id %s but holds the key of %s", c.RemoteAddr(), welcome.Peer.RuntimeID, proven)
	}
	if !isTCP {
		if err := ep.checkPeerPid(c, welcome.Peer); err != nil {
			return nil, err
		}
	}
	c.SetDeadline(time.Time{})
	sc := ep.newConn(c, rd, welcome.Peer, isTCP)
	if sc == nil {
		return nil, transport.Errorf(transport.ErrClosed, "runtime is destroyed")
	}
	return sc, nil
}

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

// newConn registers an authenticated connection and starts reading it.
func (ep *sockEndpoint) newConn(c net.Conn, rd *bufio.Reader, remote transport.PeerInfo, isTCP bool) *sconn {
	sc := &sconn{
		ep: ep, c: c, rd: rd, remote: remote, isTCP: isTCP,
		pending: map[uint64]chan *Message{}, replies: map[uint64]func(*Message){},
		handlers: map[uint64]context.CancelFunc{}, done: make(chan struct{}),
		out: newOutbox(), slots: make(chan struct{}, MaxUnanswered),
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
	if key := transport.StripAddressKeys(remote.Address); AddressNames(key, remote.RuntimeID) && ep.byAddr[key] == nil {
		ep.byAddr[key] = sc
	}
	ep.mu.Unlock()
	ep.wg.Add(2)
	go func() {
		defer ep.wg.Done()
		sc.readLoop()
	}()
	go func() {
		defer ep.wg.Done()
		sc.writeLoop()
	}()
	return sc
}

// removeConn forgets a closed connection; the peer is gone once its last
// connection is.
func (ep *sockEndpoint) removeConn(sc *sconn) {
	remote := sc.Info()
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
			sc.checkLiveness(now)
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
		sc.postNow(&Message{Kind: KindClosing})
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
	// read. pingSent is when our unanswered ping was queued (0: none).
	pinging, ponging atomic.Bool
	pingSent         atomic.Int64

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
		if !sc.clean.Load() && !sc.ep.closing.Load() {
			sc.ep.lost.Add(1)
		}
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
		sc.cancel()
		sc.c.Close()
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

// queuedRequest is a request waiting for a handler goroutine.
type queuedRequest struct {
	run  func()
	size int
}

// serve runs a request's handler on its own goroutine, or queues it while
// MaxHandlers run (see there). It never blocks the reader.
func (sc *sconn) serve(m *Message, run func()) {
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
		if !ok {
			return nil, sc.gone()
		}
		if resp.Status != transport.OK {
			return nil, &transport.Error{Status: resp.Status, Msg: resp.Text}
		}
		return resp, nil
	case <-ctx.Done():
		// The answer still comes (its channel has room for it) and
		// frees the slot; a long request is told to stop.
		if m.Kind == KindSend || m.Kind == KindGroupJoin {
			sc.postNow(&Message{Kind: KindCancel, Target: m.ID})
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, transport.Errorf(transport.ErrTimeout, "%s request to %s timed out", m.Kind, sc.Info())
		}
		return nil, transport.Errorf(transport.ErrAborted, "%s request to %s was cancelled", m.Kind, sc.Info())
	}
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
		if !sc.dispatch(m) {
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
		sc.postUrgent(&sc.ponging, KindPong)
	case KindPong:
		sc.pingSent.Store(0)
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
			return nil, svc.Send(ctx, from, SendRequest{Object: m.Object, TransferID: m.TransferID, Transport: m.Transport, CMeta: m.Data})
		})
	case KindGroupJoin:
		// Rank 0 answers once every rank joined: a long wait.
		sc.serveCancellable(m, func(ctx context.Context) (*Message, error) {
			data, err := svc.JoinGroup(ctx, from, m.Group)
			return &Message{Data: data}, err
		})
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
		resp, err := run(ctx)
		sc.mu.Lock()
		delete(sc.handlers, m.ID)
		sc.mu.Unlock()
		cancel()
		sc.answerLater(m.ID, resp, err)
	})
}

// Peer implementation.

func (sc *sconn) Info() transport.PeerInfo {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.remote
}

func (sc *sconn) Refresh(ctx context.Context) (transport.PeerInfo, error) {
	resp, err := sc.call(ctx, &Message{Kind: KindIdentity})
	if err != nil {
		return transport.PeerInfo{}, err
	}
	// The id and the pid were proven at the handshake; they cannot change.
	if old := sc.Info(); resp.Peer.RuntimeID != old.RuntimeID || resp.Peer.Pid != old.Pid {
		return transport.PeerInfo{}, transport.Errorf(transport.ErrCorrupt, "peer %s changed its identity", old)
	}
	sc.mu.Lock()
	sc.remote = resp.Peer
	sc.mu.Unlock()
	return resp.Peer, nil
}

func (sc *sconn) Borrow(ctx context.Context, obj transport.ObjectID, token uint64) error {
	_, err := sc.call(ctx, &Message{Kind: KindBorrow, Object: obj, Token: token})
	return err
}

func (sc *sconn) BorrowAsync(ctx context.Context, obj transport.ObjectID, token uint64, done func(error)) {
	m := &Message{Kind: KindBorrow, Object: obj, Token: token}
	err := sc.start(ctx, m, nil, func(resp *Message) {
		switch {
		case resp == nil:
			done(sc.gone())
		case resp.Status != transport.OK:
			done(&transport.Error{Status: resp.Status, Msg: resp.Text})
		default:
			done(nil)
		}
	})
	if err != nil {
		done(err)
	}
}

// Unborrow waits for room in the outbox while the connection lives: a
// peer that stops reading is closed by the heartbeat, which ends the wait.
func (sc *sconn) Unborrow(obj transport.ObjectID, n uint64) {
	sc.post(context.Background(), &Message{Kind: KindUnborrow, Object: obj, Count: n})
}

func (sc *sconn) Lease(ctx context.Context, obj transport.ObjectID) (uint64, error) {
	resp, err := sc.call(ctx, &Message{Kind: KindLease, Object: obj})
	if err != nil {
		return 0, err
	}
	return resp.Token, nil
}

func (sc *sconn) Metadata(ctx context.Context, obj transport.ObjectID, transportName string) ([]byte, error) {
	resp, err := sc.call(ctx, &Message{Kind: KindMetadata, Object: obj, Transport: transportName})
	if err != nil {
		return nil, err
	}
	return resp.Data, nil
}

func (sc *sconn) Send(ctx context.Context, req SendRequest) error {
	_, err := sc.call(ctx, &Message{Kind: KindSend, Object: req.Object, TransferID: req.TransferID, Transport: req.Transport, Data: req.CMeta})
	return err
}

func (sc *sconn) JoinGroup(ctx context.Context, req GroupJoin) ([]byte, error) {
	resp, err := sc.call(ctx, &Message{Kind: KindGroupJoin, Group: req})
	if err != nil {
		return nil, err
	}
	return resp.Data, nil
}

func (sc *sconn) Done() <-chan struct{} { return sc.done }

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

// IsLoopback tells whether host names this machine only, the one place
// TCP may listen without an auth token.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
