package control

import (
	"net"
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
