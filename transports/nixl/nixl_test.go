package nixl

import (
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/rdt-project/rdt/transports/internal/cuda"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// requireNIXL skips unless NIXL's C API library loads here.
func requireNIXL(t testing.TB) {
	t.Helper()
	if err := Load(); err != nil {
		t.Skipf("NIXL is not available (set %s to the libnixl_capi.so of the nixl wheel): %v", LibraryEnv, err)
	}
}

// buffer maps n bytes outside the Go heap (the race detector's pointer
// checks refuse Go memory addressed through uintptr).
func buffer(t testing.TB, n int) ([]byte, transport.Tensor) {
	t.Helper()
	b, err := unix.Mmap(-1, 0, max(n, 1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(b) })
	b = b[:n]
	desc, err := transport.NewTensorDesc(transport.Device{Type: transport.DeviceCPU}, transport.DType{Code: 1, Bits: 8, Lanes: 1}, []int64{int64(n)})
	require.NoError(t, err)
	addr := uintptr(0)
	if n > 0 {
		addr = uintptr(unsafe.Pointer(&b[0]))
	}
	return b, transport.Tensor{TensorDesc: desc, Data: addr, Orig: addr}
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*7) + seed
	}
}

func newTransport(t testing.TB) *Transport {
	t.Helper()
	requireNIXL(t)
	tr, err := New(transporttest.NewHostIn(""))
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	return tr.(*Transport)
}

func fetch(tr *Transport, meta []byte, targets []transport.Tensor) error {
	req, err := tr.Fetch(&transport.Transfer{Transport: Name}, targets, meta, nil)
	if err != nil {
		return err
	}
	defer req.Release()
	return req.Wait()
}

// ---- loader: runs everywhere ----------------------------------------------

func TestMissingLibraryIsUnsupportedAndNamesIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libnixl_capi.so")
	err := open(path, true)
	require.Error(t, err)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), LibraryEnv)
}

func TestLibraryWithoutTheSymbolsNamesTheSymbol(t *testing.T) {
	err := open("libc.so.6", true)
	require.Error(t, err)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "nixl_capi_create_configured_agent")
	assert.Contains(t, err.Error(), "libc.so.6")
}

func TestFactoryWithoutNIXLIsUnsupported(t *testing.T) {
	if Load() == nil {
		t.Skip("NIXL is loaded in this process: the factory cannot fail")
	}
	t.Setenv(LibraryEnv, filepath.Join(t.TempDir(), "absent.so"))
	_, err := Factory().New(transporttest.NewHostIn(""))
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "absent.so")
}

func TestUCXErrorHandlingIsLeftToGo(t *testing.T) {
	requireNIXL(t)
	v, ok := os.LookupEnv("UCX_HANDLE_ERRORS")
	require.True(t, ok)
	if v != "none" {
		t.Skipf("UCX_HANDLE_ERRORS was set to %q before the test", v)
	}
}

func TestCudaIPCReadsAreOnOnceNIXLLoadsWhereAGPUIs(t *testing.T) {
	requireNIXL(t)
	if n, err := cuda.DeviceCount(); err != nil || n == 0 {
		t.Skipf("the CUDA driver sees no GPU here (%d, %v): rdt leaves cuda_ipc to UCX", n, err)
	}
	v, ok := os.LookupEnv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY")
	require.True(t, ok)
	if v != "y" {
		t.Skipf("UCX_CUDA_IPC_ENABLE_GET_ZCOPY was set to %q before the test", v)
	}
}

// keepEnv restores name's value, or its absence, when the test ends.
func keepEnv(t *testing.T, name string) {
	t.Helper()
	v, ok := os.LookupEnv(name)
	t.Setenv(name, v)
	if !ok {
		require.NoError(t, os.Unsetenv(name))
	}
}

func TestPreferCudaIPCReadsLeavesAUsersValue(t *testing.T) {
	const name = "UCX_CUDA_IPC_ENABLE_GET_ZCOPY"
	keepEnv(t, name)
	for _, user := range []string{"n", "auto", ""} {
		t.Setenv(name, user)
		preferCudaIPCReads()
		v, ok := cgetenv(name)
		assert.True(t, ok)
		assert.Equal(t, user, v, "a value the user set stays")
	}
	require.NoError(t, os.Unsetenv(name))
	preferCudaIPCReads()
	v, ok := cgetenv(name)
	assert.True(t, ok)
	assert.Equal(t, "y", v)
}

func TestPrepareEnvTurnsOnCudaIPCReadsWhereAGPUIs(t *testing.T) {
	const name = "UCX_CUDA_IPC_ENABLE_GET_ZCOPY"
	keepEnv(t, name)
	keepEnv(t, "UCX_HANDLE_ERRORS")
	require.NoError(t, os.Unsetenv(name))
	prepareEnv()
	v, set := cgetenv(name)
	n, err := cuda.DeviceCount()
	if err == nil && n > 0 {
		assert.True(t, set)
		assert.Equal(t, "y", v)
	} else {
		// No cuda_ipc in UCX here: a variable it never reads would only
		// make it warn.
		assert.False(t, set, "set to %q on a host where the CUDA driver sees no GPU (%d, %v)", v, n, err)
	}
	t.Setenv(name, "n")
	prepareEnv()
	v, _ = cgetenv(name)
	assert.Equal(t, "n", v, "a value the user set stays")
}

func TestPrepareEnvLeavesErrorHandlingToGoUnlessSet(t *testing.T) {
	const name = "UCX_HANDLE_ERRORS"
	keepEnv(t, name)
	keepEnv(t, "UCX_CUDA_IPC_ENABLE_GET_ZCOPY")
	t.Setenv(name, "bt")
	prepareEnv()
	v, _ := cgetenv(name)
	assert.Equal(t, "bt", v)
	require.NoError(t, os.Unsetenv(name))
	prepareEnv()
	v, ok := cgetenv(name)
	assert.True(t, ok)
	assert.Equal(t, "none", v)
}

// ---- transfers: need NIXL ----------------------------------------------------

func TestReadBetweenTwoAgents(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	sizes := []int{0, 1, 4096, 300 << 10, 8 << 20}
	var srcs, dsts []transport.Tensor
	var want, got [][]byte
	for i, n := range sizes {
		sb, st := buffer(t, n)
		fill(sb, byte(i))
		db, dt := buffer(t, n)
		srcs, dsts = append(srcs, st), append(dsts, dt)
		want, got = append(want, sb), append(got, db)
	}
	meta, err := src.ExtractMetadata(transport.ObjectID{1}, srcs)
	require.NoError(t, err)
	require.NoError(t, fetch(dst, meta, dsts))
	for i := range sizes {
		assert.Equal(t, want[i], got[i], "tensor %d", i)
	}
	// Again: the source agent is cached, the data fetched afresh.
	fill(want[2], 99)
	require.NoError(t, fetch(dst, meta, dsts))
	assert.Equal(t, want[2], got[2])
	src.GarbageCollect(transport.ObjectID{1}, srcs, meta)
	assert.Empty(t, src.regs)
}

// A receiver forgets the agent of a source runtime that is gone, and loads
// it again should that runtime turn out to be there after all.
func TestPeerGoneForgetsTheSourceAgent(t *testing.T) {
	requireNIXL(t)
	host := transporttest.NewHostIn("")
	s, err := New(host)
	require.NoError(t, err)
	src := s.(*Transport)
	t.Cleanup(func() { _ = src.Close() })
	dst := newTransport(t)
	sb, st := buffer(t, 4096)
	fill(sb, 4)
	db, dt := buffer(t, 4096)
	meta, err := src.ExtractMetadata(transport.ObjectID{1}, []transport.Tensor{st})
	require.NoError(t, err)
	require.NoError(t, fetch(dst, meta, []transport.Tensor{dt}))
	remotes := func() int {
		dst.remMu.Lock()
		defer dst.remMu.Unlock()
		return len(dst.remotes)
	}
	assert.Equal(t, 1, remotes())
	dst.PeerGone(transport.PeerInfo{RuntimeID: transport.RuntimeID{1}})
	assert.Equal(t, 1, remotes(), "another runtime's end changes nothing")
	dst.PeerGone(transport.PeerInfo{RuntimeID: host.ID})
	assert.Equal(t, 0, remotes())
	fill(sb, 5)
	require.NoError(t, fetch(dst, meta, []transport.Tensor{dt}))
	assert.Equal(t, sb, db)
}

func TestReusedAddressAfterGarbageCollect(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	sb, st := buffer(t, 1<<20)
	db, dt := buffer(t, 1<<20)
	for round := 0; round < 3; round++ {
		fill(sb, byte(round))
		id := transport.ObjectID{byte(round + 1)}
		meta, err := src.ExtractMetadata(id, []transport.Tensor{st})
		require.NoError(t, err)
		require.NoError(t, fetch(dst, meta, []transport.Tensor{dt}), "round %d", round)
		require.Equal(t, sb, db, "round %d", round)
		src.GarbageCollect(id, []transport.Tensor{st}, meta)
	}
}

func TestSameRegionInTwoObjects(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	sb, st := buffer(t, 64<<10)
	fill(sb, 3)
	m1, err := src.ExtractMetadata(transport.ObjectID{1}, []transport.Tensor{st})
	require.NoError(t, err)
	m2, err := src.ExtractMetadata(transport.ObjectID{2}, []transport.Tensor{st})
	require.NoError(t, err)
	src.GarbageCollect(transport.ObjectID{1}, nil, m1)
	db, dt := buffer(t, 64<<10)
	require.NoError(t, fetch(dst, m2, []transport.Tensor{dt}))
	assert.Equal(t, sb, db)
	src.GarbageCollect(transport.ObjectID{2}, nil, m2)
	assert.Empty(t, src.regs)
}

func TestAbortReturnsPromptlyAndReleaseWaits(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	sb, st := buffer(t, 64<<20)
	fill(sb, 5)
	_, dt := buffer(t, 64<<20)
	meta, err := src.ExtractMetadata(transport.ObjectID{1}, []transport.Tensor{st})
	require.NoError(t, err)
	req, err := dst.Fetch(&transport.Transfer{Transport: Name}, []transport.Tensor{dt}, meta, nil)
	require.NoError(t, err)
	dst.Abort(nil, req)
	start := time.Now()
	err = req.Wait()
	if err != nil { // the read may have finished at post
		assert.Equal(t, transport.ErrAborted, transport.StatusOf(err))
	}
	assert.Less(t, time.Since(start), time.Second)
	req.Release()
	// After Release nothing is in flight: the agent can be torn down.
	require.NoError(t, dst.Close())
}

func BenchmarkFetch64MiB(b *testing.B) {
	src, dst := newTransport(b), newTransport(b)
	const n = 64 << 20
	_, s := buffer(b, n)
	db, d := buffer(b, n)
	for i := range db {
		db[i] = 1
	}
	meta, err := src.ExtractMetadata(transport.ObjectID{1}, []transport.Tensor{s})
	require.NoError(b, err)
	b.SetBytes(n)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := fetch(dst, meta, []transport.Tensor{d}); err != nil {
			b.Fatal(err)
		}
	}
}

// The descriptor: one-sided, any host, partial fetches, the devices found
// at creation, and for CUDA data the choice after cuda_ipc and before nccl
// (never for host data).
func TestDescribe(t *testing.T) {
	devices := []transport.DeviceType{transport.DeviceCPU, transport.DeviceCUDAHost, transport.DeviceCUDA}
	d := (&Transport{devices: devices}).Describe()
	assert.Equal(t, Name, d.Name)
	assert.Equal(t, devices, d.Devices)
	assert.True(t, d.OneSided && d.CanAbort && d.Ranges)
	assert.False(t, d.SameHostOnly || d.Eager() || d.GroupBackend)
	assert.Equal(t, transport.AutoRank{CUDA: 20}, d.Auto)
}

// An agent with nothing to do leaves the CPU alone: its progress thread
// waits on the workers' events instead of polling them in a loop (which
// took a whole core per process, the core a small machine's copies need).
func TestIdleAgentSleeps(t *testing.T) {
	tr := newTransport(t)
	_, err := tr.ensureAgent()
	require.NoError(t, err)
	cpu := func() time.Duration {
		var ru unix.Rusage
		require.NoError(t, unix.Getrusage(unix.RUSAGE_SELF, &ru))
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before := cpu()
	time.Sleep(time.Second)
	assert.Less(t, cpu()-before, 300*time.Millisecond, "CPU time of the process over one idle second")
}

// Regions that touch or overlap become one; others stay apart, by memory
// and device, and the bytes covered are the same.
func TestCoalesceMergesTouchingRegions(t *testing.T) {
	got := coalesce([]regKey{
		{mem: memDRAM, addr: 300, size: 100},
		{mem: memDRAM, addr: 100, size: 100},
		{mem: memDRAM, addr: 200, size: 100}, // touches both neighbours
		{mem: memDRAM, addr: 350, size: 10},  // inside
		{mem: memDRAM, addr: 500, size: 10},  // a gap before it
		{mem: memVRAM, addr: 510, size: 10},  // another memory
		{mem: memVRAM, addr: 520, size: 10, dev: 1},
	})
	assert.Equal(t, []regKey{
		{mem: memDRAM, addr: 100, size: 300},
		{mem: memDRAM, addr: 500, size: 10},
		{mem: memVRAM, addr: 510, size: 10},
		{mem: memVRAM, addr: 520, size: 10, dev: 1},
	}, got)
}

// An object of many tensors fetched into one buffer, back to back, and
// into scattered buffers: the bytes arrive either way.
func TestManyTensorsIntoOneBufferAndScattered(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	const count, size = 256, 4096
	sb, _ := buffer(t, count*size)
	fill(sb, 3)
	whole, _ := buffer(t, count*size)
	var srcs, one, scattered []transport.Tensor
	var pieces [][]byte
	for i := 0; i < count; i++ {
		srcs = append(srcs, sub(t, sb, i*size, size))
		one = append(one, sub(t, whole, i*size, size))
		b, bt := buffer(t, size)
		pieces, scattered = append(pieces, b), append(scattered, bt)
	}
	meta, err := src.ExtractMetadata(transport.ObjectID{7}, srcs)
	require.NoError(t, err)
	require.NoError(t, fetch(dst, meta, one))
	assert.Equal(t, sb, whole)
	require.NoError(t, fetch(dst, meta, scattered))
	for i, b := range pieces {
		require.Equal(t, sb[i*size:(i+1)*size], b, "tensor %d", i)
	}
	src.GarbageCollect(transport.ObjectID{7}, srcs, meta)
}

// sub is the tensor of n bytes of b from off.
func sub(t testing.TB, b []byte, off, n int) transport.Tensor {
	desc, err := transport.NewTensorDesc(transport.Device{Type: transport.DeviceCPU}, transport.DType{Code: 1, Bits: 8, Lanes: 1}, []int64{int64(n)})
	require.NoError(t, err)
	addr := uintptr(unsafe.Pointer(&b[off]))
	return transport.Tensor{TensorDesc: desc, Data: addr, Orig: addr}
}

// An object of touching tensors is registered as one region, and another
// object that puts one of them alone registers that part again: both
// fetch, and the part stays readable after the first object is freed.
func TestOverlappingObjectsOfTouchingTensors(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	sb, _ := buffer(t, 2*4096)
	fill(sb, 11)
	a, b := sub(t, sb, 0, 4096), sub(t, sb, 4096, 4096)
	both, err := src.ExtractMetadata(transport.ObjectID{1}, []transport.Tensor{a, b})
	require.NoError(t, err)
	one, err := src.ExtractMetadata(transport.ObjectID{2}, []transport.Tensor{a})
	require.NoError(t, err)
	assert.Len(t, src.regs, 2, "the pair as one region, and the single tensor")
	db, _ := buffer(t, 2*4096)
	require.NoError(t, fetch(dst, both, []transport.Tensor{sub(t, db, 0, 4096), sub(t, db, 4096, 4096)}))
	assert.Equal(t, sb, db)
	src.GarbageCollect(transport.ObjectID{1}, []transport.Tensor{a, b}, both)
	clear(db)
	require.NoError(t, fetch(dst, one, []transport.Tensor{sub(t, db, 0, 4096)}))
	assert.Equal(t, sb[:4096], db[:4096])
	src.GarbageCollect(transport.ObjectID{2}, []transport.Tensor{a}, one)
	assert.Empty(t, src.regs)
}

// Touching tensors of a version-2 source, fetched into touching targets,
// are read with one descriptor; a version-1 source's with one each.
func TestPlanSpansTouchingTensorsOnlyWhenTheSourcePromises(t *testing.T) {
	sb := make([]byte, 3*4096)
	db := make([]byte, 3*4096)
	var targets []transport.Tensor
	m := &metadata{Version: metaVersion}
	for i := 0; i < 3; i++ {
		targets = append(targets, sub(t, db, i*4096, 4096))
		m.Regions = append(m.Regions, region{Addr: uint64(uintptr(unsafe.Pointer(&sb[i*4096]))), Size: 4096, Mem: memDRAM})
	}
	chunks, local, total, err := plan(&transport.Transfer{}, m, targets)
	require.NoError(t, err)
	require.Len(t, chunks, 1)
	assert.Len(t, chunks[0].spans, 1)
	assert.Equal(t, uint64(3*4096), chunks[0].spans[0].n)
	assert.Len(t, local, 1)
	assert.Equal(t, uint64(3*4096), total)
	m.Version = 1
	chunks, _, _, err = plan(&transport.Transfer{}, m, targets)
	require.NoError(t, err)
	assert.Len(t, chunks[0].spans, 3)
}

// One fetch starts every transfer before it waits on or releases any. When
// its refs were put on both sides of a garbage_collect at the source (two
// registration epochs), the second transfer needs the source agent
// reloaded while the first holds it: it must not wait for the first to be
// released inside Fetch, which never happens before Fetch returns.
func TestTransfersOfTwoEpochsInOneFetch(t *testing.T) {
	src := newTransport(t)
	oldBuf, oldT := buffer(t, 64<<10)
	fill(oldBuf, 1)
	oldMeta, err := src.ExtractMetadata(transport.ObjectID{1}, []transport.Tensor{oldT})
	require.NoError(t, err)
	_, goneT := buffer(t, 4096)
	goneMeta, err := src.ExtractMetadata(transport.ObjectID{2}, []transport.Tensor{goneT})
	require.NoError(t, err)
	src.GarbageCollect(transport.ObjectID{2}, []transport.Tensor{goneT}, goneMeta) // a new epoch
	newBuf, newT := buffer(t, 64<<10)
	fill(newBuf, 2)
	newMeta, err := src.ExtractMetadata(transport.ObjectID{3}, []transport.Tensor{newT})
	require.NoError(t, err)

	for _, order := range [][2][]byte{{oldMeta, newMeta}, {newMeta, oldMeta}} {
		dst := newTransport(t) // with no view of the source agent yet
		gotOld, outOld := buffer(t, 64<<10)
		gotNew, outNew := buffer(t, 64<<10)
		targets := map[*byte]transport.Tensor{&oldMeta[0]: outOld, &newMeta[0]: outNew}
		started := make(chan []transport.Request, 1)
		go func() {
			var reqs []transport.Request
			for _, meta := range order {
				req, err := dst.Fetch(&transport.Transfer{Transport: Name}, []transport.Tensor{targets[&meta[0]]}, meta, nil)
				if err != nil {
					t.Error(err)
					break
				}
				reqs = append(reqs, req)
			}
			started <- reqs
		}()
		var reqs []transport.Request
		select {
		case reqs = <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("the second transfer's Fetch waits for the first to be released")
		}
		for _, req := range reqs {
			assert.NoError(t, req.Wait())
			req.Release()
		}
		assert.Equal(t, oldBuf, gotOld)
		assert.Equal(t, newBuf, gotNew)
	}
}

// A partial fetch whose pieces run across touching tensors of one source
// buffer into one target buffer (read with one descriptor), and one in the
// other order (one each): the bytes arrive either way.
func TestPartialFetchAcrossTouchingTensors(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	const size = 4096
	sb, _ := buffer(t, 4*size)
	fill(sb, 5)
	var srcs []transport.Tensor
	for i := 0; i < 4; i++ {
		srcs = append(srcs, sub(t, sb, i*size, size))
	}
	meta, err := src.ExtractMetadata(transport.ObjectID{9}, srcs)
	require.NoError(t, err)
	defer src.GarbageCollect(transport.ObjectID{9}, srcs, meta)
	for _, pieces := range [][]transport.Piece{
		{{Tensor: 0, Offset: 2048, Length: 2048}, {Tensor: 1, Length: size}, {Tensor: 2, Length: 1000}},
		{{Tensor: 3, Offset: 10, Length: 1000}, {Tensor: 1, Length: size}, {Tensor: 0, Offset: 5, Length: 0}, {Tensor: 0, Length: 1}},
	} {
		var total int
		for _, p := range pieces {
			total += int(p.Length)
		}
		db, _ := buffer(t, total)
		var targets []transport.Tensor
		var want []byte
		base, off := uint64(uintptr(unsafe.Pointer(&db[0]))), 0
		for _, p := range pieces {
			targets = append(targets, at(t, base+uint64(off), int(p.Length)))
			from := int(p.Tensor)*size + int(p.Offset)
			want = append(want, sb[from:from+int(p.Length)]...)
			off += int(p.Length)
		}
		req, err := dst.Fetch(&transport.Transfer{Transport: Name, Pieces: pieces}, targets, meta, nil)
		require.NoError(t, err)
		require.NoError(t, req.Wait())
		req.Release()
		assert.Equal(t, want, db)
	}
}
