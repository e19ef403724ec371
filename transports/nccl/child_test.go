package nccl

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/rdt-project/rdt/transports/internal/cuda"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The other rank of a two-process test: this test binary started again
// with childEnv set (TestMain), which joins a group and runs the commands
// its parent writes to its stdin (childCommand); and the parent's handle
// on it (child).

// childEnv holds the socket directory of a child rank.
const childEnv = "RDT_NCCL_TEST_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		childMain(dir)
		return
	}
	transporttest.Main(m, conformance)
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*13) + seed
	}
	return b
}

// devFill allocates n bytes on dev holding pattern(n, seed).
func devFill(dev, n int, seed byte) (cuda.Ptr, error) {
	p, err := cuda.Alloc(dev, uint64(max(n, 1)))
	if err != nil || n == 0 {
		return p, err
	}
	h, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return 0, err
	}
	defer unix.Munmap(h)
	copy(h, pattern(n, seed))
	return p, cuda.Memcpy(dev, p, cuda.Ptr(uintptr(unsafe.Pointer(&h[0]))), uint64(n))
}

// devRead copies n bytes of device memory back.
func devRead(dev int, p cuda.Ptr, n int) ([]byte, error) {
	if n == 0 {
		return []byte{}, nil
	}
	h, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, err
	}
	defer unix.Munmap(h)
	if err := cuda.Memcpy(dev, cuda.Ptr(uintptr(unsafe.Pointer(&h[0]))), p, uint64(n)); err != nil {
		return nil, err
	}
	return bytes.Clone(h), nil
}

func sockRuntime(name, dir string) (*engine.Runtime, error) {
	return engine.NewRuntime(engine.Options{Name: name, LogLevel: transport.LogOff, Network: control.Sockets{}, SocketDir: dir,
		Builtins: []transport.TransportFactory{Factory()}})
}

func transportOf(rt *engine.Runtime) *Transport {
	t, err := rt.Registry().Get(Name)
	if err != nil {
		panic(err)
	}
	return t.(*Transport)
}

// groupState is "" for a live group, the reason it is dead, or "none".
func groupState(rt *engine.Runtime, name string) string {
	t := transportOf(rt)
	t.mu.Lock()
	g := t.groups[name]
	t.mu.Unlock()
	if g == nil {
		return "none"
	}
	if err := g.deadErr(); err != nil {
		return err.Error()
	}
	return ""
}

// received counts the receives from rank src that this runtime's group
// has enqueued in NCCL.
func received(rt *engine.Runtime, name string, src int) uint64 {
	t := transportOf(rt)
	t.mu.Lock()
	g := t.groups[name]
	t.mu.Unlock()
	if g == nil {
		return 0
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.recvNext[src]
}

// inFlight counts this runtime's nccl sends and receives under way.
func inFlight(rt *engine.Runtime) int {
	t := transportOf(rt)
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.ops)
}

// childMain runs a rank: one command a line on stdin, one answer a line on
// stdout ("OK ...", or "ERR <status> <message>").
//
//	group NAME WORLD RANK RANK0ADDR DEV TIMEOUT_MS
//	put DEV N:SEED...          -> OK <serialized ref in hex>
//	get DEV HEXREF N:SEED...   -> FETCHING, then OK when the bytes are right
//	state NAME                 -> OK <groupState>
//	destroy NAME
func childMain(dir string) {
	rt, err := sockRuntime("child", dir)
	if err != nil {
		fmt.Println("ERR", int(transport.StatusOf(err)), err)
		os.Exit(1)
	}
	fmt.Println("OK", rt.Address())
	var keep []*engine.Ref
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(nil, 1<<20)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		out, err := childCommand(rt, f, &keep)
		if err != nil {
			fmt.Println("ERR", int(transport.StatusOf(err)), strings.ReplaceAll(err.Error(), "\n", " "))
		} else {
			fmt.Println("OK", out)
		}
	}
	rt.Destroy()
	os.Exit(0)
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

// sizes parses N:SEED pairs.
func sizes(args []string) (ns []int, seeds []byte) {
	for _, a := range args {
		n, s, _ := strings.Cut(a, ":")
		ns, seeds = append(ns, atoi(n)), append(seeds, byte(atoi(s)))
	}
	return ns, seeds
}

func childCommand(rt *engine.Runtime, f []string, keep *[]*engine.Ref) (string, error) {
	switch f[0] {
	case "group":
		spec := transport.GroupSpec{Name: f[1], WorldSize: atoi(f[2]), Rank: atoi(f[3]), Rank0: f[4], Device: atoi(f[5])}
		return "", rt.CreateGroup(spec, time.Duration(atoi(f[6]))*time.Millisecond)
	case "destroy":
		return "", rt.DestroyGroup(f[1])
	case "state":
		return groupState(rt, f[1]), nil
	case "put":
		dev := atoi(f[1])
		ns, seeds := sizes(f[2:])
		var ts []transport.Tensor
		for i, n := range ns {
			p, err := devFill(dev, n, seeds[i])
			if err != nil {
				return "", err
			}
			ts = append(ts, devTensor(dev, p, n))
		}
		ref, err := rt.Put(ts, Name, nil)
		if err != nil {
			return "", err
		}
		*keep = append(*keep, ref)
		b, err := ref.Serialize()
		return hex.EncodeToString(b), err
	case "get":
		dev := atoi(f[1])
		b, err := hex.DecodeString(f[2])
		if err != nil {
			return "", err
		}
		ref, err := rt.Deserialize(b)
		if err != nil {
			return "", err
		}
		defer ref.Release()
		ns, seeds := sizes(f[3:])
		var ts []transport.Tensor
		var ps []cuda.Ptr
		for _, n := range ns {
			p, err := cuda.Alloc(dev, uint64(max(n, 1)))
			if err != nil {
				return "", err
			}
			ps = append(ps, p)
			ts = append(ts, devTensor(dev, p, n))
		}
		fetch, err := rt.StartFetch([]*engine.Ref{ref}, ts, engine.FetchOptions{})
		if err != nil {
			return "", err
		}
		fmt.Println("FETCHING")
		err = fetch.Wait(-1)
		fetch.Free()
		if err != nil {
			return "", err
		}
		for i, n := range ns {
			got, err := devRead(dev, ps[i], n)
			if err != nil {
				return "", err
			}
			if !bytes.Equal(got, pattern(n, seeds[i])) {
				return "", fmt.Errorf("tensor %d: wrong bytes", i)
			}
		}
		return "", nil
	}
	return "", fmt.Errorf("unknown command %q", f[0])
}

// child is a rank in another process.
type child struct {
	t    *testing.T
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	addr string
}

func startChild(t *testing.T, dir string, env ...string) *child {
	t.Helper()
	cmd, in, out := transporttest.StartChild(t, append([]string{childEnv + "=" + dir}, env...)...)
	c := &child{t: t, cmd: cmd, in: in, out: bufio.NewReader(out)}
	t.Cleanup(c.kill)
	addr, err := c.answer()
	require.NoError(t, err)
	c.addr = addr
	return c
}

func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
}

func (c *child) send(args ...any) {
	_, err := fmt.Fprintln(c.in, args...)
	require.NoError(c.t, err)
}

// answer reads the next answer line (past FETCHING): its text, or an error
// with its status.
func (c *child) answer() (string, error) {
	line := "FETCHING"
	for line == "FETCHING" {
		l, err := c.out.ReadString('\n')
		if err != nil {
			return "", fmt.Errorf("the child said nothing: %w", err)
		}
		line = strings.TrimSpace(l)
	}
	if rest, ok := strings.CutPrefix(line, "OK"); ok {
		return strings.TrimSpace(rest), nil
	}
	if rest, ok := strings.CutPrefix(line, "ERR "); ok {
		code, msg, _ := strings.Cut(rest, " ")
		return "", transport.Errorf(transport.Status(atoi(code)), "child: %s", msg)
	}
	return line, nil
}

func (c *child) do(args ...any) (string, error) {
	c.send(args...)
	return c.answer()
}
