package control

import (
	"crypto/ecdh"
	"crypto/ed25519"
	"math/big"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// tcpOwner is a stub listening on TCP with a token, and its address as a
// peer on another host reaches it (TCP only).
func tcpOwner(t *testing.T, opts ...func(*ListenConfig)) (*stubService, *sockEndpoint, string) {
	svc, ep := listenStub(t, "owner", append([]func(*ListenConfig){func(c *ListenConfig) {
		c.ListenTCP, c.AuthToken = "127.0.0.1:0", "sesame"
	}}, opts...)...)
	return svc, ep.(*sockEndpoint), ep.Address()[strings.Index(ep.Address(), TCPScheme):]
}

// 2,000 connections to the TCP port that never say hello, from the honest
// peer's own address (loopback), do not keep it out: it connects and
// borrows within its deadline, pushing out the oldest of them. (With 64
// handshake slots held 10 s each, a peer behind 640 such connections was
// served after 99.9 s.)
func TestStalledHandshakesDoNotHoldOffAPeer(t *testing.T) {
	owner, ep, tcpOnly := tcpOwner(t)
	obj := owner.put()
	_, tcpAddr, _ := endpoints(t, ep)
	stalled := transporttest.Stalled(t, tcpAddr, 2000)

	_, good := listenStub(t, "good", func(c *ListenConfig) { c.AuthToken = "sesame" })
	peer, err := borrowAt(good, tcpOnly, obj) // within 10 s
	require.NoError(t, err)
	peer.Unborrow(obj, 1)
	assert.True(t, transporttest.ClosedWithin(stalled[0], 10*time.Second), "the oldest stalled connection was pushed out")
	assert.True(t, transporttest.ClosedWithin(stalled[len(stalled)-1], transport.PreAuthTimeout+10*time.Second), "the newest is dropped at its deadline")
}

// A peer holds at most MaxConnsPerPeer connections, and a runtime at most
// maxConns in all; past either a handshake is refused with NO_MEMORY and
// why, and a connection that goes makes room again.
func TestConnectionsAreCappedPerPeerAndInAll(t *testing.T) {
	dial := func(network, addr string) net.Conn {
		c, err := net.Dial(network, addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	_, ep, _ := tcpOwner(t)
	unixPath, tcpAddr, _ := endpoints(t, ep)
	greedy := newRawPeer()
	var mine []net.Conn
	for i := range MaxConnsPerPeer {
		c := dial("tcp", tcpAddr)
		_, err := rawHandshake(c, greedy, "sesame")
		require.NoError(t, err, "connection %d", i)
		mine = append(mine, c)
	}
	_, err := rawHandshake(dial("tcp", tcpAddr), greedy, "sesame")
	assert.Equal(t, transport.ErrNoMemory, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "the most one peer may open")
	_, err = rawHandshake(dial("unix", unixPath), greedy, "")
	assert.Equal(t, transport.ErrNoMemory, transport.StatusOf(err), "the Unix socket counts too: %v", err)
	_, err = rawHandshake(dial("tcp", tcpAddr), newRawPeer(), "sesame")
	assert.NoError(t, err, "another peer gets in")
	mine[0].Close()
	require.Eventually(t, func() bool {
		_, err := rawHandshake(dial("tcp", tcpAddr), greedy, "sesame")
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "a connection that went makes room")

	// Set before the endpoint starts, restored after it is closed.
	old := maxConns
	t.Cleanup(func() { maxConns = old })
	maxConns = 3
	_, small, _ := tcpOwner(t)
	_, tcpAddr, _ = endpoints(t, small)
	for range maxConns {
		_, err := rawHandshake(dial("tcp", tcpAddr), newRawPeer(), "sesame")
		require.NoError(t, err)
	}
	_, err = rawHandshake(dial("tcp", tcpAddr), newRawPeer(), "sesame")
	assert.Equal(t, transport.ErrNoMemory, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "the most it keeps")
	assert.Equal(t, maxConns, small.numConns())
}

// A peer that stops in the middle of a frame sends nothing whole: it is
// silent, and dropped after the peer timeout like any silent peer.
func TestHalfAFrameIsDroppedAfterThePeerTimeout(t *testing.T) {
	svc, ep, _ := tcpOwner(t, func(c *ListenConfig) { c.PeerTimeout = 300 * time.Millisecond })
	_, tcpAddr, _ := endpoints(t, ep)
	c, err := net.Dial("tcp", tcpAddr)
	require.NoError(t, err)
	defer c.Close()
	_, err = rawHandshake(c, newRawPeer(), "sesame")
	require.NoError(t, err)
	frame := (&Message{Kind: KindLease, ID: 1, Object: svc.put()}).Encode()
	_, err = c.Write(frame[:len(frame)/2])
	require.NoError(t, err)
	assert.True(t, transporttest.ClosedWithin(c, 10*time.Second), "half a frame is dropped")
	require.Eventually(t, func() bool { return ep.numConns() == 0 }, 10*time.Second, time.Millisecond)
}

// le is n as 32 little-endian bytes.
func le(n *big.Int) []byte {
	b := n.FillBytes(make([]byte, 32))
	slices.Reverse(b)
	return b
}

// The y coordinates the small-order check refuses are those of the points
// of small order: their images on Curve25519 (u = (1+y)/(1-y)) are the
// points X25519 refuses for giving an all-zero secret, which it checks
// with the standard library's own code. The identity (y = 1) has no image:
// it is the one point every encoding of y = 1 decodes to.
func TestSmallOrderPointsAreThoseX25519Refuses(t *testing.T) {
	p := new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 255), big.NewInt(19))
	priv, err := ecdh.X25519().GenerateKey(nil)
	require.NoError(t, err)
	lowOrder := func(y *big.Int) bool {
		num := new(big.Int).Add(big.NewInt(1), y)
		den := new(big.Int).Mod(new(big.Int).Sub(big.NewInt(1), y), p)
		u := new(big.Int).Mod(new(big.Int).Mul(num, new(big.Int).ModInverse(den, p)), p)
		pub, err := ecdh.X25519().NewPublicKey(le(u))
		require.NoError(t, err)
		_, err = priv.ECDH(pub)
		return err != nil
	}
	for _, y := range smallOrderY {
		slices.Reverse(y[:])
		n := new(big.Int).SetBytes(y[:])
		if n.Cmp(big.NewInt(1)) == 0 {
			continue
		}
		assert.True(t, lowOrder(n), "y = %v is of small order", n)
	}
	for range 100 {
		pub, _, err := ed25519.GenerateKey(nil)
		require.NoError(t, err)
		assert.False(t, weakPoint(pub), "an honest key passes")
		y := append([]byte(nil), pub...)
		y[31] &= 0x7f
		slices.Reverse(y)
		assert.False(t, lowOrder(new(big.Int).SetBytes(y)), "an honest key is not of small order")
	}
}

// A peer that signs with a key of small order, or a non-canonical one, is
// refused, whatever it claims. With the identity point as key, R the
// identity and S = 0, crypto/ed25519 accepts the signature for every
// message: anyone could be that runtime.
func TestSmallOrderAndNonCanonicalKeysAreRefused(t *testing.T) {
	_, ep, _ := tcpOwner(t)
	_, tcpAddr, _ := endpoints(t, ep)
	p := new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 255), big.NewInt(19))
	identity := le(big.NewInt(1))
	keys := map[string][]byte{
		"identity":                    identity,
		"identity, x negative":        append(identity[:31:31], 0x80),
		"identity as y = p+1":         le(new(big.Int).Add(p, big.NewInt(1))),
		"order 2 (y = -1)":            le(new(big.Int).Sub(p, big.NewInt(1))),
		"order 4 (y = 0)":             le(big.NewInt(0)),
		"order 4 (y = 0, x negative)": append(make([]byte, 31), 0x80),
		"order 4 as y = p":            le(p),
	}
	for i, y := range smallOrderY[3:] {
		keys["order 8, "+string(rune('a'+i))] = y[:]
	}
	// A point of large order encoded with y >= p, where its y is small
	// enough to have such an encoding: y = p+2 if 2 is the y of a point
	// (x^2 = (y^2-1)/(d*y^2+1) is a square), else the next one that is.
	d := new(big.Int).Mul(big.NewInt(-121665), new(big.Int).ModInverse(big.NewInt(121666), p))
	isY := func(y *big.Int) bool {
		y2 := new(big.Int).Mul(y, y)
		num := new(big.Int).Sub(y2, big.NewInt(1))
		den := new(big.Int).Mod(new(big.Int).Add(new(big.Int).Mul(d, y2), big.NewInt(1)), p)
		x2 := new(big.Int).Mod(new(big.Int).Mul(num, new(big.Int).ModInverse(den, p)), p)
		return new(big.Int).Exp(x2, new(big.Int).Rsh(p, 1), p).Cmp(big.NewInt(1)) == 0
	}
	for y := int64(2); y < 19; y++ {
		if isY(big.NewInt(y)) {
			keys["not canonical"] = le(new(big.Int).Add(p, big.NewInt(y)))
			break
		}
	}
	require.Contains(t, keys, "not canonical")
	sig := append(append([]byte(nil), identity...), make([]byte, 32)...) // R = identity, S = 0
	require.True(t, ed25519.Verify(identity, []byte("any message"), sig), "crypto/ed25519 takes it")
	for name, key := range keys {
		c, err := net.Dial("tcp", tcpAddr)
		require.NoError(t, err)
		_, err = forgedHandshake(c, key, sig, transport.PeerInfo{RuntimeID: runtimeIDOf(key), Name: "forger"}, "sesame")
		c.Close()
		require.Error(t, err, name)
		assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%s: %v", name, err)
		assert.Contains(t, err.Error(), "of small order or not canonically encoded", name)
	}
	assert.Zero(t, ep.numConns(), "nobody got in")
}

// forgedHandshake is the client side of the handshake with a key and a
// signature given, not made.
func forgedHandshake(c net.Conn, key, sig []byte, info transport.PeerInfo, token string) (*Message, error) {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	nonce := transport.NewNonce()
	if _, err := c.Write((&Message{Kind: KindHello, Nonce: nonce}).Encode()); err != nil {
		return nil, err
	}
	ch, err := Expect(c, KindChallenge)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write((&Message{Kind: KindAuth, Proof: transport.AuthProof(token, ProofClient, ch.Nonce), Peer: info, Key: key, Sig: sig}).Encode()); err != nil {
		return nil, err
	}
	return Expect(c, KindWelcome)
}
