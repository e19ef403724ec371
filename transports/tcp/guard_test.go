package tcp

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// timedPair is a pair whose source has the given peer timeout, its write
// timeout.
func timedPair(t *testing.T, timeout time.Duration) *pair {
	h := newHost("")
	h.Timeout = timeout
	s, err := New(h)
	require.NoError(t, err)
	d, err := New(newHost(""))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close(); d.Close() })
	return &pair{src: s.(*Transport), dst: d.(*Transport), host: h}
}

// fetchWithin fetches like p.fetch but fails the test when the fetch is
// not over within d, the deadline an honest caller would give it.
func (p *pair) fetchWithin(t *testing.T, d time.Duration, meta []byte, sizes ...int) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := p.fetch(t, meta, sizes...)
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(d):
		t.Fatalf("the fetch did not finish within %v", d)
	}
}

// 2,000 connections that never answer the hello, all from the fetch's own
// address (loopback), hold off no fetch: each costs the source a
// goroutine, the newest 512 stay, and a newcomer pushes out the oldest.
// (With a pool of 64 handshake slots held 10 s each, a fetch behind 2,000
// such connections waited over five minutes.)
func TestStalledHandshakesDoNotHoldOffAFetch(t *testing.T) {
	p := newPair(t, "", "")
	meta, _ := p.put(t, 60, 4096, 9<<20)
	m, err := decodeMetadata(meta)
	require.NoError(t, err)
	stalled := transporttest.Stalled(t, m.Endpoint, 2000)

	p.fetchWithin(t, 20*time.Second, meta, 4096, 9<<20)
	bound := transport.MaxPreAuthPerSource + 1 + p.dst.cl.streams // and the fetch's
	require.Eventually(t, func() bool { return p.serving() <= bound }, 10*time.Second, time.Millisecond,
		"connections held: at most %d, now %d", bound, p.serving())
	assert.True(t, transporttest.ClosedWithin(stalled[0], 10*time.Second), "the oldest stalled connection was pushed out")
	assert.True(t, transporttest.ClosedWithin(stalled[len(stalled)-1], transport.PreAuthTimeout+10*time.Second), "the newest is dropped at its deadline")
}

// authed is an authenticated data connection that claims client's runtime
// id.
func authed(t *testing.T, p *pair, client *Transport) net.Conn {
	c, err := client.cl.conn(context.Background(), p.srcKey())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// A client that stops in the middle of a request frame is let go after
// the write timeout; an authenticated connection that asks nothing at all
// is closed once idle for serveIdle (longer than receivers pool one).
func TestHalfARequestAndIdleConnectionsAreDropped(t *testing.T) {
	old := serveIdle
	t.Cleanup(func() { serveIdle = old }) // after the pair is closed
	serveIdle = time.Second
	p := timedPair(t, 300*time.Millisecond)
	meta, _ := p.put(t, 61, 4096)

	half := rawConn(t, p)
	frame := (&request{Object: transport.ObjectID{61}, Length: 4096, Tag: 1}).encode(nil)
	_, err := half.Write(frame[:requestLen/2])
	require.NoError(t, err)
	idle := rawConn(t, p)
	assert.True(t, transporttest.ClosedWithin(half, 10*time.Second), "half a frame is dropped after the write timeout")
	assert.True(t, transporttest.ClosedWithin(idle, 10*time.Second), "an idle connection is dropped after serveIdle")
	require.Eventually(t, func() bool { return p.serving() == 0 }, 10*time.Second, time.Millisecond, "nothing held")
	p.fetchWithin(t, 10*time.Second, meta, 4096)
}

// counted is how many authenticated connections the source counts, and
// the most of one client.
func (p *pair) counted() (total, most int) {
	p.src.srv.mu.Lock()
	defer p.src.srv.mu.Unlock()
	for _, n := range p.src.srv.perPeer {
		most = max(most, n)
	}
	return p.src.srv.nserved, most
}

// Authenticated connections are capped per client runtime and in all. A
// client past its cap pushes out its own connection idle longest; with
// every one busy it is refused, with NO_MEMORY and why. Past the overall
// cap, the connection idle longest of any client goes. Fetches go on
// throughout.
func TestServedConnectionsAreCapped(t *testing.T) {
	transporttest.NeedDescriptors(t, 2*(maxServed+200)+1024)
	p := timedPair(t, time.Minute) // so that a request begun stays busy
	meta, _ := p.put(t, 62, 4096, 9<<20)

	// One client past its cap, its connections idle: the oldest go.
	greedy := p.client(t, 1)
	var mine []net.Conn
	for range maxServedPerPeer + 20 {
		mine = append(mine, authed(t, p, greedy))
	}
	total, most := p.counted()
	assert.Equal(t, maxServedPerPeer, most, "one client's connections")
	assert.Equal(t, maxServedPerPeer, total)
	for i, c := range mine[:20] {
		assert.True(t, transporttest.ClosedWithin(c, 10*time.Second), "connection %d was pushed out", i)
	}
	for i, c := range mine[20:] {
		assert.False(t, transporttest.ClosedWithin(c, time.Millisecond), "connection %d stays", 20+i)
	}

	// Every one busy, in the middle of a request: the next is refused.
	frame := (&request{Object: transport.ObjectID{62}, Length: 4096, Tag: 1}).encode(nil)
	for _, c := range mine[20:] {
		_, err := c.Write(frame[:1])
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		p.src.srv.mu.Lock()
		defer p.src.srv.mu.Unlock()
		for _, s := range p.src.srv.sconns {
			if s.idle.Load() != 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond, "every connection is reading a request")
	_, err := greedy.cl.conn(context.Background(), p.srcKey())
	require.Error(t, err)
	assert.Equal(t, transport.ErrNoMemory, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "at most 256 data connections to one runtime")
	for _, c := range mine[20:] {
		c.Close()
	}
	require.Eventually(t, func() bool { total, _ := p.counted(); return total == 0 }, 10*time.Second, time.Millisecond)

	// Many clients past the overall cap: the connections idle longest go.
	var all []net.Conn
	for id := byte(2); len(all) < maxServed+50; id++ {
		client := p.client(t, id)
		for range 200 {
			all = append(all, authed(t, p, client))
		}
	}
	total, most = p.counted()
	assert.Equal(t, maxServed, total, "connections in all")
	assert.LessOrEqual(t, most, 200)
	assert.True(t, transporttest.ClosedWithin(all[0], 10*time.Second), "the oldest was pushed out")
	assert.False(t, transporttest.ClosedWithin(all[len(all)-1], time.Millisecond), "the newest stays")
	p.fetchWithin(t, 20*time.Second, meta, 4096, 9<<20)
	total, _ = p.counted()
	assert.LessOrEqual(t, total, maxServed)
}
