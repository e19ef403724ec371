package tcp

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

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
	bound := transport.MaxPreAuthPerSource + 1 + p.dst.streams // and the fetch's
	require.Eventually(t, func() bool { return p.serving() <= bound }, 10*time.Second, time.Millisecond,
		"connections held: at most %d, now %d", bound, p.serving())
	assert.True(t, transporttest.ClosedWithin(stalled[0], 10*time.Second), "the oldest stalled connection was pushed out")
	assert.True(t, transporttest.ClosedWithin(stalled[len(stalled)-1], transport.PreAuthTimeout+10*time.Second), "the newest is dropped at its deadline")
}
