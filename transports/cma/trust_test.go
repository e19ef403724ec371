package cma

import (
	"crypto/sha256"
	"encoding/binary"
	"os"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

// Ref bytes carry a checksum, not a signature: anyone who hands a process
// a ref can write any metadata into it. These tests play that part.

// openPidfds counts this process's open pidfds: the descriptors the
// transport keeps per source. Other descriptors come and go with whatever
// else the test binary does (earlier tests' children, the runtime's
// poller), so they are not counted.
func openPidfds(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, e := range entries {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && target == "anon_inode:[pidfd]" {
			n++
		}
	}
	return n
}

func allZero(b []byte) bool {
	for _, v := range b {
		if v != 0 {
			return false
		}
	}
	return true
}

// Metadata naming a process other than the owner the control plane
// identified is refused before anything is read, even when it is a valid
// object of that other process.
func TestMetadataOfAnotherProcessIsRefused(t *testing.T) {
	const n = 4096
	other, otherMeta := startChild(t, n) // an rdt process that is not the owner
	tr := newTransport(t)
	got, dst := buffer(t, n)
	// The object is ours (the owner is this process), the metadata the
	// other process's.
	err := fetchFrom(t, tr, from(childObject, os.Getpid()), otherMeta, []transport.Tensor{dst})
	require.Error(t, err)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "refusing to touch another process's memory")
	assert.True(t, allZero(got), "no byte of the other process reached the target")
	assert.Equal(t, 0, tr.openSources(), "the other process was not even opened")
	// The same metadata is fine when that process is the owner.
	require.NoError(t, fetchFrom(t, tr, from(childObject, other.Process.Pid), otherMeta, []transport.Tensor{dst}))
	assert.False(t, allZero(got))
}

// redirectedMetadata puts tensor as obj and returns its metadata, decoded
// too, and the metadata changed to name another buffer of the owner's
// (other) in its place.
func redirectedMetadata(t *testing.T, tr *Transport, obj transport.ObjectID, tensor transport.Tensor, other []byte) ([]byte, *metadata, []byte) {
	t.Helper()
	meta, err := tr.ExtractMetadata(obj, []transport.Tensor{tensor})
	require.NoError(t, err)
	m, err := decodeMetadata(meta)
	require.NoError(t, err)
	crafted := *m
	crafted.Regions = []region{{Addr: uint64(uintptr(unsafePointer(other))), Size: uint64(len(other))}}
	return meta, m, crafted.encode()
}

// A range the owner did not put (here: another buffer of the owner's) is
// refused, and so is metadata moved from one object to another.
func TestRangeTheOwnerDidNotPutIsRefused(t *testing.T) {
	tr := newTransport(t)
	sb, src := buffer(t, 4096)
	fill(sb, 1)
	secret, _ := buffer(t, 4096)
	fill(secret, 0xAA)
	meta, m, redirected := redirectedMetadata(t, tr, transport.ObjectID{1}, src, secret)

	got, dst := buffer(t, 4096)
	err := fetch(t, tr, transport.ObjectID{1}, redirected, []transport.Tensor{dst})
	require.Error(t, err)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "is not what its owner")
	assert.True(t, allZero(got), "no byte of the other buffer reached the target")

	// A larger range than the tensor is just as foreign.
	grown := *m
	grown.Regions = []region{{Addr: m.Regions[0].Addr, Size: 8192}}
	_, big := buffer(t, 8192)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(fetch(t, tr, transport.ObjectID{1}, grown.encode(), []transport.Tensor{big})))

	// The owner's real metadata, but for another object.
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(fetch(t, tr, transport.ObjectID{2}, meta, []transport.Tensor{dst})))
	assert.True(t, allZero(got))

	// The untouched metadata reads the object.
	require.NoError(t, fetch(t, tr, transport.ObjectID{1}, meta, []transport.Tensor{dst}))
	assert.Equal(t, sb, got)
}

// A slot forged in ordinary memory of the owner (bytes the owner holds for
// someone, say) is not a guard slot: only the owner's guard mappings count.
func TestForgedSlotOutsideTheGuardMappingsIsRefused(t *testing.T) {
	tr := newTransport(t)
	secret, _ := buffer(t, 4096)
	fill(secret, 0xAA)
	planted, _ := buffer(t, 4096)
	m := metadata{Pid: uint32(os.Getpid()), StartTime: tr.startTime,
		Guard: uint64(uintptr(unsafePointer(planted))), Token: 12345,
		Regions: []region{{Addr: uint64(uintptr(unsafePointer(secret))), Size: 4096}}}
	b := m.encode()
	digest := metaDigest(transport.ObjectID{3}, b)
	binary.LittleEndian.PutUint64(planted, m.Token)
	copy(planted[8:], digest[:])
	got, dst := buffer(t, 4096)
	err := fetch(t, tr, transport.ObjectID{3}, b, []transport.Tensor{dst})
	require.Error(t, err)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "names no guard slot")
	assert.True(t, allZero(got))
}

func TestSlotHoldsTokenAndDigest(t *testing.T) {
	tr := newTransport(t)
	_, src := buffer(t, 64)
	obj := transport.ObjectID{6}
	meta, err := tr.ExtractMetadata(obj, []transport.Tensor{src})
	require.NoError(t, err)
	m, err := decodeMetadata(meta)
	require.NoError(t, err)
	slot := tr.guards.byObj[obj]
	require.NotNil(t, slot)
	assert.Equal(t, uint64(uintptr(unsafe.Pointer(slot))), m.Guard)
	assert.Equal(t, m.Token, slot.token)
	assert.Equal(t, sha256.Sum256(append(append([]byte(guardName), obj[:]...), meta...)), slot.digest)
	tr.GarbageCollect(obj, nil, meta)
	assert.Zero(t, slot.token)
}

// ---- per-peer state ----------------------------------------------------------

// A receiver keeps a pidfd per source process; when the core reports the
// source's runtime gone, the pidfd goes too.
func TestPeerGoneClosesTheSourcesPidfd(t *testing.T) {
	tr := newTransport(t)
	type source struct {
		pid  int
		meta []byte
	}
	var sources []source
	for i := 0; i < 3; i++ {
		cmd, meta := startChild(t, 4096)
		sources = append(sources, source{cmd.Process.Pid, meta})
	}
	base := openPidfds(t)
	_, dst := buffer(t, 4096)
	for _, s := range sources {
		require.NoError(t, fetchFrom(t, tr, from(childObject, s.pid), s.meta, []transport.Tensor{dst}))
	}
	assert.Equal(t, 3, tr.openSources())
	assert.Equal(t, base+3, openPidfds(t), "a pidfd per source")
	for _, s := range sources {
		tr.PeerGone(transport.PeerInfo{Pid: s.pid})
	}
	assert.Equal(t, 0, tr.openSources())
	assert.Equal(t, base, openPidfds(t), "every pidfd is closed")
	// A source that is still there (another runtime of its process) is
	// opened again on the next fetch.
	require.NoError(t, fetchFrom(t, tr, from(childObject, sources[0].pid), sources[0].meta, []transport.Tensor{dst}))
	assert.Equal(t, 1, tr.openSources())
}

// Sources that exited are dropped when a new one is opened, even if no
// peer-gone notice came.
func TestExitedSourcesAreDroppedWhenANewOneOpens(t *testing.T) {
	tr := newTransport(t)
	first, firstMeta := startChild(t, 4096)
	second, secondMeta := startChild(t, 4096)
	_, dst := buffer(t, 4096)
	require.NoError(t, fetchFrom(t, tr, from(childObject, first.Process.Pid), firstMeta, []transport.Tensor{dst}))
	require.NoError(t, first.Process.Kill())
	_, _ = first.Process.Wait()
	require.NoError(t, fetchFrom(t, tr, from(childObject, second.Process.Pid), secondMeta, []transport.Tensor{dst}))
	assert.Equal(t, 1, tr.openSources())
}

// A peer-gone notice for a process whose object is being read (another
// runtime of that process may be the source) lets the read finish; the
// pidfd closes after it.
func TestPeerGoneDuringAReadLetsItFinish(t *testing.T) {
	tr := newTransport(t)
	const n = 128 << 20
	sb, src := buffer(t, n)
	fill(sb, 9)
	got, dst := buffer(t, n)
	meta, err := tr.ExtractMetadata(transport.ObjectID{8}, []transport.Tensor{src})
	require.NoError(t, err)
	base := openPidfds(t)
	req, err := tr.Fetch(from(transport.ObjectID{8}, os.Getpid()), []transport.Tensor{dst}, meta, nil)
	require.NoError(t, err)
	tr.PeerGone(transport.PeerInfo{Pid: os.Getpid()})
	assert.Equal(t, 0, tr.openSources())
	require.NoError(t, req.Wait())
	req.Release()
	assert.True(t, string(sb) == string(got), "contents differ")
	assert.Equal(t, base, openPidfds(t), "the pidfd closed once the read ended")
}

// A write goes only where the owner exposed memory: metadata whose
// addresses were changed to another buffer of the owner's, or that names
// another process, is refused before a byte is written.
func TestWriteOnlyWhereTheOwnerExposed(t *testing.T) {
	tr := newTransport(t)
	_, exposed := buffer(t, 4096)
	secret, _ := buffer(t, 4096)
	fill(secret, 0xAA)
	want := append([]byte(nil), secret...)
	meta, _, redirected := redirectedMetadata(t, tr, transport.ObjectID{7}, exposed, secret)
	src, srcT := buffer(t, 4096)
	fill(src, 1)

	write := func(x *transport.Transfer, meta []byte) error {
		req, err := tr.Write(x, []transport.Tensor{srcT}, meta, nil)
		if err != nil {
			return err
		}
		defer req.Release()
		return req.Wait()
	}
	to := func(pid int) *transport.Transfer {
		return &transport.Transfer{Object: transport.ObjectID{7}, Transport: Name, Role: transport.RoleSource, Direction: transport.Write, Destination: transport.PeerInfo{Name: "owner", Pid: pid}}
	}
	err := write(to(os.Getpid()), redirected)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
	assert.Equal(t, want, secret, "no byte landed outside what the owner exposed")
	err = write(to(os.Getpid()+1), meta)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)

	require.NoError(t, write(to(os.Getpid()), meta))
	assert.Equal(t, want, secret)
	tr.GarbageCollect(transport.ObjectID{7}, nil, meta)
	err = write(to(os.Getpid()), meta)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "a retired object is not written: %v", err)
}
