package transporttest

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// The environment that turns the test binary into a source process.
const (
	sourceSizesEnv = "RDT_TRANSPORTTEST_SOURCE"
	sourceDirEnv   = "RDT_TRANSPORTTEST_DIR"
)

// SourceObject is the id of the object a source process puts.
var SourceObject = transport.ObjectID{0x50, 0x7e}

// patternLimit is the largest tensor a source fills: larger ones stay zero
// (the cases that use them time the transfer, not its bytes).
const patternLimit = 64 << 20

// Main is the TestMain of a transport package that runs the suite: in a
// source process started by StartSource it puts the object and serves it
// until its parent goes away; otherwise it runs the tests.
func Main(m *testing.M, conf Config) {
	if sizes, ok := os.LookupEnv(sourceSizesEnv); ok {
		os.Exit(serveSource(conf, sizes, os.Getenv(sourceDirEnv)))
	}
	os.Exit(m.Run())
}

// serveSource puts SourceObject with tensors of the given sizes, prints
// "SOURCE <runtime id> <metadata>" in hexadecimal and serves until stdin
// closes (its parent ended or let it go); a grouped transport's source
// takes its parent's requests from stdin meanwhile (serveGroup).
func serveSource(conf Config, sizes, dir string) int {
	fail := func(err error) int { fmt.Println("ERR", err); return 1 }
	mem := conf.memory()
	if conf.Ranks != nil {
		mem = conf.Ranks(1)
	}
	h := NewHostIn(dir)
	tr, err := conf.New(h)
	if err != nil {
		return fail(err)
	}
	var tensors []transport.Tensor
	for i, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return fail(fmt.Errorf("bad size %q", s))
		}
		addr, _, err := mem.Alloc(n)
		if err != nil {
			return fail(err)
		}
		if n <= patternLimit {
			if err := mem.Write(addr, Pattern(n, seedOf(i))); err != nil {
				return fail(err)
			}
		}
		tensors = append(tensors, Describe(mem.Device, Uint8, addr, n))
	}
	h.Hold(SourceObject, tensors)
	meta, err := tr.ExtractMetadata(SourceObject, tensors)
	if err != nil {
		return fail(err)
	}
	fmt.Printf("SOURCE %x %x\n", h.ID[:], meta)
	if conf.Ranks != nil {
		serveGroup(conf, h, tr, tensors, os.Stdin)
	} else {
		_, _ = io.Copy(io.Discard, os.Stdin)
	}
	_ = tr.Close()
	return 0
}

func seedOf(i int) byte { return byte(0x51 + i) }

// Source is a process that put SourceObject over the transport under test.
type Source struct {
	Cmd *exec.Cmd
	// Peer describes its runtime as a transfer names its source.
	Peer transport.PeerInfo
	// Meta is the object's metadata.
	Meta []byte
	// Want are the contents of its tensors (nil above 64 MiB, left zero).
	Want [][]byte

	in io.Writer // its stdin: the suite's requests to a grouped source
}

// StartSource runs the test binary as a source process putting tensors of
// the given sizes (bytes, uint8) and waits up to a minute for its metadata.
// The process is killed when the test ends. The package's TestMain must
// call Main.
func StartSource(t testing.TB, sizes ...int) *Source {
	t.Helper()
	var list []string
	s := &Source{}
	for i, n := range sizes {
		list = append(list, strconv.Itoa(n))
		if n <= patternLimit {
			s.Want = append(s.Want, Pattern(n, seedOf(i)))
		} else {
			s.Want = append(s.Want, nil)
		}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), sourceSizesEnv+"="+strings.Join(list, ","), sourceDirEnv+"="+SocketDir(t))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
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
	s.Cmd, s.in = cmd, stdin
	t.Cleanup(func() { _ = stdin.Close(); s.Kill() })
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		lines <- line
		_, _ = io.Copy(io.Discard, out)
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(time.Minute):
		t.Fatal("the source process printed no metadata within a minute")
	}
	f := strings.Fields(line)
	if len(f) == 2 { // empty metadata
		f = append(f, "")
	}
	if len(f) != 3 || f[0] != "SOURCE" {
		t.Fatalf("the source process said %q", line)
	}
	id, err1 := hex.DecodeString(f[1])
	meta, err2 := hex.DecodeString(f[2])
	if err1 != nil || err2 != nil || len(id) != len(transport.RuntimeID{}) {
		t.Fatalf("the source process said %q", line)
	}
	s.Peer = transport.PeerInfo{Name: "source", HostID: TestHostID, Pid: cmd.Process.Pid}
	copy(s.Peer.RuntimeID[:], id)
	s.Meta = meta
	return s
}

// Kill kills the process and reaps it (again: no-op).
func (s *Source) Kill() {
	if s.Cmd.ProcessState != nil {
		return
	}
	_ = s.Cmd.Process.Kill()
	_ = s.Cmd.Wait()
}

// Stop stops the process (SIGSTOP): it is alive but answers nothing.
//
// A signal is delivered when the process next runs, so Stop waits (up to
// Margin) until the kernel reports it stopped: a case that acts on a
// stopped source must not race the source's last steps.
func (s *Source) Stop() {
	_ = s.Cmd.Process.Signal(syscall.SIGSTOP)
	deadline := time.Now().Add(Margin)
	for time.Now().Before(deadline) && !AllThreadsStopped(s.Cmd.Process.Pid) {
		time.Sleep(time.Millisecond)
	}
}

// AllThreadsStopped reports whether every thread of process pid is
// stopped: state T or t in /proc/<pid>/task/<tid>/stat.
func AllThreadsStopped(pid int) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tids, err := os.ReadDir(dir)
	if err != nil || len(tids) == 0 {
		return false
	}
	for _, tid := range tids {
		b, err := os.ReadFile(dir + "/" + tid.Name() + "/stat")
		if err != nil {
			continue // a thread that exited
		}
		// The state follows the command name, which is in parentheses and
		// may itself hold them.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
			return false
		}
	}
	return true
}

// Continue resumes a stopped process.
func (s *Source) Continue() { _ = s.Cmd.Process.Signal(syscall.SIGCONT) }
