package nccl

// Tests that need NCCL and CUDA devices. They skip with a reason that names
// what is missing ("no NCCL/CUDA: ..."), and fail instead when
// RDT_REQUIRE_GPU=1 (`make gpu-test`) — except the tests of two or three
// ranks, which need a GPU per rank and skip on smaller machines in any
// case. Without GPUs, `make fake-nccl-test` runs them all against the test
// doubles of NCCL and the CUDA driver.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

// ncclMissing says why NCCL transfers cannot run here ("" if they can).
func ncclMissing() string {
	if err := Available(); err != nil {
		return err.Error()
	}
	return ""
}

func requireNCCL(t *testing.T) {
	t.Helper()
	if why := ncclMissing(); why != "" {
		if os.Getenv("RDT_REQUIRE_GPU") == "1" {
			t.Fatalf("no NCCL/CUDA (RDT_REQUIRE_GPU=1): %s", why)
		}
		t.Skipf("no NCCL/CUDA: %s", why)
	}
}

func gpuRuntime(t *testing.T, name string, dir string) *engine.Runtime {
	rt, err := engine.NewRuntime(engine.Options{Name: name, LogLevel: transport.LogOff, Network: control.Sockets{}, SocketDir: dir,
		Builtins: []transport.TransportFactory{Factory()}})
	require.NoError(t, err)
	t.Cleanup(rt.Destroy)
	require.Contains(t, rt.Registry().Names(), Name)
	return rt
}

// A one-rank group forms (ncclGetUniqueId, ncclCommInitRank with nranks 1)
// and is destroyed (ncclCommDestroy) on one GPU.
func TestGPUOneRankGroup(t *testing.T) {
	requireNCCL(t)
	rt := gpuRuntime(t, "solo", t.TempDir())
	spec := transport.GroupSpec{Name: "solo", WorldSize: 1, Rank: 0, Device: 0}
	require.NoError(t, rt.CreateGroup(spec, 60*time.Second))
	assert.Equal(t, []string{"solo"}, rt.GroupNames())
	err := rt.CreateGroup(spec, time.Second)
	assert.Equal(t, transport.ErrAlreadyExists, transport.StatusOf(err))
	require.NoError(t, rt.DestroyGroup("solo"))
	assert.Empty(t, rt.GroupNames())
	require.NoError(t, rt.CreateGroup(spec, 60*time.Second), "re-created after destroy")

	bad := transport.GroupSpec{Name: "far", WorldSize: 1, Device: 4096}
	err = rt.CreateGroup(bad, time.Second)
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "device 4096 does not exist")
}

func devTensor(dev int, p cuda.Ptr, n int) transport.Tensor {
	d, err := transport.NewTensorDesc(transport.Device{Type: transport.DeviceCUDA, ID: int32(dev)}, transport.DType{Code: 1, Bits: 8, Lanes: 1}, []int64{int64(n)})
	if err != nil {
		panic(err)
	}
	return transport.Tensor{TensorDesc: d, Data: uintptr(p), Orig: uintptr(p)}
}

func hostBuf(t *testing.T, n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

// twoRanks makes runtimes a and b, one per GPU (rank 0 on cuda:0, rank 1
// on cuda:1), joined in the group "pair"; without two GPUs it skips, as
// requireTwoDevices.
func twoRanks(t *testing.T) (a, b *engine.Runtime) {
	t.Helper()
	requireTwoDevices(t)
	dir := t.TempDir()
	a, b = gpuRuntime(t, "a", dir), gpuRuntime(t, "b", dir)
	errs := make(chan error, 1)
	go func() {
		errs <- b.CreateGroup(transport.GroupSpec{Name: "pair", WorldSize: 2, Rank: 1, Rank0: a.Address(), Device: 1}, time.Minute)
	}()
	require.NoError(t, a.CreateGroup(transport.GroupSpec{Name: "pair", WorldSize: 2, Rank: 0, Device: 0}, time.Minute))
	require.NoError(t, <-errs)
	return a, b
}

// lend puts tensors on a over nccl and returns a's ref to the object and
// b's, deserialized from it; the caller releases both.
func lend(t *testing.T, a, b *engine.Runtime, tensors []transport.Tensor) (ref, bref *engine.Ref) {
	t.Helper()
	ref, err := a.Put(tensors, Name, nil)
	require.NoError(t, err)
	wire, err := ref.Serialize()
	if err == nil {
		bref, err = b.Deserialize(wire)
	}
	if err != nil {
		ref.Release()
	}
	require.NoError(t, err)
	return ref, bref
}

// Two runtimes, one per GPU, form a group and move tensors both ways; a
// transfer that is aborted destroys the group and later ones say so.
func TestGPUTwoRankTransfer(t *testing.T) {
	a, b := twoRanks(t)

	const n = 8 << 20
	src, err := cuda.Alloc(0, n)
	require.NoError(t, err)
	defer cuda.Free(0, src)
	dst, err := cuda.Alloc(1, n)
	require.NoError(t, err)
	defer cuda.Free(1, dst)
	h := hostBuf(t, n)
	for i := range h {
		h[i] = byte(i * 13)
	}
	require.NoError(t, cuda.Memcpy(0, src, cuda.Ptr(uintptr(unsafe.Pointer(&h[0]))), n))

	ref, bref := lend(t, a, b, []transport.Tensor{devTensor(0, src, n)})
	defer ref.Release()
	defer bref.Release()
	require.NoError(t, b.Get([]*engine.Ref{bref}, []transport.Tensor{devTensor(1, dst, n)}, engine.FetchOptions{}, time.Minute))
	got := hostBuf(t, n)
	require.NoError(t, cuda.Memcpy(1, cuda.Ptr(uintptr(unsafe.Pointer(&got[0]))), dst, n))
	assert.Equal(t, h, got)

	// Abort a transfer that cannot complete: the destination's group is
	// destroyed, and the next transfer says why.
	f, err := b.StartFetch([]*engine.Ref{bref}, []transport.Tensor{devTensor(1, dst, n)}, engine.FetchOptions{})
	require.NoError(t, err)
	f.Abort()
	f.Wait(-1)
	f.Free()
	err = b.Get([]*engine.Ref{bref}, []transport.Tensor{devTensor(1, dst, n)}, engine.FetchOptions{}, 10*time.Second)
	if err != nil {
		assert.Contains(t, err.Error(), `group "pair" was destroyed after`)
	}
}

// Forming a group gives up in time: when a rank never joins rank 0, when
// rank 0 never creates the group, when NCCL does not form the
// communicator (a rank that joined rdt's rendezvous but never reaches
// NCCL: rank 0 aborts its communicator while it forms, so a rank that
// comes later cannot join it, and gives up in time too), and when the
// ranks' communicators form but a rank never connects.
func TestGPUGroupTimeouts(t *testing.T) {
	requireNCCL(t)
	dir := t.TempDir()
	a, b := gpuRuntime(t, "a", dir), gpuRuntime(t, "b", dir)

	start := time.Now()
	err := a.CreateGroup(transport.GroupSpec{Name: "pair", WorldSize: 2, Rank: 0, Device: 0}, 300*time.Millisecond)
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
	assert.Contains(t, fmt.Sprint(err), "ranks [1] of 2 did not join rank 0 in time")
	assert.Less(t, time.Since(start), 10*time.Second)
	assert.Empty(t, a.GroupNames())

	err = b.CreateGroup(transport.GroupSpec{Name: "pair", WorldSize: 2, Rank: 1, Rank0: a.Address(), Device: 0}, 300*time.Millisecond)
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
	assert.Contains(t, fmt.Sprint(err), "did not accept rank 1 in time")
	assert.Empty(t, b.GroupNames())

	// The name is free again after a timeout.
	require.NoError(t, a.CreateGroup(transport.GroupSpec{Name: "pair", WorldSize: 1, Rank: 0, Device: 0}, time.Minute))
	require.NoError(t, a.DestroyGroup("pair"))

	// Rank 0's communicator waits for a rank 1 that is late.
	tr := transportOf(a)
	spec := transport.GroupSpec{Name: "late", WorldSize: 2, Rank: 0, Device: 0, Backend: Name}
	boot, err := tr.NewGroupBootstrap(spec)
	require.NoError(t, err)
	roster := &transport.GroupRoster{Name: "late", Backend: Name, Instance: 7, Bootstrap: boot,
		Members: []transport.GroupMember{{Runtime: transport.RuntimeID{1}}, {Runtime: transport.RuntimeID{2}}}}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = tr.InitGroup(ctx, roster, spec)
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
	assert.Contains(t, fmt.Sprint(err), "NCCL did not form the communicator in time")
	assert.Equal(t, "none", groupState(a, "late"))
	if n, _ := cuda.DeviceCount(); n >= 2 {
		// Rank 0 gave up: rank 1, late, cannot form the communicator,
		// and gives up in time too.
		var id UniqueID
		copy(id[:], boot)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		c, err := InitRank(ctx, 1, 2, 1, id)
		assert.Error(t, err)
		assert.Less(t, time.Since(start), 10*time.Second)
		if c != nil {
			require.NoError(t, c.Abort())
		}

		// Rank 1 forms the communicators but never connects: rank 0 gives
		// up connecting in time, and aborts its communicators.
		spec.Name, roster.Name = "mute", "mute"
		boot, err := tr.NewGroupBootstrap(spec)
		require.NoError(t, err)
		roster.Bootstrap = boot
		ctx, cancel = context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		errc := make(chan error, 1)
		go func() { errc <- tr.InitGroup(ctx, roster, spec) }()
		var mute []*Comm
		for i := range numLanes {
			var id UniqueID
			copy(id[:], boot[i*UniqueIDSize:])
			c, err := InitRank(context.Background(), 1, 2, 1, id)
			require.NoError(t, err)
			mute = append(mute, c)
		}
		err = <-errc
		assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
		assert.Contains(t, fmt.Sprint(err), "NCCL did not connect the 2 ranks in time")
		assert.Equal(t, "none", groupState(a, "mute"))
		for _, c := range mute {
			require.NoError(t, c.Destroy())
		}
	}
}

// NCCL refuses two ranks of one communicator on one GPU; both ranks say so
// and keep no trace of the group.
func TestGPUTwoRanksOnOneDevice(t *testing.T) {
	requireNCCL(t)
	dir := t.TempDir()
	a, b := gpuRuntime(t, "a", dir), gpuRuntime(t, "b", dir)
	errs := make(chan error, 1)
	go func() {
		errs <- b.CreateGroup(transport.GroupSpec{Name: "pair", WorldSize: 2, Rank: 1, Rank0: a.Address(), Device: 0}, time.Minute)
	}()
	for _, err := range []error{a.CreateGroup(transport.GroupSpec{Name: "pair", WorldSize: 2, Rank: 0, Device: 0}, time.Minute), <-errs} {
		assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
		assert.Contains(t, fmt.Sprint(err), "Duplicate GPU")
	}
	assert.Empty(t, a.GroupNames())
	assert.Empty(t, b.GroupNames())
}

// putFilled puts n bytes of pattern seed on device r of rt and returns the
// serialized ref; the object is released, and its memory freed, at cleanup.
func putFilled(t *testing.T, rt *engine.Runtime, r, n int, seed byte) []byte {
	t.Helper()
	p, err := devFill(r, n, seed)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cuda.Free(r, p) })
	ref, err := rt.Put([]transport.Tensor{devTensor(r, p, n)}, Name, nil)
	require.NoError(t, err)
	t.Cleanup(func() { ref.Release() })
	wire, err := ref.Serialize()
	require.NoError(t, err)
	return wire
}

// Two ranks fetch from each other at the same time, again and again, small
// tensors and large ones: neither waits for the other (each enqueues its
// receive and its send in either order).
func TestGPUBothWaysAtOnce(t *testing.T) {
	a, b := twoRanks(t)
	rts := []*engine.Runtime{a, b}
	for _, n := range []int{1000, 4 << 20} {
		wires := make([][]byte, 2)
		for r, rt := range rts {
			wires[r] = putFilled(t, rt, r, n, byte(r+1))
		}
		targets := make([]cuda.Ptr, 2)
		for r := range rts {
			p, err := cuda.Alloc(r, uint64(n))
			require.NoError(t, err)
			defer cuda.Free(r, p)
			targets[r] = p
		}
		for round := 0; round < 10; round++ {
			res := make(chan error, 2)
			for dst := range rts {
				go func() {
					ref, err := rts[dst].Deserialize(wires[1-dst])
					if err != nil {
						res <- err
						return
					}
					defer ref.Release()
					res <- rts[dst].Get([]*engine.Ref{ref}, []transport.Tensor{devTensor(dst, targets[dst], n)}, engine.FetchOptions{}, 30*time.Second)
				}()
			}
			require.NoError(t, <-res, "%d bytes, round %d", n, round)
			require.NoError(t, <-res, "%d bytes, round %d", n, round)
			for dst := range rts {
				got, err := devRead(dst, targets[dst], n)
				require.NoError(t, err)
				require.True(t, bytes.Equal(got, pattern(n, byte(2-dst))), "%d bytes, round %d, rank %d", n, round, dst)
			}
		}
	}
}

// Three ranks (one per GPU): every rank fetches from every other at once,
// first thing after the group formed (the first send or receive between two
// ranks is when NCCL would connect them), which uses the right pair of
// ranks for each transfer. Several times, with the group formed anew.
func TestGPUThreeRanks(t *testing.T) {
	requireNCCL(t)
	if n, _ := cuda.DeviceCount(); n < 3 {
		t.Skipf("three ranks need three GPUs (this machine has %d)", n)
	}
	dir := t.TempDir()
	rts := []*engine.Runtime{gpuRuntime(t, "r0", dir), gpuRuntime(t, "r1", dir), gpuRuntime(t, "r2", dir)}
	// Each rank puts an object of its own size and contents.
	wires := make([][]byte, 3)
	for r, rt := range rts {
		wires[r] = putFilled(t, rt, r, 20000+r*4099, byte(r*50))
	}
	for round := 0; round < 8; round++ {
		errs := make(chan error, 2)
		for r := 1; r < 3; r++ {
			go func() {
				errs <- rts[r].CreateGroup(transport.GroupSpec{Name: "trio", WorldSize: 3, Rank: r, Rank0: rts[0].Address(), Device: r}, time.Minute)
			}()
		}
		require.NoError(t, rts[0].CreateGroup(transport.GroupSpec{Name: "trio", WorldSize: 3, Rank: 0, Device: 0}, time.Minute))
		require.NoError(t, <-errs)
		require.NoError(t, <-errs)
		allToAll(t, rts, wires)
		destroyAll(t, rts, "trio")
	}
}

// destroyAll destroys group name on every runtime at once, as ranks on one
// host must: NCCL frees a communicator once its peers free theirs.
func destroyAll(t *testing.T, rts []*engine.Runtime, name string) {
	t.Helper()
	errs := make(chan error, len(rts))
	for _, rt := range rts {
		go func() { errs <- rt.DestroyGroup(name) }()
	}
	for range rts {
		require.NoError(t, <-errs)
	}
}

// A rank that destroys its group alone waits for NCCL at most
// RDT_NCCL_TEARDOWN_MS and says so (TIMEOUT, naming the setting); the
// group is gone from it all the same, and NCCL frees the communicator in
// the background once the other rank destroys its own. A runtime's
// destroy is bounded the same way.
func TestGPUDestroyAloneIsBounded(t *testing.T) {
	requireTwoDevices(t)
	t.Setenv("RDT_NCCL_TEARDOWN_MS", "300")
	dir := t.TempDir()
	a, b := gpuRuntime(t, "a", dir), gpuRuntime(t, "b", dir)
	formPair := func(name string) {
		errs := make(chan error, 1)
		go func() {
			errs <- b.CreateGroup(transport.GroupSpec{Name: name, WorldSize: 2, Rank: 1, Rank0: a.Address(), Device: 1}, time.Minute)
		}()
		require.NoError(t, a.CreateGroup(transport.GroupSpec{Name: name, WorldSize: 2, Rank: 0, Device: 0}, time.Minute))
		require.NoError(t, <-errs)
	}
	formPair("pair")
	tr := transportOf(a)
	tr.mu.Lock()
	g := tr.groups["pair"]
	tr.mu.Unlock()
	start := time.Now()
	err := a.DestroyGroup("pair")
	took := time.Since(start)
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
	assert.Contains(t, fmt.Sprint(err), "RDT_NCCL_TEARDOWN_MS")
	assert.GreaterOrEqual(t, took, 300*time.Millisecond)
	assert.Less(t, took, 10*time.Second)
	assert.Empty(t, a.GroupNames())
	select {
	case <-g.torn:
		t.Fatal("NCCL freed rank 0's communicators before rank 1 destroyed its own")
	default:
	}
	require.NoError(t, b.DestroyGroup("pair"), "the second rank's destroy finds its peer gone and returns")
	select {
	case <-g.torn:
	case <-time.After(10 * time.Second):
		t.Fatal("rank 0's teardown did not finish after rank 1 destroyed its rank")
	}

	// A runtime destroyed alone (as at a process's exit, with the other
	// rank still up) waits at most the bound for all its groups together;
	// the other runtime's destroy then finds its peer gone.
	formPair("g1")
	formPair("g2")
	start = time.Now()
	a.Destroy()
	took = time.Since(start)
	assert.GreaterOrEqual(t, took, 300*time.Millisecond)
	assert.Less(t, took, 10*time.Second)
	start = time.Now()
	b.Destroy()
	assert.Less(t, time.Since(start), 10*time.Second)
}

// allToAll has every rank fetch every other rank's object twice, all at once.
func allToAll(t *testing.T, rts []*engine.Runtime, wires [][]byte) {
	t.Helper()
	res := make(chan error, 12)
	for dst := range rts {
		for src := range rts {
			if src == dst {
				continue
			}
			for k := 0; k < 2; k++ {
				go func() {
					res <- func() error {
						n := 20000 + src*4099
						ref, err := rts[dst].Deserialize(wires[src])
						if err != nil {
							return err
						}
						defer ref.Release()
						p, err := cuda.Alloc(dst, uint64(n))
						if err != nil {
							return err
						}
						defer cuda.Free(dst, p)
						if err := rts[dst].Get([]*engine.Ref{ref}, []transport.Tensor{devTensor(dst, p, n)}, engine.FetchOptions{}, 20*time.Second); err != nil {
							return err
						}
						got, err := devRead(dst, p, n)
						if err != nil {
							return err
						}
						if !bytes.Equal(got, pattern(n, byte(src*50))) {
							return fmt.Errorf("rank %d got the wrong bytes from rank %d", dst, src)
						}
						return nil
					}()
				}()
			}
		}
	}
	for i := 0; i < 12; i++ {
		require.NoError(t, <-res)
	}
}

// A partial fetch through two runtimes: the destination receives the
// pieces it names, in its order, from the source runtime's Send; a whole
// fetch over the group afterwards still finds both sides in step.
func TestGPUTwoRankPartialFetch(t *testing.T) {
	a, b := twoRanks(t)

	sizes := []int{1 << 20, 4096}
	var tensors []transport.Tensor
	var want [][]byte
	for i, n := range sizes {
		h := hostBuf(t, n)
		for j := range h {
			h[j] = byte(j*13 + i*101)
		}
		p, err := cuda.Alloc(0, uint64(n))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cuda.Free(0, p) })
		require.NoError(t, cuda.Memcpy(0, p, cuda.Ptr(uintptr(unsafe.Pointer(&h[0]))), uint64(n)))
		tensors, want = append(tensors, devTensor(0, p, n)), append(want, h)
	}
	ref, bref := lend(t, a, b, tensors)
	defer ref.Release()
	defer bref.Release()

	sources := []engine.Range{
		{Piece: transport.Piece{Tensor: 1, Offset: 96, Length: 1000}},
		{Piece: transport.Piece{Tensor: 0, Offset: 4096, Length: 0}},
		{Piece: transport.Piece{Tensor: 0, Offset: 512 << 10, Length: 256 << 10}},
	}
	var targets []transport.Tensor
	for _, s := range sources {
		p := cuda.Ptr(0)
		if s.Length > 0 {
			var err error
			p, err = cuda.Alloc(1, s.Length)
			require.NoError(t, err)
			t.Cleanup(func() { _ = cuda.Free(1, p) })
		}
		targets = append(targets, devTensor(1, p, int(s.Length)))
	}
	require.NoError(t, b.Get([]*engine.Ref{bref}, targets, engine.FetchOptions{Sources: sources}, time.Minute))
	for i, s := range sources {
		if s.Length == 0 {
			continue
		}
		got := hostBuf(t, int(s.Length))
		require.NoError(t, cuda.Memcpy(1, cuda.Ptr(uintptr(unsafe.Pointer(&got[0]))), cuda.Ptr(targets[i].Data), s.Length))
		assert.True(t, bytes.Equal(want[s.Tensor][s.Offset:s.End()], got), "piece %d", i)
	}

	whole := make([]transport.Tensor, len(sizes))
	for i, n := range sizes {
		p, err := cuda.Alloc(1, uint64(n))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cuda.Free(1, p) })
		whole[i] = devTensor(1, p, n)
	}
	require.NoError(t, b.Get([]*engine.Ref{bref}, whole, engine.FetchOptions{}, time.Minute))
	for i, n := range sizes {
		got := hostBuf(t, n)
		require.NoError(t, cuda.Memcpy(1, cuda.Ptr(uintptr(unsafe.Pointer(&got[0]))), cuda.Ptr(whole[i].Data), uint64(n)))
		assert.True(t, bytes.Equal(want[i], got), "tensor %d", i)
	}
}
