package shm

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func socketDir(t testing.TB) string {
	// t.TempDir paths can exceed the Unix socket path limit.
	dir, err := os.MkdirTemp("", "rdtshm")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o700))
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func newTransport(t testing.TB) *Transport {
	tr, err := New(transporttest.NewHostIn(socketDir(t)))
	require.NoError(t, err)
	t.Cleanup(func() { tr.Close() })
	return tr.(*Transport)
}

// newSegmentTransport has no arena: every object gets a segment of its own.
func newSegmentTransport(t testing.TB) *Transport {
	tr, err := New(noArena{transporttest.NewHostIn(socketDir(t))})
	require.NoError(t, err)
	t.Cleanup(func() { tr.Close() })
	return tr.(*Transport)
}

func stageObject(t *testing.T, tr *Transport, id byte, sizes ...int) ([]byte, [][]byte) {
	tensors, want := transporttest.Filled(t, id, sizes...)
	meta, err := tr.ExtractMetadata(transport.ObjectID{id}, tensors)
	require.NoError(t, err)
	// Staging copied the bytes: changing the source afterwards changes
	// nothing a receiver sees.
	expect := make([][]byte, len(want))
	for i := range want {
		expect[i] = append([]byte(nil), want[i]...)
	}
	return meta, expect
}

// fetched fetches meta's object (tensors as long as want's) and checks
// that it holds want.
func fetched(t *testing.T, tr *Transport, meta []byte, want [][]byte) {
	t.Helper()
	sizes := make([]int, len(want))
	for i := range want {
		sizes[i] = len(want[i])
	}
	got, err := fetch(t, tr, meta, sizes...)
	require.NoError(t, err)
	assert.Equal(t, want, got)
}

func fetch(t *testing.T, tr *Transport, meta []byte, sizes ...int) ([][]byte, error) {
	return fetchFrom(t, tr, meta, os.Getpid(), sizes...)
}

// fetchFrom fetches an object that the process pid owns.
func fetchFrom(t *testing.T, tr *Transport, meta []byte, pid int, sizes ...int) ([][]byte, error) {
	targets, got := transporttest.Buffers(t, sizes...)
	x := transferOf(t, meta)
	x.Source.Pid = pid
	req, err := tr.Fetch(x, targets, meta, nil)
	if err != nil {
		return nil, err
	}
	defer req.Release()
	return got, req.Wait()
}

// sourceRuntime stands for the runtime that owns the test's objects.
var sourceRuntime = transport.RuntimeID{0x5e}

// transferOf is the transfer the core would describe for the object meta
// names, put by a runtime of this process.
func transferOf(t testing.TB, meta []byte) *transport.Transfer {
	m, err := decodeMetadata(meta)
	require.NoError(t, err)
	return &transport.Transfer{Object: m.Object, Transport: Name, Role: transport.RoleDestination,
		Source: transport.PeerInfo{RuntimeID: sourceRuntime, Name: "source", Pid: os.Getpid()}}
}

// devShm lists what rdt could have left in /dev/shm. Other processes'
// files (UCX's, say, from tests running beside these) are not ours to
// judge.
func devShm(t *testing.T) []string {
	entries, _ := os.ReadDir("/dev/shm")
	var names []string
	for _, e := range entries {
		if strings.Contains(strings.ToLower(e.Name()), "rdt") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names
}

func TestRoundTrip(t *testing.T) {
	before := devShm(t)
	src, dst := newTransport(t), newTransport(t)
	sizes := []int{0, 1, 4096, 3 << 20, 64 << 20}
	meta, want := stageObject(t, src, 1, sizes...)
	for round := 0; round < 2; round++ {
		got, err := fetch(t, dst, meta, sizes...)
		require.NoError(t, err)
		for i := range sizes {
			assert.True(t, string(want[i]) == string(got[i]), "round %d tensor %d differs", round, i)
		}
	}
	assert.Equal(t, before, devShm(t), "nothing was created in /dev/shm")
}

func TestSegmentIsSealed(t *testing.T) {
	src := newSegmentTransport(t)
	meta, _ := stageObject(t, src, 3, 8192)
	m, err := decodeMetadata(meta)
	require.NoError(t, err)
	dst := newTransport(t)
	kept, err := dst.peers.record(transport.PeerInfo{RuntimeID: sourceRuntime})
	require.NoError(t, err)
	a, err := dst.rcv.getSegment(nil, kept, os.Getpid(), m, nil, false)
	require.NoError(t, err)
	fd, size := a.fd, a.size
	defer unix.Close(fd)
	assert.Equal(t, uint64(8192), size)
	_, err = unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	assert.Error(t, err, "a writable shared mapping is refused")
	assert.Error(t, unix.Ftruncate(fd, 1), "shrinking is refused")
	_, err = unix.Pwrite(fd, []byte{1}, 0)
	assert.Error(t, err, "writing is refused")
}

// Receivers keep their connection to a segment server for the next
// request, and start a new one when the server has closed the old one (it
// does after idleTimeout, or when its runtime goes).
func TestSegmentConnectionsAreKeptAndRenewed(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	meta, want := stageObject(t, src, 7, 4096)
	for i := 0; i < 3; i++ {
		fetched(t, dst, meta, want)
	}
	assert.Equal(t, 1, dst.peers.count(), "three fetches in a row share one connection")
	src.srv.mu.Lock()
	assert.Len(t, src.srv.conns, 1)
	for c := range src.srv.conns {
		c.Close() // as the server does to an idle connection
	}
	src.srv.mu.Unlock()
	got, err := fetch(t, dst, meta, 4096)
	require.NoError(t, err, "a closed kept connection is replaced")
	assert.Equal(t, want, got)

	require.NoError(t, src.Close())
	_, err = fetch(t, dst, meta, 4096)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
}

func TestOwnerClosedIsPeerUnavailable(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	meta, _ := stageObject(t, src, 4, 100)
	require.NoError(t, src.Close())
	_, err := fetch(t, dst, meta, 100)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err))
	m, _ := decodeMetadata(meta)
	_, err = os.Stat(m.Path)
	assert.True(t, os.IsNotExist(err), "the socket file is removed at close")
}

// The descriptor keeps shm to its host and stages nothing at put (no eager
// metadata: staging costs a copy).
func TestDescribe(t *testing.T) {
	d := newTransport(t).Describe()
	assert.Equal(t, Name, d.Name)
	assert.True(t, d.OneSided && d.CanAbort && d.SameHostOnly && d.DetectsFreedObjects && d.Ranges)
	assert.False(t, d.Eager(), "staging costs a copy: only on demand")
	assert.Equal(t, transport.AutoRank{Host: 20}, d.Auto)
}

func TestStaleSocketsOfDeadProcessesAreRemoved(t *testing.T) {
	dir := socketDir(t)
	stale := filepath.Join(dir, "shm-999999999-abcdef.sock")
	require.NoError(t, os.WriteFile(stale, nil, 0o600))
	live := filepath.Join(dir, "shm-1-abcdef.sock") // pid 1 always exists
	require.NoError(t, os.WriteFile(live, nil, 0o600))
	tr, err := New(transporttest.NewHostIn(dir))
	require.NoError(t, err)
	defer tr.Close()
	_, x := transporttest.Buffer(t, 8)
	_, err = tr.ExtractMetadata(transport.ObjectID{7}, []transport.Tensor{x})
	require.NoError(t, err)
	_, err = os.Stat(stale)
	assert.True(t, os.IsNotExist(err))
	_, err = os.Stat(live)
	assert.NoError(t, err)
}

func BenchmarkFetch4KiB(b *testing.B)  { benchFetch(b, 4<<10) }
func BenchmarkFetch64MiB(b *testing.B) { benchFetch(b, 64<<20) }

func benchFetch(b *testing.B, n int) {
	src, _ := New(transporttest.NewHostIn(socketDir(b)))
	dst, _ := New(transporttest.NewHostIn(socketDir(b)))
	defer src.Close()
	defer dst.Close()
	_, s := transporttest.Buffer(b, n)
	_, d := transporttest.Buffer(b, n)
	meta, err := src.ExtractMetadata(transport.ObjectID{1}, []transport.Tensor{s})
	require.NoError(b, err)
	x := transferOf(b, meta)
	b.SetBytes(int64(n))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req, err := dst.Fetch(x, []transport.Tensor{d}, meta, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := req.Wait(); err != nil {
			b.Fatal(err)
		}
		req.Release()
	}
}

func BenchmarkMemcpy64MiB(b *testing.B) {
	const n = 64 << 20
	s, _ := transporttest.Buffer(b, n)
	d, _ := transporttest.Buffer(b, n)
	b.SetBytes(n)
	for i := 0; i < b.N; i++ {
		copy(d, s)
	}
}
