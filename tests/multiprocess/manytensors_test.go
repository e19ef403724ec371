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
			o := borrow(t, parent, owner.put(name, 41, uneven(2000, 4096)...))
			defer o.close()
			for round := 0; round < 2; round++ {
				for _, b := range o.bufs {
					clear(b)
				}
				require.NoError(t, o.get(engine.FetchOptions{Transport: name}, 30*time.Second))
				require.NoError(t, checkPattern(o.bufs, 41), "round %d", round)
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
	o := borrow(t, parent, owner.put("tcp", 42, uneven(1500, 4096)...))
	defer o.close()
	opts := engine.FetchOptions{Transport: "tcp"}
	require.NoError(t, o.get(opts, 30*time.Second)) // connections pooled
	owner.stop(t)
	err, took := timed(func() error { return o.get(opts, deadline) })
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
	assert.Less(t, took, deadline+margin, "get returned %v after its deadline", took-deadline)

	f := o.start(t, opts)
	time.Sleep(20 * time.Millisecond)
	err, took = timed(func() error { f.Abort(); return f.Wait(margin) })
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "%v", err)
	assert.Less(t, took, margin)
	f.Free()

	owner.resume()
	require.NoError(t, o.get(opts, 30*time.Second))
	require.NoError(t, checkPattern(o.bufs, 42))
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
			o := borrow(t, parent, doomed.put(name, 43, sizes...))
			defer o.close()
			f := o.start(t, engine.FetchOptions{Transport: name})
			err, _ := killDuring(t, f, doomed, 2*time.Millisecond, "the 256 MiB "+name+" get")
			assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
		})
	}
}
