package transporttest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// StartChild starts the test binary again as a process that runs no test:
// the package's TestMain tells from env, added to this process's
// environment, what it is to do. Its stderr is this process's; it returns
// the command and the child's stdin and stdout. The caller waits for it.
func StartChild(t testing.TB, env ...string) (*exec.Cmd, io.WriteCloser, io.ReadCloser) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, in, out
}

// ResidentBytes is the resident memory (VmRSS) of process pid.
func ResidentBytes(t testing.TB, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// SettledResidentBytes is this process's resident memory after the Go
// runtime gave its free memory back to the kernel.
func SettledResidentBytes(t testing.TB) int64 {
	runtime.GC()
	debug.FreeOSMemory()
	return ResidentBytes(t, os.Getpid())
}

// LogBuffer collects log lines written from any goroutine.
type LogBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// NeedDescriptors raises this process's descriptor limit (RLIMIT_NOFILE)
// to at least n, up to the hard limit, and skips the test where the hard
// limit is lower.
func NeedDescriptors(t testing.TB, n uint64) {
	t.Helper()
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur >= n {
		return
	}
	if rl.Max < n {
		t.Skipf("needs %d descriptors; the hard limit (RLIMIT_NOFILE) is %d", n, rl.Max)
	}
	rl.Cur = n
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
}

// Stalled opens n TCP connections to addr that never say a word, for the
// test's life, as a flood of half-open handshakes does, with descriptors
// to spare for both their ends.
func Stalled(t testing.TB, addr string, n int) []net.Conn {
	t.Helper()
	NeedDescriptors(t, uint64(2*n+1024))
	conns := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for range n {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatalf("connection %d of %d: %v", len(conns)+1, n, err)
		}
		conns = append(conns, c)
	}
	return conns
}

// ClosedWithin reports whether the other end closes c within d; what it
// sends meanwhile (a handshake's greeting) is read and dropped.
func ClosedWithin(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}
