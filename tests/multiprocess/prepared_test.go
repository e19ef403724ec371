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
