package multiprocess

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

// Prepared gets between real processes: runs move the bytes again, a
// stopped owner is a timeout at the run's deadline (and the next run after
// it resumed works), and a killed owner fails the run with
// PEER_UNAVAILABLE.
func TestPreparedGetAcrossProcesses(t *testing.T) {
	for _, name := range []string{"cma", "shm", "tcp"} {
		t.Run(name, func(t *testing.T) {
			rt := receiver(t)
			src := startChild(t, runtimeConfig{Name: "owner"})
			const size = 1 << 20
			ref, err := rt.Deserialize(src.put(name, 3, size))
			require.NoError(t, err)
			dst := hostMem(size)
			defer freeMem(dst)
			p, err := rt.PrepareFetch([]*engine.Ref{ref}, []transport.Tensor{tensorOver(dst)}, engine.FetchOptions{})
			require.NoError(t, err)
			defer p.Close()
			require.NoError(t, ref.Release())
			want := make([]byte, size)
			for i := range want {
				want[i] = patternByte(3, 0, i)
			}
			for run := 0; run < 3; run++ {
				clear(dst)
				require.NoError(t, p.Run(0, 30*time.Second))
				require.True(t, bytes.Equal(want, dst), "run %d", run)
			}
			require.True(t, p.Kept())

			if name == "tcp" {
				// Only tcp needs the owner to move bytes: stopped, it is
				// silent, and the run ends at its deadline.
				src.stop(t)
				err, took := timed(func() error { return p.Run(0, 300*time.Millisecond) })
				assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
				assert.Less(t, took, 10*time.Second)
				src.resume()
				clear(dst)
				require.NoError(t, p.Run(0, 30*time.Second), "the next run after it resumed")
				require.True(t, bytes.Equal(want, dst))
			}

			src.kill()
			require.Eventually(t, func() bool {
				return transport.StatusOf(p.Run(0, 5*time.Second)) == transport.ErrPeerUnavailable
			}, 60*time.Second, 10*time.Millisecond, "a killed owner fails the run")
		})
	}
}

// A prepared writer in another process runs under one standing admission:
// every run has its notice with its tag and leaves its version whole, the
// owner holds one write open between runs, and revoking reaches the idle
// writer over its own connection, which closes the admission (no notice)
// so that the revocation returns.
func TestPreparedWriterStandingAdmissionAcrossProcesses(t *testing.T) {
	forEachWriter(t, func(t *testing.T, name string) {
		owner := parentRuntime(t, runtimeConfig{Name: "owner"})
		const size, runs = 1 << 20, 20
		exposed, buf := exposeIn(t, owner, size, name)
		startWriteLoop(t, exposed, request{Sizes: []int{size}, Seed: 7, Count: runs, Prepared: true})
		for tag := uint64(1); tag <= runs; tag++ {
			n, err := exposed.WaitWriteNotice(60 * time.Second)
			require.NoError(t, err)
			require.NoError(t, n.Err, "run %d", tag)
			require.Equal(t, tag, n.Tag, "notices come in the order of the runs")
		}
		want := make([]byte, size)
		for j := range want {
			want[j] = patternByte(7, 0, j) + byte(runs)
		}
		assert.True(t, bytes.Equal(want, buf), "the last version is whole")
		waitOpenWrites(t, owner, 1) // the standing admission, between runs

		require.NoError(t, exposed.RevokeWrites(60*time.Second), "the writer closes its admission when told")
		assert.Zero(t, owner.Stats().WritesOpen)
		_, err := exposed.WaitWriteNotice(0)
		assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "closing between runs makes no notice")
	})
}

// A prepared writer killed amid its runs: every notice before the last is
// a success in the order of the runs, the last may be a failure
// (PEER_UNAVAILABLE, with the tag of the run under way; none when it died
// between runs), and nothing stays open.
func TestPreparedWriterKilledAmidRuns(t *testing.T) {
	forEachWriter(t, func(t *testing.T, name string) {
		owner := parentRuntime(t, runtimeConfig{Name: "owner"})
		const size = 1 << 20
		exposed, _ := exposeIn(t, owner, size, name)
		w := startWriteLoop(t, exposed, request{Sizes: []int{size}, Seed: 9, Prepared: true})
		var notices []engine.WriteNotice
		for len(notices) < 3 { // past the first run, into the standing admission
			n, err := exposed.WaitWriteNotice(60 * time.Second)
			require.NoError(t, err)
			notices = append(notices, n)
		}
		w.kill()
		waitOpenWrites(t, owner, 0)
		notices = append(notices, laterNotices(t, exposed, 0)...)
		last := notices[len(notices)-1]
		for i, n := range notices {
			require.Equal(t, uint64(i+1), n.Tag, "each notice names its run, a torn one too")
			if i < len(notices)-1 {
				require.NoError(t, n.Err, "only the last notice can be a failure")
			}
		}
		if last.Err != nil {
			assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(last.Err), "%v", last.Err)
		}
	})
}
