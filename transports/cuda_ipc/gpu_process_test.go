package cudaipc

// More tests that need a CUDA device, or the test double of the driver
// (tests/fakecuda, which `make fake-gpu-test` loads): a source process with
// several allocations, the receiver's handle cache against the mappings it
// really holds, work in flight when a fetch is aborted or the source dies,
// and devices numbered differently in two processes. They skip with "no
// CUDA device: ..." elsewhere.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

// layoutTargets allocates a target on dev for every tensor of the layout.
func layoutTargets(t *testing.T, dev int) ([]transport.Tensor, []cuda.Ptr) {
	ts := make([]transport.Tensor, len(layout))
	ps := make([]cuda.Ptr, len(layout))
	for i, l := range layout {
		if l.n == 0 {
			ts[i] = devTensor(dev, 0, 0)
			continue
		}
		p, err := cuda.Alloc(dev, l.n)
		require.NoError(t, err)
		t.Cleanup(func() { _ = cuda.Free(dev, p) })
		ps[i], ts[i] = p, devTensor(dev, p, l.n)
	}
	return ts, ps
}

// checkLayout checks that the targets hold what serveMain wrote (with the
// seeds of the first allocation bumped by bump).
func checkLayout(t *testing.T, ps []cuda.Ptr, dev int, bump byte) {
	t.Helper()
	for i, l := range layout {
		if l.n == 0 {
			continue
		}
		got := hostBuffer(t, int(l.n))
		require.NoError(t, cuda.Memcpy(dev, hostAddr(got), ps[i], l.n))
		want := hostBuffer(t, int(l.n))
		seed := l.seed
		if l.alloc == 0 {
			seed += bump
		}
		fill(want, seed)
		assert.True(t, bytes.Equal(want, got), "tensor %d", i)
	}
}

func transfer(source byte) *transport.Transfer {
	x := &transport.Transfer{Transport: Name}
	x.Source.RuntimeID[0] = source
	return x
}

// entriesOf lists the cache's entries of source process pid.
func entriesOf(c *handleCache, pid int) []*entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*entry
	for _, e := range c.m {
		if e.pid == pid {
			out = append(out, e)
		}
	}
	return out
}

func setClock(c *handleCache, now func() time.Time) {
	c.mu.Lock()
	c.now = now
	c.mu.Unlock()
}

// testDouble reports whether the driver loaded is the test double.
func testDouble() bool { return strings.HasPrefix(cuda.DeviceName(0), "rdt fake CUDA device") }

// mappedFrom counts the allocations of process pid mapped into this one,
// as /proc/self/maps shows them under the test double (which names each
// allocation's memfd "rdt-fakecuda-<pid>-..."); -1 with a real driver.
func mappedFrom(t *testing.T, pid int) int {
	if !testDouble() {
		return -1
	}
	b, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	prefix := fmt.Sprintf("/memfd:rdt-fakecuda-%d-", pid)
	seen := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if i := strings.Index(line, prefix); i >= 0 {
			seen[line[i:]] = true
		}
	}
	return len(seen)
}

// rerun runs the calling test again in a new process with env added and
// reports true; in that process (or when it cannot be rerun) it reports
// false, and the test goes on.
func rerun(t *testing.T, env ...string) bool {
	t.Helper()
	if os.Getenv(rerunEnv) != "" {
		return false
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(append(os.Environ(), env...), rerunEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	if strings.Contains(string(out), "--- SKIP: "+t.Name()) {
		t.Skipf("skipped in the new process:\n%s", out)
	}
	require.Contains(t, string(out), "--- PASS: "+t.Name(), "%s", out)
	t.Logf("in a new process with %v:\n%s", env, out)
	return true
}

func requireDevices(t *testing.T, n int) {
	t.Helper()
	if got, _ := cuda.DeviceCount(); got < n {
		t.Skipf("needs %d CUDA devices, this process sees %d", n, got)
	}
}

// The metadata holds one handle per allocation and each tensor's offset in
// it; the receiver opens each allocation once and reuses the mapping.
func TestGPUAnotherProcessOffsetsInAllocations(t *testing.T) {
	requireGPU(t)
	src := startSource(t)
	m, err := decodeMetadata(src.meta)
	require.NoError(t, err)
	require.Len(t, m.Allocs, 2)
	assert.NotEqual(t, m.Allocs[0].Handle, m.Allocs[1].Handle)
	for i, l := range layout {
		if l.alloc < 0 {
			assert.Equal(t, noAlloc, m.Tensors[i].Alloc)
			continue
		}
		assert.EqualValues(t, l.alloc, m.Tensors[i].Alloc, "tensor %d", i)
		assert.Equal(t, l.off, m.Tensors[i].Offset, "tensor %d", i)
		assert.Equal(t, l.n, m.Tensors[i].Nbytes, "tensor %d", i)
	}

	tr := gpuTransport(t)
	x := transfer(10)
	for round := 0; round < 2; round++ {
		targets, ps := layoutTargets(t, 0)
		require.NoError(t, fetchWith(tr, x, src.meta, targets))
		checkLayout(t, ps, 0, 0)
		assert.Len(t, entriesOf(tr.cache, src.pid), 2, "one mapping per allocation")
		if n := mappedFrom(t, src.pid); n >= 0 {
			assert.Equal(t, 2, n, "allocations of the source mapped here")
		}
	}
}

// A partial fetch copies each piece from its allocation's mapping at the
// tensor's offset plus the piece's, and maps only the allocations its
// pieces read from.
func TestGPUAnotherProcessPieces(t *testing.T) {
	requireGPU(t)
	src := startSource(t)
	tr := gpuTransport(t)
	x := transfer(12)
	x.Pieces = []transport.Piece{
		{Tensor: 1, Offset: 1000, Length: 5000},         // inside the second tensor of the first allocation
		{Tensor: 0, Offset: 1<<20 - 16, Length: 16},     // the end of the first
		{Tensor: 2, Offset: 64 << 10, Length: 0},        // empty, at the end of the other allocation
		{Tensor: 1, Offset: 1<<20 - 512 - 1, Length: 1}, // its last byte
		{Tensor: 3, Length: 0},                          // the empty tensor
	}
	var targets []transport.Tensor
	var ps []cuda.Ptr
	for _, pc := range x.Pieces {
		if pc.Length == 0 {
			targets, ps = append(targets, devTensor(0, 0, 0)), append(ps, 0)
			continue
		}
		p, err := cuda.Alloc(0, pc.Length)
		require.NoError(t, err)
		t.Cleanup(func() { _ = cuda.Free(0, p) })
		targets, ps = append(targets, devTensor(0, p, pc.Length)), append(ps, p)
	}
	require.NoError(t, fetchWith(tr, x, src.meta, targets))
	for i, pc := range x.Pieces {
		if pc.Length == 0 {
			continue
		}
		l := layout[pc.Tensor]
		whole := hostBuffer(t, int(l.n))
		fill(whole, l.seed)
		got := hostBuffer(t, int(pc.Length))
		require.NoError(t, cuda.Memcpy(0, hostAddr(got), ps[i], pc.Length))
		assert.True(t, bytes.Equal(whole[pc.Offset:pc.End()], got), "piece %d", i)
	}
	assert.Len(t, entriesOf(tr.cache, src.pid), 1, "only the allocation the pieces read from is mapped")
}

// A CUDA source lands in host memory too: whole tensors and pieces are
// copied from the opened handle into the host targets, chunk by chunk
// (with chunks of the default size, and of a size that divides nothing).
func TestGPUAnotherProcessIntoHostMemory(t *testing.T) {
	requireGPU(t)
	src := startSource(t)
	tr := gpuTransport(t)
	x := transfer(13)
	x.Pieces = []transport.Piece{
		{Tensor: 1, Offset: 1000, Length: 5000},
		{Tensor: 0, Length: layout[0].n},
		{Tensor: 2, Offset: 8, Length: 4096},
	}
	defer func(c uint64) { hostChunk = c }(hostChunk)
	for _, chunk := range []uint64{hostChunk, 3001} {
		hostChunk = chunk
		var targets []transport.Tensor
		var bufs [][]byte
		for _, pc := range x.Pieces {
			b := hostBuffer(t, int(pc.Length))
			targets, bufs = append(targets, hostTensor(b)), append(bufs, b)
		}
		require.NoError(t, fetchWith(tr, x, src.meta, targets))
		for i, pc := range x.Pieces {
			whole := hostBuffer(t, int(layout[pc.Tensor].n))
			fill(whole, layout[pc.Tensor].seed)
			assert.True(t, bytes.Equal(whole[pc.Offset:pc.End()], bufs[i]), "chunks of %d: piece %d", chunk, i)
		}
	}
	assert.Contains(t, tr.Describe().CrossDevice, transport.DevicePair{Source: transport.DeviceCUDA, Target: transport.DeviceCPU})
}

func hostTensor(b []byte) transport.Tensor {
	tg := deviceTensor(hostAddr(b), len(b))
	tg.Device = transport.Device{Type: transport.DeviceCPU}
	return tg
}

// A get into host memory whose deadline passes while the copies run ends
// within a chunk of the deadline. The driver copies from a device into
// pageable memory inside the call, where nothing interrupts it: a fetch
// that made one call per tensor would block the get for all of them. The
// test double delays each copy (each chunk: a small one here).
func TestGPUDeadlineIntoHostMemory(t *testing.T) {
	requireGPU(t)
	const delay = 200 * time.Millisecond
	if rerun(t, fmt.Sprintf("RDT_FAKECUDA_COPY_DELAY_US=%d", delay.Microseconds())) {
		return
	}
	defer func(c uint64) { hostChunk = c }(hostChunk)
	hostChunk = 256 << 10
	a, b := twoRuntimes(t)
	// Four tensors of two chunks each: 1.6 s of copies in all.
	const n, tensors = 512 << 10, 4
	var srcs, targets []transport.Tensor
	var bufs [][]byte
	for i := 0; i < tensors; i++ {
		srcs = append(srcs, deviceTensor(deviceBuffer(t, n, byte(30+i)), n))
		buf := hostBuffer(t, n)
		targets, bufs = append(targets, hostTensor(buf)), append(bufs, buf)
	}
	ref, err := a.Put(srcs, Name, nil)
	require.NoError(t, err)
	defer ref.Release()
	wire, err := ref.Serialize()
	require.NoError(t, err)
	borrowed, err := b.Deserialize(wire)
	require.NoError(t, err)
	defer borrowed.Release()

	const deadline = 100 * time.Millisecond
	start := time.Now()
	err = b.Get([]*engine.Ref{borrowed}, targets, engine.FetchOptions{Transport: Name}, deadline)
	took := time.Since(start)
	if err == nil {
		require.False(t, testDouble(), "the copies are delayed: they cannot be done within the deadline")
		t.Skip("the copies ended within the deadline")
	}
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
	t.Logf("the get returned after %v: %v", took, err)
	if testDouble() {
		// The deadline, the chunk being copied, and room for a loaded machine;
		// well short of the 1.6 s all the chunks take.
		assert.Less(t, took, deadline+delay+500*time.Millisecond, "the get waited for more than the chunk in flight")
	}
	// Nothing writes into the targets after the get returned.
	before := make([][]byte, tensors)
	for i, buf := range bufs {
		before[i] = bytes.Clone(buf)
	}
	time.Sleep(2 * delay)
	for i, buf := range bufs {
		assert.True(t, bytes.Equal(before[i], buf), "target %d changed after the get returned", i)
	}
}

// A source that frees an allocation and allocates again (at the same
// address, often) exports a new handle: the receiver never reads the new
// memory through the old mapping, and the old mapping closes once idle.
func TestGPUSourceReallocates(t *testing.T) {
	requireGPU(t)
	src := startSource(t)
	tr := gpuTransport(t)
	x := transfer(11)
	targets, ps := layoutTargets(t, 0)
	require.NoError(t, fetchWith(tr, x, src.meta, targets))
	checkLayout(t, ps, 0, 0)

	meta2 := src.realloc(t)
	m1, _ := decodeMetadata(src.meta)
	m2, err := decodeMetadata(meta2)
	require.NoError(t, err)
	assert.NotEqual(t, m1.Allocs[0].Handle, m2.Allocs[0].Handle, "a new allocation, a new handle")
	assert.Equal(t, m1.Allocs[1].Handle, m2.Allocs[1].Handle)
	require.NoError(t, fetchWith(tr, x, meta2, targets))
	checkLayout(t, ps, 0, 100)
	assert.Len(t, entriesOf(tr.cache, src.pid), 3, "the old mapping stays until it is idle")

	// Later: the mappings in use stay, the old one closes.
	later := time.Now().Add(idleTimeout + time.Second)
	setClock(tr.cache, func() time.Time { return later })
	defer setClock(tr.cache, time.Now)
	require.NoError(t, fetchWith(tr, x, meta2, targets))
	tr.cache.sweep()
	assert.Len(t, entriesOf(tr.cache, src.pid), 2)
	if n := mappedFrom(t, src.pid); n >= 0 {
		assert.Equal(t, 2, n, "the old allocation is no longer mapped here")
	}
}

// When the source exits, its mappings close at the next sweep, and a fetch
// from it says that it is gone.
func TestGPUSourceExitClosesItsMappings(t *testing.T) {
	requireGPU(t)
	for _, reap := range []bool{true, false} {
		t.Run(fmt.Sprintf("reaped=%v", reap), func(t *testing.T) {
			src := startSource(t)
			tr := gpuTransport(t)
			x := transfer(12)
			targets, ps := layoutTargets(t, 0)
			require.NoError(t, fetchWith(tr, x, src.meta, targets))
			checkLayout(t, ps, 0, 0)
			require.Len(t, entriesOf(tr.cache, src.pid), 2)

			src.kill(t, reap)
			tr.cache.sweep()
			assert.Empty(t, entriesOf(tr.cache, src.pid))
			if n := mappedFrom(t, src.pid); n >= 0 {
				assert.Equal(t, 0, n, "mappings of the dead source")
			}
			err := fetchWith(tr, x, src.meta, targets)
			assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
		})
	}
}

// Abort while the copies run: Wait returns at once, Release waits for the
// copies (they cannot be cancelled), so the targets are final when the
// request is released. The test double delays each copy to keep it running.
func TestGPUAbortWhileCopying(t *testing.T) {
	requireGPU(t)
	if rerun(t, "RDT_FAKECUDA_COPY_DELAY_US=200000") {
		return
	}
	src := startSource(t)
	tr := gpuTransport(t)
	x := transfer(13)
	targets, ps := layoutTargets(t, 0)
	req, err := tr.Fetch(x, targets, src.meta, nil)
	require.NoError(t, err)
	if req.(*request).Completed() {
		require.False(t, testDouble(), "the copies are delayed: they cannot be done yet")
		req.Release()
		t.Skip("the copies ended before they could be aborted")
	}
	tr.Abort(x, req)
	err = req.Wait()
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "%v", err)
	if testDouble() {
		assert.False(t, req.(*request).Completed(), "Wait returned without waiting for the copies")
	}
	req.Release()
	assert.True(t, req.(*request).Completed(), "Release waited for the copies")
	checkLayout(t, ps, 0, 0)
	assert.Len(t, entriesOf(tr.cache, src.pid), 2, "released mappings stay cached")
}

// A get whose deadline passes while the copies run fails with a timeout,
// and returns only once nothing writes into the targets any more.
func TestGPUDeadlineWhileCopying(t *testing.T) {
	requireGPU(t)
	if rerun(t, "RDT_FAKECUDA_COPY_DELAY_US=300000") {
		return
	}
	a, b := twoRuntimes(t)
	const n = 1 << 20
	p := deviceBuffer(t, n, 21)
	ref, err := a.Put([]transport.Tensor{deviceTensor(p, n)}, Name, nil)
	require.NoError(t, err)
	wire, err := ref.Serialize()
	require.NoError(t, err)
	borrowed, err := b.Deserialize(wire)
	require.NoError(t, err)
	defer borrowed.Release()
	dst := deviceBuffer(t, n, 0)

	start := time.Now()
	err = b.Get([]*engine.Ref{borrowed}, []transport.Tensor{deviceTensor(dst, n)}, engine.FetchOptions{}, 50*time.Millisecond)
	took := time.Since(start)
	if err == nil {
		require.False(t, testDouble(), "the copy is delayed: it cannot be done within the deadline")
		t.Skip("the copy ended within the deadline")
	}
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
	if testDouble() {
		assert.GreaterOrEqual(t, took, 250*time.Millisecond, "Get returned while the copy still ran")
	}
	want := hostBuffer(t, n)
	fill(want, 21)
	assert.True(t, bytes.Equal(want, readBack(t, dst, n)), "the copy ran to the end before Get returned")
	require.NoError(t, ref.Release())
}

// The source dies while the receiver copies out of its memory: the fetch
// ends (with the bytes, or with ErrPeerUnavailable), never hangs, and the
// mapping closes once the request has released it.
func TestGPUSourceKilledWhileCopying(t *testing.T) {
	requireGPU(t)
	if rerun(t, "RDT_FAKECUDA_COPY_DELAY_US=200000") {
		return
	}
	src := startSource(t)
	tr := gpuTransport(t)
	x := transfer(14)
	targets, ps := layoutTargets(t, 0)
	req, err := tr.Fetch(x, targets, src.meta, nil)
	require.NoError(t, err)
	src.kill(t, true)
	tr.cache.sweep() // the entries in use leave the cache; they close on release
	assert.Empty(t, entriesOf(tr.cache, src.pid))
	done := make(chan error, 1)
	go func() { done <- req.Wait() }()
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("a fetch from a killed source hung")
	}
	req.Release()
	if err == nil {
		checkLayout(t, ps, 0, 0)
	} else {
		assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
	}
	if n := mappedFrom(t, src.pid); n >= 0 {
		assert.Equal(t, 0, n, "mappings of the dead source after the release")
	}
}

// Many fetches at once, over the transport's streams, from one source.
func TestGPUConcurrentFetches(t *testing.T) {
	requireGPU(t)
	src := startSource(t)
	tr := gpuTransport(t)
	x := transfer(15)
	var wg sync.WaitGroup
	for g := 0; g < 6; g++ {
		targets, ps := layoutTargets(t, 0)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 4; i++ {
				if !assert.NoError(t, fetchWith(tr, x, src.meta, targets)) {
					return
				}
			}
			checkLayout(t, ps, 0, 0)
		}()
	}
	wg.Wait()
	assert.Len(t, entriesOf(tr.cache, src.pid), 2)
}

// A tensor whose memory is on another device than it says is refused.
func TestGPUTensorOnAnotherDeviceThanItSays(t *testing.T) {
	requireGPU(t)
	requireDevices(t, 2)
	tr := gpuTransport(t)
	p := deviceBuffer(t, 4096, 1) // on cuda:0
	_, err := tr.ExtractMetadata(transport.ObjectID{}, []transport.Tensor{devTensor(1, p, 4096)})
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
	assert.ErrorContains(t, err, "described as cuda:1 but its memory is on cuda:0")
}

// Device ordinals differ between processes (CUDA_VISIBLE_DEVICES): the
// receiver finds the source's GPU by UUID, and opens the handle on its
// target's device, the source's GPU or another with peer access to it.
// Without peer access, a target on another GPU than the source's is an
// error naming both.
func TestGPUSourceNumbersDevicesDifferently(t *testing.T) {
	requireGPU(t)
	requireDevices(t, 2)
	src := startSource(t, "CUDA_VISIBLE_DEVICES=1") // its cuda:0 is our cuda:1
	tr := gpuTransport(t)
	x := transfer(16)
	targets, ps := layoutTargets(t, 1)
	require.NoError(t, fetchWith(tr, x, src.meta, targets))
	checkLayout(t, ps, 1, 0)
	for _, e := range entriesOf(tr.cache, src.pid) {
		assert.Equal(t, 1, e.key.dev, "opened on the source's GPU, the targets'")
	}

	targets, ps = layoutTargets(t, 0)
	err := fetchWith(tr, x, src.meta, targets)
	if can, _ := cuda.CanAccessPeer(0, 1); can {
		require.NoError(t, err)
		checkLayout(t, ps, 0, 0)
		devs := map[int]int{}
		for _, e := range entriesOf(tr.cache, src.pid) {
			devs[e.key.dev]++
		}
		assert.Equal(t, map[int]int{0: 2, 1: 2}, devs, "each allocation opened on each target device")
	} else {
		assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err), "%v", err)
		assert.ErrorContains(t, err, "on the source's cuda:1")
		assert.ErrorContains(t, err, "target 0 on cuda:0")
		assert.ErrorContains(t, err, "no peer access")
	}
}

// A receiver that sees both GPUs and fetches into cuda:0 from a source on
// cuda:1 opens the handles on cuda:0, into device and host memory alike,
// and makes no context on cuda:1: under the double, or on a GPU where
// nothing else in this new process touched cuda:1. Without peer access,
// the device targets are refused and the host targets land through the
// source's GPU.
func TestGPUOpensOnTheLocalDevice(t *testing.T) {
	requireGPU(t)
	requireDevices(t, 2)
	if rerun(t) {
		return
	}
	src := startSource(t, "CUDA_VISIBLE_DEVICES=1")
	tr := gpuTransport(t)
	x := transfer(20)
	can, err := cuda.CanAccessPeer(0, 1)
	require.NoError(t, err)
	targets, ps := layoutTargets(t, 0)
	err = fetchWith(tr, x, src.meta, targets)
	if can {
		require.NoError(t, err)
		checkLayout(t, ps, 0, 0)
	} else {
		t.Log(err)
		assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err), "%v", err)
		assert.ErrorContains(t, err, "no peer access")
	}

	host := hostLayoutTargets(t)
	require.NoError(t, fetchWith(tr, x, src.meta, host.tensors))
	host.check(t)
	active, err := cuda.PrimaryContextActive(1)
	require.NoError(t, err)
	want := map[int]int{0: 2}
	if !can {
		want = map[int]int{1: 2} // through the source's GPU: a context there
	}
	devs := map[int]int{}
	for _, e := range entriesOf(tr.cache, src.pid) {
		devs[e.key.dev]++
	}
	assert.Equal(t, want, devs, "the devices the allocations were opened on")
	assert.Equal(t, !can, active, "a context on the source's GPU")
}

// A receiver that does not see the source's GPU opens its handles on its
// own, which the driver allows when the two have peer access: into device
// and host targets. Without peer access the error says what happened.
func TestGPUOpensOnTheLocalDeviceSourceHidden(t *testing.T) {
	requireGPU(t)
	if os.Getenv(rerunEnv) == "" {
		requireDevices(t, 2)
	}
	if rerun(t, "CUDA_VISIBLE_DEVICES=0") {
		return
	}
	src := startSource(t, "CUDA_VISIBLE_DEVICES=1")
	tr := gpuTransport(t)
	x := transfer(17)
	targets, ps := layoutTargets(t, 0)
	err := fetchWith(tr, x, src.meta, targets)
	if err != nil {
		// No peer access (this process cannot ask: it does not see the GPU).
		t.Log(err)
		assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err), "%v", err)
		assert.ErrorContains(t, err, "opening the source's allocation on cuda:0")
		assert.ErrorContains(t, err, "is not visible in this process")
		assert.ErrorContains(t, err, "peer access")
		if testDouble() {
			assert.Equal(t, "0", os.Getenv("RDT_FAKECUDA_PEER_ACCESS"), "the double has peer access: %v", err)
		}
		return
	}
	checkLayout(t, ps, 0, 0)
	host := hostLayoutTargets(t)
	require.NoError(t, fetchWith(tr, x, src.meta, host.tensors))
	host.check(t)
	for _, e := range entriesOf(tr.cache, src.pid) {
		assert.Equal(t, 0, e.key.dev)
	}
}

// hostTargets is a host target for every tensor of the layout.
type hostTargets struct {
	tensors []transport.Tensor
	bufs    [][]byte
}

func hostLayoutTargets(t *testing.T) hostTargets {
	var h hostTargets
	for _, l := range layout {
		b := hostBuffer(t, max(int(l.n), 1))[:l.n]
		tg := devTensor(0, 0, 0)
		tg.Device = transport.Device{Type: transport.DeviceCPU}
		if l.n > 0 {
			tg = hostTensor(b)
		}
		h.tensors, h.bufs = append(h.tensors, tg), append(h.bufs, b)
	}
	return h
}

func (h hostTargets) check(t *testing.T) {
	t.Helper()
	for i, l := range layout {
		want := make([]byte, l.n)
		fill(want, l.seed)
		assert.True(t, bytes.Equal(want, h.bufs[i]), "tensor %d", i)
	}
}

// A target that is not what it says (host memory described as CUDA, memory
// of another device) is named when the driver refuses the copy. A driver
// may also copy regardless (unified addressing); the test double refuses.
func TestGPUTargetIsNotWhatItSays(t *testing.T) {
	requireGPU(t)
	tr := gpuTransport(t)
	p := deviceBuffer(t, 4096, 1)
	meta, err := tr.ExtractMetadata(transport.ObjectID{}, []transport.Tensor{deviceTensor(p, 4096)})
	require.NoError(t, err)
	check := func(err error, want string) {
		t.Helper()
		if err == nil {
			require.False(t, testDouble(), "the copy was refused by the test double")
			return
		}
		assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
		assert.ErrorContains(t, err, want)
	}
	host := deviceTensor(hostAddr(hostBuffer(t, 4096)), 4096)
	check(fetchWith(tr, transfer(0), meta, []transport.Tensor{host}), "target 0 at")
	check(tr.CopyLocal([]transport.Tensor{host}, []transport.Tensor{deviceTensor(p, 4096)}), "is not CUDA memory this process knows")
	if n, _ := cuda.DeviceCount(); n > 1 {
		q := deviceBuffer(t, 4096, 0) // on cuda:0
		check(fetchWith(tr, transfer(0), meta, []transport.Tensor{devTensor(1, q, 4096)}),
			"target 0 is described as cuda:1 but its memory is on cuda:0")
	}
}

// RDT_CUDA_IPC_CACHE=0 keeps no mapping: each fetch opens the source's
// allocations and closes them when released, and opening again works.
func TestGPUCacheThatKeepsNothing(t *testing.T) {
	requireGPU(t)
	if rerun(t, "RDT_CUDA_IPC_CACHE=0") {
		return
	}
	src := startSource(t)
	tr := gpuTransport(t)
	x := transfer(18)
	for round := 0; round < 3; round++ {
		targets, ps := layoutTargets(t, 0)
		require.NoError(t, fetchWith(tr, x, src.meta, targets))
		checkLayout(t, ps, 0, 0)
		assert.Empty(t, entriesOf(tr.cache, src.pid))
		if n := mappedFrom(t, src.pid); n >= 0 {
			assert.Equal(t, 0, n, "round %d: mappings left open", round)
		}
	}
}

// A closed transport refuses a fetch before it maps anything.
func TestGPUFetchOnAClosedTransport(t *testing.T) {
	requireGPU(t)
	src := startSource(t)
	tr := gpuTransport(t)
	require.NoError(t, tr.Close())
	targets, _ := layoutTargets(t, 0)
	_, err := tr.Fetch(transfer(19), targets, src.meta, nil)
	assert.Equal(t, transport.ErrClosed, transport.StatusOf(err), "%v", err)
	assert.Empty(t, entriesOf(tr.cache, src.pid), "mappings opened for a closed transport")
}

// BenchmarkGPUFetch times the transport alone (no runtime, no Python):
// fetches from a source process into device memory of this one, its
// mapping cached after the first. The GPU pack runs it to tell the
// transport's share of a fetch from the runtime's and the binding's.
func BenchmarkGPUFetch(b *testing.B) {
	requireGPU(b)
	src := startSource(b)
	tr := gpuTransport(b)
	for _, n := range []uint64{4 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dKiB", n>>10), func(b *testing.B) {
			x := transfer(16)
			x.Pieces = []transport.Piece{{Tensor: 0, Length: n}}
			p, err := cuda.Alloc(0, n)
			require.NoError(b, err)
			b.Cleanup(func() { _ = cuda.Free(0, p) })
			targets := []transport.Tensor{devTensor(0, p, n)}
			require.NoError(b, fetchWith(tr, x, src.meta, targets))
			b.SetBytes(int64(n))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := fetchWith(tr, x, src.meta, targets); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A small fetch ends on the caller's goroutine: its copy into host memory
// runs inside Fetch, and its first Completed waits for its device copy, so
// the engine needs no waiting goroutine. A fetch larger than inlineMax
// leaves its host copies to a goroutine of their own.
func TestGPUSmallFetchCompletesInline(t *testing.T) {
	requireGPU(t)
	old := inlineBudget
	inlineBudget = 10 * time.Second // the race detector and a busy machine are slow
	defer func() { inlineBudget = old }()
	src := startSource(t)
	tr := gpuTransport(t)
	const n = 4096
	want := make([]byte, n)
	fill(want, layout[0].seed)
	x := transfer(21)
	x.Pieces = []transport.Piece{{Tensor: 0, Length: n}}

	dev := deviceBuffer(t, n, 0)
	host := hostBuffer(t, n)
	for _, tg := range []transport.Tensor{devTensor(0, dev, n), hostTensor(host)} {
		req, err := tr.Fetch(x, []transport.Tensor{tg}, src.meta, nil)
		require.NoError(t, err)
		r := req.(*request)
		assert.True(t, r.small)
		assert.True(t, r.hostEnded(), "the host copy ran inside Fetch")
		assert.True(t, r.Completed(), "a 4 KiB fetch on %s did not complete inline", tg.Device)
		require.NoError(t, req.Wait())
		req.Release()
	}
	assert.True(t, bytes.Equal(want, readBack(t, dev, n)), "device target")
	assert.True(t, bytes.Equal(want, host), "host target")

	x.Pieces = []transport.Piece{{Tensor: 0, Length: inlineMax + 4096}}
	big := hostBuffer(t, inlineMax+4096)
	req, err := tr.Fetch(x, []transport.Tensor{hostTensor(big)}, src.meta, nil)
	require.NoError(t, err)
	assert.False(t, req.(*request).small)
	require.NoError(t, req.Wait())
	req.Release()
	want = make([]byte, inlineMax+4096)
	fill(want, layout[0].seed)
	assert.True(t, bytes.Equal(want, big))
}

// twoRuntimes makes two runtimes of this process with only cuda_ipc,
// destroyed at cleanup.
func twoRuntimes(t *testing.T) (a, b *engine.Runtime) {
	t.Helper()
	for _, name := range []string{"a", "b"} {
		rt, err := engine.NewRuntime(engine.Options{Name: name, LogLevel: transport.LogOff, Builtins: []transport.TransportFactory{Factory()}})
		require.NoError(t, err)
		t.Cleanup(rt.Destroy)
		if a == nil {
			a = rt
		} else {
			b = rt
		}
	}
	return a, b
}
