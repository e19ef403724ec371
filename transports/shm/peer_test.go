package shm

import (
	"fmt"
	"net"
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(entries)
}

func allZero(b []byte) bool {
	for _, v := range b {
		if v != 0 {
			return false
		}
	}
	return true
}

func fetchWith(t *testing.T, tr *Transport, x *transport.Transfer, meta []byte, n int) ([]byte, error) {
	got, target := transporttest.Buffer(t, n)
	req, err := tr.Fetch(x, []transport.Tensor{target}, meta, nil)
	if err != nil {
		return got, err
	}
	defer req.Release()
	return got, req.Wait()
}

// A receiver keeps its connection to a source's segment server for the
// next fetch, and closes it once the core reports that source gone.
func TestPeerGoneClosesKeptConnections(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	meta, _ := stageObject(t, src, 1, 4096)
	base := openFDs(t)
	_, err := fetch(t, dst, meta, 4096)
	require.NoError(t, err)
	assert.Equal(t, 1, dst.peers.count())
	dst.PeerGone(transport.PeerInfo{RuntimeID: transport.RuntimeID{0x77}, Pid: os.Getpid()})
	assert.Equal(t, 1, dst.peers.count(), "another runtime going away changes nothing")
	dst.PeerGone(transport.PeerInfo{RuntimeID: sourceRuntime, Pid: os.Getpid()})
	assert.Equal(t, 0, dst.peers.count())
	// Both ends are in this process: the server closes its end on EOF.
	require.Eventually(t, func() bool { return openFDs(t) <= base }, 5*time.Second, 5*time.Millisecond,
		"the connection's descriptors are closed (%d open, %d before)", openFDs(t), base)
	// A later fetch from a runtime of that id (it was not gone after all)
	// connects again.
	_, err = fetch(t, dst, meta, 4096)
	require.NoError(t, err)
	assert.Equal(t, 1, dst.peers.count())
}

// A connection that comes back from a fetch after its source was reported
// gone is closed, not kept.
func TestConnectionOfAGoneSourceIsNotKept(t *testing.T) {
	dst := newTransport(t)
	peer := transport.PeerInfo{RuntimeID: sourceRuntime, Pid: os.Getpid()}
	kept, err := dst.peers.record(peer)
	require.NoError(t, err)
	dst.PeerGone(peer)
	assertNotKept(t, dst, kept)
}

// The record of a source is dropped when another source's is made while it
// keeps nothing (its end may have been reported before its first fetch
// began), so the receiver's records stay bounded; a connection that comes
// back to a dropped record is closed.
func TestRecordsThatKeepNothingAreDropped(t *testing.T) {
	dst := newTransport(t)
	first, err := dst.peers.record(transport.PeerInfo{RuntimeID: transport.RuntimeID{1}})
	require.NoError(t, err)
	_, err = dst.peers.record(transport.PeerInfo{RuntimeID: transport.RuntimeID{2}})
	require.NoError(t, err)
	dst.peers.mu.Lock()
	_, kept := dst.peers.idle[transport.RuntimeID{1}]
	records := len(dst.peers.idle)
	dst.peers.mu.Unlock()
	assert.False(t, kept)
	assert.Equal(t, 1, records)
	assertNotKept(t, dst, first)
}

// assertNotKept hands a connection back to rec as a fetch does at its
// end, and checks that dst closed it rather than keep it.
func assertNotKept(t *testing.T, dst *Transport, rec *keptConns) {
	t.Helper()
	a, b, err := socketPair()
	require.NoError(t, err)
	defer b.Close()
	dst.peers.keepIdle(rec, "/some/path", a)
	assert.Equal(t, 0, dst.peers.count())
	_, err = a.Write([]byte{1})
	assert.Error(t, err, "the connection was closed")
}

func socketPair() (*net.UnixConn, *net.UnixConn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			panic(err)
		}
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1]), nil
}

// Ref bytes are checksummed, not signed: metadata taken from another
// object's ref is refused before anything is asked of the server.
func TestMetadataOfAnotherObjectIsRefused(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	secret, _ := stageObject(t, src, 1, 4096)
	_, _ = stageObject(t, src, 2, 4096)
	x := transferOf(t, secret)
	x.Object = transport.ObjectID{2}
	got, err := fetchWith(t, dst, x, secret, 4096)
	require.Error(t, err)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "names object")
	assert.True(t, allZero(got), "no byte of the other object reached the target")
}

// A segment server that is not the owner's process (a ref pointing at
// another runtime's socket) is refused, and nothing of it is read.
func TestSegmentServerOfAnotherProcessIsRefused(t *testing.T) {
	src := transporttest.StartSource(t, 4096)
	other, meta := src.Cmd.Process.Pid, src.Meta
	dst := newTransport(t)
	x := transferOf(t, meta) // the owner is this process, by the control plane
	got, err := fetchWith(t, dst, x, meta, 4096)
	require.Error(t, err)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), fmt.Sprintf("is process %d, but the owner", other))
	assert.True(t, allZero(got), "no byte of the other process reached the target")
	assert.Equal(t, 0, dst.peers.count(), "the connection was not kept")
	// With the child as the owner the same metadata reads its object.
	x.Source.Pid = other
	got, err = fetchWith(t, dst, x, meta, 4096)
	require.NoError(t, err)
	assert.Equal(t, src.Want[0], got)
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
