package engine

import (
	"bufio"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// Hostile peers are real processes: the test binary run again with
// RDT_HOSTILE_MODE set, which makes TestHostilePeerChild act as one and
// report on stdout, one "KEY value..." line per fact.

const hostileModeEnv = "RDT_HOSTILE_MODE"

// hostile is a running hostile child.
type hostile struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

// startHostile runs the child in mode with extra environment; prefix runs
// it under another program (setpriv), with bin the binary to run.
func startHostile(t *testing.T, mode string, env map[string]string, prefix ...string) *hostile {
	t.Helper()
	bin := os.Args[0]
	if len(prefix) > 0 {
		bin, prefix = prefix[len(prefix)-1], prefix[:len(prefix)-1]
	}
	args := append(append([]string{}, prefix...), bin, "-test.run=^TestHostilePeerChild$", "-test.count=1")
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), hostileModeEnv+"="+mode)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	h := &hostile{cmd: cmd, stdin: stdin, lines: make(chan string, 64)}
	go func() {
		defer close(h.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
	}()
	t.Cleanup(h.stop)
	return h
}

// expectLine waits for the child's next line starting with key and returns
// its fields after the key.
func (h *hostile) expectLine(t *testing.T, key string, timeout time.Duration) []string {
	t.Helper()
	deadline := time.After(timeout)
	var seen []string // what it printed instead, for the failure message
	for {
		select {
		case line, ok := <-h.lines:
			require.True(t, ok, "the child exited before reporting %s; it printed:\n%s", key, strings.Join(seen, "\n"))
			seen = append(seen, line)
			if f := strings.Fields(line); len(f) > 0 && f[0] == key {
				return f[1:]
			}
		case <-deadline:
			t.Fatalf("the child did not report %s within %v", key, timeout)
		}
	}
}

// stop ends the child: closing stdin tells it to drop its connections and
// exit; a child that does not is killed.
func (h *hostile) stop() {
	h.stdin.Close()
	done := make(chan struct{})
	go func() { h.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		h.cmd.Process.Kill()
		<-done
	}
}

func atoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}

// endpoints are the Unix socket path and TCP host:port of a runtime's
// address, and the key its TCP part carries.
func endpoints(t *testing.T, rt *Runtime) (unixPath, tcpHostPort, key string) {
	for _, part := range strings.Split(rt.Address(), ",") {
		switch {
		case strings.HasPrefix(part, control.UnixScheme):
			unixPath = strings.TrimPrefix(part, control.UnixScheme)
		case strings.HasPrefix(part, control.TCPScheme):
			key, tcpHostPort = transport.SplitTCPKey(strings.TrimPrefix(part, control.TCPScheme))
		}
	}
	require.NotEmpty(t, unixPath)
	return
}

const memoryBound = 64 << 20

func TestPreAuthFloodKeepsMemoryBounded(t *testing.T) {
	rt := socketRuntime(t, "victim", func(o *Options) { o.ListenTCP = "127.0.0.1:0" })
	unixPath, tcpAddr, _ := endpoints(t, rt)
	before := transporttest.SettledResidentBytes(t)

	// 100 connections on each listener announce a 17 MiB hello and send
	// 1 MiB of it: the runtime must neither allocate nor read it.
	flood := startHostile(t, "preauth", map[string]string{
		"RDT_HOSTILE_UNIX": unixPath, "RDT_HOSTILE_TCP": tcpAddr, "RDT_HOSTILE_N": "100",
		"RDT_HOSTILE_LEN": strconv.Itoa(control.MaxFrame), "RDT_HOSTILE_BODY": strconv.Itoa(1 << 20),
	})
	sent := flood.expectLine(t, "SENT", 60*time.Second)
	grown := transporttest.ResidentBytes(t, os.Getpid()) - before
	t.Logf("%s connections sent their prefix; RSS grew by %d KiB", sent[0], grown>>10)
	assert.Less(t, grown, int64(memoryBound), "RSS growth under 200 pre-auth connections announcing 17 MiB")
	flood.stop()

	// Connections that send nothing: each costs the runtime a goroutine
	// until its handshake deadline, and none is closed at once (100 stay
	// under the cap of one address).
	goroutines := runtime.NumGoroutine()
	idle := startHostile(t, "idle", map[string]string{
		"RDT_HOSTILE_UNIX": unixPath, "RDT_HOSTILE_TCP": tcpAddr, "RDT_HOSTILE_N": "100",
	})
	for _, listener := range []string{"unix", "tcp"} {
		f := idle.expectLine(t, "IDLE_"+listener, 60*time.Second)
		closed, open := atoi(t, f[0]), atoi(t, f[1])
		t.Logf("%s: %d closed at once, %d left waiting", listener, closed, open)
		assert.Zero(t, closed, "%s: idle connections under the cap wait for their deadline", listener)
	}
	held := runtime.NumGoroutine() - goroutines
	t.Logf("goroutines while 200 idle connections wait: +%d", held)
	assert.LessOrEqual(t, held, 200+16, "a goroutine per handshake, both listeners")
	assert.Less(t, transporttest.ResidentBytes(t, os.Getpid())-before, int64(memoryBound))

	// An honest peer arriving meanwhile is not made to wait.
	var released atomic.Int64
	ref, _ := putOne(t, rt, "", &released)
	defer ref.Release()
	b, err := ref.Serialize()
	require.NoError(t, err)
	waiting := socketRuntime(t, "waiting")
	r, err := waiting.Deserialize(b)
	require.NoError(t, err, "a peer connects while idle connections hold their handshakes")
	r.Release()
	idle.stop()

	// Once the flood is gone, real peers get in on both listeners.
	peer := socketRuntime(t, "peer")
	require.Eventually(t, func() bool {
		r, err := peer.Deserialize(b)
		if err == nil {
			r.Release()
		}
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "a real peer connects over the Unix socket after the flood")
	desc, token, err := DecodeRef(b)
	require.NoError(t, err)
	desc.Owner.Address = rt.Address()[strings.Index(rt.Address(), control.TCPScheme):]
	remote := socketRuntime(t, "remote")
	require.Eventually(t, func() bool {
		r, err := remote.Deserialize(EncodeRef(desc, desc.Meta, token))
		if err == nil {
			r.Release()
		}
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "a real peer connects over TCP after the flood")
}

func TestPingFloodKeepsGoroutinesBounded(t *testing.T) {
	rt := socketRuntime(t, "victim", func(o *Options) { o.PeerTimeout = 60 * time.Second })
	unixPath, _, _ := endpoints(t, rt)
	runtime.GC()
	baseGoroutines := runtime.NumGoroutine()
	before := transporttest.SettledResidentBytes(t)

	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peak.Store(max(peak.Load(), int64(runtime.NumGoroutine())))
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	// 200k pings, then 20k metadata requests, never reading an answer.
	flood := startHostile(t, "flood", map[string]string{"RDT_HOSTILE_UNIX": unixPath, "RDT_HOSTILE_PINGS": "200000", "RDT_HOSTILE_REQUESTS": "20000"})
	pings := flood.expectLine(t, "PINGS", 60*time.Second)
	requests := flood.expectLine(t, "REQUESTS", 60*time.Second)
	time.Sleep(200 * time.Millisecond) // let the runtime catch up with what arrived
	close(stop)
	<-sampled
	grown := transporttest.ResidentBytes(t, os.Getpid()) - before
	t.Logf("sent %s pings and %s requests; goroutines %d -> peak %d; RSS grew by %d KiB", pings[0], requests[0], baseGoroutines, peak.Load(), grown>>10)
	assert.Equal(t, "200000", pings[0], "every ping was read")
	assert.Less(t, peak.Load()-int64(baseGoroutines), int64(control.MaxHandlers+64), "goroutines under a ping and request flood")
	assert.Less(t, grown, int64(memoryBound))
	flood.stop()
	require.Eventually(t, func() bool { return rt.Stats().Peers == 0 }, 10*time.Second, 10*time.Millisecond, "the flooder is dropped")
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= baseGoroutines+2 }, 10*time.Second, 10*time.Millisecond,
		"goroutines back to %d (now %d)", baseGoroutines, runtime.NumGoroutine())
}

// leaseFlood has a hostile child ask rt, as each of ids identities in turn,
// for n leases of obj, and returns it and what it reports: the leases
// granted, refused (RDT_ERR_NO_MEMORY) and answered otherwise, and the last
// refusal's text.
func leaseFlood(t *testing.T, rt *Runtime, obj transport.ObjectID, ids, n int) (flood *hostile, granted, refused, other int, why string) {
	unixPath, _, _ := endpoints(t, rt)
	flood = startHostile(t, "leases", map[string]string{"RDT_HOSTILE_UNIX": unixPath, "RDT_HOSTILE_IDS": strconv.Itoa(ids),
		"RDT_HOSTILE_OBJECT": obj.String(), "RDT_HOSTILE_N": strconv.Itoa(n)})
	f := flood.expectLine(t, "LEASES", 120*time.Second)
	return flood, atoi(t, f[0]), atoi(t, f[1]), atoi(t, f[2]), strings.Join(f[3:], " ")
}

// consumeLeases has the child deserialize what it holds (borrow with each
// token, then return the borrows), and waits until the borrows are back.
func consumeLeases(t *testing.T, rt *Runtime, flood *hostile) {
	_, err := io.WriteString(flood.stdin, "consume\n")
	require.NoError(t, err)
	flood.expectLine(t, "CONSUMED", 60*time.Second)
	eventually(t, func() bool { return rt.Stats().Borrows == 0 }, "the borrows are returned")
}

func TestLeaseFloodIsRefusedPastTheCap(t *testing.T) {
	rt := socketRuntime(t, "owner")
	var released atomic.Int64
	ref, _ := putOne(t, rt, "", &released)
	defer ref.Release()
	before := transporttest.SettledResidentBytes(t)

	const asks = 5 * MaxLeasesPerPeer
	flood, granted, refused, other, why := leaseFlood(t, rt, ref.Desc().ID, 1, asks)
	assert.Equal(t, MaxLeasesPerPeer, granted, "leases granted to one peer")
	assert.Equal(t, asks-MaxLeasesPerPeer, refused, "refused with RDT_ERR_NO_MEMORY")
	assert.Zero(t, other, "no other answers")
	assert.Contains(t, why, "the limit", "the refusal says why")
	assert.Equal(t, uint64(MaxLeasesPerPeer), rt.Stats().RefsInTransit)
	assert.Less(t, transporttest.ResidentBytes(t, os.Getpid())-before, int64(memoryBound))

	// The peer deserializes what it holds: its count goes with its leases.
	consumeLeases(t, rt, flood)
	assert.Zero(t, rt.Stats().RefsInTransit)
	rt.store.mu.Lock()
	assert.Empty(t, rt.store.peerLeases, "nothing kept for the peer once its leases are gone")
	rt.store.mu.Unlock()
}

// Identities cost a handshake each, so the leases of all peers together
// are capped too: five identities asking for the per-peer cap each get
// MaxPeerLeases in all, and the rest are refused with why. (Twelve
// identities held 49,152 leases before.)
func TestLeasesOfAllPeersAreCapped(t *testing.T) {
	rt := socketRuntime(t, "owner")
	var released atomic.Int64
	ref, _ := putOne(t, rt, "", &released)
	defer ref.Release()

	const ids = MaxPeerLeases/MaxLeasesPerPeer + 1
	flood, granted, refused, other, why := leaseFlood(t, rt, ref.Desc().ID, ids, MaxLeasesPerPeer)
	assert.Equal(t, MaxPeerLeases, granted, "leases granted to all peers")
	assert.Equal(t, ids*MaxLeasesPerPeer-MaxPeerLeases, refused, "refused with RDT_ERR_NO_MEMORY")
	assert.Zero(t, other, "no other answers")
	assert.Contains(t, why, "its peers together already hold", "the refusal says why")
	assert.Equal(t, uint64(MaxPeerLeases), rt.Stats().RefsInTransit)
	_, err := rt.svc.Lease(transport.RandomID(), ref.Desc().ID)
	assert.Equal(t, transport.ErrNoMemory, transport.StatusOf(err), "a peer with none is refused too: %v", err)
	_, err = ref.Serialize()
	assert.NoError(t, err, "the owner's own serializations are not leases on behalf of peers")

	consumeLeases(t, rt, flood)
	assert.Equal(t, uint64(1), rt.Stats().RefsInTransit, "the owner's own")
	rt.store.mu.Lock()
	assert.Zero(t, rt.store.peerLeasesHeld, "the total goes with the leases")
	rt.store.mu.Unlock()
	_, err = rt.svc.Lease(transport.RandomID(), ref.Desc().ID)
	assert.NoError(t, err, "room again")
}

func TestPeerLeasesExpireFromTheCount(t *testing.T) {
	rt := newRuntime(t, "owner", func(o *Options) { o.Lease = 200 * time.Millisecond })
	var released atomic.Int64
	ref, _ := putOne(t, rt, "", &released)
	defer ref.Release()
	greedy, modest := transport.RandomID(), transport.RandomID()
	for i := 0; i < MaxLeasesPerPeer; i++ {
		_, err := rt.svc.Lease(greedy, ref.Desc().ID)
		require.NoError(t, err)
	}
	_, err := rt.svc.Lease(greedy, ref.Desc().ID)
	assert.Equal(t, transport.ErrNoMemory, transport.StatusOf(err), "%v", err)
	_, err = rt.svc.Lease(modest, ref.Desc().ID)
	assert.NoError(t, err, "the cap is per peer")
	eventually(t, func() bool { return rt.Stats().RefsInTransit == 0 }, "the leases expire")
	rt.store.mu.Lock()
	assert.Empty(t, rt.store.peerLeases)
	rt.store.mu.Unlock()
	_, err = rt.svc.Lease(greedy, ref.Desc().ID)
	assert.NoError(t, err, "expired leases no longer count")
}

func TestTokenlessTCPRequiresTheAddressKey(t *testing.T) {
	var ownerLog transporttest.LogBuffer
	owner := socketRuntime(t, "owner", func(o *Options) {
		o.ListenTCP, o.LogLevel, o.LogOutput = "127.0.0.1:0", transport.LogDebug, &ownerLog
	})
	_, tcpAddr, key := endpoints(t, owner)
	require.Equal(t, owner.host.RuntimeSecret(), key, "the TCP part of the address carries the runtime secret")
	src, dst := newMemTransport("mem"), newMemTransport("mem")
	require.NoError(t, owner.RegisterTransport(src))
	var released atomic.Int64
	ref, buf := putOne(t, owner, "mem", &released)
	defer ref.Release()
	b, err := ref.Serialize()
	require.NoError(t, err)
	desc, token, err := DecodeRef(b)
	require.NoError(t, err)
	withKey := control.TCPScheme + key + "@" + tcpAddr

	// Without the key (what any local user can learn: the port) it is refused.
	desc.Owner.Address = control.TCPScheme + tcpAddr
	stranger := socketRuntime(t, "stranger")
	_, err = stranger.Deserialize(EncodeRef(desc, desc.Meta, token))
	require.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	c, err := net.Dial("tcp", tcpAddr)
	require.NoError(t, err)
	_, err = rawHandshake(c, newRawPeer(), "")
	c.Close()
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "the empty token is refused: %v", err)

	// With the address from the ref it works.
	desc.Owner.Address = withKey
	friend := socketRuntime(t, "friend")
	require.NoError(t, friend.RegisterTransport(dst))
	r, err := friend.Deserialize(EncodeRef(desc, desc.Meta, token))
	require.NoError(t, err)
	out := newHostBuf(t, len(buf.b))
	require.NoError(t, friend.Get([]*Ref{r}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{}, 5*time.Second))
	assert.Equal(t, buf.b, out.b)
	require.NoError(t, r.Release())
	eventually(t, func() bool { return owner.Stats().Borrows == 0 }, "the borrow came and went")

	// The secret shows in no message: not in errors quoting the address,
	// not in the peer's name, not in the log.
	desc.Owner.Address = control.TCPScheme + key + "@127.0.0.1:1"
	_, err = stranger.Deserialize(EncodeRef(desc, desc.Meta, token))
	require.Error(t, err)
	assert.NotContains(t, err.Error(), key)
	assert.Contains(t, err.Error(), "tcp://****@127.0.0.1:1")
	assert.NotContains(t, owner.Identity().String(), key)
	assert.NotContains(t, ownerLog.String(), key)
	assert.Contains(t, ownerLog.String(), "tcp://****@", "the log names the address, redacted")
}

func TestCrossUIDPeerIsRefusedOnControlTCP(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a peer as another user (uid 65534)")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("needs setpriv (util-linux) to run a peer as another user")
	}
	owner := socketRuntime(t, "owner", func(o *Options) { o.ListenTCP = "127.0.0.1:0" })
	_, tcpAddr, _ := endpoints(t, owner)
	require.NoError(t, owner.RegisterTransport(newMemTransport("mem")))
	var released atomic.Int64
	ref, _ := putOne(t, owner, "mem", &released)
	defer ref.Release()

	// The other user runs a copy of this binary it may execute.
	dir, err := os.MkdirTemp("", "rdt-crossuid-")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	require.NoError(t, os.Chmod(dir, 0o755))
	bin := filepath.Join(dir, "peer.test")
	self, err := os.ReadFile(os.Args[0])
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, self, 0o755))

	other := startHostile(t, "crossuid", map[string]string{
		"RDT_HOSTILE_TCP": tcpAddr, "RDT_HOSTILE_OBJECT": ref.Desc().ID.String(),
		"RDT_HOSTILE_OWNER": owner.ID().String(), "TMPDIR": "/tmp", "XDG_RUNTIME_DIR": "",
	}, setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups", bin)
	uid := other.expectLine(t, "UID", 30*time.Second)
	require.Equal(t, "65534", uid[0], "the peer runs as another user")
	borrow := other.expectLine(t, "BORROW", 60*time.Second)
	assert.Equal(t, transport.ErrPermissionDenied.String(), borrow[0], "borrow over the control TCP port: %s", strings.Join(borrow, " "))
	meta := other.expectLine(t, "METADATA", 60*time.Second)
	assert.Equal(t, transport.ErrPermissionDenied.String(), meta[0], "metadata over the control TCP port: %s", strings.Join(meta, " "))
	write := other.expectLine(t, "WRITE", 60*time.Second)
	assert.Equal(t, transport.ErrPermissionDenied.String(), write[0], "a write over the control TCP port: %s", strings.Join(write, " "))
	assert.Zero(t, owner.Stats().Borrows)
	assert.Zero(t, owner.Stats().Peers)
}
