package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

func queueingRuntime(t *testing.T) *Runtime {
	return newRuntime(t, "q", func(o *Options) { o.QueueReleases = true })
}

// putQueued puts one small object whose release queues userData.
func putQueued(t *testing.T, rt *Runtime, userData uintptr) *Ref {
	t.Helper()
	ref, err := rt.Put([]transport.Tensor{tensorOf(t, newHostBuf(t, 16))}, "", rt.ReleaseToQueue(userData))
	require.NoError(t, err)
	return ref
}

// takeAll waits (boundedly) until want user data were taken, in batches of at
// most batch.
func takeAll(t *testing.T, rt *Runtime, want, batch int) [][]uintptr {
	t.Helper()
	var batches [][]uintptr
	total := 0
	deadline := time.Now().Add(10 * time.Second)
	for total < want {
		require.True(t, time.Now().Before(deadline), "took %d of %d", total, want)
		out := make([]uintptr, batch)
		n, err := rt.TakeReleased(out, time.Second)
		require.NoError(t, err)
		if n > 0 {
			batches = append(batches, out[:n])
			total += n
		}
	}
	return batches
}

func TestTakeReleasedIsOldestFirstInBatchesOfTheCallersSize(t *testing.T) {
	rt := queueingRuntime(t)
	for i := uintptr(1); i <= 5; i++ {
		ref := putQueued(t, rt, i)
		require.NoError(t, ref.Release())
		// Each free is queued before the next, so the order is known.
		require.Eventually(t, func() bool { return rt.Stats().ObjectsFreed == uint64(i) }, 10*time.Second, time.Millisecond)
	}
	require.Equal(t, [][]uintptr{{1, 2}, {3, 4}, {5}}, takeAll(t, rt, 5, 2))

	n, err := rt.TakeReleased(make([]uintptr, 4), 0)
	require.NoError(t, err)
	require.Zero(t, n, "each user data is reported once")
}

func TestTakeReleasedBoundsOneBatch(t *testing.T) {
	rt := queueingRuntime(t)
	for i := 0; i < MaxTakeReleased+3; i++ {
		rt.releases.push(uintptr(i + 1))
	}
	out := make([]uintptr, MaxTakeReleased+10)
	n, err := rt.TakeReleased(out, 0)
	require.NoError(t, err)
	require.Equal(t, MaxTakeReleased, n)
	require.Equal(t, uintptr(1), out[0])
	require.Equal(t, uintptr(MaxTakeReleased), out[n-1])

	n, err = rt.TakeReleased(out, 0)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, uintptr(MaxTakeReleased+1), out[0])
}

func TestTakeReleasedWaitsUntilItsDeadline(t *testing.T) {
	rt := queueingRuntime(t)
	start := time.Now()
	n, err := rt.TakeReleased(make([]uintptr, 1), 300*time.Millisecond)
	waited := time.Since(start)
	require.NoError(t, err, "running out of time is not an error")
	require.Zero(t, n)
	require.GreaterOrEqual(t, waited, 300*time.Millisecond)
	require.Less(t, waited, 300*time.Millisecond+1500*time.Millisecond)
}

func TestTakeReleasedWakesWhenAnObjectIsFreed(t *testing.T) {
	rt := queueingRuntime(t)
	ref := putQueued(t, rt, 42)
	type result struct {
		n   int
		got uintptr
		err error
	}
	done := make(chan result, 1)
	go func() {
		out := make([]uintptr, 8)
		n, err := rt.TakeReleased(out, -1)
		done <- result{n, out[0], err}
	}()
	select {
	case r := <-done:
		t.Fatalf("returned before anything was freed: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, ref.Release())
	select {
	case r := <-done:
		require.NoError(t, r.err)
		require.Equal(t, 1, r.n)
		require.Equal(t, uintptr(42), r.got)
	case <-time.After(10 * time.Second):
		t.Fatal("a waiting take was not woken by the free")
	}
}

func TestTakeReleasedWakesEveryWaiterThatHasAnItem(t *testing.T) {
	rt := queueingRuntime(t)
	got := make(chan uintptr, 2)
	for range 2 {
		go func() {
			out := make([]uintptr, 1)
			n, err := rt.TakeReleased(out, 10*time.Second)
			if err != nil || n != 1 {
				got <- 0
				return
			}
			got <- out[0]
		}()
	}
	time.Sleep(50 * time.Millisecond) // let both wait
	// Two pushes may leave one wake-up token: the first taker, seeing an
	// item left, must pass the wake-up on.
	rt.releases.mu.Lock()
	rt.releases.items = append(rt.releases.items, 7, 8)
	rt.releases.mu.Unlock()
	rt.releases.signal()
	a, b := <-got, <-got
	require.ElementsMatch(t, []uintptr{7, 8}, []uintptr{a, b})
}

func TestTakeReleasedEndsWithClosedWhenTheRuntimeIsDestroyed(t *testing.T) {
	rt := queueingRuntime(t)
	putQueued(t, rt, 9) // freed by destroy: not reported
	done := make(chan error, 1)
	go func() {
		_, err := rt.TakeReleased(make([]uintptr, 4), -1)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	rt.Destroy()
	select {
	case err := <-done:
		require.Equal(t, transport.ErrClosed, transport.StatusOf(err), "%v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("destroy did not wake a waiting take")
	}
	n, err := rt.TakeReleased(make([]uintptr, 4), 0)
	require.Equal(t, transport.ErrClosed, transport.StatusOf(err))
	require.Zero(t, n)
}

func TestTakeReleasedNeedsAQueueingRuntime(t *testing.T) {
	rt := newRuntime(t, "plain")
	require.False(t, rt.QueuesReleases())
	_, err := rt.TakeReleased(make([]uintptr, 1), 0)
	require.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err))
	require.Contains(t, err.Error(), "does not queue releases")
}
