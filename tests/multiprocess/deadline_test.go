package multiprocess

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/rdt-project/rdt/transports/cma"
	"github.com/rdt-project/rdt/transports/nixl"
	"github.com/rdt-project/rdt/transports/shm"
	"github.com/rdt-project/rdt/transports/tcp"
)

// These tests stop an owner process with SIGSTOP: its sockets still accept
// connections and take requests, and nobody answers. Every wait of the
// receiver must still end at the caller's deadline.

const (
	deadline = time.Second
	// margin is how late a deadline may be kept on a loaded machine.
	margin = 1500 * time.Millisecond
)

// stop suspends the child until resume (or the end of the test), and
// returns once every thread of it stopped (the signal is delivered
// asynchronously).
func (c *child) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, syscall.Kill(c.pid, syscall.SIGSTOP))
	t.Cleanup(c.resume)
	require.Eventually(t, func() bool { return transporttest.AllThreadsStopped(c.pid) }, 10*time.Second, time.Millisecond,
		"process %d stops", c.pid)
}

func (c *child) resume() { syscall.Kill(c.pid, syscall.SIGCONT) }

// receiver is a parent runtime that would wait long for a silent peer on its
// own (a peer timeout far above the deadlines under test), so that only the
// caller's deadline can end a wait.
func receiver(t *testing.T, builtins ...transport.TransportFactory) *engine.Runtime {
	t.Helper()
	if builtins == nil {
		builtins = []transport.TransportFactory{cma.Factory(), shm.Factory(), tcp.Factory()}
	}
	rt, err := engine.NewRuntime(engine.Options{
		Name: "receiver", LogLevel: transport.LogOff, Network: control.Sockets{}, Builtins: builtins,
		SocketDir: sharedSocketDir(t), PeerTimeout: 30 * time.Second,
	})
	require.NoError(t, err)
	t.Cleanup(rt.Destroy)
	return rt
}

// timed runs f and returns its error and how long it took.
func timed(f func() error) (error, time.Duration) {
	start := time.Now()
	err := f()
	return err, time.Since(start)
}

func TestGetKeepsItsDeadlineWithAStoppedOwner(t *testing.T) {
	// Each case makes a phase of the fetch need the stopped owner: the
	// transport's metadata is not in the ref (put with another transport)
	// and must be asked for, or the bytes themselves are served by it.
	cases := []struct {
		name, put, override string
		noCMA               bool // the receiver lacks cma: auto falls back to shm
	}{
		{name: "cma", put: "shm", override: "cma"},
		{name: "shm", put: "cma", override: "shm"},
		{name: "tcp", put: "cma", override: "tcp"},
		{name: "tcp-transfer", put: "tcp"},
		{name: "auto", put: "", noCMA: true},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var rt *engine.Runtime
			if tc.noCMA {
				rt = receiver(t, shm.Factory(), tcp.Factory())
			} else {
				rt = receiver(t)
			}
			owner := startChild(t, runtimeConfig{Name: "owner"})
			seed := 70 + i
			o := borrow(t, rt, owner.put(tc.put, seed, 64<<10))
			defer o.close()
			opts := engine.FetchOptions{Transport: tc.override}
			owner.stop(t)

			err, took := timed(func() error { return o.get(opts, deadline) })
			assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
			assert.Less(t, took, deadline+margin, "get returned %v after its deadline", took-deadline)

			// The same with the fetch's own calls: start waits for nothing,
			// wait keeps its deadline and leaves the fetch valid, and an
			// abort ends whatever phase it is in.
			var f *engine.Fetch
			err, took = timed(func() (err error) { f, err = rt.StartFetch([]*engine.Ref{o.ref}, o.targets, opts); return })
			require.NoError(t, err)
			assert.Less(t, took, margin, "start waited for the owner")
			err, took = timed(func() error { return f.Wait(deadline) })
			assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
			assert.Less(t, took, deadline+margin)
			assert.Equal(t, transport.ErrTimeout, transport.StatusOf(f.Wait(0)), "still valid after a timeout")
			err, took = timed(func() error { f.Abort(); return f.Wait(margin) })
			assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "%v", err)
			_, took2 := timed(func() error { f.Free(); return nil })
			assert.Less(t, took+took2, margin, "abort and free end the fetch at once")
			assert.Equal(t, uint64(0), rt.Stats().FetchesActive)

			// Once the owner runs again the ref is fetched as usual.
			owner.resume()
			require.NoError(t, o.get(opts, 30*time.Second))
			require.NoError(t, checkPattern(o.bufs, seed))
		})
	}
}

func TestDeserializeKeepsItsDeadlineWithAStoppedOwner(t *testing.T) {
	owner := startChild(t, runtimeConfig{Name: "owner"})
	transports := []string{"cma", "shm", "tcp", ""}
	refs := make([][]byte, len(transports))
	for i, name := range transports {
		refs[i] = owner.put(name, 90+i, 4096)
	}
	owner.stop(t)
	// Each receiver is new: it has no connection to the owner yet, and the
	// owner's socket accepts but never answers the handshake.
	receivers := make([]*engine.Runtime, len(transports))
	for i, name := range transports {
		if name == "" {
			name = "auto"
		}
		receivers[i] = receiver(t)
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		err, took := timed(func() error { _, err := receivers[i].DeserializeContext(ctx, refs[i]); return err })
		cancel()
		assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%s: %v", name, err)
		assert.Less(t, took, deadline+margin, "%s: deserialize returned %v after its deadline", name, took-deadline)
		assert.Equal(t, uint64(0), receivers[i].Stats().Refs, "%s: nothing kept", name)
	}

	// Running again, the owner finishes the handshakes begun meanwhile, and
	// the same bytes make refs that fetch.
	owner.resume()
	for i := range transports {
		o := borrow(t, receivers[i], refs[i])
		require.NoError(t, o.get(engine.FetchOptions{}, 30*time.Second))
		require.NoError(t, checkPattern(o.bufs, 90+i))
		o.close()
	}
}

// Timeout 0 is one thing on every transport (docs/abi.md, "Timeouts"): no
// time to involve another runtime, so a get, write, prepared run or view
// of another process's object returns TIMEOUT at once and moves nothing,
// the owner running or stopped; a runtime's own object needs no other
// process and is fetched.
func TestTimeoutZeroIsTheSameOnEveryTransport(t *testing.T) {
	names := []string{"cma", "shm", "tcp"}
	if nixl.Load() == nil {
		names = append(names, "nixl")
	}
	rt := parentRuntime(t, runtimeConfig{Name: "receiver"})
	owner := startChild(t, runtimeConfig{Name: "owner"})
	target := hostMem(4096)
	defer freeMem(target)
	for _, stopped := range []bool{false, true} {
		refs := map[string]*engine.Ref{}
		exposed := map[string]*engine.Ref{}
		for _, name := range names {
			r, err := rt.Deserialize(owner.put(name, 3, 4096))
			require.NoError(t, err)
			defer r.Release()
			refs[name] = r
			if name != "nixl" { // nixl does not write
				e := owner.call(request{Op: "expose", Sizes: []int{4096}, Transport: name})
				require.Empty(t, e.Error)
				w, err := rt.Deserialize(dec(e.Refs[0]))
				require.NoError(t, err)
				defer w.Release()
				exposed[name] = w
			}
		}
		if stopped {
			owner.stop(t)
		}
		for _, name := range names {
			what := name
			if stopped {
				what += ", owner stopped"
			}
			clear(target)
			before := rt.Stats()
			tg := []transport.Tensor{tensorOver(target)}
			err := rt.Get([]*engine.Ref{refs[name]}, tg, engine.FetchOptions{Transport: name}, 0)
			assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "get, %s: %v", what, err)
			assert.Equal(t, make([]byte, len(target)), target, "get, %s: nothing moved", what)
			p, err := rt.PrepareFetch([]*engine.Ref{refs[name]}, tg, engine.FetchOptions{Transport: name})
			require.NoError(t, err)
			err = p.Run(0, 0)
			p.Close()
			assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "prepared run, %s: %v", what, err)
			_, err = rt.View(refs[name], engine.ViewOptions{}, 0)
			assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "view, %s: %v", what, err)
			if w := exposed[name]; w != nil {
				err = rt.Write([]*engine.Ref{w}, tg, engine.WriteOptions{Transport: name, Tag: 1}, 0)
				assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "write, %s: %v", what, err)
			}
			after := rt.Stats()
			assert.Equal(t, before.TransfersCompleted+before.TransfersFailed, after.TransfersCompleted+after.TransfersFailed, "%s: no transfer started", what)
			assert.Equal(t, before.WritesCompleted+before.WritesFailed, after.WritesCompleted+after.WritesFailed, "%s: no write started", what)
			assert.Zero(t, after.FetchesActive)
		}
		if stopped {
			owner.resume()
		}
	}
	// With time, the objects move over each; an own object needs none.
	for _, name := range names {
		fetchAndCheck(t, rt, owner.put(name, 3, 4096), 3, name)
	}
	own := hostMem(4096)
	defer freeMem(own)
	own[7] = 42
	mine, err := rt.Put([]transport.Tensor{tensorOver(own)}, "", nil)
	require.NoError(t, err)
	defer mine.Release()
	clear(target)
	require.NoError(t, rt.Get([]*engine.Ref{mine}, []transport.Tensor{tensorOver(target)}, engine.FetchOptions{}, 0))
	assert.Equal(t, byte(42), target[7])
}
