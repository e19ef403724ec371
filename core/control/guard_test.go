package control

import (
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
