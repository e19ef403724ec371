package tcp

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core"
)

// testHost is the little of a runtime the transport asks for, with a
// table of objects for PinObject.
type testHost struct {
	token string
	mu    sync.Mutex
	objs  map[core.ObjectID][]core.Tensor
	pins  int
}

func newHost(token string) *testHost {
	return &testHost{token: token, objs: map[core.ObjectID][]core.Tensor{}}
}

func (h *testHost) Identity() core.PeerInfo  { return core.PeerInfo{Name: "test"} }
func (h *testHost) Log() *core.Logger        { return core.NewLogger("test", core.LogOff) }
func (h *testHost) Context() context.Context { return context.Background() }
func (h *testHost) AuthToken() string        { return h.token }
func (h *testHost) BindHost() string         { return "127.0.0.1" }
func (h *testHost) AdvertiseHost() string    { return "127.0.0.1" }
func (h *testHost) SocketDir() string        { return os.TempDir() }
func (h *testHost) PinObject(id core.ObjectID) ([]core.Tensor, func(), error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t, ok := h.objs[id]
	if !ok {
		return nil, nil, core.Errorf(core.ErrNotFound, "object %s is not held here", id)
	}
	h.pins++
	return t, func() { h.mu.Lock(); h.pins--; h.mu.Unlock() }, nil
}

// buffer maps n bytes outside the Go heap (the race detector's pointer
// checks refuse Go memory addressed through uintptr).
func buffer(t testing.TB, n int) ([]byte, core.Tensor) {
	t.Helper()
	b, err := unix.Mmap(-1, 0, max(n, 1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(b) })
	addr := uintptr(unsafe.Pointer(&b[0]))
	b = b[:n]
	desc, err := core.NewTensorDesc(core.Device{Type: core.DeviceCPU}, core.DType{Code: 1, Bits: 8, Lanes: 1}, []int64{int64(n)})
	require.NoError(t, err)
	return b, core.Tensor{TensorDesc: desc, Data: addr, Orig: addr}
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*13) ^ seed
	}
}

type pair struct {
	src, dst *Transport
	host     *testHost
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
func (p *pair) put(t *testing.T, id byte, sizes ...int) ([]byte, [][]byte) {
	var tensors []core.Tensor
	var contents [][]byte
	for i, n := range sizes {
		b, x := buffer(t, n)
		fill(b, id+byte(i))
		tensors = append(tensors, x)
		contents = append(contents, b)
	}
	obj := core.ObjectID{id}
	p.host.mu.Lock()
	p.host.objs[obj] = tensors
	p.host.mu.Unlock()
	meta, err := p.src.ExtractMetadata(obj, tensors)
	require.NoError(t, err)
	return meta, contents
}

func (p *pair) fetch(t *testing.T, meta []byte, sizes ...int) ([][]byte, error) {
	var targets []core.Tensor
	var got [][]byte
	for _, n := range sizes {
		b, x := buffer(t, n)
		targets = append(targets, x)
		got = append(got, b)
	}
	req, err := p.dst.Fetch(&core.Transfer{}, targets, meta, nil)
	if err != nil {
		return nil, err
	}
	defer req.Release()
	return got, req.Wait()
}

func statusOf(err error) core.Status {
	var e *core.Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

func TestRoundTrip(t *testing.T) {
	p := newPair(t, "", "")
	sizes := []int{0, 1, 4096, 100 << 10, 9 << 20, 64 << 20}
	meta, want := p.put(t, 1, sizes...)
	for round := 0; round < 2; round++ { // the second round reuses pooled connections
		got, err := p.fetch(t, meta, sizes...)
		require.NoError(t, err)
		for i := range sizes {
			assert.True(t, string(want[i]) == string(got[i]), "tensor %d differs", i)
		}
	}
	p.dst.pmu.Lock()
	pooled := len(p.dst.idle[p.src.endpoint])
	p.dst.pmu.Unlock()
	assert.Greater(t, pooled, 1, "several streams were used and returned to the pool")
}

func TestManySmallTensorsShareOneConnection(t *testing.T) {
	p := newPair(t, "", "")
	sizes := []int{10, 20, 4096, 1 << 20}
	meta, want := p.put(t, 2, sizes...)
	got, err := p.fetch(t, meta, sizes...)
	require.NoError(t, err)
	for i := range sizes {
		assert.Equal(t, want[i], got[i])
	}
	p.dst.pmu.Lock()
	assert.Len(t, p.dst.idle[p.src.endpoint], 1)
	p.dst.pmu.Unlock()
}

func TestUnknownObjectIsNotFound(t *testing.T) {
	p := newPair(t, "", "")
	meta, _ := p.put(t, 3, 64)
	p.host.mu.Lock()
	delete(p.host.objs, core.ObjectID{3})
	p.host.mu.Unlock()
	_, err := p.fetch(t, meta, 64)
	assert.Equal(t, core.ErrNotFound, statusOf(err))
}

// rawConn dials the source and authenticates like a client would.
func rawConn(t *testing.T, p *pair) net.Conn {
	c, err := p.dst.conn(context.Background(), p.src.endpoint)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func TestOutOfRangeRequestIsRefusedAndTheServerStaysUp(t *testing.T) {
	p := newPair(t, "", "")
	meta, want := p.put(t, 4, 1000)
	c := rawConn(t, p)
	for _, req := range []request{
		{Object: core.ObjectID{4}, Tensor: 0, Offset: 999, Length: 2},
		{Object: core.ObjectID{4}, Tensor: 0, Offset: 1001, Length: 0},
		{Object: core.ObjectID{4}, Tensor: 1, Offset: 0, Length: 1},
		{Object: core.ObjectID{4}, Tensor: 0, Offset: 1 << 62, Length: 1 << 29},
	} {
		_, err := c.Write(req.encode(nil))
		require.NoError(t, err)
		st, msg, err := readResponse(c)
		require.NoError(t, err)
		assert.Equal(t, core.ErrInvalidArgument, st, "%+v", req)
		assert.NotEmpty(t, msg)
	}
	// The same connection still serves a good request.
	_, err := c.Write((&request{Object: core.ObjectID{4}, Length: 1000}).encode(nil))
	require.NoError(t, err)
	st, _, err := readResponse(c)
	require.NoError(t, err)
	require.Equal(t, core.OK, st)
	got := make([]byte, 1000)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	assert.Equal(t, want[0], got)
	// And so do new connections.
	g, err := p.fetch(t, meta, 1000)
	require.NoError(t, err)
	assert.Equal(t, want[0], g[0])
	p.host.mu.Lock()
	assert.Equal(t, 0, p.host.pins, "every pin was released")
	p.host.mu.Unlock()
}

func TestMalformedFrameClosesOnlyThatConnection(t *testing.T) {
	p := newPair(t, "", "")
	meta, want := p.put(t, 5, 128)
	c := rawConn(t, p)
	bad := make([]byte, requestLen)
	copy(bad, "JUNK")
	_, err := c.Write(bad)
	require.NoError(t, err)
	st, _, err := readResponse(c)
	require.NoError(t, err)
	assert.Equal(t, core.ErrInvalidArgument, st)
	_, err = c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "the server hung up")
	got, err := p.fetch(t, meta, 128)
	require.NoError(t, err)
	assert.Equal(t, want[0], got[0])
}

func TestWrongTokenIsPermissionDenied(t *testing.T) {
	p := newPair(t, "right", "wrong")
	meta, _ := p.put(t, 6, 64)
	_, err := p.fetch(t, meta, 64)
	assert.Equal(t, core.ErrPermissionDenied, statusOf(err))
	assert.Contains(t, err.Error(), "auth token")
	// With the right token it works.
	q := newPair(t, "right", "right")
	meta, want := q.put(t, 6, 64)
	got, err := q.fetch(t, meta, 64)
	require.NoError(t, err)
	assert.Equal(t, want[0], got[0])
}

func TestAbortStopsALargeTransfer(t *testing.T) {
	p := newPair(t, "", "")
	const n = 512 << 20
	meta, _ := p.put(t, 7, n)
	_, x := buffer(t, n)
	req, err := p.dst.Fetch(&core.Transfer{}, []core.Tensor{x}, meta, nil)
	require.NoError(t, err)
	time.Sleep(5 * time.Millisecond)
	start := time.Now()
	p.dst.Abort(&core.Transfer{}, req)
	err = req.Wait()
	req.Release()
	assert.Equal(t, core.ErrAborted, statusOf(err))
	assert.Less(t, time.Since(start), 5*time.Second)
}

func TestSourceClosedIsPeerUnavailable(t *testing.T) {
	p := newPair(t, "", "")
	meta, _ := p.put(t, 8, 64)
	p.src.Close()
	_, err := p.fetch(t, meta, 64)
	assert.Equal(t, core.ErrPeerUnavailable, statusOf(err))
}

func TestTargetCountMismatch(t *testing.T) {
	p := newPair(t, "", "")
	meta, _ := p.put(t, 9, 64, 64)
	_, err := p.fetch(t, meta, 64)
	assert.Equal(t, core.ErrInvalidArgument, statusOf(err))
}

func TestMetadataRejectsCorruption(t *testing.T) {
	good := (&metadata{Endpoint: "127.0.0.1:5", Object: core.ObjectID{1}, Tensors: 2}).encode()
	m, err := decodeMetadata(good)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:5", m.Endpoint)
	for name, b := range map[string][]byte{
		"empty":     nil,
		"truncated": good[:len(good)-1],
		"trailing":  append(append([]byte{}, good...), 0),
		"magic":     append([]byte("XTCP"), good[4:]...),
		"no host":   (&metadata{}).encode(),
		"binary":    (&metadata{Endpoint: "a\x00b:1"}).encode(),
	} {
		_, err := decodeMetadata(b)
		assert.Equal(t, core.ErrCorrupt, statusOf(err), name)
	}
}

func FuzzDecodeRequest(f *testing.F) {
	f.Add((&request{Object: core.ObjectID{1}, Tensor: 2, Offset: 3, Length: 4}).encode(nil))
	f.Add(make([]byte, requestLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRequest(b)
		if err != nil {
			return
		}
		if r.Length > maxRequest || r.Offset+r.Length < r.Offset {
			t.Fatalf("accepted an unbounded request %+v", r)
		}
		if string(r.encode(nil)) != string(b) {
			t.Fatalf("re-encoding differs")
		}
	})
}

func FuzzDecodeMetadata(f *testing.F) {
	f.Add((&metadata{Endpoint: "host:1", Object: core.ObjectID{1}, Tensors: 1}).encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMetadata(b)
		if err != nil {
			return
		}
		if string(m.encode()) != string(b) {
			t.Fatalf("re-encoding differs")
		}
	})
}

func BenchmarkFetch64MiB(b *testing.B) {
	h := newHost("")
	s, _ := New(h)
	d, _ := New(newHost(""))
	defer s.Close()
	defer d.Close()
	const n = 64 << 20
	_, src := buffer(b, n)
	_, dst := buffer(b, n)
	h.objs[core.ObjectID{1}] = []core.Tensor{src}
	meta, _ := s.ExtractMetadata(core.ObjectID{1}, []core.Tensor{src})
	b.SetBytes(n)
	for i := 0; i < b.N; i++ {
		req, err := d.Fetch(&core.Transfer{}, []core.Tensor{dst}, meta, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := req.Wait(); err != nil {
			b.Fatal(err)
		}
		req.Release()
	}
}
