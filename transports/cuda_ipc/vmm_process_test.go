package cudaipc

// Memory of virtual memory management (PyTorch's expandable segments)
// shared with another process through file descriptors (vmm.go): a source
// process serves an object in two chunks of one mapped range, and the
// tests fetch it. They need a CUDA device or the test double.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

// vmmEnv makes serveMain serve vmmLayout: "fd" in chunks exportable as
// file descriptors, "nofd" in chunks without that handle type.
const vmmEnv = "RDT_CUDA_IPC_SERVE_VMM"

// vmmChunk is the size of each of the two chunks (the granularity of the
// double and of current GPUs; PyTorch's small pool uses it too).
const vmmChunk = 2 << 20

// vmmLayout: tensors at offsets of a range of two chunks (alloc 0; one
// across the boundary between them), one in cuMemAlloc'd memory (alloc 1),
// and an empty one.
var vmmLayout = []struct {
	alloc  int
	off, n uint64
	seed   byte
}{
	{0, 4096, 1 << 20, 21},
	{0, vmmChunk - 5000, 64 << 10, 22},
	{1, 512, 4096, 23},
	{0, vmmChunk + 1<<20, 8192, 24},
	{-1, 0, 0, 0},
}

// serveVMM is serveMain for vmmLayout. It prints the object's metadata
// ("META <hex>", or "ERR <error>" when extraction fails) and answers
// commands on stdin: "again" extracts the same tensors as a second object
// and prints its metadata; "gc N" garbage-collects the N-th object
// extracted (from 0); "fds" prints "FDS <n>", the descriptors of the
// double's virtual memory this process holds (its own chunks' and their
// exports). It exits when stdin closes.
func serveVMM(mode string) {
	fail := func(err error) { fmt.Println("ERR", err); os.Exit(1) }
	tr, err := New(newHost())
	if err != nil {
		fail(err)
	}
	vmm, size, err := cuda.AllocVMMChunks(0, 2*vmmChunk, 2, mode == "fd")
	if err != nil {
		fail(err)
	}
	if size != 2*vmmChunk {
		fail(fmt.Errorf("mapped %d bytes, want %d", size, 2*vmmChunk))
	}
	plain, err := cuda.Alloc(0, 64<<10)
	if err != nil {
		fail(err)
	}
	bases := []cuda.Ptr{vmm, plain}
	ts := make([]transport.Tensor, len(vmmLayout))
	for i, l := range vmmLayout {
		if l.alloc < 0 {
			ts[i] = devTensor(0, 0, 0)
			continue
		}
		h := hostBuffer(nil, int(l.n))
		fill(h, l.seed)
		if err := cuda.Memcpy(0, bases[l.alloc]+l.off, hostAddr(h), l.n); err != nil {
			fail(err)
		}
		ts[i] = devTensor(0, bases[l.alloc]+l.off, l.n)
	}
	var metas [][]byte
	extract := func() {
		meta, err := tr.ExtractMetadata(transport.ObjectID{}, ts)
		if err != nil {
			fmt.Println("ERR", strings.ReplaceAll(err.Error(), "\n", " "))
			return
		}
		metas = append(metas, meta)
		fmt.Printf("META %x\n", meta)
	}
	extract()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd := in.Text()
		var n int
		switch {
		case cmd == "again":
			extract()
		case cmd == "fds":
			fmt.Printf("FDS %d\n", vmmFDs())
		default:
			if _, err := fmt.Sscanf(cmd, "gc %d", &n); err == nil && n >= 0 && n < len(metas) {
				tr.GarbageCollect(transport.ObjectID{}, ts, metas[n])
				fmt.Println("OK")
			} else {
				fmt.Println("ERR unknown command", cmd)
			}
		}
	}
	os.Exit(0)
}

// vmmFDs counts this process's descriptors of the double's virtual memory.
func vmmFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	n := 0
	for _, e := range ents {
		if link, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(link, "/memfd:rdt-fakecuda-vmm-") {
			n++
		}
	}
	return n
}

// vmmMappedFrom counts the chunks of process pid's virtual memory mapped
// into this one (the double's memfds, as /proc/self/maps names them).
func vmmMappedFrom(t *testing.T, pid int) int {
	b, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	prefix := fmt.Sprintf("/memfd:rdt-fakecuda-vmm-%d-", pid)
	seen := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if i := strings.Index(line, prefix); i >= 0 {
			seen[line[i:]] = true
		}
	}
	return len(seen)
}

func (s *sourceProc) ask(t *testing.T, cmd string) string {
	t.Helper()
	_, err := io.WriteString(s.in, cmd+"\n")
	require.NoError(t, err)
	line, err := s.out.ReadString('\n')
	require.NoError(t, err)
	return strings.TrimSpace(line)
}

func (s *sourceProc) fds(t *testing.T) int {
	t.Helper()
	var n int
	_, err := fmt.Sscanf(s.ask(t, "fds"), "FDS %d", &n)
	require.NoError(t, err)
	return n
}

// requireVMM skips where virtual memory cannot be shared (a driver
// without the calls); the double has them.
func requireVMM(t *testing.T) {
	t.Helper()
	requireGPU(t)
	p, size, err := cuda.AllocVMMChunks(0, vmmChunk, 1, true)
	var ce *cuda.Error
	if errors.As(err, &ce) && ce.Code == cuda.ErrorMissingCall && !testDouble() {
		t.Skipf("the driver lacks virtual memory management: %v", err)
	}
	require.NoError(t, err)
	require.NoError(t, cuda.FreeVMMChunks(0, p, size, 1))
}

func vmmTargets(t *testing.T, host bool) ([]transport.Tensor, func(i int) []byte) {
	ts := make([]transport.Tensor, len(vmmLayout))
	read := make([]func() []byte, len(vmmLayout))
	for i, l := range vmmLayout {
		switch {
		case l.n == 0:
			ts[i] = devTensor(0, 0, 0)
		case host:
			b := hostBuffer(t, int(l.n))
			ts[i], read[i] = hostTensor(b), func() []byte { return b }
		default:
			p, err := cuda.Alloc(0, l.n)
			require.NoError(t, err)
			t.Cleanup(func() { _ = cuda.Free(0, p) })
			ts[i], read[i] = devTensor(0, p, l.n), func() []byte { return readBack(t, p, int(l.n)) }
		}
	}
	return ts, func(i int) []byte { return read[i]() }
}

func checkVMMLayout(t *testing.T, read func(i int) []byte) {
	t.Helper()
	for i, l := range vmmLayout {
		if l.n == 0 {
			continue
		}
		want := hostBuffer(t, int(l.n))
		fill(want, l.seed)
		assert.Equal(t, want, read(i), "tensor %d", i)
	}
}

// The source exports each chunk once and the metadata places the tensors
// in the run of two chunks; the receiver maps the run once (cached: a
// second fetch maps nothing more) and copies into device and host
// targets, a tensor across the chunks' boundary included.
func TestGPUVMMAnotherProcess(t *testing.T) {
	requireVMM(t)
	src := startSource(t, vmmEnv+"=fd")
	m, err := decodeMetadata(src.meta)
	require.NoError(t, err)
	require.Len(t, m.Allocs, 2)
	var chunked *allocation
	for i := range m.Allocs {
		if m.Allocs[i].Chunks != nil {
			chunked = &m.Allocs[i]
		}
	}
	require.NotNil(t, chunked, "a chunked allocation")
	require.Len(t, chunked.Chunks, 2, "one per chunk")
	assert.EqualValues(t, 2*vmmChunk, chunked.Size)
	assert.NotEqual(t, chunked.Chunks[0].FD, chunked.Chunks[1].FD)
	for i, l := range vmmLayout {
		if l.alloc == 0 {
			assert.Equal(t, l.off, m.Tensors[i].Offset, "tensor %d", i)
		}
	}

	tr := gpuTransport(t)
	x := transfer(30)
	for _, host := range []bool{false, true, false} {
		targets, read := vmmTargets(t, host)
		require.NoError(t, fetchWith(tr, x, src.meta, targets))
		checkVMMLayout(t, read)
		assert.Len(t, entriesOf(tr.cache, src.pid), 2, "one mapping per allocation, reused (host targets open on the same device)")
	}

	// The source's own process reads its addresses directly.
	if testDouble() {
		assert.Equal(t, 4, src.fds(t), "two chunks, each exported once")
	}
}

// A chunk created without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR cannot
// be exported: the source refuses the object, saying why.
func TestGPUVMMWithoutFileDescriptorsIsRefused(t *testing.T) {
	requireVMM(t)
	cmd, in, out := transporttest.StartChild(t, childEnv+"="+serveChild, vmmEnv+"=nofd")
	defer func() { _ = in.Close(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	t.Log(line)
	assert.True(t, strings.HasPrefix(line, "ERR "), "%s", line)
	assert.Contains(t, line, "expandable_segments:True")
	assert.Contains(t, line, "created without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR")
	assert.Contains(t, line, "which CUDA IPC cannot share")
	assert.NotContains(t, line, "CUDA_ERROR", "the refusal is explained, not the driver's code passed on")
}

// A source that is gone: ErrPeerUnavailable, before and after the
// receiver's cache noticed.
func TestGPUVMMSourceKilled(t *testing.T) {
	requireVMM(t)
	for _, fetchedBefore := range []bool{false, true} {
		t.Run(fmt.Sprintf("fetched before=%v", fetchedBefore), func(t *testing.T) {
			src := startSource(t, vmmEnv+"=fd")
			tr := gpuTransport(t)
			x := transfer(31)
			targets, read := vmmTargets(t, false)
			if fetchedBefore {
				require.NoError(t, fetchWith(tr, x, src.meta, targets))
				checkVMMLayout(t, read)
			}
			if fetchedBefore && testDouble() {
				assert.Equal(t, 2, vmmMappedFrom(t, src.pid), "the source's two chunks mapped here")
			}
			src.kill(t, true)
			tr.cache.sweep()
			assert.Empty(t, entriesOf(tr.cache, src.pid))
			if testDouble() {
				assert.Zero(t, vmmMappedFrom(t, src.pid), "the dead source's chunks unmapped")
			}
			err := fetchWith(tr, x, src.meta, targets)
			require.Error(t, err)
			t.Log(err)
			assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
		})
	}
	// Taking the descriptors of a process that is gone says so too.
	src := startSource(t, vmmEnv+"=fd")
	m, err := decodeMetadata(src.meta)
	require.NoError(t, err)
	src.kill(t, true)
	for _, a := range m.Allocs {
		if a.Chunks != nil {
			_, _, err := openVMM(src.pid, &a, 0)
			assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
		}
	}
}

// The source keeps the exported descriptors while an object uses them,
// shares them between objects in the same chunks, and closes them when
// the last such object is garbage-collected.
func TestGPUVMMGarbageCollectionClosesTheExports(t *testing.T) {
	requireVMM(t)
	if !testDouble() {
		t.Skip("counts the double's descriptors")
	}
	src := startSource(t, vmmEnv+"=fd")
	assert.Equal(t, 4, src.fds(t), "two chunks and an export of each")
	second := src.ask(t, "again")
	require.True(t, strings.HasPrefix(second, "META "), second)
	assert.Equal(t, 4, src.fds(t), "a second object in the same chunks shares the exports")
	require.Equal(t, "OK", src.ask(t, "gc 0"))
	assert.Equal(t, 4, src.fds(t), "still used by the second object")

	// The second object still fetches.
	var meta []byte
	_, err := fmt.Sscanf(strings.TrimPrefix(second, "META "), "%x", &meta)
	require.NoError(t, err)
	tr := gpuTransport(t)
	targets, read := vmmTargets(t, false)
	require.NoError(t, fetchWith(tr, transfer(32), meta, targets))
	checkVMMLayout(t, read)

	require.Equal(t, "OK", src.ask(t, "gc 1"))
	assert.Equal(t, 2, src.fds(t), "only the chunks' own descriptors are left")
}
