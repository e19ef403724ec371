package multiprocess

import (
	"bufio"
	"encoding/binary"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

func used(rt *engine.Runtime) map[string]uint64 {
	out := map[string]uint64{}
	for _, ti := range rt.Registry().List() {
		out[ti.Name] = ti.TransfersCompleted
	}
	return out
}

// fetchAndCheck deserializes b in rt, fetches it and checks the pattern.
func fetchAndCheck(t *testing.T, rt *engine.Runtime, b []byte, seed int, override string) {
	t.Helper()
	o := borrow(t, rt, b)
	defer o.close()
	require.NoError(t, o.get(engine.FetchOptions{Transport: override}, 30*time.Second))
	require.NoError(t, checkPattern(o.bufs, seed))
}

func waitFreed(t *testing.T, c *child, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return c.call(request{Op: "stats"}).Freed >= n }, 10*time.Second, 5*time.Millisecond,
		"the source process frees the object")
}

func TestEachTransportBetweenTwoProcesses(t *testing.T) {
	parent := parentRuntime(t, runtimeConfig{Name: "receiver"})
	src := startChild(t, runtimeConfig{Name: "source"})
	cases := []struct{ put, want string }{
		{"cma", "cma"}, {"shm", "shm"}, {"tcp", "tcp"}, {"stream2", "stream2"}, {"", "cma"},
	}
	for i, tc := range cases {
		name := tc.put
		if name == "" {
			name = "auto"
		}
		t.Run(name, func(t *testing.T) {
			before := used(parent)
			b := src.put(tc.put, i+1, 4096, 3<<20+5, 1, 0)
			fetchAndCheck(t, parent, b, i+1, "")
			assert.Equal(t, before[tc.want]+1, used(parent)[tc.want], "fetched over %s", tc.want)
			src.call(request{Op: "release_all"})
			waitFreed(t, src, i+1)
		})
	}
	// A fetch may override the transport the object was put with.
	before := used(parent)
	b := src.put("cma", 42, 1<<20)
	fetchAndCheck(t, parent, b, 42, "tcp")
	assert.Equal(t, before["tcp"]+1, used(parent)["tcp"])
	src.call(request{Op: "release_all"})
}

func TestThreeProcessesPassARefAlong(t *testing.T) {
	parent := parentRuntime(t, runtimeConfig{Name: "third"})
	owner := startChild(t, runtimeConfig{Name: "owner"})
	middle := startChild(t, runtimeConfig{Name: "middle"})
	for i, transportName := range []string{"cma", "shm", "tcp", "stream2"} {
		seed := 10 + i
		b := owner.put(transportName, seed, 64<<10, 123)
		owner.call(request{Op: "release_all"})
		// The middle process borrows, re-serializes and lets go of its copy.
		r := middle.call(request{Op: "reserialize", Refs: []string{enc(b)}})
		require.Empty(t, r.Error)
		r2 := middle.call(request{Op: "get", Refs: []string{enc(b)}, Seed: seed})
		assert.Empty(t, r2.Error, "the middle process fetches too (%s)", transportName)
		fetchAndCheck(t, parent, dec(r.Refs[0]), seed, "")
		waitFreed(t, owner, i+1)
	}
}

func TestBorrowerKilledReturnsItsBorrows(t *testing.T) {
	owner := parentRuntime(t, runtimeConfig{Name: "owner"})
	var released atomic.Int64
	buf := hostMem(4096)
	defer freeMem(buf)
	ref, err := owner.Put([]transport.Tensor{tensorOver(buf)}, "", func() { released.Add(1) })
	require.NoError(t, err)
	b, err := ref.Serialize()
	require.NoError(t, err)
	require.NoError(t, ref.Release())

	borrower := startChild(t, runtimeConfig{Name: "borrower"})
	require.Empty(t, borrower.call(request{Op: "deserialize", Refs: []string{enc(b)}}).Error)
	// The borrower does not wait for the owner to count the borrow.
	require.Eventually(t, func() bool { return owner.Stats().Borrows == 1 }, 10*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, int64(0), released.Load(), "the borrow holds the object")
	start := time.Now()
	borrower.kill()
	require.Eventually(t, func() bool { return released.Load() == 1 }, 10*time.Second, time.Millisecond)
	t.Logf("borrower killed: object freed after %v", time.Since(start).Round(time.Millisecond))
	assert.Equal(t, uint64(0), owner.Stats().Borrows)
}

// killDuring lets f run for pause, kills doomed (f's source) and waits for
// f's end, which must come within the peer timeout's bound; it returns f's
// error and how long after the kill it came. A fetch that finished before
// the kill (what names it) skips the test: nothing was caught mid-transfer.
func killDuring(t *testing.T, f *engine.Fetch, doomed *child, pause time.Duration, what string) (error, time.Duration) {
	t.Helper()
	time.Sleep(pause)
	killed := time.Now()
	doomed.kill()
	err := f.Wait(30 * time.Second)
	elapsed := time.Since(killed)
	f.Free()
	if err == nil {
		t.Skipf("%s finished within %v, before the kill: this machine is too fast to catch it mid-transfer", what, pause)
	}
	assert.Less(t, elapsed, transport.DefaultPeerTimeout+2*time.Second, "failed within the bound")
	return err, elapsed
}

func TestSourceKilledDuringLargeFetch(t *testing.T) {
	const big = 1 << 30
	for _, transportName := range []string{"tcp", "cma"} {
		t.Run(transportName, func(t *testing.T) {
			parent := parentRuntime(t, runtimeConfig{Name: "receiver"})
			doomed := startChild(t, runtimeConfig{Name: "doomed"})
			healthy := startChild(t, runtimeConfig{Name: "healthy"})
			bigObj := borrow(t, parent, doomed.put(transportName, 5, big))
			defer bigObj.close()
			okObj := borrow(t, parent, healthy.put(transportName, 6, 32<<20))
			defer okObj.close()
			// Touch the target so the transfer, not page faults, is what runs.
			for i := 0; i < len(bigObj.bufs[0]); i += 4096 {
				bigObj.bufs[0][i] = 0
			}

			f := bigObj.start(t, engine.FetchOptions{})
			other := okObj.start(t, engine.FetchOptions{})
			err, elapsed := killDuring(t, f, doomed, 5*time.Millisecond, "the 1 GiB "+transportName+" fetch")
			assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
			t.Logf("%s: source killed mid-transfer, fetch failed after %v: %v", transportName, elapsed.Round(time.Millisecond), err)
			require.NoError(t, other.Wait(30*time.Second), "the other fetch is unaffected")
			other.Free()
			require.NoError(t, checkPattern(okObj.bufs, 6))
		})
	}
}

func TestLeaseExpiryAcrossProcesses(t *testing.T) {
	src := startChild(t, runtimeConfig{Name: "source", LeaseMS: 300})
	_ = src.put("cma", 3, 4096) // the bytes go nowhere
	src.call(request{Op: "release_all"})
	r := src.call(request{Op: "stats"})
	require.Equal(t, 0, r.Freed, "the lease holds it at first")
	waitFreed(t, src, 1)
	assert.Equal(t, uint64(1), src.call(request{Op: "stats"}).Stats.LeasesExpired)
}

// tcpOnly rewrites a ref so that it names only the owner's TCP endpoint, as
// a peer on another host sees it.
func tcpOnly(t *testing.T, b []byte) []byte {
	desc, token, err := engine.DecodeRef(b)
	require.NoError(t, err)
	i := strings.Index(desc.Owner.Address, "tcp://")
	require.GreaterOrEqual(t, i, 0, "owner listens on TCP")
	desc.Owner.Address = desc.Owner.Address[i:]
	return engine.EncodeRef(desc, desc.Meta, token)
}

func TestWrongTokenIsPermissionDenied(t *testing.T) {
	src := startChild(t, runtimeConfig{Name: "source", ListenTCP: "127.0.0.1:0", Token: "right"})
	b := tcpOnly(t, src.put("tcp", 1, 4096))
	wrong := parentRuntime(t, runtimeConfig{Name: "intruder", Token: "wrong"})
	_, err := wrong.Deserialize(b)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	// The same bytes work with the right token.
	right := parentRuntime(t, runtimeConfig{Name: "friend", Token: "right"})
	fetchAndCheck(t, right, b, 1, "")
}

func TestCorruptControlMessagesLeaveTheRuntimeUp(t *testing.T) {
	src := startChild(t, runtimeConfig{Name: "source"})
	hello := src.call(request{Op: "hello"})
	path := strings.TrimPrefix(strings.Split(hello.Address, ",")[0], "unix://")
	garbage := [][]byte{
		[]byte("GET / HTTP/1.1\r\n\r\n"),
		binary.LittleEndian.AppendUint32(nil, 1<<31),
		append(binary.LittleEndian.AppendUint32(nil, 20), make([]byte, 20)...),
	}
	for _, g := range garbage {
		c, err := net.Dial("unix", path)
		require.NoError(t, err)
		c.Write(g)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = bufio.NewReader(c).ReadByte()
		assert.Error(t, err, "the connection is closed")
		c.Close()
	}
	parent := parentRuntime(t, runtimeConfig{Name: "receiver"})
	fetchAndCheck(t, parent, src.put("cma", 9, 1000), 9, "")
}

func TestThousandConcurrentSmallFetchesFromFourProcesses(t *testing.T) {
	owner := startChild(t, runtimeConfig{Name: "owner"})
	r := owner.call(request{Op: "put", Transport: "", Seed: 77, Sizes: []int{4096}, Count: 1000})
	require.Empty(t, r.Error)
	require.Len(t, r.Refs, 1000)
	fetchers := make([]*child, 4)
	for i := range fetchers {
		fetchers[i] = startChild(t, runtimeConfig{Name: "fetcher"})
	}
	errs := make(chan string, len(fetchers))
	for i, f := range fetchers {
		go func() {
			errs <- f.call(request{Op: "get", Refs: r.Refs[i*250 : (i+1)*250], Seed: 77, Parallel: true}).Error
		}()
	}
	for range fetchers {
		assert.Empty(t, <-errs)
	}
	owner.call(request{Op: "release_all"})
	waitFreed(t, owner, 1)
}

func TestOtherHostUsesTCP(t *testing.T) {
	// Two hosts on one machine: the runtimes get distinct host identities,
	// so same-host transports (cma, shm) do not apply and auto picks tcp.
	t.Log("simulating two hosts with distinct host identities")
	src := startChild(t, runtimeConfig{Name: "host-a", HostID: "simulated-host-a", ListenTCP: "127.0.0.1:0"})
	parent := parentRuntime(t, runtimeConfig{Name: "host-b", HostID: "simulated-host-b"})
	before := used(parent)
	fetchAndCheck(t, parent, tcpOnly(t, src.put("", 4, 2<<20)), 4, "")
	assert.Equal(t, before["tcp"]+1, used(parent)["tcp"])
	// Naming a same-host transport across hosts is a clear error.
	o := borrow(t, parent, tcpOnly(t, src.put("cma", 4, 64)))
	defer o.close()
	err := o.get(engine.FetchOptions{}, 10*time.Second)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "same host")
}
