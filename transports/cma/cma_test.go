package cma

import (
	"os"
	"os/exec"
	"testing"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// buffer maps n bytes outside the Go heap (the race detector's pointer
// checks refuse Go memory addressed through uintptr).
func buffer(t testing.TB, n int) ([]byte, transport.Tensor) {
	t.Helper()
	size := max(n, 1)
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(b) })
	b = b[:n]
	desc, err := transport.NewTensorDesc(transport.Device{Type: transport.DeviceCPU}, transport.DType{Code: 1, Bits: 8, Lanes: 1}, []int64{int64(n)})
	require.NoError(t, err)
	addr := uintptr(0)
	if n > 0 {
		addr = uintptr(unsafePointer(b))
	}
	return b, transport.Tensor{TensorDesc: desc, Data: addr, Orig: addr}
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*7) + seed
	}
}

func newTransport(t testing.TB) *Transport {
	tr, err := New(transporttest.NewHost(t))
	require.NoError(t, err)
	return tr.(*Transport)
}

// from is a transfer of obj from the runtime in process pid, as the core
// describes it to the transport.
func from(obj transport.ObjectID, pid int) *transport.Transfer {
	return &transport.Transfer{Object: obj, Transport: Name, Role: transport.RoleDestination, Source: transport.PeerInfo{Name: "source", Pid: pid}}
}

// fetch fetches obj, put by this process.
func fetch(t testing.TB, tr *Transport, obj transport.ObjectID, meta []byte, targets []transport.Tensor) error {
	return fetchFrom(t, tr, from(obj, os.Getpid()), meta, targets)
}

func fetchFrom(t testing.TB, tr *Transport, x *transport.Transfer, meta []byte, targets []transport.Tensor) error {
	req, err := tr.Fetch(x, targets, meta, nil)
	if err != nil {
		return err
	}
	defer req.Release()
	return req.Wait()
}

func TestUnmappedSourceIsAClearError(t *testing.T) {
	tr := newTransport(t)
	b, src := buffer(t, 4096)
	meta, err := tr.ExtractMetadata(transport.ObjectID{9}, []transport.Tensor{src})
	require.NoError(t, err)
	_, dst := buffer(t, 4096)
	// The memory is gone as far as readers go (unmapping it here would let
	// another mapping take its place before the test's cleanup unmaps it).
	require.NoError(t, unix.Mprotect(b[:cap(b)], unix.PROT_NONE))
	t.Cleanup(func() { _ = unix.Mprotect(b[:cap(b)], unix.PROT_READ|unix.PROT_WRITE) })
	err = fetch(t, tr, transport.ObjectID{9}, meta, []transport.Tensor{dst})
	require.Error(t, err)
	assert.Equal(t, transport.ErrInternal, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "no longer mapped")
}

func TestRecycledPidIsPeerUnavailable(t *testing.T) {
	tr := newTransport(t)
	_, src := buffer(t, 64)
	_, dst := buffer(t, 64)
	m := metadata{Pid: uint32(os.Getpid()), StartTime: tr.startTime + 1, Guard: slotSize, Token: 1,
		Regions: []region{{Addr: uint64(src.Data), Size: 64}}}
	err := fetch(t, tr, transport.ObjectID{1}, m.encode(), []transport.Tensor{dst})
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "another process")
}

func TestAFreedObjectIsNeverReported(t *testing.T) {
	tr := newTransport(t)
	sb, src := buffer(t, 8192)
	fill(sb, 3)
	got, dst := buffer(t, 8192)
	meta, err := tr.ExtractMetadata(transport.ObjectID{4}, []transport.Tensor{src})
	require.NoError(t, err)
	require.NoError(t, fetch(t, tr, transport.ObjectID{4}, meta, []transport.Tensor{dst}))
	assert.Equal(t, sb, got)
	// The owner frees the object (its runtime is destroyed, say) while a
	// borrower still holds the metadata: the memory is still mapped, but the
	// read must not be reported as the object's bytes.
	tr.GarbageCollect(transport.ObjectID{4}, []transport.Tensor{src}, meta)
	err = fetch(t, tr, transport.ObjectID{4}, meta, []transport.Tensor{dst})
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "freed")
	// A new object reusing the guard word gets another token.
	meta2, err := tr.ExtractMetadata(transport.ObjectID{5}, []transport.Tensor{src})
	require.NoError(t, err)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(fetch(t, tr, transport.ObjectID{4}, meta, []transport.Tensor{dst})))
	require.NoError(t, fetch(t, tr, transport.ObjectID{5}, meta2, []transport.Tensor{dst}))
}

// The descriptor keeps cma to its host, notices freed objects, and puts its
// metadata in every ref.
func TestDescribe(t *testing.T) {
	d := newTransport(t).Describe()
	assert.Equal(t, Name, d.Name)
	assert.True(t, d.OneSided && d.CanAbort && d.SameHostOnly && d.DetectsFreedObjects && d.Eager())
	assert.Equal(t, transport.AutoRank{Host: 10}, d.Auto)
	assert.False(t, d.GroupBackend)
}

// ---- another process --------------------------------------------------------

// childObject is the id of the object a source process puts.
var childObject = transporttest.SourceObject

// startChild runs a source process putting n bytes and returns it with
// the object's metadata.
func startChild(t *testing.T, n int) (*exec.Cmd, []byte) {
	s := transporttest.StartSource(t, n)
	return s.Cmd, s.Meta
}

func TestReadFromAnotherProcess(t *testing.T) {
	const n = 40 << 20 // above parallelMin: several workers
	src := transporttest.StartSource(t, n)
	tr := newTransport(t)
	got, dst := buffer(t, n)
	require.NoError(t, fetchFrom(t, tr, from(childObject, src.Cmd.Process.Pid), src.Meta, []transport.Tensor{dst}))
	assert.True(t, string(src.Want[0]) == string(got), "contents differ")
}

func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
