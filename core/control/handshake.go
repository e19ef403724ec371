package control

import (
	"bufio"
	"crypto/ed25519"
	"errors"
	"io"
	"net"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

const (
	// Labels that keep a proof for one direction from being replayed in the
	// other.
	ProofServer = "rdt-control-server"
	ProofClient = "rdt-control-client"
)

func (ep *sockEndpoint) handshakeTimeout() time.Duration {
	return max(ep.cfg.PeerTimeout, 10*time.Second)
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
func (ep *sockEndpoint) serverHandshake(c net.Conn, isTCP bool, p *transport.Pending) (err error) {
	defer func() {
		var refusal *transport.Error
		if !p.Done() && !errors.As(err, &refusal) {
			err = transport.PushedOut() // why reading it failed
		}
	}()
	c.SetDeadline(time.Now().Add(transport.PreAuthTimeout))
	watch := newSocketWatch(c)
	// Unbuffered until the peer is in: a connection in its handshake holds
	// no more than the one frame being read.
	hello, err := Expect(watch, KindHello)
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
	auth, err := Expect(watch, KindAuth)
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
	if !p.Done() {
		return transport.PushedOut()
	}
	// Registered before the welcome goes, so that the caps count it; it
	// starts reading and writing only after.
	sc, err := ep.newConn(watch, bufio.NewReaderSize(watch, connReadBuffer), auth.Peer, isTCP, true)
	if err != nil {
		return refuse(err.Error(), err)
	}
	welcome := &Message{Kind: KindWelcome, Peer: ep.identity(isTCP)}
	if _, err := c.Write(welcome.Encode()); err != nil {
		sc.closeClean(err)
		return err
	}
	c.SetDeadline(time.Time{})
	sc.run()
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
func Expect(rd io.Reader, k Kind) (*Message, error) {
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
	watch := newSocketWatch(c)
	rd := bufio.NewReaderSize(watch, connReadBuffer)
	ch, err := Expect(rd, KindChallenge)
	if err != nil {
		return nil, err
	}
	if !transport.CheckAuthProof(token, ProofServer, nonce, ch.Proof) {
		return nil, transport.Errorf(transport.ErrPermissionDenied, "the peer at %s does not hold the token we Expect (RDT_AUTH_TOKEN, or the key in its address, differs)", c.RemoteAddr())
	}
	if !verify(ch.Key, ch.Sig, IdentityTranscript(SignServer, nonce, ch.Nonce, nil)) {
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
	sc, err := ep.newConn(watch, rd, welcome.Peer, isTCP, false)
	if err != nil {
		return nil, err
	}
	sc.run()
	return sc, nil
}
