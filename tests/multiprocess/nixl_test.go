package multiprocess

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/nixl"
)

func requireNIXL(t *testing.T) {
	t.Helper()
	if err := nixl.Load(); err != nil {
		t.Skipf("NIXL is not available (set %s to the libnixl_capi.so of the nixl wheel): %v", nixl.LibraryEnv, err)
	}
}

func TestNIXLBetweenTwoProcesses(t *testing.T) {
	requireNIXL(t)
	parent := parentRuntime(t, runtimeConfig{Name: "receiver"})
	src := startChild(t, runtimeConfig{Name: "source"})
	for i, sizes := range [][]int{{1}, {4096, 0, 3<<20 + 5}, {32 << 20}} {
		before := used(parent)
		b := src.put("nixl", i+1, sizes...)
		fetchAndCheck(t, parent, b, i+1, "")
		fetchAndCheck(t, parent, b, i+1, "") // the source agent is cached now
		assert.Equal(t, before["nixl"]+2, used(parent)["nixl"])
	}
	src.call(request{Op: "release_all"})
	waitFreed(t, src, 3)

	// An object put for another transport, fetched over nixl: the owner
	// registers it on demand.
	before := used(parent)
	b := src.put("cma", 9, 1<<20)
	fetchAndCheck(t, parent, b, 9, "nixl")
	assert.Equal(t, before["nixl"]+1, used(parent)["nixl"])
	src.call(request{Op: "release_all"})
	waitFreed(t, src, 4)

	// Addresses freed and put again get fresh registrations.
	for seed := 20; seed < 23; seed++ {
		b := src.put("nixl", seed, 1<<20)
		fetchAndCheck(t, parent, b, seed, "")
		src.call(request{Op: "release_all"})
	}
}

func TestNIXLTimeoutThenAbort(t *testing.T) {
	requireNIXL(t)
	parent := parentRuntime(t, runtimeConfig{Name: "receiver"})
	src := startChild(t, runtimeConfig{Name: "source"})
	o := borrow(t, parent, src.put("nixl", 4, 256<<20))
	defer o.close()

	// A deadline that passes leaves the fetch valid: wait again to finish.
	f := o.start(t, engine.FetchOptions{})
	if err := f.Wait(time.Microsecond); err != nil {
		assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
	}
	require.NoError(t, f.Wait(30*time.Second))
	f.Free()
	require.NoError(t, checkPattern(o.bufs, 4))

	// An abort ends the wait at once; Free returns once NIXL is done with
	// the targets.
	f = o.start(t, engine.FetchOptions{})
	f.Abort()
	start := time.Now()
	err := f.Wait(30 * time.Second)
	if err != nil {
		assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "%v", err)
	}
	f.Free()
	t.Logf("abort: wait and free returned after %v (err %v)", time.Since(start).Round(time.Microsecond), err)
}

func TestNIXLSourceKilledDuringFetch(t *testing.T) {
	requireNIXL(t)
	const big = 512 << 20
	parent := parentRuntime(t, runtimeConfig{Name: "receiver"})
	doomed := startChild(t, runtimeConfig{Name: "doomed"})
	healthy := startChild(t, runtimeConfig{Name: "healthy"})
	bigObj := borrow(t, parent, doomed.put("nixl", 5, big))
	defer bigObj.close()
	okObj := borrow(t, parent, healthy.put("nixl", 6, 8<<20))
	defer okObj.close()

	f := bigObj.start(t, engine.FetchOptions{})
	err, elapsed := killDuring(t, f, doomed, 2*time.Millisecond, "the 512 MiB nixl fetch")
	assert.Contains(t, []transport.Status{transport.ErrPeerUnavailable, transport.ErrTransport}, transport.StatusOf(err), "%v", err)
	t.Logf("nixl: source killed mid-transfer, fetch failed after %v: %v", elapsed.Round(time.Millisecond), err)

	// The receiver's agent still works with other sources.
	require.NoError(t, okObj.get(engine.FetchOptions{}, 30*time.Second))
	require.NoError(t, checkPattern(okObj.bufs, 6))
}
