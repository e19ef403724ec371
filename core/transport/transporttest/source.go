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
	// sourceExposeEnv set to 1 makes the source expose its object for
	// writing: its metadata is the transport's for exposed objects (see
	// transport.ExposedMetadata).
	sourceExposeEnv = "RDT_TRANSPORTTEST_EXPOSE"
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
	meta, err := extractMetadata(tr, SourceObject, tensors, os.Getenv(sourceExposeEnv) == "1")
	if err != nil {
		return fail(err)
	}
	fmt.Printf("SOURCE %x %x\n", h.ID[:], meta)
	if conf.Ranks != nil {
		serveGroup(conf, h, tr, tensors, os.Stdin)
	} else {
		serveReads(mem, tensors, os.Stdin)
	}
	_ = tr.Close()
	return 0
}

// extractMetadata is what the engine extracts: for an exposed object, the
// transport's metadata for writing when it makes that differently.
func extractMetadata(tr transport.Transport, obj transport.ObjectID, tensors []transport.Tensor, exposed bool) ([]byte, error) {
	if x, ok := tr.(transport.ExposedMetadata); ok && exposed {
		return x.ExtractExposedMetadata(obj, tensors)
	}
	return tr.ExtractMetadata(obj, tensors)
}

// serveReads answers each "READ" line of its parent with the contents of
// the tensors ("TENSORS" and each in hexadecimal), until stdin closes.
func serveReads(mem Memory, tensors []transport.Tensor, in io.Reader) {
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		if lines.Text() != "READ" {
			continue
		}
		out := bufio.NewWriter(os.Stdout)
		out.WriteString("TENSORS")
		for _, x := range tensors {
			b := make([]byte, x.Nbytes)
			if err := mem.Read(x.Data, b); err != nil {
				fmt.Fprintln(os.Stderr, "source process: reading a tensor:", err)
			}
			fmt.Fprintf(out, " x%x", b) // x: an empty tensor is a field too
		}
		out.WriteString("\n")
		out.Flush()
	}
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

	in    io.Writer   // its stdin: the suite's requests to a grouped source
	lines chan string // its stdout's lines after the first
}

// StartSource runs the test binary as a source process putting tensors of
// the given sizes (bytes, uint8) and waits up to a minute for its metadata.
// The process is killed when the test ends. The package's TestMain must
// call Main.
func StartSource(t testing.TB, sizes ...int) *Source {
	t.Helper()
	return startSource(t, false, sizes...)
}

// StartExposedSource is StartSource for an object exposed for writing: its
// Meta is the transport's metadata for writes.
func StartExposedSource(t testing.TB, sizes ...int) *Source {
	t.Helper()
	return startSource(t, true, sizes...)
}

func startSource(t testing.TB, exposed bool, sizes ...int) *Source {
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
	env := []string{sourceSizesEnv + "=" + strings.Join(list, ","), sourceDirEnv + "=" + SocketDir(t)}
	if exposed {
		env = append(env, sourceExposeEnv+"=1")
	}
	cmd, stdin, out := StartChild(t, env...)
	s.Cmd, s.in = cmd, stdin
	t.Cleanup(func() { _ = stdin.Close(); s.Kill() })
	lines := make(chan string, 1)
	s.lines = make(chan string, 1)
	go func() {
		rd := bufio.NewReader(out)
		line, _ := rd.ReadString('\n')
		lines <- line
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				close(s.lines)
				return
			}
			s.lines <- line
		}
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

// Contents reads the tensors of the process's object as they are now,
// within a minute.
func (s *Source) Contents(t testing.TB) [][]byte {
	t.Helper()
	if _, err := io.WriteString(s.in, "READ\n"); err != nil {
		t.Fatalf("asking the source process for its tensors: %v", err)
	}
	var line string
	select {
	case l, ok := <-s.lines:
		if !ok {
			t.Fatal("the source process ended before it sent its tensors")
		}
		line = l
	case <-time.After(time.Minute):
		t.Fatal("the source process sent no tensors within a minute")
	}
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != "TENSORS" || len(f)-1 != len(s.Want) {
		t.Fatalf("the source process said %.100q", line)
	}
	out := make([][]byte, len(f)-1)
	for i, h := range f[1:] {
		b, err := hex.DecodeString(strings.TrimPrefix(h, "x"))
		if err != nil {
			t.Fatalf("tensor %d from the source process: %v", i, err)
		}
		out[i] = b
	}
	return out
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
