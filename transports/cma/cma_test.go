package cma

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// testHost is the little of a runtime the transport asks for.
type testHost struct{}

func (testHost) Identity() transport.PeerInfo { return transport.PeerInfo{Name: "test", HostID: "h"} }
func (testHost) Log() *transport.Logger       { return transport.NewLogger("test", transport.LogOff) }
func (testHost) Context() context.Context     { return context.Background() }
func (testHost) AuthToken() string            { return "" }
func (testHost) RuntimeSecret() string        { return "test-secret" }
func (testHost) BindHost() string             { return "127.0.0.1" }
func (testHost) AdvertiseHost() string        { return "127.0.0.1" }
func (testHost) SocketDir() string            { return os.TempDir() }

// PeerTimeout implements transport.Host.
func (testHost) PeerTimeout() time.Duration   { return transport.DefaultPeerTimeout }
func (testHost) Settings() transport.Settings { return transport.DefaultSettings() }

func (testHost) PinObject(transport.ObjectID) ([]transport.Tensor, func(), error) {
	return nil, nil, transport.Errorf(transport.ErrNotFound, "no objects")
}

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
	tr, err := New(testHost{})
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

func statusOf(err error) transport.Status {
	var e *transport.Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

func TestRoundTripInProcess(t *testing.T) {
	tr := newTransport(t)
	sizes := []int{0, 1, 4096, 300 << 10, 64 << 20}
	var srcs, dsts []transport.Tensor
	var want, got [][]byte
	for i, n := range sizes {
		sb, st := buffer(t, n)
		fill(sb, byte(i))
		db, dt := buffer(t, n)
		srcs, dsts = append(srcs, st), append(dsts, dt)
		want, got = append(want, sb), append(got, db)
	}
	meta, err := tr.ExtractMetadata(transport.ObjectID{1}, srcs)
	require.NoError(t, err)
	require.NoError(t, fetch(t, tr, transport.ObjectID{1}, meta, dsts))
	for i := range sizes {
		assert.Equal(t, want[i], got[i], "tensor %d", i)
	}
}

func TestSizeMismatchAndCountMismatch(t *testing.T) {
	tr := newTransport(t)
	_, src := buffer(t, 100)
	_, dst := buffer(t, 99)
	meta, err := tr.ExtractMetadata(transport.ObjectID{1}, []transport.Tensor{src})
	require.NoError(t, err)
	err = fetch(t, tr, transport.ObjectID{1}, meta, []transport.Tensor{dst})
	assert.Equal(t, transport.ErrInvalidArgument, statusOf(err))
	err = fetch(t, tr, transport.ObjectID{1}, meta, nil)
	assert.Equal(t, transport.ErrInvalidArgument, statusOf(err))
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
	assert.Equal(t, transport.ErrInternal, statusOf(err))
	assert.Contains(t, err.Error(), "no longer mapped")
}

func TestRecycledPidIsPeerUnavailable(t *testing.T) {
	tr := newTransport(t)
	_, src := buffer(t, 64)
	_, dst := buffer(t, 64)
	m := metadata{Pid: uint32(os.Getpid()), StartTime: tr.startTime + 1, Guard: slotSize, Token: 1,
		Regions: []region{{Addr: uint64(src.Data), Size: 64}}}
	err := fetch(t, tr, transport.ObjectID{1}, m.encode(), []transport.Tensor{dst})
	assert.Equal(t, transport.ErrPeerUnavailable, statusOf(err))
	assert.Contains(t, err.Error(), "another process")
}

func TestAbortStopsALargeRead(t *testing.T) {
	tr := newTransport(t)
	const n = 512 << 20
	_, src := buffer(t, n)
	_, dst := buffer(t, n)
	meta, err := tr.ExtractMetadata(transport.ObjectID{1}, []transport.Tensor{src})
	require.NoError(t, err)
	req, err := tr.Fetch(from(transport.ObjectID{1}, os.Getpid()), []transport.Tensor{dst}, meta, nil)
	require.NoError(t, err)
	tr.Abort(&transport.Transfer{}, req)
	err = req.Wait()
	req.Release()
	assert.Equal(t, transport.ErrAborted, statusOf(err))
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
	assert.Equal(t, transport.ErrPeerUnavailable, statusOf(err))
	assert.Contains(t, err.Error(), "freed")
	// A new object reusing the guard word gets another token.
	meta2, err := tr.ExtractMetadata(transport.ObjectID{5}, []transport.Tensor{src})
	require.NoError(t, err)
	assert.Equal(t, transport.ErrPeerUnavailable, statusOf(fetch(t, tr, transport.ObjectID{4}, meta, []transport.Tensor{dst})))
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

const childEnv = "RDT_CMA_TEST_CHILD"

func TestMain(m *testing.M) {
	if n := os.Getenv(childEnv); n != "" {
		childMain(n)
		return
	}
	os.Exit(m.Run())
}

// childObject is the id of the object a child puts.
var childObject = transport.ObjectID{7}

// childMain maps n bytes, fills them, prints its metadata as hex and
// waits to be killed.
func childMain(size string) {
	n, _ := strconv.Atoi(size)
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fill(b, 5)
	tr, err := New(testHost{})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	meta, _ := tr.ExtractMetadata(childObject, []transport.Tensor{{TensorDesc: transport.TensorDesc{Device: transport.Device{Type: transport.DeviceCPU}, Nbytes: uint64(n)}, Data: uintptr(unsafePointer(b))}})
	fmt.Printf("META %x\n", meta)
	time.Sleep(time.Minute)
	os.Exit(0)
}

func startChild(t *testing.T, n int) (*exec.Cmd, []byte) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+strconv.Itoa(n))
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	hex, ok := strings.CutPrefix(strings.TrimSpace(line), "META ")
	require.True(t, ok, "child said %q", line)
	var meta []byte
	_, err = fmt.Sscanf(hex, "%x", &meta)
	require.NoError(t, err)
	return cmd, meta
}

func TestReadFromAnotherProcess(t *testing.T) {
	const n = 40 << 20 // above parallelMin: several workers
	cmd, meta := startChild(t, n)
	tr := newTransport(t)
	got, dst := buffer(t, n)
	require.NoError(t, fetchFrom(t, tr, from(childObject, cmd.Process.Pid), meta, []transport.Tensor{dst}))
	want := make([]byte, n)
	fill(want, 5)
	assert.True(t, string(want) == string(got), "contents differ")
}

func TestKilledSourceIsPeerUnavailable(t *testing.T) {
	cmd, meta := startChild(t, 4096)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	tr := newTransport(t)
	_, dst := buffer(t, 4096)
	err := fetchFrom(t, tr, from(childObject, cmd.Process.Pid), meta, []transport.Tensor{dst})
	assert.Equal(t, transport.ErrPeerUnavailable, statusOf(err))
}

func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
