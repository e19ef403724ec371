package tcp

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// newHost is a test host with the given token and a fixed runtime id.
func newHost(token string) *transporttest.Host {
	h := transporttest.NewHostIn("")
	h.Token = token
	h.ID = transport.RuntimeID{0x7e, 1}
	return h
}

type pair struct {
	src, dst *Transport
	host     *transporttest.Host
}

func newPair(t *testing.T, srcToken, dstToken string) *pair {
	h := newHost(srcToken)
	s, err := New(h)
	require.NoError(t, err)
	d, err := New(newHost(dstToken))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close(); d.Close() })
	return &pair{src: s.(*Transport), dst: d.(*Transport), host: h}
}

// put registers an object of the given sizes with the source and returns
// its metadata and contents.
func (p *pair) put(t testing.TB, id byte, sizes ...int) ([]byte, [][]byte) {
	tensors, contents := transporttest.Filled(t, id, sizes...)
	obj := transport.ObjectID{id}
	p.host.Hold(obj, tensors)
	meta, err := p.src.ExtractMetadata(obj, tensors)
	require.NoError(t, err)
	return meta, contents
}

// wait finishes a request the way the engine does: ask Completed first.
func wait(req transport.Request) error {
	if c, ok := req.(transport.CompletedRequest); ok {
		c.Completed()
	}
	err := req.Wait()
	req.Release()
	return err
}

func (p *pair) fetch(t testing.TB, meta []byte, sizes ...int) ([][]byte, error) {
	targets, got := transporttest.Buffers(t, sizes...)
	req, err := p.dst.Fetch(&transport.Transfer{}, targets, meta, nil)
	if err != nil {
		return nil, err
	}
	return got, wait(req)
}

// srcKey is the pool key of connections to the source, as fetches made
// with a zero Transfer.Source use.
func (p *pair) srcKey() poolKey {
	return poolKey{endpoint: p.src.srv.endpoint, key: p.src.srv.metaKey}
}

func (p *pair) pooled() int {
	return p.dst.cl.pool.Len(p.srcKey())
}

func TestRoundTrip(t *testing.T) {
	p := newPair(t, "", "")
	sizes := []int{0, 1, 4096, 100 << 10, 9 << 20, 64 << 20}
	meta, want := p.put(t, 1, sizes...)
	for round := 0; round < 3; round++ { // later rounds reuse pooled connections
		got, err := p.fetch(t, meta, sizes...)
		require.NoError(t, err)
		for i := range sizes {
			assert.True(t, bytes.Equal(want[i], got[i]), "round %d: tensor %d (%d bytes) differs", round, i, sizes[i])
		}
	}
	assert.Greater(t, p.pooled(), 1, "several streams were used and returned to the pool")
	// The server unpins just after its last write.
	assert.Eventually(t, func() bool { return p.host.Pinned() == 0 }, 5*time.Second, time.Millisecond, "every pin was released")
}

func TestZeroSizeObject(t *testing.T) {
	p := newPair(t, "", "")
	meta, _ := p.put(t, 2, 0, 0)
	_, a := transporttest.Buffer(t, 0)
	_, b := transporttest.Buffer(t, 0)
	req, err := p.dst.Fetch(&transport.Transfer{}, []transport.Tensor{a, b}, meta, nil)
	require.NoError(t, err)
	assert.True(t, req.(transport.CompletedRequest).Completed(), "nothing to move: complete at once")
	require.NoError(t, wait(req))
}

func TestManySmallTensorsShareOneConnection(t *testing.T) {
	p := newPair(t, "", "")
	sizes := make([]int, window+44) // over the window, so the frames go out in turns
	for i := range sizes {
		sizes[i] = 1 + i*517%50000
	}
	meta, want := p.put(t, 3, sizes...)
	for round := 0; round < 2; round++ { // a dialled stream, then an inline one
		got, err := p.fetch(t, meta, sizes...)
		require.NoError(t, err)
		for i := range sizes {
			require.True(t, bytes.Equal(want[i], got[i]), "tensor %d differs", i)
		}
		assert.Equal(t, 1, p.pooled())
	}
}

func TestSmallFetchCompletesInline(t *testing.T) {
	old := inlineBudget
	inlineBudget = 5 * time.Second // the race detector and a busy machine are slow
	defer func() { inlineBudget = old }()
	p := newPair(t, "", "")
	meta, want := p.put(t, 4, 4096, 300)
	_, err := p.fetch(t, meta, 4096, 300) // dials, and pools the connection
	require.NoError(t, err)
	b0, x0 := transporttest.Buffer(t, 4096)
	b1, x1 := transporttest.Buffer(t, 300)
	req, err := p.dst.Fetch(&transport.Transfer{}, []transport.Tensor{x0, x1}, meta, nil)
	require.NoError(t, err)
	r := req.(*fetchRequest)
	require.NotNil(t, r.inline, "a pooled connection was at hand")
	assert.Nil(t, r.ctx, "no goroutine was started")
	assert.True(t, r.Completed(), "Completed read the answer on this goroutine")
	require.NoError(t, wait(req))
	assert.Equal(t, want[0], b0)
	assert.Equal(t, want[1], b1)
	assert.Equal(t, 1, p.pooled())
}

func TestMultiStreamOverride(t *testing.T) {
	srcHost, dstHost := newHost(""), newHost("")
	dstHost.Config = transport.NewSettings(map[string]string{"RDT_TCP_STREAMS": "7"})
	s, err := New(srcHost)
	require.NoError(t, err)
	d, err := New(dstHost)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close(); d.Close() })
	p := &pair{src: s.(*Transport), dst: d.(*Transport), host: srcHost}
	require.Equal(t, 7, p.dst.cl.streams)
	const n = 24<<20 + 12345 // not a multiple of anything
	meta, want := p.put(t, 5, n)
	got, err := p.fetch(t, meta, n)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(want[0], got[0]))
	// One connection per stream, less any a quick stream handed on to a
	// slow starter through the pool.
	assert.GreaterOrEqual(t, p.pooled(), 2)
	assert.LessOrEqual(t, p.pooled(), 7)

	// The runtime refuses bad values of RDT_TCP_STREAMS (core's
	// environment table); a host handing out of range ones is refused too.
	for _, bad := range []string{"0", "17"} {
		h := newHost("")
		h.Config = transport.NewSettings(map[string]string{"RDT_TCP_STREAMS": bad})
		_, err := New(h)
		assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), bad)
	}
}

func TestPlan(t *testing.T) {
	// A 1 GiB reservation that is never touched: plan only slices it.
	const n = 1<<30 + 5
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	require.NoError(t, err)
	defer unix.Munmap(mem)
	addr := uintptr(unsafe.Pointer(&mem[0]))
	cpu := transport.Device{Type: transport.DeviceCPU}
	tensor := func(off, size uint64) transport.Tensor {
		return transport.Tensor{TensorDesc: transport.TensorDesc{Device: cpu, Nbytes: size}, Data: addr + uintptr(off)}
	}
	targets := []transport.Tensor{tensor(0, 0), tensor(0, 100), tensor(100, streamMin-1), tensor(streamMin+99, n-streamMin-99)}
	for _, streams := range []int{1, 4, 7, 16} {
		small, shares, err := plan(&transport.Transfer{}, targets, streams)
		require.NoError(t, err)
		require.Len(t, small, 2, "the empty tensor moves nothing; the two small ones share a stream")
		assert.Equal(t, []uint32{1, 2}, []uint32{small[0].tensor, small[1].tensor})
		require.Len(t, shares, streams)
		next := uint64(0)
		for _, ps := range shares {
			for _, p := range ps {
				assert.Equal(t, uint32(3), p.tensor)
				assert.Equal(t, next, p.offset, "pieces tile the tensor")
				assert.LessOrEqual(t, len(p.dst), maxChunk)
				assert.Equal(t, addr+streamMin+99+uintptr(p.offset), uintptr(unsafe.Pointer(unsafe.SliceData(p.dst))))
				next += uint64(len(p.dst))
			}
		}
		assert.Equal(t, uint64(n-streamMin-99), next)
	}
	// 1,000 tensors of 1 MiB, apart in memory: small each, large together,
	// so they spread over the streams in order, in runs of about equal
	// bytes. (Pieces are not printed: their memory is not readable.)
	var views []transport.Tensor
	for i := uint64(0); i < 1000; i++ {
		views = append(views, tensor(i<<20, 1<<20-64))
	}
	for _, streams := range []int{1, 4, 7} {
		small, shares, err := plan(&transport.Transfer{}, views, streams)
		require.NoError(t, err)
		runs := append([][]piece{small}, shares...)
		require.Len(t, runs, streams)
		next := uint32(0)
		for _, run := range runs {
			assert.InDelta(t, 1000/streams, len(run), 1, "runs of about equal bytes")
			for _, p := range run {
				require.True(t, p.tensor == next && p.tensors == 1, "in order, each once, alone")
				next++
			}
		}
		assert.Equal(t, uint32(1000), next)
	}
	// Small pieces that stay small together keep to one stream, and so do
	// many tiny ones, whose cost is per request.
	small, shares, err := plan(&transport.Transfer{}, views[:10], 4)
	require.NoError(t, err)
	assert.Len(t, small, 10)
	assert.Empty(t, shares)
	var tiny []transport.Tensor
	for i := uint64(0); i < 10000; i++ {
		tiny = append(tiny, tensor(i<<13, 4<<10))
	}
	small, shares, err = plan(&transport.Transfer{}, tiny, 4)
	require.NoError(t, err)
	assert.Len(t, small, 10000)
	assert.Empty(t, shares)
	// Views of one buffer into views of one buffer: whole tensors that
	// touch in the targets become runs of up to streamMin bytes, each one
	// request, and the runs spread like a large tensor. An empty tensor
	// inside a run is part of it.
	var touching []transport.Tensor
	for i := uint64(0); i < 10000; i++ {
		size := uint64(4 << 10)
		if i == 5 {
			size = 0
		}
		touching = append(touching, tensor(i<<12-min(i, 6)<<12+min(i, 5)<<12, size))
	}
	small, shares, err = plan(&transport.Transfer{}, touching, 4)
	require.NoError(t, err)
	next, bytes := uint32(0), 0
	for _, run := range append([][]piece{small}, shares...) {
		for _, p := range run {
			require.Equal(t, next, p.tensor, "runs in order")
			require.LessOrEqual(t, len(p.dst), streamMin)
			digest := uint64(sizeDigestStart)
			for k := p.tensor; k < p.tensor+p.tensors; k++ {
				digest = sizeDigest(digest, touching[k].Nbytes)
			}
			require.Equal(t, digest, p.sizes, "the run's sizes digest")
			next += p.tensors
			bytes += len(p.dst)
		}
	}
	assert.Equal(t, uint32(10000), next, "every tensor in one run")
	assert.Equal(t, (10000-1)*4<<10, bytes)
	pieces := len(small)
	for _, ps := range shares {
		pieces += len(ps)
	}
	assert.Equal(t, 5, pieces, "40 MiB in runs of 8 MiB")
	assert.GreaterOrEqual(t, len(shares), 2, "spread over the streams")
	// In a partial fetch pieces of one tensor that touch become one range.
	rows := &transport.Transfer{Pieces: []transport.Piece{{Tensor: 0, Offset: 0, Length: 100}, {Tensor: 0, Offset: 100, Length: 50}, {Tensor: 1, Offset: 0, Length: 10}}}
	small, _, err = plan(rows, []transport.Tensor{tensor(0, 100), tensor(100, 50), tensor(150, 10)}, 4)
	require.NoError(t, err)
	require.Equal(t, 2, len(small), "tensor 1 follows in memory, but its size at the source is not known")
	assert.Equal(t, []uint64{150, 10}, []uint64{uint64(len(small[0].dst)), uint64(len(small[1].dst))})
	assert.Equal(t, uint32(1), small[0].tensors)
	gpu := transport.Tensor{TensorDesc: transport.TensorDesc{Device: transport.Device{Type: transport.DeviceCUDA}, Nbytes: 4}, Data: addr}
	_, _, err = plan(&transport.Transfer{}, []transport.Tensor{gpu}, 4)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
}

func TestUnknownObjectIsNotFound(t *testing.T) {
	p := newPair(t, "", "")
	meta, _ := p.put(t, 6, 64, 9<<20)
	_, err := p.fetch(t, meta, 64, 9<<20)
	require.NoError(t, err)
	p.host.Drop(transport.ObjectID{6}) // freed at the source
	for round := 0; round < 2; round++ {
		_, err := p.fetch(t, meta, 64, 9<<20)
		assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "%v", err)
	}
	// The source still serves other objects, on pooled and new connections.
	meta2, want2 := p.put(t, 7, 100)
	got, err := p.fetch(t, meta2, 100)
	require.NoError(t, err)
	assert.Equal(t, want2[0], got[0])
}

// rawConn dials the source and authenticates like a client would.
func rawConn(t *testing.T, p *pair) net.Conn {
	c, err := p.dst.cl.conn(context.Background(), p.srcKey())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func TestOutOfRangeRequestIsRefusedAndTheServerStaysUp(t *testing.T) {
	p := newPair(t, "", "")
	meta, want := p.put(t, 8, 1000)
	c := rawConn(t, p)
	bad := []request{
		{Object: transport.ObjectID{8}, Tensor: 0, Offset: 999, Length: 2},
		{Object: transport.ObjectID{8}, Tensor: 0, Offset: 1001, Length: 0},
		{Object: transport.ObjectID{8}, Tensor: 1, Offset: 0, Length: 1},
		{Object: transport.ObjectID{8}, Tensor: 0xffffffff, Offset: 0, Length: 1},
		{Object: transport.ObjectID{8}, Tensor: 0, Offset: 1 << 62, Length: 1 << 20},
		{Object: transport.ObjectID{8}, Tensor: 0, Offset: ^uint64(0) - 10, Length: 20},
		{Object: transport.ObjectID{8}, Tensor: 0, Offset: 0, Length: maxChunk + 1},
	}
	// All at once, pipelined, and a good one at the end: the answers come
	// back in order.
	var frames []byte
	for i := range bad {
		bad[i].Tag = uint64(100 + i)
		frames = bad[i].encode(frames)
	}
	frames = (&request{Object: transport.ObjectID{8}, Offset: 10, Length: 990, Tag: 99}).encode(frames)
	_, err := c.Write(frames)
	require.NoError(t, err)
	for _, req := range bad {
		st, tag, msg, err := readResponse(c)
		require.NoError(t, err)
		assert.Equal(t, transport.ErrInvalidArgument, st, "%+v", req)
		assert.Equal(t, req.Tag, tag, "a refusal echoes its request's tag")
		assert.Regexp(t, "outside tensor|tensors; tensor|byte limit", msg)
	}
	st, tag, _, err := readResponse(c)
	require.NoError(t, err)
	require.Equal(t, transport.OK, st)
	require.Equal(t, uint64(99), tag, "the answer echoes its request's tag")
	got := make([]byte, 990)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	assert.Equal(t, want[0][10:], got)
	// Through the client API the refusal is a clear InvalidArgument, and
	// new connections are served too.
	_, err = RequestRange(context.Background(), "", meta, 0, 999, 2)
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "outside tensor 0 (1000 bytes)")
	g, err := p.fetch(t, meta, 1000)
	require.NoError(t, err)
	assert.Equal(t, want[0], g[0])
	// The server unpins just after its last write.
	assert.Eventually(t, func() bool { return p.host.Pinned() == 0 }, 5*time.Second, time.Millisecond, "every pin was released")
}

func TestTargetLargerThanSourceIsRefused(t *testing.T) {
	p := newPair(t, "", "")
	meta, _ := p.put(t, 9, 100, 9<<20)
	_, err := p.fetch(t, meta, 101, 9<<20)
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
	_, err = p.fetch(t, meta, 100, 9<<20+1)
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
}

func TestMalformedFrameClosesOnlyThatConnection(t *testing.T) {
	p := newPair(t, "", "")
	meta, want := p.put(t, 10, 128)
	c := rawConn(t, p)
	bad := make([]byte, requestLen)
	copy(bad, "JUNK")
	bad[44+7] = 0x5a // the tag field
	_, err := c.Write(bad)
	require.NoError(t, err)
	st, tag, _, err := readResponse(c)
	require.NoError(t, err)
	assert.Equal(t, transport.ErrInvalidArgument, st)
	assert.Equal(t, uint64(0x5a)<<56, tag, "the answer echoes the frame's tag field")
	_, err = c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "the server hung up")
	got, err := p.fetch(t, meta, 128)
	require.NoError(t, err)
	assert.Equal(t, want[0], got[0])
}

func TestWrongTokenIsPermissionDenied(t *testing.T) {
	p := newPair(t, "right", "wrong")
	meta, _ := p.put(t, 11, 64)
	_, err := p.fetch(t, meta, 64)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "data connection to 127.0.0.1:")
	assert.NotContains(t, err.Error(), "tcp", "the engine, not the transport, names the transport")
	assert.Contains(t, err.Error(), "the peer refused our auth token")
	// No token against a token, too.
	_, err = RequestRange(context.Background(), "", meta, 0, 0, 1)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err))
	// With the right token it works.
	got, err := RequestRange(context.Background(), "right", meta, 0, 0, 64)
	require.NoError(t, err)
	b := make([]byte, 64)
	transporttest.Fill(b, 11)
	assert.Equal(t, b, got)
}

func TestDeviceMemoryIsRefused(t *testing.T) {
	p := newPair(t, "", "")
	gpu := transport.Tensor{TensorDesc: transport.TensorDesc{Device: transport.Device{Type: transport.DeviceCUDA}, Nbytes: 4}, Data: 1}
	_, err := p.src.ExtractMetadata(transport.ObjectID{16}, []transport.Tensor{gpu})
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	meta, _ := p.put(t, 16, 4)
	_, err = p.dst.Fetch(&transport.Transfer{}, []transport.Tensor{gpu}, meta, nil)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
}

func TestConcurrentFetches(t *testing.T) {
	p := newPair(t, "", "")
	sizes := []int{1, 4096, 1 << 20, 9 << 20}
	meta, want := p.put(t, 17, sizes...)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 4; i++ {
				got, err := p.fetch(t, meta, sizes...)
				if err != nil {
					errs <- err
					return
				}
				for k := range sizes {
					if !bytes.Equal(want[k], got[k]) {
						errs <- fmt.Errorf("tensor %d differs", k)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.LessOrEqual(t, p.pooled(), maxIdle)
}

func TestOtherMethods(t *testing.T) {
	tr, err := Factory().New(newHost(""))
	require.NoError(t, err)
	defer tr.Close()
	assert.Equal(t, "tcp", Factory().Name)
	d := tr.Describe()
	assert.Equal(t, "tcp", d.Name)
	assert.True(t, d.OneSided && d.CanAbort && d.DetectsFreedObjects && d.Ranges)
	assert.False(t, d.SameHostOnly, "tcp reaches other hosts")
	assert.Equal(t, transport.AutoRank{Host: 30}, d.Auto)
	assert.False(t, d.Eager(), "no listener yet: objects without a transport do not start one")
	_, err = tr.ExtractMetadata(transport.ObjectID{1}, nil) // starts the listener
	require.NoError(t, err)
	assert.True(t, d.Eager(), "once the listener runs, the descriptor read at registration says eager")
	cm, err := tr.CommunicatorMetadata(&transport.Transfer{})
	assert.NoError(t, err)
	assert.Nil(t, cm)
	_, isSender := tr.(transport.Sender)
	assert.False(t, isSender, "one-sided: the engine never asks it to send")
	require.NoError(t, tr.Close())
	_, err = tr.ExtractMetadata(transport.ObjectID{1}, nil)
	assert.Equal(t, transport.ErrClosed, transport.StatusOf(err))
}
