package cudaipc

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/rdt-project/rdt/transports/internal/cuda"
	"github.com/stretchr/testify/require"
)

// The source process of the two-process tests: this test binary started
// again to serve an object laid out in allocations at offsets (serveMain),
// and the parent's handle on it (sourceProc).

// serveChild is childEnv's value for serveMain.
const serveChild = "serve"

// rerunEnv marks a test process started by rerun.
const rerunEnv = "RDT_CUDA_IPC_RERUN"

// The object serveMain shares: two allocations; two tensors at offsets in
// the first, one at the start of the second, and an empty one.
var layout = []struct {
	alloc  int
	off, n uint64
	seed   byte
}{
	{0, 4096, 1 << 20, 11},
	{0, 4096 + 1<<20, 1<<20 - 512, 12},
	{1, 0, 64 << 10, 13},
	{-1, 0, 0, 0},
}

var allocSizes = []uint64{3 << 20, 64 << 10}

func devTensor(dev int, p cuda.Ptr, n uint64) transport.Tensor {
	x := deviceTensor(p, int(n))
	x.Device.ID = int32(dev)
	return x
}

// serveMain is a source process: it allocates the layout on its device 0,
// prints the object's metadata ("META <hex>") and then answers commands
// on stdin: "realloc" frees the first allocation, allocates it again with
// other contents and prints the new metadata. It exits when stdin closes.
func serveMain() {
	if mode := os.Getenv(vmmEnv); mode != "" {
		serveVMM(mode)
		return
	}
	fail := func(err error) { fmt.Println("ERR", err); os.Exit(1) }
	tr, err := New(newHost())
	if err != nil {
		fail(err)
	}
	ptrs := make([]cuda.Ptr, len(allocSizes))
	alloc := func(i int, bump byte) {
		p, err := cuda.Alloc(0, allocSizes[i])
		if err != nil {
			fail(err)
		}
		ptrs[i] = p
		for _, l := range layout {
			if l.alloc == i {
				h := hostBuffer(nil, int(l.n))
				fill(h, l.seed+bump)
				if err := cuda.Memcpy(0, p+l.off, hostAddr(h), l.n); err != nil {
					fail(err)
				}
			}
		}
	}
	printMeta := func() {
		ts := make([]transport.Tensor, len(layout))
		for i, l := range layout {
			if l.alloc < 0 {
				ts[i] = devTensor(0, 0, 0)
			} else {
				ts[i] = devTensor(0, ptrs[l.alloc]+l.off, l.n)
			}
		}
		meta, err := tr.ExtractMetadata(transport.ObjectID{}, ts)
		if err != nil {
			fail(err)
		}
		fmt.Printf("META %x\n", meta)
	}
	for i := range allocSizes {
		alloc(i, 0)
	}
	printMeta()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "realloc":
			if err := cuda.Free(0, ptrs[0]); err != nil {
				fail(err)
			}
			alloc(0, 100)
			printMeta()
		}
	}
	os.Exit(0)
}

type sourceProc struct {
	cmd  *exec.Cmd
	pid  int
	in   io.WriteCloser
	out  *bufio.Reader
	meta []byte
}

// startSource starts serveMain in a child process, with env added.
func startSource(t testing.TB, env ...string) *sourceProc {
	t.Helper()
	cmd, in, out := transporttest.StartChild(t, append([]string{childEnv + "=" + serveChild}, env...)...)
	s := &sourceProc{cmd: cmd, pid: cmd.Process.Pid, in: in, out: bufio.NewReader(out)}
	t.Cleanup(func() { _ = s.in.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	s.meta = s.readMeta(t)
	return s
}

func (s *sourceProc) readMeta(t testing.TB) []byte {
	t.Helper()
	line, err := s.out.ReadString('\n')
	require.NoError(t, err)
	hex, ok := strings.CutPrefix(strings.TrimSpace(line), "META ")
	require.True(t, ok, "the source said %q", line)
	var meta []byte
	_, err = fmt.Sscanf(hex, "%x", &meta)
	require.NoError(t, err)
	return meta
}

func (s *sourceProc) realloc(t *testing.T) []byte {
	t.Helper()
	_, err := io.WriteString(s.in, "realloc\n")
	require.NoError(t, err)
	return s.readMeta(t)
}

// kill kills the source; reap says whether to wait for it, or leave it a
// zombie (dead, with its parent not told yet).
func (s *sourceProc) kill(t *testing.T, reap bool) {
	t.Helper()
	require.NoError(t, s.cmd.Process.Kill())
	if reap {
		_ = s.cmd.Wait()
		return
	}
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.pid))
		if err != nil {
			return false
		}
		i := bytes.LastIndexByte(b, ')')
		return i > 0 && i+2 < len(b) && b[i+2] == 'Z'
	}, 10*time.Second, 5*time.Millisecond, "the killed source never became a zombie")
}
