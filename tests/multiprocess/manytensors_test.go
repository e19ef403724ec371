package multiprocess

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

// uneven is count tensor sizes around n bytes, no two neighbours alike.
func uneven(count, n int) []int {
	sizes := make([]int, count)
	for i := range sizes {
		sizes[i] = n + i%5*123
	}
	return sizes
}

// An object of 2,000 small tensors crosses processes whole over tcp
// (pipelined requests answered many to a write) and cma (many ranges to a
// process_vm_readv), twice (new connections, then pooled ones).
func TestManySmallTensorsAcrossProcesses(t *testing.T) {
	for _, name := range []string{"tcp", "cma"} {
		t.Run(name, func(t *testing.T) {
			parent := parentRuntime(t, runtimeConfig{Name: "receiver"})
			owner := startChild(t, runtimeConfig{Name: "owner"})
			ref, err := parent.Deserialize(owner.put(name, 41, uneven(2000, 4096)...))
			require.NoError(t, err)
			defer ref.Release()
			targets, bufs := targetsFor(ref.Desc())
			defer func() {
				for _, b := range bufs {
					freeMem(b)
				}
			}()
			for round := 0; round < 2; round++ {
				for _, b := range bufs {
					clear(b)
				}
				require.NoError(t, parent.Get([]*engine.Ref{ref}, targets, engine.FetchOptions{Transport: name}, 30*time.Second))
				require.NoError(t, checkPattern(bufs, 41), "round %d", round)
			}
		})
	}
}

// A many-tensor tcp get from a stopped owner keeps its deadline, and an
// abort of the same fetch ends it at once; once the owner runs again the
// object is fetched whole.
func TestManyTensorsKeepTheDeadlineAndAbort(t *testing.T) {
	parent := parentRuntime(t, runtimeConfig{Name: "receiver"})
	owner := startChild(t, runtimeConfig{Name: "owner"})
	ref, err := parent.Deserialize(owner.put("tcp", 42, uneven(1500, 4096)...))
	require.NoError(t, err)
	defer ref.Release()
	targets, bufs := targetsFor(ref.Desc())
	defer func() {
		for _, b := range bufs {
			freeMem(b)
		}
	}()
	opts := engine.FetchOptions{Transport: "tcp"}
	require.NoError(t, parent.Get([]*engine.Ref{ref}, targets, opts, 30*time.Second)) // connections pooled
	owner.stop(t)
	err, took := timed(func() error { return parent.Get([]*engine.Ref{ref}, targets, opts, deadline) })
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
	assert.Less(t, took, deadline+margin, "get returned %v after its deadline", took-deadline)

	f, err := parent.StartFetch([]*engine.Ref{ref}, targets, opts)
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	err, took = timed(func() error { f.Abort(); return f.Wait(margin) })
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "%v", err)
	assert.Less(t, took, margin)
	f.Free()

	owner.resume()
	require.NoError(t, parent.Get([]*engine.Ref{ref}, targets, opts, 30*time.Second))
	require.NoError(t, checkPattern(bufs, 42))
}

// The owner of 4,096 tensors of 64 KiB is killed during the get: the get
// fails with PeerUnavailable within the bound, over tcp and cma.
func TestOwnerKilledDuringAManyTensorGet(t *testing.T) {
	for _, name := range []string{"tcp", "cma"} {
		t.Run(name, func(t *testing.T) {
			parent := parentRuntime(t, runtimeConfig{Name: "receiver"})
			doomed := startChild(t, runtimeConfig{Name: "doomed"})
			sizes := make([]int, 4096)
			for i := range sizes {
				sizes[i] = 64 << 10
			}
			ref, err := parent.Deserialize(doomed.put(name, 43, sizes...))
			require.NoError(t, err)
			defer ref.Release()
			targets, bufs := targetsFor(ref.Desc())
			defer func() {
				for _, b := range bufs {
					freeMem(b)
				}
			}()
			f, err := parent.StartFetch([]*engine.Ref{ref}, targets, engine.FetchOptions{Transport: name})
			require.NoError(t, err)
			time.Sleep(2 * time.Millisecond)
			killed := time.Now()
			doomed.kill()
			err = f.Wait(30 * time.Second)
			elapsed := time.Since(killed)
			f.Free()
			if err == nil {
				t.Skipf("the 256 MiB %s get finished within 2 ms, before the kill: this machine is too fast to catch it mid-transfer", name)
			}
			assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
			assert.Less(t, elapsed, transport.DefaultPeerTimeout+2*time.Second, "failed within the bound")
		})
	}
}
