package tcp

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// client is a second destination transport that claims runtime id id.
func (p *pair) client(t *testing.T, id byte) *Transport {
	h := newHost("")
	h.ID = transport.RuntimeID{0xc1, id}
	d, err := New(h)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d.(*Transport)
}

// stall asks for a whole chunk over c and never reads it: the server's
// write blocks once the socket buffers are full.
func stall(t *testing.T, c net.Conn, obj byte) {
	_, err := c.Write((&request{Object: transport.ObjectID{obj}, Length: maxChunk}).encode(nil))
	require.NoError(t, err)
}

func (p *pair) serving() int {
	p.src.srv.mu.Lock()
	defer p.src.srv.mu.Unlock()
	return len(p.src.srv.sconns)
}

// A receiver that stops reading releases the object's pin once a write
// has made no progress for the peer timeout.
func TestStalledReceiverReleasesThePin(t *testing.T) {
	h := newHost("")
	h.Timeout = 300 * time.Millisecond // the runtime's peer timeout
	s, err := New(h)
	require.NoError(t, err)
	d, err := New(newHost(""))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close(); d.Close() })
	p := &pair{src: s.(*Transport), dst: d.(*Transport), host: h}
	p.put(t, 30, maxChunk)
	c := rawConn(t, p)
	stall(t, c, 30)
	require.Eventually(t, func() bool { return p.host.Pinned() == 1 }, 5*time.Second, time.Millisecond, "the server is writing")
	start := time.Now()
	require.Eventually(t, func() bool { return p.host.Pinned() == 0 }, p.host.Timeout+2*time.Second, time.Millisecond,
		"the pin is released after the write timeout")
	t.Logf("pin released %v after the write began", time.Since(start).Round(time.Millisecond))
	// The server gave up on the connection: what was sent ends early.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, c)
	assert.NoError(t, err, "the server closed the connection")
	assert.Less(t, n, int64(responseLen+maxChunk))
	require.Eventually(t, func() bool { return p.serving() == 0 }, 5*time.Second, time.Millisecond)
}

// A reader that keeps reading, however slowly, is not cut: the deadline
// bounds a stall, not the whole answer.
func TestSlowReaderIsNotCut(t *testing.T) {
	p := newPair(t, "", "")
	// Read at 10 MiB/s: the answer takes twice the write timeout, while
	// each 1 MiB chunk leaves a busy machine fifteen times the time it needs.
	p.src.srv.writeTimeout = 1500 * time.Millisecond
	const n = 32 << 20
	_, want := p.put(t, 31, n)
	c := rawConn(t, p)
	_, err := c.Write((&request{Object: transport.ObjectID{31}, Length: n, Tag: 31}).encode(nil))
	require.NoError(t, err)
	st, tag, _, err := readResponse(c)
	require.NoError(t, err)
	require.Equal(t, transport.OK, st)
	require.Equal(t, uint64(31), tag)
	got := make([]byte, n)
	for off := 0; off < n; off += 1 << 20 {
		time.Sleep(100 * time.Millisecond)
		_, err := io.ReadFull(c, got[off:off+1<<20])
		require.NoError(t, err, "at byte %d", off)
	}
	assert.True(t, bytes.Equal(want[0], got))
}

// When the core reports a peer gone, the connections it is served on are
// closed at once (long before the write timeout), and only those.
func TestPeerGoneClosesItsServingConnections(t *testing.T) {
	p := newPair(t, "", "")
	p.src.srv.writeTimeout = time.Minute
	_, want := p.put(t, 32, maxChunk)
	gone, stays := p.client(t, 1), p.client(t, 2)
	k := p.srcKey()
	cg, err := gone.cl.conn(context.Background(), k)
	require.NoError(t, err)
	defer cg.Close()
	cs, err := stays.cl.conn(context.Background(), k)
	require.NoError(t, err)
	defer cs.Close()
	stall(t, cg, 32)
	require.Eventually(t, func() bool { return p.host.Pinned() == 1 }, 5*time.Second, time.Millisecond)

	p.src.PeerGone(transport.PeerInfo{RuntimeID: transport.RuntimeID{0xc1, 9}}) // a peer we never served
	p.src.PeerGone(transport.PeerInfo{})                                        // no id: nothing to match
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, 1, p.host.Pinned())
	assert.Equal(t, 2, p.serving())

	p.src.PeerGone(gone.cl.h.Identity())
	require.Eventually(t, func() bool { return p.host.Pinned() == 0 }, 2*time.Second, time.Millisecond, "the pin goes with the connection")
	require.Eventually(t, func() bool { return p.serving() == 1 }, 2*time.Second, time.Millisecond)
	// The other client is still served.
	_, err = cs.Write((&request{Object: transport.ObjectID{32}, Offset: 5, Length: 100, Tag: 32}).encode(nil))
	require.NoError(t, err)
	st, tag, _, err := readResponse(cs)
	require.NoError(t, err)
	require.Equal(t, transport.OK, st)
	require.Equal(t, uint64(32), tag)
	got := make([]byte, 100)
	_, err = io.ReadFull(cs, got)
	require.NoError(t, err)
	assert.Equal(t, want[0][5:105], got)
}

// fetchFrom fetches as if the object belonged to runtime source.
func (p *pair) fetchFrom(t *testing.T, source transport.RuntimeID, meta []byte, sizes ...int) {
	var targets []transport.Tensor
	for _, n := range sizes {
		_, x := transporttest.Buffer(t, n)
		targets = append(targets, x)
	}
	req, err := p.dst.Fetch(&transport.Transfer{Source: transport.PeerInfo{RuntimeID: source}}, targets, meta, nil)
	require.NoError(t, err)
	require.NoError(t, wait(req))
}

func (p *pair) pooledFor(source transport.RuntimeID) int {
	k := p.srcKey()
	k.source = source
	return p.dst.cl.pool.Len(k)
}

// A receiver drops its pooled connections to a source runtime that is gone.
func TestPeerGoneDropsPooledConnections(t *testing.T) {
	p := newPair(t, "", "")
	sizes := []int{4096, 9 << 20}
	meta, _ := p.put(t, 33, sizes...)
	gone, stays := transport.RuntimeID{0x50, 1}, transport.RuntimeID{0x50, 2}
	p.fetchFrom(t, gone, meta, sizes...)
	p.fetchFrom(t, stays, meta, sizes...)
	// Each fetch's streams pool a connection each, unless a stream ended
	// and pooled its own before a later one started (a loaded machine) and
	// that one reused it: at least one, then.
	require.GreaterOrEqual(t, p.pooledFor(gone), 1)
	kept := p.pooledFor(stays)
	require.GreaterOrEqual(t, kept, 1)
	require.Eventually(t, func() bool { return p.serving() == p.pooledFor(gone)+kept }, 5*time.Second, time.Millisecond)

	p.dst.PeerGone(transport.PeerInfo{RuntimeID: gone})
	assert.Zero(t, p.pooledFor(gone))
	assert.Equal(t, kept, p.pooledFor(stays), "only that peer's connections go")
	require.Eventually(t, func() bool { return p.serving() == kept }, 5*time.Second, time.Millisecond,
		"the connections were closed, not just forgotten")
	p.fetchFrom(t, stays, meta, sizes...)
}

// Pooled connections nobody uses are closed after idleTimeout.
func TestIdlePooledConnectionsAreClosed(t *testing.T) {
	old := idleTimeout
	idleTimeout = 200 * time.Millisecond
	defer func() { idleTimeout = old }()
	p := newPair(t, "", "")
	sizes := []int{4096, 9 << 20}
	meta, _ := p.put(t, 34, sizes...)
	_, err := p.fetch(t, meta, sizes...)
	require.NoError(t, err)
	require.Greater(t, p.pooled(), 1)
	require.Eventually(t, func() bool { return p.pooled() == 0 }, idleTimeout+3*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return p.serving() == 0 }, 5*time.Second, time.Millisecond, "and closed")
	assert.False(t, p.dst.cl.pool.Reaping(), "nothing pooled, nothing scheduled")
	// The pool fills again on demand.
	_, err = p.fetch(t, meta, sizes...)
	require.NoError(t, err)
	assert.Greater(t, p.pooled(), 0)
}

// The data listener starts only when an object needs tcp, and objects put
// without a transport carry tcp metadata only once it runs.
func TestListenerStartsWhenAnObjectNeedsIt(t *testing.T) {
	newRT := func(name string) *engine.Runtime {
		rt, err := engine.NewRuntime(engine.Options{Name: name, LogLevel: transport.LogOff,
			Builtins: []transport.TransportFactory{Factory()}, SocketDir: t.TempDir()})
		require.NoError(t, err)
		t.Cleanup(rt.Destroy)
		return rt
	}
	owner, receiver := newRT("owner"), newRT("receiver")
	tr, err := owner.Registry().Get(Name)
	require.NoError(t, err)
	listening := func() bool {
		tt := tr.(*Transport)
		tt.srv.mu.Lock()
		defer tt.srv.mu.Unlock()
		return tt.srv.ln != nil
	}
	b, x := transporttest.Buffer(t, 5000)
	transporttest.Fill(b, 35)
	autoPut := func() []byte {
		ref, err := owner.Put([]transport.Tensor{x}, "", nil)
		require.NoError(t, err)
		t.Cleanup(func() { ref.Release() })
		data, err := ref.Serialize()
		require.NoError(t, err)
		return data
	}
	first := autoPut()
	desc, _, err := engine.DecodeRef(first)
	require.NoError(t, err)
	assert.NotContains(t, desc.Meta, Name, "no eager tcp metadata without a listener")
	assert.False(t, listening(), "a put without a transport opens no port")

	// A peer that fetches it over tcp asks for the metadata: that starts it.
	ref, err := receiver.Deserialize(first)
	require.NoError(t, err)
	defer ref.Release()
	got, dst := transporttest.Buffer(t, 5000)
	require.NoError(t, receiver.Get([]*engine.Ref{ref}, []transport.Tensor{dst}, engine.FetchOptions{}, 30*time.Second))
	assert.Equal(t, b, got)
	assert.True(t, listening())
	desc, _, err = engine.DecodeRef(autoPut())
	require.NoError(t, err)
	assert.Contains(t, desc.Meta, Name, "once it runs, the metadata is cheap and put eagerly")
}
