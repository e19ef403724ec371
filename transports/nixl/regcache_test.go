package nixl

import (
	"testing"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// requireCache skips unless UCX's memory hooks are there to keep the
// receive registration cache correct.
func requireCache(t *testing.T, tr *Transport) {
	t.Helper()
	_, err := tr.ensureAgent() // UCX is loaded with the first agent
	require.NoError(t, err)
	if off := tr.cacheOff(); off != "" {
		t.Skipf("the receive registration cache is off here: %s", off)
	}
}

// libcTensor maps n bytes through libc (so that UCX's hooks see their
// munmap) at the address at, unless zero.
func libcTensor(t *testing.T, n int, at uintptr) ([]byte, transport.Tensor, func() error) {
	t.Helper()
	p, free := libcBuffer(n, at)
	require.NotNil(t, p, "mmap of %d bytes", n)
	desc, err := transport.NewTensorDesc(transport.Device{Type: transport.DeviceCPU}, transport.DType{Code: 1, Bits: 8, Lanes: 1}, []int64{int64(n)})
	require.NoError(t, err)
	b := unsafe.Slice((*byte)(p), n)
	return b, transport.Tensor{TensorDesc: desc, Data: uintptr(p), Orig: uintptr(p)}, free
}

func hostKey(x transport.Tensor) regKey {
	return regKey{mem: memDRAM, addr: uint64(x.Data), size: x.Nbytes}
}

// A target registered by one fetch is used again by the next; once its
// memory is unmapped the entry is dead, and a buffer mapped at the same
// address afterwards is registered afresh and gets the right bytes.
func TestRegistrationCacheSeesFreedAndReusedAddress(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	requireCache(t, dst)
	const n = 1 << 20
	sb, st := buffer(t, n)
	fill(sb, 1)
	meta, err := src.ExtractMetadata(transport.ObjectID{1}, []transport.Tensor{st})
	require.NoError(t, err)

	db, dt, free := libcTensor(t, n, 0)
	require.NoError(t, fetch(dst, meta, []transport.Tensor{dt}))
	require.Equal(t, sb, db)
	entries, bytes, registered, live := dst.cacheState(hostKey(dt))
	assert.Equal(t, 1, entries)
	assert.Equal(t, uint64(n), bytes)
	assert.True(t, live)

	fill(sb, 2)
	require.NoError(t, fetch(dst, meta, []transport.Tensor{dt}))
	require.Equal(t, sb, db)
	_, _, again, _ := dst.cacheState(hostKey(dt))
	assert.Equal(t, registered, again, "the second fetch into the same buffer registers nothing")

	require.NoError(t, free())
	_, _, _, live = dst.cacheState(hostKey(dt))
	assert.False(t, live, "munmap through libc kills the entry")

	db2, dt2, free2 := libcTensor(t, n, dt.Data)
	defer func() { _ = free2() }()
	require.Equal(t, dt.Data, dt2.Data, "the new buffer is at the old address")
	fill(sb, 3)
	require.NoError(t, fetch(dst, meta, []transport.Tensor{dt2}))
	assert.Equal(t, sb, db2)
	entries, _, after, live := dst.cacheState(hostKey(dt2))
	assert.Equal(t, 1, entries, "the dead entry was replaced")
	assert.Equal(t, registered+1, after, "the reused address was registered again")
	assert.True(t, live)
}

// The cache keeps at most its bound of regions and bytes, evicting the
// least recently used; a region above the byte bound is registered for its
// fetch alone. Every fetch still gets the right bytes.
func TestRegistrationCacheStaysBounded(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	requireCache(t, dst)
	dst.cache.maxRegions, dst.cache.maxBytes = 3, 2<<20+512<<10
	sizes := []int{1 << 20, 1 << 20, 256 << 10, 256 << 10, 1 << 20, 4 << 20}
	for i, n := range sizes {
		sb, st := buffer(t, n)
		fill(sb, byte(i))
		meta, err := src.ExtractMetadata(transport.ObjectID{byte(i + 1)}, []transport.Tensor{st})
		require.NoError(t, err)
		db, dt := buffer(t, n)
		require.NoError(t, fetch(dst, meta, []transport.Tensor{dt}), "fetch %d", i)
		require.Equal(t, sb, db, "fetch %d", i)
		entries, bytes, _, _ := dst.cacheState(regKey{})
		assert.LessOrEqual(t, entries, 3, "after fetch %d", i)
		assert.LessOrEqual(t, bytes, uint64(2<<20+512<<10), "after fetch %d", i)
		_, _, _, live := dst.cacheState(hostKey(dt))
		assert.Equal(t, n <= 2<<20+512<<10, live, "fetch %d of %d bytes cached", i, n)
	}
}

// Close deregisters the cached registrations and gives their slots back.
func TestCloseReleasesTheRegistrationCache(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	requireCache(t, dst)
	before := freeSlotCount()
	var targets []transport.Tensor
	var srcs []transport.Tensor
	for i := 0; i < 5; i++ {
		sb, st := buffer(t, 64<<10)
		fill(sb, byte(i))
		_, dt := buffer(t, 64<<10)
		srcs, targets = append(srcs, st), append(targets, dt)
	}
	meta, err := src.ExtractMetadata(transport.ObjectID{1}, srcs)
	require.NoError(t, err)
	require.NoError(t, fetch(dst, meta, targets))
	entries, _, _, _ := dst.cacheState(regKey{})
	assert.Equal(t, 5, entries)
	assert.Equal(t, before-5, freeSlotCount())
	require.NoError(t, dst.Close())
	entries, bytes, _, _ := dst.cacheState(regKey{})
	assert.Zero(t, entries)
	assert.Zero(t, bytes)
	assert.Equal(t, before, freeSlotCount())
}
