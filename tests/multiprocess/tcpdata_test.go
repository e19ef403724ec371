package multiprocess

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

// readChars is how many bytes process pid has read with read(2) and the
// like (rchar in /proc/<pid>/io): a receiver's progress through a tcp get.
func readChars(t *testing.T, pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, err := strconv.ParseUint(v, 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatalf("no rchar in /proc/%d/io", pid)
	return 0
}

// A receiver stopped (SIGSTOP) in the middle of a large tcp get no longer
// pins the object: once the owner has let go of it, the object is freed
// within the peer timeout and a margin, while the receiver is still
// stopped.
func TestStoppedReceiverDoesNotPinATCPObject(t *testing.T) {
	const size = 512 << 20
	const peerTimeout = 2 * time.Second
	owner, err := engine.NewRuntime(engine.Options{
		Name: "owner", LogLevel: transport.LogOff, Network: control.Sockets{}, Builtins: builtins(),
		SocketDir: sharedSocketDir(t), PeerTimeout: peerTimeout,
	})
	require.NoError(t, err)
	t.Cleanup(owner.Destroy)
	buf := hostMem(size)
	defer freeMem(buf)
	for i := range buf {
		buf[i] = patternByte(7, 0, i)
	}
	var released atomic.Bool
	ref, err := owner.Put([]transport.Tensor{tensorOver(buf)}, "tcp", func() { released.Store(true) })
	require.NoError(t, err)
	b, err := ref.Serialize()
	require.NoError(t, err)

	receiver := startChild(t, runtimeConfig{Name: "receiver"})
	defer receiver.kill()
	before := readChars(t, receiver.pid)
	// Ask for the get without waiting for its answer: the receiver is
	// stopped before it can give one.
	line, _ := json.Marshal(request{Op: "get", Refs: []string{enc(b)}, Seed: 7})
	_, err = receiver.in.Write(append(line, '\n'))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return readChars(t, receiver.pid)-before >= 32<<20 }, 30*time.Second, 200*time.Microsecond,
		"the receiver starts reading")
	require.NoError(t, syscall.Kill(receiver.pid, syscall.SIGSTOP))
	stopped := time.Now()
	time.Sleep(20 * time.Millisecond) // let the stop take effect
	got := readChars(t, receiver.pid) - before
	if got >= size {
		t.Skipf("the receiver read all %d MiB before it was stopped: this machine is too fast to catch it mid-get", size>>20)
	}
	t.Logf("receiver stopped after reading %d of %d MiB", got>>20, size>>20)
	require.Eventually(t, func() bool { return owner.Stats().Borrows == 1 }, 10*time.Second, time.Millisecond,
		"the receiver borrows the object")

	require.NoError(t, ref.Release())
	require.Eventually(t, released.Load, peerTimeout+3*time.Second, 5*time.Millisecond,
		"the object is freed while the receiver is stopped")
	t.Logf("object freed %v after the receiver stopped", time.Since(stopped).Round(time.Millisecond))
	assert.Equal(t, uint64(0), owner.Stats().Objects)
}

// listeningTCP counts this process's TCP sockets in the LISTEN state: its
// socket descriptors matched against /proc/net/tcp{,6}.
func listeningTCP(t *testing.T) int {
	listening := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue
		}
		require.NoError(t, err)
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fields := strings.Fields(line)
			if len(fields) > 9 && fields[3] == "0A" { // TCP_LISTEN
				listening[fields[9]] = true
			}
		}
	}
	n := 0
	for _, inode := range socketInodes(t) {
		if listening[inode] {
			n++
		}
	}
	return n
}

// socketInodes lists the inodes of this process's socket descriptors.
func socketInodes(t *testing.T) []string {
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	var out []string
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if inode, ok := strings.CutPrefix(target, "socket:["); ok {
			out = append(out, strings.TrimSuffix(inode, "]"))
		}
	}
	return out
}

// A runtime whose objects are put without a transport and fetched over cma
// or shm opens no TCP port; one put naming tcp does.
func TestAutoPutsFetchedOnThisHostOpenNoTCPPort(t *testing.T) {
	owner := parentRuntime(t, runtimeConfig{Name: "owner"})
	baseline := listeningTCP(t) // zero, unless something else in this process listens
	receiver := startChild(t, runtimeConfig{Name: "receiver"})
	var refs []string
	for i := 0; i < 3; i++ {
		buf := hostMem(64 << 10)
		defer freeMem(buf)
		for j := range buf {
			buf[j] = patternByte(20+i, 0, j)
		}
		ref, err := owner.Put([]transport.Tensor{tensorOver(buf)}, "", nil)
		require.NoError(t, err)
		defer ref.Release()
		b, err := ref.Serialize()
		require.NoError(t, err)
		r := receiver.call(request{Op: "get", Refs: []string{enc(b)}, Seed: 20 + i})
		require.Empty(t, r.Error)
		refs = append(refs, enc(b))
	}
	r := receiver.call(request{Op: "get", Refs: refs[:1], Seed: 20, Override: "shm"})
	require.Empty(t, r.Error)
	assert.Equal(t, uint64(3), r.Used["cma"], "auto chose cma")
	assert.Equal(t, uint64(1), r.Used["shm"])
	assert.Equal(t, baseline, listeningTCP(t), "no TCP listener was opened")

	// The check sees a listener when there is one.
	buf := hostMem(4096)
	defer freeMem(buf)
	ref, err := owner.Put([]transport.Tensor{tensorOver(buf)}, "tcp", nil)
	require.NoError(t, err)
	defer ref.Release()
	assert.Equal(t, baseline+1, listeningTCP(t), "a put naming tcp starts the data listener")
}

// A receiver fed by short-lived sources over tcp keeps no socket of theirs
// once they exited: pooled data connections go with the peer.
func TestSocketsBackToBaselineAfterShortLivedTCPSources(t *testing.T) {
	receiver := parentRuntime(t, runtimeConfig{Name: "receiver"})
	baseline := len(socketInodes(t))
	for i := 0; i < 10; i++ {
		src := startChild(t, runtimeConfig{Name: fmt.Sprintf("source-%d", i)})
		// A small tensor and a large one: a pooled stream and parallel ones.
		fetchAndCheck(t, receiver, src.put("tcp", 30+i, 4096, 9<<20), 30+i, "")
		if i == 0 {
			assert.Greater(t, len(socketInodes(t)), baseline+2, "pooled data connections and a control connection are open")
		}
		require.Empty(t, src.call(request{Op: "exit"}).Error)
		select {
		case <-src.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("source %d did not exit", i)
		}
	}
	require.Eventually(t, func() bool { return len(socketInodes(t)) <= baseline }, 10*time.Second, 10*time.Millisecond,
		"sockets back to the baseline of %d", baseline)
}
