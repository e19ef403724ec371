package engine

import (
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
)

// hostBuf is host memory outside the Go heap (as C or Python memory is), so
// that tensors may point at it under the race detector's pointer checks.
type hostBuf struct {
	b []byte
}

func newHostBuf(t testing.TB, n int) *hostBuf {
	t.Helper()
	size := n
	if size == 0 {
		size = 1
	}
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(b) })
	return &hostBuf{b: b[:n]}
}

func (h *hostBuf) addr() uintptr {
	if cap(h.b) == 0 {
		return 0
	}
	return uintptr(unsafePointer(h.b[:1]))
}

func (h *hostBuf) fill(seed byte) {
	for i := range h.b {
		h.b[i] = seed + byte(i*7)
	}
}

// tensorOf describes a float32 vector over buf.
func tensorOf(t testing.TB, buf *hostBuf) transport.Tensor {
	t.Helper()
	d, err := transport.NewTensorDesc(transport.Device{Type: transport.DeviceCPU}, transport.DType{Code: 2, Bits: 32, Lanes: 1}, []int64{int64(len(buf.b) / 4)})
	require.NoError(t, err)
	return transport.Tensor{TensorDesc: d, Data: buf.addr(), Orig: buf.addr()}
}

func newRuntime(t testing.TB, name string, opts ...func(*Options)) *Runtime {
	t.Helper()
	o := Options{Name: name, LogLevel: transport.LogOff}
	for _, f := range opts {
		f(&o)
	}
	rt, err := NewRuntime(o)
	require.NoError(t, err)
	t.Cleanup(rt.Destroy)
	return rt
}

func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, 5*time.Second, time.Millisecond, msg)
}

// putOne puts a 4096-byte tensor in rt; released counts the runs of its
// release callback.
func putOne(t *testing.T, rt *Runtime, transportName string, released *atomic.Int64) (*Ref, *hostBuf) {
	t.Helper()
	buf := newHostBuf(t, 4096)
	buf.fill(3)
	ref, err := rt.Put([]transport.Tensor{tensorOf(t, buf)}, transportName, func() { released.Add(1) })
	require.NoError(t, err)
	return ref, buf
}

// serialized is a ref's serialized bytes.
func serialized(t *testing.T, ref *Ref) []byte {
	t.Helper()
	b, err := ref.Serialize()
	require.NoError(t, err)
	return b
}

// deserialized is the ref rt makes of serialized bytes.
func deserialized(t *testing.T, rt *Runtime, b []byte) *Ref {
	t.Helper()
	ref, err := rt.Deserialize(b)
	require.NoError(t, err)
	return ref
}

// lendOne puts an object in rt as putOne does, serializes a ref to it and
// releases the owner's handle: only the bytes' lease holds the object.
func lendOne(t *testing.T, rt *Runtime, transportName string, released *atomic.Int64) ([]byte, *hostBuf) {
	t.Helper()
	ref, buf := putOne(t, rt, transportName, released)
	b := serialized(t, ref)
	require.NoError(t, ref.Release())
	return b, buf
}

// borrowIn is rt's ref of ref's serialized bytes, released when the test
// ends.
func borrowIn(t *testing.T, rt *Runtime, ref *Ref) *Ref {
	t.Helper()
	borrowed := deserialized(t, rt, serialized(t, ref))
	t.Cleanup(func() { borrowed.Release() })
	return borrowed
}

// memTransport is a test transport for runtimes of one process: the source
// publishes its tensors' addresses as metadata and the destination copies
// from them. Hooks let tests block, fail and observe every call.
type memTransport struct {
	name     string
	oneSided bool
	canAbort bool
	ranges   bool // serves partial fetches
	writes   bool // writes into exposed objects

	mu     sync.Mutex
	events []string

	gcCount      atomic.Int64
	released     atomic.Int64
	fetched      atomic.Int64
	aborts       atomic.Int64
	sends        atomic.Int64
	failFetchIdx int   // fail the Nth Fetch call at start (1-based; 0 never)
	failWrite    error // when set, Write fails with it at start
	waitErr      func(x *transport.Transfer) error
	gate         chan struct{}                 // when set, transfers wait for it (or abort)
	mailbox      *sync.Map                     // transfer id -> chan []byte (two-sided), shared by a pair
	collected    *sync.Map                     // object ids garbage-collected at the source, shared by a pair
	gcDelay      time.Duration                 // GarbageCollect takes this long before the object is gone
	describe     func(d *transport.Descriptor) // when set, adjusts the descriptor
	panicIn      string                        // a call that panics: "communicator metadata", "fetch", "write", "wait" or "release"
}

// mayPanic panics when call is the one the test made panic.
func (m *memTransport) mayPanic(call string) {
	if m.panicIn == call {
		panic("transport " + m.name + " panicked in " + call)
	}
}

func newMemTransport(name string) *memTransport {
	return &memTransport{name: name, oneSided: true, canAbort: true, mailbox: &sync.Map{}, collected: &sync.Map{}}
}

func (m *memTransport) log(ev string) {
	m.mu.Lock()
	m.events = append(m.events, ev)
	m.mu.Unlock()
}

func (m *memTransport) Events() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.events...)
}

func (m *memTransport) Describe() transport.Descriptor {
	d := transport.Descriptor{Name: m.name, Devices: []transport.DeviceType{transport.DeviceCPU}, OneSided: m.oneSided, CanAbort: m.canAbort, Ranges: m.ranges, Writes: m.writes}
	if m.describe != nil {
		m.describe(&d)
	}
	return d
}
func (m *memTransport) Close() error { return nil }

func (m *memTransport) ExtractMetadata(obj transport.ObjectID, ts []transport.Tensor) ([]byte, error) {
	var b []byte
	for _, t := range ts {
		b = binary.LittleEndian.AppendUint64(b, uint64(t.Data))
		b = binary.LittleEndian.AppendUint64(b, t.Nbytes)
	}
	return b, nil
}

func (m *memTransport) CommunicatorMetadata(x *transport.Transfer) ([]byte, error) {
	m.mayPanic("communicator metadata")
	return []byte("comm"), nil
}

func (m *memTransport) GarbageCollect(obj transport.ObjectID, ts []transport.Tensor, tmeta []byte) {
	time.Sleep(m.gcDelay)
	m.gcCount.Add(1)
	m.collected.Store(obj, true)
	m.log("gc")
}

type memRequest struct {
	m       *memTransport
	x       *transport.Transfer
	targets []transport.Tensor
	tmeta   []byte
	abort   chan struct{}
	once    sync.Once
	write   bool // targets are a write's sources, copied into the object
}

func (m *memTransport) Fetch(x *transport.Transfer, targets []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	n := m.fetched.Add(1)
	m.log("fetch")
	m.mayPanic("fetch")
	if int(n) == m.failFetchIdx {
		return nil, transport.Errorf(transport.ErrTransport, "fetch %d refused", n)
	}
	if string(cmeta) != "comm" {
		return nil, errors.New("communicator metadata did not arrive")
	}
	return &memRequest{m: m, x: x, targets: targets, tmeta: tmeta, abort: make(chan struct{})}, nil
}

func (m *memTransport) Write(x *transport.Transfer, sources []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	m.log("write")
	m.mayPanic("write")
	if m.failWrite != nil {
		return nil, m.failWrite
	}
	if string(cmeta) != "comm" {
		return nil, errors.New("communicator metadata did not arrive")
	}
	return &memRequest{m: m, x: x, targets: sources, tmeta: tmeta, abort: make(chan struct{}), write: true}, nil
}

func (r *memRequest) Wait() error {
	r.m.log("wait")
	r.m.mayPanic("wait")
	if r.m.gate != nil {
		select {
		case <-r.m.gate:
		case <-r.abort:
			return transport.Errorf(transport.ErrAborted, "aborted")
		}
	}
	if r.m.waitErr != nil {
		if err := r.m.waitErr(r.x); err != nil {
			return err
		}
	}
	if !r.m.oneSided {
		ch := r.m.box(r.x.TransferID)
		select {
		case data := <-ch:
			off := 0 // the source sent the pieces (or tensors) in order
			for _, t := range r.targets {
				copy(transport.Bytes(t.Data, t.Nbytes), data[off:off+int(t.Nbytes)])
				off += int(t.Nbytes)
			}
			return nil
		case <-r.abort:
			return transport.Errorf(transport.ErrAborted, "aborted")
		}
	}
	if _, freed := r.m.collected.Load(r.x.Object); freed {
		// What a transport with DetectsFreedObjects does.
		return transport.Errorf(transport.ErrNotFound, "the source freed object %s", r.x.Object)
	}
	for i, t := range r.targets {
		p := r.x.PieceOf(i, t)
		src := uintptr(binary.LittleEndian.Uint64(r.tmeta[16*p.Tensor:])) + uintptr(p.Offset)
		if r.write {
			copy(transport.Bytes(src, p.Length), transport.Bytes(t.Data, t.Nbytes))
			continue
		}
		copy(transport.Bytes(t.Data, t.Nbytes), transport.Bytes(src, p.Length))
	}
	return nil
}

func (r *memRequest) Release() {
	r.m.released.Add(1)
	r.m.log("release")
	r.m.mayPanic("release")
}

func (m *memTransport) Abort(x *transport.Transfer, req transport.Request) {
	m.aborts.Add(1)
	if r, ok := req.(*memRequest); ok {
		r.once.Do(func() { close(r.abort) })
	}
}

func (m *memTransport) box(id uint64) chan []byte {
	ch, _ := m.mailbox.LoadOrStore(id, make(chan []byte, 1))
	return ch.(chan []byte)
}

func (m *memTransport) Send(x *transport.Transfer, ts []transport.Tensor, tmeta, cmeta []byte) error {
	m.sends.Add(1)
	m.log("send")
	pieces := x.Pieces
	if pieces == nil {
		for i, t := range ts {
			pieces = append(pieces, transport.Piece{Tensor: uint32(i), Length: t.Nbytes})
		}
	}
	var data []byte
	for _, p := range pieces {
		data = append(data, transport.Bytes(ts[p.Tensor].Data+uintptr(p.Offset), p.Length)...)
	}
	m.box(x.TransferID) <- data
	return nil
}

// pair is an owner and a borrower runtime with the same test transport.
type pair struct {
	owner, borrower *Runtime
	src, dst        *memTransport
}

func newPair(t *testing.T, configure func(*memTransport)) *pair {
	t.Helper()
	return pairOf(t, newRuntime(t, "owner"), newRuntime(t, "borrower"), configure)
}

// gatedPair is a pair whose transfers wait until gate is closed (or they
// are aborted); configure, when given, sets the transports up further.
func gatedPair(t *testing.T, configure func(*memTransport)) (p *pair, gate chan struct{}) {
	t.Helper()
	gate = make(chan struct{})
	p = newPair(t, func(m *memTransport) {
		m.gate = gate
		if configure != nil {
			configure(m)
		}
	})
	return p, gate
}

// pairOf registers a "mem" transport in owner and one in borrower, each
// set up by configure, that share their two-sided channel.
func pairOf(t *testing.T, owner, borrower *Runtime, configure func(*memTransport)) *pair {
	t.Helper()
	p := &pair{owner: owner, borrower: borrower, src: newMemTransport("mem"), dst: newMemTransport("mem")}
	p.dst.mailbox = p.src.mailbox // the pair's two-sided channel
	if configure != nil {
		configure(p.src)
		configure(p.dst)
	}
	require.NoError(t, p.owner.RegisterTransport(p.src))
	require.NoError(t, p.borrower.RegisterTransport(p.dst))
	return p
}

// lend puts tensors in the owner, serializes a ref and releases the
// owner's handle, and returns the borrower's ref of the bytes, released
// when the test ends.
func (p *pair) lend(t *testing.T, tensors []transport.Tensor, transportName string) *Ref {
	t.Helper()
	ref, err := p.owner.Put(tensors, transportName, nil)
	require.NoError(t, err)
	b := serialized(t, ref)
	require.NoError(t, ref.Release())
	borrowed := deserialized(t, p.borrower, b)
	t.Cleanup(func() { borrowed.Release() })
	return borrowed
}

// share puts n buffers of size bytes in the owner and returns the borrowed
// refs and the source buffers.
func (p *pair) share(t *testing.T, n, size int, transportName string) ([]*Ref, []*hostBuf) {
	t.Helper()
	refs := make([]*Ref, n)
	bufs := make([]*hostBuf, n)
	for i := range refs {
		bufs[i] = newHostBuf(t, size)
		bufs[i].fill(byte(i + 1))
		refs[i] = p.lend(t, []transport.Tensor{tensorOf(t, bufs[i])}, transportName)
	}
	return refs, bufs
}

// shareToFetch is share over "mem" with a target for every object: the
// borrowed refs, the targets, and the source and target buffers.
func (p *pair) shareToFetch(t *testing.T, n, size int) (refs []*Ref, targets []transport.Tensor, src, dst []*hostBuf) {
	t.Helper()
	refs, src = p.share(t, n, size, "mem")
	targets, dst = targetsFor(t, src)
	return refs, targets, src, dst
}

// startFetch starts the borrower's fetch of refs into targets.
func (p *pair) startFetch(t *testing.T, refs []*Ref, targets []transport.Tensor, opts FetchOptions) *Fetch {
	t.Helper()
	f, err := p.borrower.StartFetch(refs, targets, opts)
	require.NoError(t, err)
	return f
}

func targetsFor(t *testing.T, bufs []*hostBuf) ([]transport.Tensor, []*hostBuf) {
	t.Helper()
	out := make([]*hostBuf, len(bufs))
	ts := make([]transport.Tensor, len(bufs))
	for i, b := range bufs {
		out[i] = newHostBuf(t, len(b.b))
		ts[i] = tensorOf(t, out[i])
	}
	return ts, out
}
