package multiprocess

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

// Two runtimes that borrow, lease, serialize and fetch each other's
// objects in both directions at once, from several threads, while the
// machine is busy and the collector runs all the time: the pattern of Ray
// actors handing tensors both ways. Neither may ever see the other as
// gone. These tests run twoWaySeconds (20 s unless RDT_TWOWAY_SECONDS
// says otherwise) each; with RDT_TWOWAY_STALL_DUMP=DIR a process whose
// exchange makes no progress for a second writes its goroutines there.

const (
	twoWayThreads = 4
	twoWayObjects = 8
	hogRoleEnv    = "RDT_TEST_HOG"
)

func twoWaySeconds() time.Duration {
	if s, err := strconv.Atoi(os.Getenv("RDT_TWOWAY_SECONDS")); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return 20 * time.Second
}

// exchangeResult is what one side's exchange did.
type exchangeResult struct {
	Iterations int64    `json:"iterations"` // rounds of either kind
	Fetches    int64    `json:"fetches"`    // rounds that fetched
	Errors     []string `json:"errors,omitempty"`
}

// exchange borrows the other side's objects (refs, put with seeds
// seed, seed+1, ...) from twoWayThreads goroutines for d: each round
// half of them deserialize one (a borrow), serialize the borrowed handle (a lease
// granted by the owner), deserializes that (a second borrow), fetches it
// over cma, shm, tcp or the automatic choice in turn, checks every byte,
// and release both handles (unborrows); the other half borrow and release
// in a tight loop, never waiting for the owner. The first few errors are
// kept.
func exchange(rt *engine.Runtime, refs [][]byte, seed int, d time.Duration, name string) exchangeResult {
	var res exchangeResult
	var mu sync.Mutex
	var iterations, fetches atomic.Int64
	stop := time.Now().Add(d)
	record := func(err error) {
		mu.Lock()
		if len(res.Errors) < 8 {
			res.Errors = append(res.Errors, err.Error())
		}
		mu.Unlock()
	}
	done := make(chan struct{})
	defer close(done)
	go stallWatch(name, &iterations, done)
	var wg sync.WaitGroup
	for w := 0; w < twoWayThreads; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			transports := []string{"cma", "shm", "tcp", ""}
			for i := w; time.Now().Before(stop); i++ {
				k := i % len(refs)
				var err error
				if w%2 == 0 {
					err = exchangeOnce(rt, refs[k], seed+k, transports[i%len(transports)])
					fetches.Add(1)
				} else {
					err = borrowOnce(rt, refs[k])
				}
				if err != nil {
					record(err)
					return
				}
				iterations.Add(1)
			}
		}()
	}
	wg.Wait()
	res.Iterations, res.Fetches = iterations.Load(), fetches.Load()
	return res
}

func exchangeOnce(rt *engine.Runtime, b []byte, seed int, override string) error {
	first, err := rt.Deserialize(b)
	if err != nil {
		return fmt.Errorf("deserialize: %w", err)
	}
	defer first.Release()
	again, err := first.Serialize()
	if err != nil {
		return fmt.Errorf("serialize a borrowed ref: %w", err)
	}
	second, err := rt.Deserialize(again)
	if err != nil {
		return fmt.Errorf("deserialize a re-serialized ref: %w", err)
	}
	defer second.Release()
	targets, bufs := targetsFor(second.Desc())
	defer func() {
		for _, b := range bufs {
			freeMem(b)
		}
	}()
	if err := rt.Get([]*engine.Ref{second}, targets, engine.FetchOptions{Transport: override}, 60*time.Second); err != nil {
		return fmt.Errorf("get over %q: %w", override, err)
	}
	return checkPattern(bufs, seed)
}

// borrowOnce borrows and returns an object without waiting for its owner:
// a borrow request and an unborrow notice, as fast as a thread can loop.
func borrowOnce(rt *engine.Runtime, b []byte) error {
	r, err := rt.Deserialize(b)
	if err != nil {
		return fmt.Errorf("deserialize: %w", err)
	}
	return r.Release()
}

// stallWatch writes this process's goroutines into RDT_TWOWAY_STALL_DUMP
// (when set) the first time the exchange makes no progress for a second:
// the evidence of what a stuck pair waits on.
func stallWatch(name string, iterations *atomic.Int64, done <-chan struct{}) {
	dir := os.Getenv("RDT_TWOWAY_STALL_DUMP")
	if dir == "" {
		return
	}
	last, since := iterations.Load(), time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		if n := iterations.Load(); n != last {
			last, since = n, time.Now()
			continue
		}
		if time.Since(since) > time.Second {
			f, err := os.Create(filepath.Join(dir, fmt.Sprintf("stall-%s-%d.txt", name, os.Getpid())))
			if err == nil {
				pprof.Lookup("goroutine").WriteTo(f, 2)
				f.Close()
			}
			return
		}
	}
}

// putObjects puts twoWayObjects objects of a few small tensors with seeds
// seed, seed+1, ... and returns their serialized refs; release frees them.
func putObjects(rt *engine.Runtime, seed int) (refs [][]byte, release func(), err error) {
	var held []*engine.Ref
	var mems [][]byte
	release = func() {
		for _, r := range held {
			r.Release()
		}
	}
	for k := 0; k < twoWayObjects; k++ {
		sizes := []int{4096, 64 << 10, 1000 + k}
		tensors := make([]transport.Tensor, len(sizes))
		var bufs [][]byte
		for i, n := range sizes {
			b := hostMem(n)
			for j := range b {
				b[j] = patternByte(seed+k, i, j)
			}
			bufs = append(bufs, b)
			tensors[i] = tensorOver(b)
		}
		mems = append(mems, bufs...)
		ref, err := rt.Put(tensors, "", func() {
			for _, b := range bufs {
				freeMem(b)
			}
		})
		if err != nil {
			release()
			return nil, nil, err
		}
		held = append(held, ref)
		b, err := ref.Serialize()
		if err != nil {
			release()
			return nil, nil, err
		}
		refs = append(refs, b)
	}
	return refs, release, nil
}

// startHogs runs one busy process per core until the test ends.
func startHogs(t *testing.T) {
	t.Helper()
	for i := 0; i < runtime.NumCPU(); i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), hogRoleEnv+"=1")
		require.NoError(t, cmd.Start())
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
	}
}

// hogMain spins until killed.
func hogMain() int {
	x := uint64(1)
	for {
		x = x*6364136223846793005 + 1442695040888963407
		if x == 0 {
			return 1
		}
	}
}

// frequentGC runs the collector after every small allocation growth until
// the test ends, as GOGC=1 does in a child.
func frequentGC(t *testing.T) {
	old := debug.SetGCPercent(1)
	t.Cleanup(func() { debug.SetGCPercent(old) })
}

func checkExchange(t *testing.T, who string, res exchangeResult, rt *engine.Runtime) {
	t.Helper()
	assert.Empty(t, res.Errors, "%s's exchange failed", who)
	assert.Positive(t, res.Fetches, "%s fetched nothing", who)
	assert.Zero(t, rt.Stats().PeersLost, "%s saw a live peer as gone", who)
	t.Logf("%s: %d rounds, %d of them fetched", who, res.Iterations, res.Fetches)
}

func TestTwoWayExchangeBetweenProcesses(t *testing.T) {
	d := twoWaySeconds()
	startHogs(t)
	frequentGC(t)
	parent := parentRuntime(t, runtimeConfig{Name: "parent"})
	peer := startChild(t, runtimeConfig{Name: "child", GOGC: 1})
	childRefs := peer.call(request{Op: "put_exchange", Seed: 100})
	require.Empty(t, childRefs.Error)
	ours, release, err := putObjects(parent, 200)
	require.NoError(t, err)
	defer release()

	// The child borrows ours while we borrow its.
	childDone := make(chan reply, 1)
	go func() {
		r, err := peer.callNoFail(request{Op: "exchange", Refs: encAll(ours), Seed: 200, Millis: int(d / time.Millisecond)})
		if err != nil {
			r.Error = err.Error()
		}
		childDone <- r
	}()
	var theirs [][]byte
	for _, r := range childRefs.Refs {
		theirs = append(theirs, dec(r))
	}
	res := exchange(parent, theirs, 100, d, "parent")
	got := <-childDone
	require.Empty(t, got.Error)
	checkExchange(t, "parent", res, parent)
	require.NotNil(t, got.Exchange)
	assert.Empty(t, got.Exchange.Errors, "the child's exchange failed")
	assert.Positive(t, got.Exchange.Fetches, "the child fetched nothing")
	require.NotNil(t, got.Stats)
	assert.Zero(t, got.Stats.PeersLost, "the child saw a live peer as gone")
	t.Logf("child: %d rounds, %d of them fetched", got.Exchange.Iterations, got.Exchange.Fetches)
}

func TestTwoWayExchangeInOneProcess(t *testing.T) {
	d := twoWaySeconds()
	startHogs(t)
	frequentGC(t)
	a := parentRuntime(t, runtimeConfig{Name: "a"})
	b := parentRuntime(t, runtimeConfig{Name: "b"})
	aRefs, releaseA, err := putObjects(a, 300)
	require.NoError(t, err)
	defer releaseA()
	bRefs, releaseB, err := putObjects(b, 400)
	require.NoError(t, err)
	defer releaseB()
	var resA, resB exchangeResult
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); resA = exchange(a, bRefs, 400, d, "a") }()
	go func() { defer wg.Done(); resB = exchange(b, aRefs, 300, d, "b") }()
	wg.Wait()
	checkExchange(t, "a", resA, a)
	checkExchange(t, "b", resB, b)
}

func encAll(bs [][]byte) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = enc(b)
	}
	return out
}
