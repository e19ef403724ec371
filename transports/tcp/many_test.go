package tcp

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Many tensors of mixed sizes in one object: small answers go out many to
// a writev and are read many to a readv, straight into their targets,
// empty ones and ones answered alone among them, and every byte lands
// where it belongs.
func TestManyTensorsOfMixedSizes(t *testing.T) {
	p := newPair(t, "", "")
	var sizes []int
	for i := 0; i < 1200; i++ {
		switch i % 7 {
		case 0:
			sizes = append(sizes, 0)
		case 3:
			sizes = append(sizes, 16<<10+13) // inside a run
		case 5:
			sizes = append(sizes, smallAnswer+1) // answered alone
		default:
			sizes = append(sizes, 1+i*37%5000)
		}
	}
	meta, want := p.put(t, 20, sizes...)
	for round := 0; round < 2; round++ { // a new connection, then a pooled one
		got, err := p.fetch(t, meta, sizes...)
		require.NoError(t, err)
		for i := range sizes {
			require.Equal(t, want[i], got[i], "round %d tensor %d", round, i)
		}
	}
	assert.Eventually(t, func() bool { return p.host.Pinned() == 0 }, 5*time.Second, time.Millisecond, "every pin was released")
	assert.Equal(t, 1, p.pooled(), "small tensors share one connection")
}

// A refusal inside a run of answers fails the fetch with the source's
// reason; the answers around it were framed correctly, so the connection
// and the server stay usable.
func TestRefusalInsideARunOfAnswers(t *testing.T) {
	p := newPair(t, "", "")
	sizes := make([]int, 600)
	for i := range sizes {
		sizes[i] = 1000
	}
	meta, want := p.put(t, 21, sizes...)
	bigger := append([]int(nil), sizes...)
	bigger[300] = 1001 // a target larger than its source
	_, err := p.fetch(t, meta, bigger...)
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "outside tensor 300")
	got, err := p.fetch(t, meta, sizes...)
	require.NoError(t, err)
	assert.Equal(t, want[599], got[599])
	assert.Eventually(t, func() bool { return p.host.Pinned() == 0 }, 5*time.Second, time.Millisecond, "every pin was released")
}

// An object of many tensors freed at the source is not found, on the
// pooled connection that served it before.
func TestFreedObjectOfManyTensors(t *testing.T) {
	p := newPair(t, "", "")
	sizes := make([]int, 1000)
	for i := range sizes {
		sizes[i] = 4096
	}
	meta, _ := p.put(t, 22, sizes...)
	_, err := p.fetch(t, meta, sizes...)
	require.NoError(t, err)
	p.host.Drop(transport.ObjectID{22})
	_, err = p.fetch(t, meta, sizes...)
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "%v", err)
}

// fetchMany starts a fetch of an object of count tensors of n bytes from
// the source process.
func fetchMany(t *testing.T, d *Transport, src *transporttest.Source, count, n int) transport.Request {
	var targets []transport.Tensor
	for i := 0; i < count; i++ {
		_, x := buffer(t, n)
		targets = append(targets, x)
	}
	req, err := d.Fetch(&transport.Transfer{Source: src.Peer}, targets, src.Meta, nil)
	require.NoError(t, err)
	return req
}

// A source process that stops answering in the middle of a many-tensor
// fetch: an abort (what a deadline does) ends the fetch promptly; one that
// is killed ends it with PeerUnavailable.
func TestManyTensorsFromAStalledThenKilledSource(t *testing.T) {
	const count, n = 2000, 4096
	sizes := make([]int, count)
	for i := range sizes {
		sizes[i] = n
	}
	src := transporttest.StartSource(t, sizes...)
	dt, err := New(newHost(""))
	require.NoError(t, err)
	defer dt.Close()
	d := dt.(*Transport)
	// A whole fetch first: the bytes are the source's.
	var targets []transport.Tensor
	var got [][]byte
	for range sizes {
		b, x := buffer(t, n)
		targets, got = append(targets, x), append(got, b)
	}
	req, err := d.Fetch(&transport.Transfer{Source: src.Peer}, targets, src.Meta, nil)
	require.NoError(t, err)
	require.NoError(t, wait(req))
	for i := range sizes {
		require.Equal(t, src.Want[i], got[i], "tensor %d", i)
	}

	src.Stop()
	defer src.Continue()
	req = fetchMany(t, d, src, count, n)
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	d.Abort(&transport.Transfer{}, req)
	err = wait(req)
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "%v", err)
	assert.Less(t, time.Since(start), 1500*time.Millisecond, "an abort is not held up by the stalled source")

	req = fetchMany(t, d, src, count, n)
	done := make(chan error, 1)
	go func() { done <- wait(req) }()
	time.Sleep(50 * time.Millisecond)
	src.Kill()
	select {
	case err := <-done:
		assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("a fetch from a killed source did not end")
	}
}

// A source that sends more than was asked for is caught, not read into
// the next fetch on the same connection.
func TestUnaskedBytesAreCorrupt(t *testing.T) {
	ep := fakeSource(t, "", func(c net.Conn) {
		frames := make([]byte, 3*requestLen)
		if _, err := io.ReadFull(c, frames); err != nil {
			return
		}
		var out []byte
		for i := 0; i < 3; i++ {
			out = encodeResponse(out, frameTag(frames[i*requestLen:(i+1)*requestLen]), transport.OK, "")
			out = append(out, make([]byte, 100)...)
		}
		c.Write(append(out, "extra"...)) // one write: it arrives whole
		silent(c)
	})
	d, err := New(newHost(""))
	require.NoError(t, err)
	defer d.Close()
	var targets []transport.Tensor
	for i := 0; i < 3; i++ {
		_, x := buffer(t, 100)
		targets = append(targets, x)
	}
	req, err := d.Fetch(&transport.Transfer{}, targets, fakeMeta(ep, 3), nil)
	require.NoError(t, err)
	err = wait(req)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
}

// setBuffer sets a socket buffer of c (the kernel rounds up to its minimum).
func setBuffer(t *testing.T, c net.Conn, opt int) {
	rc, err := c.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	var serr error
	require.NoError(t, rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, 1) }))
	require.NoError(t, serr)
}

// The receiver writes its requests on the goroutine that reads the
// answers (stream.advance), and the source answers on the goroutine that
// reads the requests (serve): neither reads while it writes. That cannot
// deadlock because the request bytes the source has not read yet are
// bounded by the window (window*requestLen, 13 KiB), which the socket
// buffers always take, so the receiver's write never waits for the source.
// Here the receiver's send buffer is the smallest the kernel allows, and
// the source writes large answers all along: the fetch ends on that
// connection (with a window of thousands of frames it would not: both
// sides would block in their writes until the source's write timeout).
func TestPipelinedRequestsWithTheSmallestSocketBuffers(t *testing.T) {
	p := newPair(t, "", "")
	p.src.writeTimeout = time.Minute
	const count, n = window*4 + 7, 64 << 10
	sizes := make([]int, count)
	for i := range sizes {
		sizes[i] = n
	}
	meta, want := p.put(t, 23, sizes...)
	c, err := p.dst.conn(context.Background(), p.srcKey())
	require.NoError(t, err)
	setBuffer(t, c, unix.SO_SNDBUF)
	p.dst.pool.Put(p.srcKey(), c)
	got, err := p.fetch(t, meta, sizes...)
	require.NoError(t, err)
	for i := range sizes {
		require.True(t, bytes.Equal(want[i], got[i]), "tensor %d", i)
	}
	if l := p.dst.pool.Idle(p.srcKey()); assert.Len(t, l, 1) {
		assert.Equal(t, c, l[0], "the fetch ran on the connection with the small buffers")
	}
}
