package cudaipc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/rdt-project/rdt/transports/internal/cuda"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newHost is a test host whose settings come from this process's
// environment through the engine's table, as a runtime's do: tests rerun
// with RDT_CUDA_IPC_CACHE or CUDA_VISIBLE_DEVICES see them.
func newHost() *transporttest.Host {
	env, err := engine.ReadEnvironment(os.LookupEnv, Settings())
	if err != nil {
		panic(err)
	}
	h := transporttest.NewHostIn("")
	h.Config = env.Settings
	return h
}

// cudaMissing reports why this machine has no CUDA ("" when it has).
func cudaMissing() string {
	n, err := cuda.DeviceCount()
	switch {
	case err != nil:
		return err.Error()
	case n == 0:
		return "the driver sees no device"
	}
	return ""
}

func TestWithoutCUDAThereIsNoTransport(t *testing.T) {
	if cudaMissing() == "" {
		t.Skip("this machine has CUDA")
	}
	_, err := New(newHost())
	require.Error(t, err)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	assert.NotContains(t, err.Error(), "cuda_ipc", "the engine names the transport, not the transport itself")
	assert.Contains(t, err.Error(), cuda.Library())

	// A runtime with the factory starts, without the transport.
	rt, err := engine.NewRuntime(engine.Options{Name: "nocuda", Builtins: []transport.TransportFactory{Factory()}})
	require.NoError(t, err)
	defer rt.Destroy()
	assert.NotContains(t, rt.Registry().Names(), Name)
}

// ---- the handle cache, with the driver calls replaced --------------------

type fakeDriver struct {
	opened, closed atomic.Int32
	open           map[cuda.Ptr]bool
	devOf          map[cuda.Ptr]int // the device each mapping was opened on
	next           cuda.Ptr
	dead           map[int]bool
	now            time.Time
	failOpen       error
}

func newFakeCache(limit int) (*handleCache, *fakeDriver) {
	d := &fakeDriver{open: map[cuda.Ptr]bool{}, devOf: map[cuda.Ptr]int{}, next: 0x1000, dead: map[int]bool{}, now: time.Unix(1000, 0)}
	c := newHandleCache(limit)
	c.open = func(dev int, h cuda.IPCHandle) (cuda.Ptr, error) {
		if d.failOpen != nil {
			return 0, d.failOpen
		}
		d.opened.Add(1)
		d.next += 0x1000
		d.open[d.next] = true
		d.devOf[d.next] = dev
		return d.next, nil
	}
	c.close = func(dev int, p cuda.Ptr) error {
		if !d.open[p] {
			return fmt.Errorf("close of %#x, which is not open", p)
		}
		if d.devOf[p] != dev {
			return fmt.Errorf("close of %#x on cuda:%d, opened on cuda:%d", p, dev, d.devOf[p])
		}
		delete(d.open, p)
		d.closed.Add(1)
		return nil
	}
	c.alive = func(pid int) bool { return !d.dead[pid] }
	c.now = func() time.Time { return d.now }
	c.warn = func(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
	return c, d
}

func key(src byte, h byte) cacheKey {
	k := cacheKey{}
	k.source[0] = src
	k.handle[0] = h
	return k
}

func TestCacheReusesAMapping(t *testing.T) {
	c, d := newFakeCache(8)
	a, err := c.acquire(key(1, 1), 10)
	require.NoError(t, err)
	b, err := c.acquire(key(1, 1), 10)
	require.NoError(t, err)
	assert.Same(t, a, b)
	assert.EqualValues(t, 1, d.opened.Load())
	// The same handle from another source runtime is another mapping.
	o, err := c.acquire(key(2, 1), 11)
	require.NoError(t, err)
	assert.NotSame(t, a, o)
	// The same handle opened on another device is another mapping, closed
	// on its own device.
	k := key(1, 1)
	k.dev = 1
	on1, err := c.acquire(k, 10)
	require.NoError(t, err)
	assert.NotSame(t, a, on1)
	assert.Equal(t, 1, d.devOf[on1.ptr])
	assert.Equal(t, 0, d.devOf[a.ptr])
	c.release(a)
	c.release(b)
	c.release(o)
	c.release(on1)
	assert.Equal(t, 3, c.len())
	assert.EqualValues(t, 0, d.closed.Load())
	c.addUser()
	c.dropUser()
	assert.Empty(t, d.open, "each closed on the device it was opened on")
}

func TestCacheEvictsLeastRecentlyUsedIdleEntries(t *testing.T) {
	c, d := newFakeCache(2)
	e1, _ := c.acquire(key(1, 1), 10)
	e2, _ := c.acquire(key(1, 2), 10)
	c.release(e2)
	// e1 is in use: over the limit, e2 (idle) goes, e1 stays.
	e3, _ := c.acquire(key(1, 3), 10)
	e4, _ := c.acquire(key(1, 4), 10)
	assert.EqualValues(t, 1, d.closed.Load())
	assert.False(t, d.open[e2.ptr])
	assert.True(t, d.open[e1.ptr])
	assert.Equal(t, 3, c.len(), "entries in use are never closed, even over the limit")
	c.release(e1)
	assert.Equal(t, 2, c.len())
	assert.False(t, d.open[e1.ptr])
	c.release(e3)
	c.release(e4)
	assert.Equal(t, 2, c.len())
}

func TestCacheLimitZeroKeepsNothing(t *testing.T) {
	c, d := newFakeCache(0)
	e, _ := c.acquire(key(1, 1), 10)
	assert.True(t, d.open[e.ptr])
	c.release(e)
	assert.Equal(t, 0, c.len())
	assert.Empty(t, d.open)
}

// idleAndBusy is a cache of eight holding two mappings of source 1 (pid
// 10): idle, released, and busy, still in use.
func idleAndBusy() (c *handleCache, d *fakeDriver, idle, busy *entry) {
	c, d = newFakeCache(8)
	idle, _ = c.acquire(key(1, 1), 10)
	c.release(idle)
	busy, _ = c.acquire(key(1, 2), 10)
	return c, d, idle, busy
}

func TestCacheSweepsIdleEntriesAndExitedSources(t *testing.T) {
	c, d, idle, busy := idleAndBusy()
	fresh, _ := c.acquire(key(2, 1), 20)
	d.now = d.now.Add(idleTimeout / 2)
	c.release(fresh)
	d.now = d.now.Add(idleTimeout/2 + time.Millisecond)
	c.sweep()
	assert.False(t, d.open[idle.ptr], "idle past the timeout")
	assert.True(t, d.open[busy.ptr], "in use")
	assert.True(t, d.open[fresh.ptr], "used recently")

	// The source of busy and idle exits: busy leaves the cache now and is
	// closed when its request releases it.
	d.dead[10] = true
	c.sweep()
	assert.Equal(t, 1, c.len())
	assert.True(t, d.open[busy.ptr])
	c.release(busy)
	assert.False(t, d.open[busy.ptr])
	// A new fetch opens a new mapping.
	again, _ := c.acquire(key(1, 2), 10)
	assert.NotEqual(t, busy.ptr, again.ptr)
	c.release(again)
}

var _ transport.PeerWatcher = (*Transport)(nil)

// A source runtime reported gone loses its mappings at once (one in use
// once released); other sources keep theirs.
func TestCacheDropsAGoneSource(t *testing.T) {
	c, d, idle, busy := idleAndBusy()
	other, _ := c.acquire(key(2, 1), 20)
	c.release(other)
	c.dropSource(key(1, 0).source)
	assert.False(t, d.open[idle.ptr], "closed at once")
	assert.True(t, d.open[busy.ptr], "still read by a request")
	assert.True(t, d.open[other.ptr], "another source's")
	assert.Equal(t, 1, c.len())
	c.release(busy)
	assert.False(t, d.open[busy.ptr], "closed once released")
	again, err := c.acquire(key(1, 2), 10)
	require.NoError(t, err)
	assert.NotEqual(t, busy.ptr, again.ptr, "opened again on demand")
	c.release(again)
}

func TestCacheClosesEverythingWithTheLastTransport(t *testing.T) {
	c, d := newFakeCache(8)
	c.addUser()
	c.addUser()
	e1, _ := c.acquire(key(1, 1), 10)
	e2, _ := c.acquire(key(1, 2), 10)
	c.release(e2)
	c.dropUser()
	assert.Equal(t, 2, c.len())
	c.dropUser()
	assert.Equal(t, 0, c.len())
	assert.True(t, d.open[e1.ptr], "still used by a request")
	c.release(e1)
	assert.Empty(t, d.open)
}

func TestCacheOpenFailure(t *testing.T) {
	c, d := newFakeCache(8)
	d.failOpen = &cuda.Error{Op: "cuIpcOpenMemHandle", Code: 1}
	_, err := c.acquire(key(1, 1), 10)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cuIpcOpenMemHandle: CUDA_ERROR_INVALID_VALUE")
	assert.Equal(t, 0, c.len())
}

func TestSweeperStopsWhenEmpty(t *testing.T) {
	c, d := newFakeCache(8)
	c.alive = func(int) bool { return false }
	e, _ := c.acquire(key(1, 1), 10)
	c.release(e)
	require.Eventually(t, func() bool { return c.len() == 0 }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return !c.sweeping
	}, 5*time.Second, 10*time.Millisecond)
	assert.Empty(t, d.open)
}

// ---- waiting on events, with the driver calls replaced -------------------

type fakeEvent struct {
	done atomic.Bool
	err  error
}

func (e *fakeEvent) Query() (bool, error) { return e.done.Load(), e.err }

func TestWaitEndsWhenEveryEventIsDone(t *testing.T) {
	a, b := &fakeEvent{}, &fakeEvent{}
	a.done.Store(true)
	go func() { time.Sleep(20 * time.Millisecond); b.done.Store(true) }()
	require.NoError(t, waitEvents([]event{a, b}, make(chan struct{})))
}

func TestAbortEndsTheWaitPromptly(t *testing.T) {
	never := &fakeEvent{}
	aborted := make(chan struct{})
	go func() { time.Sleep(20 * time.Millisecond); close(aborted) }()
	start := time.Now()
	err := waitEvents([]event{never}, aborted)
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(err))
	assert.Less(t, time.Since(start), time.Second)
}

func TestEventErrorsNameTheCall(t *testing.T) {
	bad := &fakeEvent{err: &cuda.Error{Op: "cuEventQuery", Code: 700}}
	err := waitEvents([]event{bad}, nil)
	require.Error(t, err)
	assert.Equal(t, transport.ErrTransport, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "cuEventQuery: CUDA_ERROR_ILLEGAL_ADDRESS")
	var ce *cuda.Error
	assert.True(t, errors.As(err, &ce), "the driver's error is kept: its status travels with it")
}

// The descriptor keeps cuda_ipc to its host, where it is the first choice
// for CUDA data, and serves partial fetches.
func TestDescribe(t *testing.T) {
	d := (&Transport{}).Describe()
	assert.Equal(t, Name, d.Name)
	assert.Equal(t, []transport.DeviceType{transport.DeviceCUDA}, d.Devices)
	assert.True(t, d.OneSided && d.CanAbort && d.SameHostOnly && d.Ranges)
	assert.False(t, d.DetectsFreedObjects || d.Eager() || d.GroupBackend)
	assert.Equal(t, transport.AutoRank{CUDA: 10}, d.Auto)
}

// A process that has exited is not alive, even before its parent waits for
// it (a zombie still answers kill(pid, 0)).
func TestProcessAliveSeesZombies(t *testing.T) {
	assert.True(t, transport.ProcessAlive(os.Getpid()))
	cmd := exec.Command("sleep", "60")
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	assert.True(t, transport.ProcessAlive(cmd.Process.Pid))
	require.NoError(t, cmd.Process.Kill())
	require.Eventually(t, func() bool { return !transport.ProcessAlive(cmd.Process.Pid) }, 10*time.Second, 5*time.Millisecond,
		"a killed child, not yet waited for, still counts as alive")
	_ = cmd.Wait()
	assert.False(t, transport.ProcessAlive(cmd.Process.Pid))
}
