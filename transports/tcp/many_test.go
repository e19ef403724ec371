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
		_, x := transporttest.Buffer(t, n)
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
		b, x := transporttest.Buffer(t, n)
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
		_, x := transporttest.Buffer(t, 100)
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
	p.src.srv.writeTimeout = time.Minute
	const count, n = window*4 + 7, 64 << 10
	sizes := make([]int, count)
	for i := range sizes {
		sizes[i] = n
	}
	meta, want := p.put(t, 23, sizes...)
	c, err := p.dst.cl.conn(context.Background(), p.srcKey())
	require.NoError(t, err)
	setBuffer(t, c, unix.SO_SNDBUF)
	p.dst.cl.pool.Put(p.srcKey(), c)
	got, err := p.fetch(t, meta, sizes...)
	require.NoError(t, err)
	for i := range sizes {
		require.True(t, bytes.Equal(want[i], got[i]), "tensor %d", i)
	}
	if l := p.dst.cl.pool.Idle(p.srcKey()); assert.Len(t, l, 1) {
		assert.Equal(t, c, l[0], "the fetch ran on the connection with the small buffers")
	}
}

// views cuts one buffer into tensors of the given sizes, laid end to end.
func views(t testing.TB, sizes ...int) ([]byte, []transport.Tensor) {
	total := 0
	for _, n := range sizes {
		total += n
	}
	b, whole := transporttest.Buffer(t, total)
	var ts []transport.Tensor
	off := 0
	for _, n := range sizes {
		desc, err := transport.NewTensorDesc(whole.Device, whole.DType, []int64{int64(n)})
		require.NoError(t, err)
		ts = append(ts, transport.Tensor{TensorDesc: desc, Data: whole.Data + uintptr(off), Orig: whole.Orig})
		off += n
	}
	return b, ts
}

// Views of one buffer fetched into views of another travel as runs of
// whole tensors, one request each, empty tensors among them, and every
// byte lands where it belongs; a tensor too large for a run is pulled
// on its own.
func TestRunsOfTouchingTensors(t *testing.T) {
	p := newPair(t, "", "")
	var sizes []int
	for i := 0; i < 5000; i++ {
		sizes = append(sizes, []int{4096, 0, 1, 3000, 777}[i%5])
	}
	sizes[2500] = streamMin + 5 // pulled over the streams, between two runs
	src, tensors := views(t, sizes...)
	for i := range src {
		src[i] = byte(i * 7)
	}
	obj := transport.ObjectID{40}
	p.host.Hold(obj, tensors)
	meta, err := p.src.ExtractMetadata(obj, tensors)
	require.NoError(t, err)
	for round := 0; round < 2; round++ {
		dst, targets := views(t, sizes...)
		req, err := p.dst.Fetch(&transport.Transfer{}, targets, meta, nil)
		require.NoError(t, err)
		require.NoError(t, wait(req))
		require.True(t, bytes.Equal(src, dst), "round %d: the runs landed shifted or short", round)
	}
}

// The source checks a run as it checks a range: a run whose tensors do
// not split where the targets do (one target a byte larger, the next a
// byte smaller, the same bytes in all) is refused, naming the run, and
// nothing lands shifted.
func TestRunSplitOtherwiseIsRefused(t *testing.T) {
	p := newPair(t, "", "")
	sizes := []int{1000, 1000, 1000, 1000}
	_, tensors := views(t, sizes...)
	obj := transport.ObjectID{41}
	p.host.Hold(obj, tensors)
	meta, err := p.src.ExtractMetadata(obj, tensors)
	require.NoError(t, err)
	_, targets := views(t, 1000, 1001, 999, 1000)
	req, err := p.dst.Fetch(&transport.Transfer{}, targets, meta, nil)
	require.NoError(t, err)
	err = wait(req)
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "tensors 0..3 are 4000 bytes at the source, split other than")
	// Runs that leave the object, cross too many tensors or do not start
	// a tensor are refused on a connection that stays usable.
	c := rawConn(t, p)
	for _, r := range []request{
		{Object: obj, Tensor: 2, Tensors: 3, Length: 3000},
		{Object: obj, Tensor: 0, Tensors: maxRunTensors + 1, Length: 4000},
		{Object: obj, Tensor: 0, Tensors: 2, Offset: 1, Length: 1999},
	} {
		r.Tag = newTag()
		_, err := c.Write(r.encode(nil))
		require.NoError(t, err)
		st, tag, msg, err := readResponse(c)
		require.NoError(t, err)
		assert.Equal(t, r.Tag, tag)
		assert.Equal(t, transport.ErrInvalidArgument, st, "%+v", r)
		assert.Contains(t, string(msg), "is not whole tensors of this object of 4")
	}
	digest := uint64(sizeDigestStart)
	for range 2 {
		digest = sizeDigest(digest, 1000)
	}
	ok := request{Object: obj, Tensor: 1, Tensors: 2, Length: 2000, Tag: newTag(), Sizes: digest}
	_, err = c.Write(ok.encode(nil))
	require.NoError(t, err)
	st, tag, _, err := readResponse(c)
	require.NoError(t, err)
	require.Equal(t, transport.OK, st)
	require.Equal(t, ok.Tag, tag)
	_, err = io.ReadFull(c, make([]byte, 2000))
	require.NoError(t, err)
}
