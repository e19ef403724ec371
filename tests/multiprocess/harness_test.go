// Package multiprocess tests rdt between real processes: the test binary
// re-executes itself as children that own, borrow and fetch objects over
// the socket control plane and the built-in transports.
package multiprocess

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/cma"
	"github.com/rdt-project/rdt/transports/nixl"
	"github.com/rdt-project/rdt/transports/shm"
	"github.com/rdt-project/rdt/transports/tcp"
)

const roleEnv = "RDT_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) != "" {
		os.Exit(childMain())
	}
	if os.Getenv(hogRoleEnv) != "" {
		os.Exit(hogMain())
	}
	os.Exit(m.Run())
}

func builtins() []transport.TransportFactory {
	// nixl is skipped by the runtime where libnixl_capi.so is not found.
	return []transport.TransportFactory{cma.Factory(), shm.Factory(), tcp.Factory(), nixl.Factory(), twoSidedFactory(), stallWriteFactory()}
}

// runtimeConfig is how a process's runtime is set up; children get theirs
// from the environment.
type runtimeConfig struct {
	Name      string
	HostID    string
	ListenTCP string
	Token     string
	LeaseMS   int
	SocketDir string
	GOGC      int // the child's GOGC; 0: the default
}

func (c runtimeConfig) env() []string {
	env := []string{
		"RDT_TEST_NAME=" + c.Name, "RDT_TEST_HOSTID=" + c.HostID, "RDT_TEST_LISTEN=" + c.ListenTCP,
		"RDT_TEST_TOKEN=" + c.Token, "RDT_TEST_LEASE_MS=" + strconv.Itoa(c.LeaseMS), "RDT_TEST_SOCKETDIR=" + c.SocketDir,
	}
	if c.GOGC != 0 {
		env = append(env, "GOGC="+strconv.Itoa(c.GOGC))
	}
	return env
}

func configFromEnv() runtimeConfig {
	lease, _ := strconv.Atoi(os.Getenv("RDT_TEST_LEASE_MS"))
	return runtimeConfig{
		Name: os.Getenv("RDT_TEST_NAME"), HostID: os.Getenv("RDT_TEST_HOSTID"),
		ListenTCP: os.Getenv("RDT_TEST_LISTEN"), Token: os.Getenv("RDT_TEST_TOKEN"),
		LeaseMS: lease, SocketDir: os.Getenv("RDT_TEST_SOCKETDIR"),
	}
}

func newRuntime(c runtimeConfig) (*engine.Runtime, error) {
	return engine.NewRuntime(engine.Options{
		Name: c.Name, LogLevel: transport.LogOff, Network: control.Sockets{}, Builtins: builtins(),
		HostID: c.HostID, ListenTCP: c.ListenTCP, AuthToken: c.Token,
		Lease: time.Duration(c.LeaseMS) * time.Millisecond, SocketDir: c.SocketDir,
	})
}

func parentRuntime(t *testing.T, c runtimeConfig) *engine.Runtime {
	t.Helper()
	if c.SocketDir == "" {
		c.SocketDir = sharedSocketDir(t)
	}
	rt, err := newRuntime(c)
	require.NoError(t, err)
	t.Cleanup(rt.Destroy)
	return rt
}

var socketDirOnce struct {
	sync.Once
	dir string
}

// sharedSocketDir is one private directory per test binary run.
func sharedSocketDir(t *testing.T) string {
	socketDirOnce.Do(func() {
		dir, err := os.MkdirTemp("", "rdt-mp-")
		if err != nil {
			panic(err)
		}
		socketDirOnce.dir = dir
	})
	return socketDirOnce.dir
}

// request and reply are the parent/child protocol, one JSON object a line.
type request struct {
	Op        string   `json:"op"`
	Transport string   `json:"transport,omitempty"`
	Sizes     []int    `json:"sizes,omitempty"`
	Seed      int      `json:"seed,omitempty"`
	Count     int      `json:"count,omitempty"`
	Refs      []string `json:"refs,omitempty"`
	Override  string   `json:"override,omitempty"`
	Parallel  bool     `json:"parallel,omitempty"`
	Millis    int      `json:"millis,omitempty"`
	// Prepared: write_loop runs one prepared write (and keeps it open
	// after Count runs).
	Prepared bool `json:"prepared,omitempty"`
}

type reply struct {
	Refs    []string          `json:"refs,omitempty"`
	Status  int32             `json:"status,omitempty"`
	Error   string            `json:"error,omitempty"`
	Stats   *engine.Stats     `json:"stats,omitempty"`
	Freed   int               `json:"freed,omitempty"`
	Used    map[string]uint64 `json:"used,omitempty"`
	Address string            `json:"address,omitempty"`
	Pid     int               `json:"pid,omitempty"`
	// What the child's side of a two-way exchange did.
	Exchange *exchangeResult `json:"exchange,omitempty"`
}

// child is a running child process.
type child struct {
	t    *testing.T
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	pid  int
	done chan struct{}
}

func startChild(t *testing.T, c runtimeConfig) *child {
	t.Helper()
	if c.SocketDir == "" {
		c.SocketDir = sharedSocketDir(t)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), roleEnv+"=1"), c.env()...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	outPipe, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	sc := bufio.NewScanner(outPipe)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	ch := &child{t: t, cmd: cmd, in: in, out: sc, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() { cmd.Wait(); close(ch.done) }()
	t.Cleanup(func() {
		ch.in.Close()
		select {
		case <-ch.done:
		case <-time.After(10 * time.Second):
			ch.cmd.Process.Kill()
			<-ch.done
		}
	})
	hello := ch.call(request{Op: "hello"})
	require.Empty(t, hello.Error)
	return ch
}

func (c *child) call(req request) reply {
	c.t.Helper()
	r, err := c.callNoFail(req)
	require.NoError(c.t, err)
	return r
}

// callNoFail is call for goroutines other than the test's: a failure to
// talk to the child is returned, not raised.
func (c *child) callNoFail(req request) (reply, error) {
	b, _ := json.Marshal(req)
	if _, err := c.in.Write(append(b, '\n')); err != nil {
		return reply{}, fmt.Errorf("child %d is gone: %v", c.pid, err)
	}
	if !c.out.Scan() {
		return reply{}, fmt.Errorf("child %d exited without answering %s", c.pid, req.Op)
	}
	var r reply
	if err := json.Unmarshal(c.out.Bytes(), &r); err != nil {
		return reply{}, err
	}
	return r, nil
}

// exit makes the child destroy its runtime and exit (its stdin closes),
// and waits until it has. (An "exit" request would race its answer with
// Wait closing the child's stdout.)
func (c *child) exit() {
	c.t.Helper()
	c.in.Close()
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		c.t.Fatalf("child %d did not exit", c.pid)
	}
}

func (c *child) kill() {
	c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// put asks the child to put one object per size list entry... see childMain.
func (c *child) put(transportName string, seed int, sizes ...int) []byte {
	c.t.Helper()
	r := c.call(request{Op: "put", Transport: transportName, Seed: seed, Sizes: sizes})
	require.Empty(c.t, r.Error)
	require.Len(c.t, r.Refs, 1)
	b, err := base64.StdEncoding.DecodeString(r.Refs[0])
	require.NoError(c.t, err)
	return b
}

func enc(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func dec(s string) []byte {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// pattern is the content of tensor i of an object put with seed.
func patternByte(seed, tensor, i int) byte {
	return byte(seed*31 + tensor*17 + i*7 + i>>9)
}

// hostMem is memory outside the Go heap, as C or Python memory is.
func hostMem(n int) []byte {
	size := max(n, 1)
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		panic(err)
	}
	return b[:n]
}

func freeMem(b []byte) {
	if cap(b) > 0 {
		unix.Munmap(b[:cap(b)])
	}
}

func tensorOver(b []byte) transport.Tensor {
	d, err := transport.NewTensorDesc(transport.Device{Type: transport.DeviceCPU}, transport.DType{Code: 1, Bits: 8, Lanes: 1}, []int64{int64(len(b))})
	if err != nil {
		panic(err)
	}
	var addr uintptr
	if len(b) > 0 {
		addr = addrOf(b)
	}
	return transport.Tensor{TensorDesc: d, Data: addr, Orig: addr}
}

// targetsFor allocates receive buffers for an object's tensors.
func targetsFor(desc *engine.ObjectDesc) ([]transport.Tensor, [][]byte) {
	ts := make([]transport.Tensor, len(desc.Tensors))
	bufs := make([][]byte, len(desc.Tensors))
	for i, td := range desc.Tensors {
		bufs[i] = hostMem(int(td.Nbytes))
		ts[i] = tensorOver(bufs[i])
	}
	return ts, bufs
}

// checkPattern verifies fetched buffers against the seed's pattern.
func checkPattern(bufs [][]byte, seed int) error {
	for t, b := range bufs {
		for i := range b {
			if b[i] != patternByte(seed, t, i) {
				return fmt.Errorf("tensor %d byte %d is %d, want %d", t, i, b[i], patternByte(seed, t, i))
			}
		}
	}
	return nil
}

// borrowed is an object deserialized in a runtime of the test, with
// buffers to fetch its tensors into.
type borrowed struct {
	rt      *engine.Runtime
	ref     *engine.Ref
	targets []transport.Tensor
	bufs    [][]byte
}

// borrow deserializes b in rt and allocates buffers for its tensors; the
// caller closes it.
func borrow(t *testing.T, rt *engine.Runtime, b []byte) *borrowed {
	t.Helper()
	ref, err := rt.Deserialize(b)
	require.NoError(t, err)
	targets, bufs := targetsFor(ref.Desc())
	return &borrowed{rt: rt, ref: ref, targets: targets, bufs: bufs}
}

// close frees the buffers and releases the ref.
func (o *borrowed) close() {
	for _, b := range o.bufs {
		freeMem(b)
	}
	o.ref.Release()
}

// get fetches the object into its buffers.
func (o *borrowed) get(opts engine.FetchOptions, timeout time.Duration) error {
	return o.rt.Get([]*engine.Ref{o.ref}, o.targets, opts, timeout)
}

// start starts a fetch of the object into its buffers.
func (o *borrowed) start(t *testing.T, opts engine.FetchOptions) *engine.Fetch {
	t.Helper()
	f, err := o.rt.StartFetch([]*engine.Ref{o.ref}, o.targets, opts)
	require.NoError(t, err)
	return f
}
