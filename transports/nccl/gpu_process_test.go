package nccl

// Groups whose ranks are separate processes, as in real use: this test
// process is one rank, a child process (this test binary, started with
// childEnv set) the other, driven over its stdin and stdout. They need two
// CUDA devices, and skip like the other GPU tests.

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

func requireTwoDevices(t *testing.T) {
	t.Helper()
	requireNCCL(t)
	if n, _ := cuda.DeviceCount(); n < 2 {
		t.Skipf("NCCL needs two GPUs for one group (this machine has %d): NCCL refuses two ranks on one device", n)
	}
}

// requireDelayedTransfers skips unless the tests run on the NCCL and CUDA
// test doubles, whose RDT_FAKENCCL_DELAY_MS keeps a transfer in flight
// while a test kills, aborts or destroys something under it; on a GPU the
// transfer is over in microseconds, before the test can act.
func requireDelayedTransfers(t *testing.T) {
	t.Helper()
	requireTwoDevices(t)
	if !strings.HasPrefix(cuda.DeviceName(0), "rdt fake CUDA device") {
		t.Skip("needs the NCCL test double (make fake-nccl-test) to hold a transfer in flight; on a GPU it ends before the test can act")
	}
}

// pairWithChild forms group name: rank 0 here on device 0, rank 1 in the
// child on device 1.
func pairWithChild(t *testing.T, rt *engine.Runtime, c *child, name string) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		_, err := c.do("group", name, 2, 1, rt.Address(), 1, 60000)
		errc <- err
	}()
	require.NoError(t, rt.CreateGroup(transport.GroupSpec{Name: name, WorldSize: 2, Rank: 0, Device: 0}, time.Minute))
	require.NoError(t, <-errc)
}

func putHere(t *testing.T, rt *engine.Runtime, dev int, ns []int, seed byte) (*engine.Ref, string) {
	t.Helper()
	var ts []transport.Tensor
	var args []string
	for i, n := range ns {
		p, err := devFill(dev, n, seed+byte(i))
		require.NoError(t, err)
		t.Cleanup(func() { cuda.Free(dev, p) })
		ts = append(ts, devTensor(dev, p, n))
		args = append(args, fmt.Sprintf("%d:%d", n, seed+byte(i)))
	}
	ref, err := rt.Put(ts, Name, nil)
	require.NoError(t, err)
	t.Cleanup(func() { ref.Release() })
	b, err := ref.Serialize()
	require.NoError(t, err)
	return ref, hex.EncodeToString(b) + " " + strings.Join(args, " ")
}

// getHere fetches a ref the child put (wire in hex) into fresh device
// memory and checks the bytes.
func getHere(t *testing.T, rt *engine.Runtime, dev int, wire string, ns []int, seed byte, timeout time.Duration) error {
	b, err := hex.DecodeString(wire)
	require.NoError(t, err)
	ref, err := rt.Deserialize(b)
	require.NoError(t, err)
	defer ref.Release()
	var ts []transport.Tensor
	var ps []cuda.Ptr
	for _, n := range ns {
		p, err := cuda.Alloc(dev, uint64(max(n, 1)))
		require.NoError(t, err)
		t.Cleanup(func() { cuda.Free(dev, p) })
		ps = append(ps, p)
		ts = append(ts, devTensor(dev, p, n))
	}
	if err := rt.Get([]*engine.Ref{ref}, ts, engine.FetchOptions{}, timeout); err != nil {
		return err
	}
	for i, n := range ns {
		got, err := devRead(dev, ps[i], n)
		require.NoError(t, err)
		require.True(t, bytes.Equal(got, pattern(n, seed+byte(i))), "tensor %d of %d bytes", i, n)
	}
	return nil
}

// pairedWithChild makes a runtime ("rank0", destroyed at cleanup) and a
// child process (started with env), paired in the group "pair".
func pairedWithChild(t *testing.T, env ...string) (*engine.Runtime, *child) {
	t.Helper()
	dir := t.TempDir()
	rt, err := sockRuntime("rank0", dir)
	require.NoError(t, err)
	t.Cleanup(func() { rt.Destroy() })
	c := startChild(t, dir, env...)
	pairWithChild(t, rt, c, "pair")
	return rt, c
}

// childObject has the child put one object of tensors of sizes ns (on
// its cuda:1) and returns this runtime's ref to it (released at cleanup)
// and the serialized ref.
func childObject(t *testing.T, rt *engine.Runtime, c *child, ns []int, seed byte) (*engine.Ref, string) {
	t.Helper()
	wire, err := c.do("put", 1, childArgs(ns, seed))
	require.NoError(t, err)
	b, err := hex.DecodeString(wire)
	require.NoError(t, err)
	ref, err := rt.Deserialize(b)
	require.NoError(t, err)
	t.Cleanup(func() { ref.Release() })
	return ref, wire
}

// devBuffer allocates n bytes on cuda:0, freed at cleanup.
func devBuffer(t *testing.T, n int) cuda.Ptr {
	t.Helper()
	p, err := cuda.Alloc(0, uint64(n))
	require.NoError(t, err)
	t.Cleanup(func() { cuda.Free(0, p) })
	return p
}

func childArgs(ns []int, seed byte) string {
	var s []string
	for i, n := range ns {
		s = append(s, fmt.Sprintf("%d:%d", n, seed+byte(i)))
	}
	return strings.Join(s, " ")
}

// Two processes form a group and move tensors both ways, several at once
// and in order; a runtime outside the group is told to use another
// transport; the group is destroyed and formed again on both ranks.
func TestGPUTwoProcesses(t *testing.T) {
	requireTwoDevices(t)
	rt, c := pairedWithChild(t)
	var err error

	// Here to the child: several tensors of one object, one of them empty.
	ns := []int{3 << 20, 0, 4099}
	_, wire := putHere(t, rt, 0, ns, 1)
	c.send("get", 1, wire)
	require.Equal(t, "FETCHING", mustLine(t, c))
	_, err = c.answer()
	require.NoError(t, err)

	// The child to here.
	out, err := c.do("put", 1, childArgs([]int{5 << 20, 17}, 40))
	require.NoError(t, err)
	require.NoError(t, getHere(t, rt, 0, out, []int{5 << 20, 17}, 40, time.Minute))

	// Many objects fetched at once: the destination gives each transfer its
	// place, and both sides enqueue in that order (the sizes differ, so a
	// send matched with the wrong receive would fail).
	var wires []string
	var sz [][]int
	for i := 0; i < 6; i++ {
		n := []int{(i + 1) * 70001}
		out, err := c.do("put", 1, childArgs(n, byte(60+i)))
		require.NoError(t, err)
		wires, sz = append(wires, out), append(sz, n)
	}
	var refs []*engine.Ref
	var targets []transport.Tensor
	var ptrs []cuda.Ptr
	for i, w := range wires {
		b, err := hex.DecodeString(w)
		require.NoError(t, err)
		ref, err := rt.Deserialize(b)
		require.NoError(t, err)
		defer ref.Release()
		p, err := cuda.Alloc(0, uint64(sz[i][0]))
		require.NoError(t, err)
		defer cuda.Free(0, p)
		refs, targets, ptrs = append(refs, ref), append(targets, devTensor(0, p, sz[i][0])), append(ptrs, p)
	}
	require.NoError(t, rt.Get(refs, targets, engine.FetchOptions{}, time.Minute))
	for i, p := range ptrs {
		got, err := devRead(0, p, sz[i][0])
		require.NoError(t, err)
		assert.True(t, bytes.Equal(got, pattern(sz[i][0], byte(60+i))), "object %d", i)
	}

	// A runtime outside the group cannot fetch over nccl.
	other, err := sockRuntime("outsider", t.TempDir())
	require.NoError(t, err)
	err = getHere(t, other, 0, out, []int{5 << 20, 17}, 40, 10*time.Second)
	other.Destroy()
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err), "%v", err)
	assert.Contains(t, fmt.Sprint(err), "not ranks of one nccl group")

	// Destroyed on both ranks at once (NCCL frees a communicator once its
	// peers on the host free theirs), formed again, and used again.
	childDone := make(chan error, 1)
	go func() { _, err := c.do("destroy", "pair"); childDone <- err }()
	require.NoError(t, rt.DestroyGroup("pair"))
	require.NoError(t, <-childDone)
	pairWithChild(t, rt, c, "pair")
	require.NoError(t, getHere(t, rt, 0, out, []int{5 << 20, 17}, 40, time.Minute))
	assert.Equal(t, "", groupState(rt, "pair"))
}

func mustLine(t *testing.T, c *child) string {
	t.Helper()
	line, err := c.out.ReadString('\n')
	require.NoError(t, err)
	return strings.TrimSpace(line)
}

// waitFor polls cond for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// The source process dies while the destination waits for the bytes: the
// fetch fails promptly (it does not hang) and the destination's group is
// destroyed, which later transfers report.
func TestGPUSourceDiesMidTransfer(t *testing.T) {
	requireDelayedTransfers(t)
	// The child's sends take a minute (under the NCCL double).
	rt, c := pairedWithChild(t, "RDT_FAKENCCL_DELAY_MS=60000", "RDT_FAKENCCL_DELAY_MIN_BYTES=1024")
	ns := []int{8 << 20}
	wire, err := c.do("put", 1, childArgs(ns, 3))
	require.NoError(t, err)

	res := make(chan error, 1)
	go func() { res <- getHere(t, rt, 0, wire, ns, 3, time.Minute) }()
	require.True(t, waitFor(10*time.Second, func() bool { return inFlight(rt) > 0 }), "the receive never started")
	time.Sleep(50 * time.Millisecond)
	c.kill()
	select {
	case err = <-res:
	case <-time.After(30 * time.Second):
		t.Fatal("the fetch from a dead source did not end")
	}
	require.Error(t, err)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
	require.True(t, waitFor(10*time.Second, func() bool { return groupState(rt, "pair") != "" }))
	assert.Contains(t, groupState(rt, "pair"), `group "pair" was destroyed after`)
}

// The destination process dies while the source sends: the source's send
// fails and destroys its group.
func TestGPUDestinationDiesMidTransfer(t *testing.T) {
	requireDelayedTransfers(t)
	// The child's receives take a minute.
	rt, c := pairedWithChild(t, "RDT_FAKENCCL_DELAY_MS=60000", "RDT_FAKENCCL_DELAY_MIN_BYTES=1024")
	_, wire := putHere(t, rt, 0, []int{8 << 20}, 9)
	c.send("get", 1, wire)
	require.Equal(t, "FETCHING", mustLine(t, c))
	require.True(t, waitFor(10*time.Second, func() bool { return inFlight(rt) > 0 }), "the send never started")
	time.Sleep(50 * time.Millisecond)
	c.kill()
	require.True(t, waitFor(30*time.Second, func() bool { return groupState(rt, "pair") != "" }),
		"the source's group outlived its dead peer")
	assert.Contains(t, groupState(rt, "pair"), `group "pair" was destroyed after`)
}

// An aborted fetch destroys the group on the destination, and the source's
// half of the transfer is cancelled and destroys it there too, also when
// NCCL does not tell the source (RDT_FAKENCCL_ABORT=silent).
func TestGPUAbortDestroysBothSides(t *testing.T) {
	requireDelayedTransfers(t)
	rt, c := pairedWithChild(t, "RDT_FAKENCCL_DELAY_MS=60000", "RDT_FAKENCCL_DELAY_MIN_BYTES=1024")
	ns := []int{8 << 20}
	ref, wire := childObject(t, rt, c, ns, 3)
	p, p2 := devBuffer(t, ns[0]), devBuffer(t, ns[0])

	f, err := rt.StartFetch([]*engine.Ref{ref}, []transport.Tensor{devTensor(0, p, ns[0])}, engine.FetchOptions{})
	require.NoError(t, err)
	require.True(t, waitFor(10*time.Second, func() bool { return inFlight(rt) > 0 }))
	// A second transfer behind it, which the abort ends too: its NCCL work
	// stops early, and that is not a success.
	f2, err := rt.StartFetch([]*engine.Ref{ref}, []transport.Tensor{devTensor(0, p2, ns[0])}, engine.FetchOptions{})
	require.NoError(t, err)
	require.True(t, waitFor(10*time.Second, func() bool { return inFlight(rt) > 1 }))
	time.Sleep(100 * time.Millisecond)
	f.Abort()
	err = f.Wait(30 * time.Second)
	f.Free()
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "%v", err)
	assert.Contains(t, groupState(rt, "pair"), `group "pair" was destroyed after`)
	err = f2.Wait(30 * time.Second)
	f2.Free()
	assert.Contains(t, fmt.Sprint(err), `group "pair" was destroyed after`)
	require.True(t, waitFor(30*time.Second, func() bool {
		s, err := c.do("state", "pair")
		return err == nil && s != ""
	}), "the source's group outlived the aborted transfer")
	s, err := c.do("state", "pair")
	require.NoError(t, err)
	assert.Contains(t, s, `group "pair" was destroyed after`)

	// Later transfers say why, on both sides.
	err = getHere(t, rt, 0, wire, ns, 3, 10*time.Second)
	assert.Contains(t, fmt.Sprint(err), `group "pair" was destroyed after`)
	_, wire2 := putHere(t, rt, 0, []int{100}, 1)
	_, err = c.do("get", 1, wire2)
	assert.Contains(t, fmt.Sprint(err), `group "pair" was destroyed after`)
}

// The source fails before it sends (its tensor is not on its group's
// device), while the destination's first receive from it waits in NCCL for
// the source to connect. The destination's fetch fails with the source's
// error instead of waiting forever, also when NCCL does not tell it that
// the source aborted.
func TestGPUSourceFailsBeforeSending(t *testing.T) {
	requireTwoDevices(t)
	rt, c := pairedWithChild(t)
	ns := []int{1 << 20}
	wire, err := c.do("put", 0, childArgs(ns, 3)) // cuda:0, but the child's rank uses cuda:1
	require.NoError(t, err)

	res := make(chan error, 1)
	go func() { res <- getHere(t, rt, 0, wire, ns, 3, time.Minute) }()
	select {
	case err = <-res:
	case <-time.After(30 * time.Second):
		t.Fatal("the fetch did not end after the source failed")
	}
	// The source's error, or (when NCCL reports the source's abort first)
	// the destination's group destroyed by it.
	require.Error(t, err)
	if transport.StatusOf(err) == transport.ErrInvalidArgument {
		assert.Contains(t, err.Error(), "tensor 0 is on cuda:0, but this rank of group \"pair\" uses cuda:1")
	} else {
		assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
		assert.Contains(t, err.Error(), `group "pair" was destroyed after`)
	}
	s, err := c.do("state", "pair")
	require.NoError(t, err)
	assert.Contains(t, s, `group "pair" was destroyed after`)
	require.True(t, waitFor(10*time.Second, func() bool { return groupState(rt, "pair") != "" }))
}

// rdt_group_destroy while a transfer is in flight frees the communicator
// after its pending work: the transfer completes, and the fetch does not
// return while NCCL may still write into its targets.
func TestGPUDestroyGroupDuringTransfer(t *testing.T) {
	d := destroyGroupDuringFetch(t, "500")
	ferr := d.f.Wait(30 * time.Second)
	d.f.Free()
	require.NoError(t, ferr)
	after, err := devRead(0, d.p, destroyingN)
	require.NoError(t, err)
	d.awaitDestroyed(t, true, "rdt_group_destroy did not return")
	time.Sleep(100 * time.Millisecond)
	again, err := devRead(0, d.p, destroyingN)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(after, again), "the target changed after the fetch returned")
	assert.True(t, bytes.Equal(after, pattern(destroyingN, 3)), "the fetch succeeded with the wrong bytes")
	assert.Equal(t, "none", groupState(d.rt, "pair"))
}

// destroyingN is the size of the object destroyGroupDuringFetch fetches.
const destroyingN = 1 << 20

// destroyingGroup is a fetch from a child over the group "pair", enqueued,
// while rdt_group_destroy runs on another goroutine.
type destroyingGroup struct {
	rt        *engine.Runtime
	c         *child
	f         *engine.Fetch
	p         cuda.Ptr
	destroyed chan error
}

// destroyGroupDuringFetch starts fetching a destroyingN-byte object (seed
// 3) from a child whose NCCL sends take delayMS milliseconds into device
// buffer p, waits until the transfer is enqueued and then destroys the
// group on another goroutine.
func destroyGroupDuringFetch(t *testing.T, delayMS string) *destroyingGroup {
	requireDelayedTransfers(t)
	rt, c := pairedWithChild(t, "RDT_FAKENCCL_DELAY_MS="+delayMS, "RDT_FAKENCCL_DELAY_MIN_BYTES=1024")
	ref, _ := childObject(t, rt, c, []int{destroyingN}, 3)
	p := devBuffer(t, destroyingN)

	f, err := rt.StartFetch([]*engine.Ref{ref}, []transport.Tensor{devTensor(0, p, destroyingN)}, engine.FetchOptions{})
	require.NoError(t, err)
	require.True(t, waitFor(10*time.Second, func() bool { return received(rt, "pair", 1) > 0 }), "never enqueued")
	d := &destroyingGroup{rt: rt, c: c, f: f, p: p, destroyed: make(chan error, 1)}
	go func() { d.destroyed <- rt.DestroyGroup("pair") }()
	return d
}

// awaitDestroyed requires rdt_group_destroy to return, without error,
// within 30 s; msg says what it means if it does not. With peerToo the
// child destroys its rank meanwhile (NCCL frees a communicator once its
// peers on the host free theirs); else its group must end by itself.
func (d *destroyingGroup) awaitDestroyed(t *testing.T, peerToo bool, msg string) {
	peer := make(chan error, 1)
	if peerToo {
		go func() { _, err := d.c.do("destroy", "pair"); peer <- err }()
	}
	select {
	case err := <-d.destroyed:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal(msg)
	}
	if peerToo {
		require.NoError(t, <-peer)
	}
}

// rdt_group_destroy waits for a transfer that does not end (here: a very
// slow source), but aborting that fetch aborts the communicator and ends
// both.
func TestGPUAbortWhileGroupIsDestroyed(t *testing.T) {
	d := destroyGroupDuringFetch(t, "60000")
	f := d.f
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(f.Wait(200*time.Millisecond)), "the fetch ended by itself")
	f.Abort()
	ferr := f.Wait(30 * time.Second)
	f.Free()
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(ferr), "%v", ferr)
	d.awaitDestroyed(t, false, "rdt_group_destroy did not return after the abort")
	require.True(t, waitFor(30*time.Second, func() bool {
		s, err := d.c.do("state", "pair")
		return err == nil && s != ""
	}), "the source's group outlived the aborted transfer")
}

// Destroying a runtime ends its transfers in flight, as destination and as
// source, promptly (the other rank is slow, and under a silent abort NCCL
// does not tell it), and the other rank's group is destroyed.
func TestGPURuntimeDestroyedMidTransfer(t *testing.T) {
	requireDelayedTransfers(t)
	for _, role := range []string{"destination", "source"} {
		t.Run(role, func(t *testing.T) {
			rt, c := pairedWithChild(t, "RDT_FAKENCCL_DELAY_MS=60000", "RDT_FAKENCCL_DELAY_MIN_BYTES=1024")
			ns := []int{1 << 20}
			res := make(chan error, 1)
			if role == "destination" {
				wire, err := c.do("put", 1, childArgs(ns, 3))
				require.NoError(t, err)
				go func() { res <- getHere(t, rt, 0, wire, ns, 3, time.Minute) }()
			} else {
				_, wire := putHere(t, rt, 0, ns, 9)
				c.send("get", 1, wire)
				require.Equal(t, "FETCHING", mustLine(t, c))
			}
			require.True(t, waitFor(10*time.Second, func() bool { return inFlight(rt) > 0 }))
			time.Sleep(50 * time.Millisecond)
			done := make(chan struct{})
			go func() { rt.Destroy(); close(done) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the runtime's destruction waited for the transfer")
			}
			if role == "destination" {
				assert.Error(t, <-res)
			} else {
				_, err := c.answer()
				assert.Error(t, err, "the child's fetch from a destroyed runtime")
			}
			require.True(t, waitFor(30*time.Second, func() bool {
				s, err := c.do("state", "pair")
				return err == nil && s != ""
			}), "the other rank's group outlived the transfer")
		})
	}
}
