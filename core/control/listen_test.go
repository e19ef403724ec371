package control

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

const sweepTestDir = "RDT_CORE_TEST_SWEEP_DIR"

// A new runtime sweeps the socket directory for sockets of runtimes that
// died. It removes those, leaves the live ones, and makes no live runtime
// log a warning (each used to log "refused a connection from @: EOF").
// The live runtime runs in another process, logging at debug level.
func TestSweepRemovesStaleSocketsWithoutWarningLiveRuntimes(t *testing.T) {
	if dir := os.Getenv(sweepTestDir); dir != "" {
		runExistingRuntime(t, dir)
		return
	}
	dir, err := os.MkdirTemp("", "rdtsweep") // short: Unix socket paths are limited
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o700))

	// A socket file whose runtime died: nothing listens on it.
	stale := filepath.Join(dir, "zz-stale.sock") // sorts after the live one
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	require.NoError(t, err)
	ln.SetUnlinkOnClose(false)
	require.NoError(t, ln.Close())

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), sweepTestDir+"="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	var live string
	for lines := bufio.NewScanner(stdout); lines.Scan(); {
		if a, ok := strings.CutPrefix(lines.Text(), "ADDRESS unix://"); ok {
			live = a
			break
		}
	}
	if live == "" {
		cmd.Process.Kill()
		cmd.Wait() // stderr is complete only now
		t.Fatalf("the existing runtime did not start; stderr:\n%s", stderr.String())
	}

	// The sweep only looks at sockets older than half a minute.
	old := time.Now().Add(-time.Minute)
	for _, p := range []string{stale, live} {
		require.NoError(t, os.Chtimes(p, old, old))
	}
	listenStub(t, "newcomer", func(c *ListenConfig) { c.SocketDir = dir })
	eventually(t, func() bool { _, err := os.Stat(stale); return os.IsNotExist(err) }, "the stale socket is removed")
	time.Sleep(300 * time.Millisecond) // time for a warning, were one coming
	_, err = os.Stat(live)
	assert.NoError(t, err, "the live runtime's socket is kept")

	// A probe that connects and closes without a word (as the sweep does
	// where it cannot tell, such as a runtime in another network namespace)
	// is noted at debug level only.
	c, err := net.Dial("unix", live)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	time.Sleep(300 * time.Millisecond)

	require.NoError(t, stdin.Close())
	require.NoError(t, cmd.Wait())
	probes := strings.Count(stderr.String(), " on the Unix socket closed before the handshake ended")
	if _, err := os.Stat("/proc/net/unix"); err == nil {
		assert.Equal(t, 1, probes, "only the test's probe connected: the sweep saw the live socket listed as listening")
	} else {
		assert.GreaterOrEqual(t, probes, 1)
	}
	assert.NotContains(t, stderr.String(), " warn: ")
	assert.NotContains(t, stderr.String(), "refused a connection")
}

// runExistingRuntime is the live runtime: it prints its address and runs
// until its stdin closes.
func runExistingRuntime(t *testing.T, dir string) {
	_, ep := listenStub(t, "existing", func(c *ListenConfig) {
		c.SocketDir, c.Log = dir, transport.NewLogger("existing", transport.LogDebug)
	})
	os.Stdout.WriteString("ADDRESS " + ep.Address() + "\n")
	bufio.NewReader(os.Stdin).ReadString('\n')
	ep.Close()
	transport.FlushStderrLogs(time.Second)
}
