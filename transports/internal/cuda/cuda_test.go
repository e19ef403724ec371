package cuda

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
)

func status(err error) transport.Status { return transport.StatusOf(err) }

func TestMissingLibraryIsUnsupported(t *testing.T) {
	err := load("/nonexistent/libcuda-for-rdt-tests.so.1")
	require.Error(t, err)
	assert.Equal(t, transport.ErrUnsupported, status(err))
	assert.Contains(t, err.Error(), "/nonexistent/libcuda-for-rdt-tests.so.1")
	assert.Contains(t, err.Error(), "could not be loaded")
}

func TestLibraryWithoutSymbols(t *testing.T) {
	err := load("libc.so.6")
	require.Error(t, err)
	assert.Equal(t, transport.ErrUnsupported, status(err))
	assert.Contains(t, err.Error(), "libc.so.6 has no symbol cuInit")
}

func TestLibraryFromEnvironment(t *testing.T) {
	t.Setenv("RDT_CUDA_LIBRARY", "/nonexistent/other-libcuda.so")
	assert.Equal(t, "/nonexistent/other-libcuda.so", Library())
	t.Setenv("RDT_CUDA_LIBRARY", "")
	assert.Equal(t, "libcuda.so.1", Library())
}

// TestLoadOnceFromEnvironment runs Load in a fresh process, where the
// environment decides which library is opened.
func TestLoadOnceFromEnvironment(t *testing.T) {
	if os.Getenv("RDT_CUDA_CHILD") == "load" {
		err := Load()
		if err == nil || status(err) != transport.ErrUnsupported || !strings.Contains(err.Error(), "libc.so.6 has no symbol") {
			t.Fatalf("Load: %v", err)
		}
		if err2 := Load(); err2 != err {
			t.Fatalf("a second Load returned %v, not the first result", err2)
		}
		_, err = DeviceCount()
		if err != Load() {
			t.Fatalf("DeviceCount: %v", err)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestLoadOnceFromEnvironment$", "-test.v")
	cmd.Env = append(os.Environ(), "RDT_CUDA_CHILD=load", "RDT_CUDA_LIBRARY=libc.so.6")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "PASS")
}

func TestErrorNames(t *testing.T) {
	e := &Error{Op: "cuIpcOpenMemHandle", Code: 1}
	assert.Equal(t, "cuIpcOpenMemHandle: CUDA_ERROR_INVALID_VALUE (invalid argument)", e.Error())
	assert.Equal(t, "CUDA_ERROR_NOT_READY", Result(600).Name())
	assert.Equal(t, "CUDA_ERROR_OUT_OF_MEMORY", Result(2).Name())
	assert.Equal(t, "CUresult(123456)", Result(123456).Name())
	assert.Equal(t, "RDT_CUDA_NOT_LOADED", Result(-1).Name())

	// The status travels with the error itself, however it is wrapped.
	assert.Equal(t, transport.ErrNoMemory, status(&Error{Op: "cuMemAlloc", Code: 2}))
	assert.Equal(t, transport.ErrInvalidArgument, status(fmt.Errorf("opening: %w", e)))
	wrapped := transport.Wrap(&Error{Op: "cuMemcpy", Code: 700}, "copying tensor %d", 0)
	assert.Equal(t, transport.ErrTransport, status(wrapped))
	assert.Contains(t, wrapped.Error(), "copying tensor 0: cuMemcpy: ")
	assert.Equal(t, transport.ErrInternal, status(errors.New("x")))
}

func TestUUIDString(t *testing.T) {
	u := UUID{0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8}
	assert.Equal(t, "GPU-12345678-9abc-def0-0102-030405060708", u.String())
}

// ---- with a GPU ----------------------------------------------------------

// requireGPU skips the test on machines without a usable CUDA device.
func requireGPU(t testing.TB) {
	t.Helper()
	n, err := DeviceCount()
	if err == nil && n == 0 {
		err = errors.New("the driver sees no device")
	}
	if err != nil {
		if os.Getenv("RDT_REQUIRE_GPU") == "1" {
			t.Fatalf("no CUDA device (RDT_REQUIRE_GPU=1): %v", err)
		}
		t.Skipf("no CUDA device: %v", err)
	}
}

// hostBuffer maps n bytes outside the Go heap.
func hostBuffer(t testing.TB, n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}

func addr(b []byte) Ptr { return Ptr(uintptr(unsafe.Pointer(&b[0]))) }

func pattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*13) + seed
	}
}

func TestDevices(t *testing.T) {
	requireGPU(t)
	n, err := DeviceCount()
	require.NoError(t, err)
	for i := 0; i < n; i++ {
		u, err := DeviceUUID(i)
		require.NoError(t, err)
		d, ok, err := DeviceByUUID(u)
		require.NoError(t, err)
		assert.True(t, ok)
		assert.Equal(t, i, d)
		t.Logf("device %d: %s %s", i, DeviceName(i), u)
	}
	_, err = DeviceUUID(n + 5)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cuDeviceGetUuid")
	_, ok, err := DeviceByUUID(UUID{1, 2, 3})
	require.NoError(t, err)
	assert.False(t, ok)
}

func TestPointerInfoAndCopy(t *testing.T) {
	requireGPU(t)
	const n = 1 << 20
	p, err := Alloc(0, n)
	require.NoError(t, err)
	defer Free(0, p)

	info, err := GetPointerInfo(0, p+4096)
	require.NoError(t, err)
	assert.Equal(t, MemoryDevice, info.MemoryType)
	assert.Equal(t, 0, info.Device)
	assert.Equal(t, p, info.Base)
	assert.GreaterOrEqual(t, info.Size, uint64(n))
	assert.True(t, info.LegacyIPC)
	assert.NotZero(t, info.BufferID)

	host := hostBuffer(t, n)
	_, err = GetPointerInfo(0, addr(host))
	require.Error(t, err, "a plain host pointer is unknown to the driver")

	src := hostBuffer(t, n)
	pattern(src, 7)
	require.NoError(t, Memcpy(0, p, addr(src), n))

	q, err := Alloc(0, n)
	require.NoError(t, err)
	defer Free(0, q)
	s, err := NewStream(0)
	require.NoError(t, err)
	defer s.Destroy()
	ev, err := NewEvent(0)
	require.NoError(t, err)
	defer ev.Destroy()
	k, err := CopyAsync(0, 0, s, []Copy{{Dst: q, Src: p, N: n / 2}, {Dst: q + n/2, Src: p + n/2, N: n / 2}}, ev)
	require.NoError(t, err)
	assert.Equal(t, 2, k)
	deadline := time.Now().Add(10 * time.Second)
	for {
		done, err := ev.Query()
		require.NoError(t, err)
		if done {
			break
		}
		require.True(t, time.Now().Before(deadline))
		time.Sleep(10 * time.Microsecond)
	}
	back := hostBuffer(t, n)
	// Device to host through unified addressing on the same stream.
	_, err = CopyAsync(0, -1, s, []Copy{{Dst: addr(back), Src: q, N: n}}, nil)
	require.NoError(t, err)
	require.NoError(t, s.Synchronize())
	assert.True(t, bytes.Equal(src, back))

	_, err = CopyAsync(0, 0, s, []Copy{{Dst: q, Src: 16, N: 16}}, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cuMemcpyDtoDAsync")
	require.NoError(t, s.Synchronize())
}

// TestIPCAcrossProcesses exports an allocation here and reads it from a
// child process, which also checks the bytes.
func TestIPCAcrossProcesses(t *testing.T) {
	if os.Getenv("RDT_CUDA_CHILD") == "ipc" {
		ipcChild(t)
		return
	}
	requireGPU(t)
	const n = 4 << 20
	p, err := Alloc(0, n)
	require.NoError(t, err)
	defer Free(0, p)
	src := hostBuffer(t, n)
	pattern(src, 3)
	require.NoError(t, Memcpy(0, p, addr(src), n))

	h, err := IPCGetMemHandle(0, p)
	require.NoError(t, err)
	_, err = IPCOpenMemHandle(0, h)
	require.Error(t, err, "a process cannot open its own handle")
	t.Logf("opening one's own handle: %v", err)

	var arg bytes.Buffer
	arg.Write(h[:])
	binary.Write(&arg, binary.LittleEndian, uint64(n))
	cmd := exec.Command(os.Args[0], "-test.run", "^TestIPCAcrossProcesses$", "-test.v")
	cmd.Env = append(os.Environ(), "RDT_CUDA_CHILD=ipc")
	cmd.Stdin = &arg
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "child read the exported bytes")
}

func ipcChild(t *testing.T) {
	requireGPU(t)
	var h IPCHandle
	_, err := os.Stdin.Read(h[:])
	require.NoError(t, err)
	var n uint64
	require.NoError(t, binary.Read(os.Stdin, binary.LittleEndian, &n))
	p, err := IPCOpenMemHandle(0, h)
	require.NoError(t, err)
	back := hostBuffer(t, int(n))
	require.NoError(t, Memcpy(0, addr(back), p, n))
	want := hostBuffer(t, int(n))
	pattern(want, 3)
	require.True(t, bytes.Equal(want, back))
	require.NoError(t, IPCCloseMemHandle(0, p))
	t.Log("child read the exported bytes")
}

// A handle is the same for every export of one allocation (the handle
// cache in cuda_ipc relies on it), and differs for a new allocation, even
// at the address of a freed one.
func TestIPCHandlePerAllocation(t *testing.T) {
	requireGPU(t)
	const n = 1 << 20
	p, err := Alloc(0, n)
	require.NoError(t, err)
	h1, err := IPCGetMemHandle(0, p)
	require.NoError(t, err)
	h2, err := IPCGetMemHandle(0, p)
	require.NoError(t, err)
	assert.Equal(t, h1, h2)
	require.NoError(t, Free(0, p))
	q, err := Alloc(0, n)
	require.NoError(t, err)
	defer Free(0, q)
	h3, err := IPCGetMemHandle(0, q)
	require.NoError(t, err)
	assert.NotEqual(t, h1, h3)
}

// An event is not done until its stream has run what came before the
// record. Run in a process where the test double of the driver delays
// every copy (a real driver ignores the variable).
func TestEventWaitsForTheStream(t *testing.T) {
	requireGPU(t)
	if os.Getenv("RDT_CUDA_CHILD") != "event" {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestEventWaitsForTheStream$", "-test.v")
		cmd.Env = append(os.Environ(), "RDT_CUDA_CHILD=event", "RDT_FAKECUDA_COPY_DELAY_US=100000")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Contains(t, string(out), "--- PASS: TestEventWaitsForTheStream")
		return
	}
	double := strings.HasPrefix(DeviceName(0), "rdt fake CUDA device")
	const n = 1 << 20
	p, q, s, ev := copyFixture(t, n)
	done, err := ev.Query()
	require.NoError(t, err)
	assert.True(t, done, "an event never recorded is done")

	for round := 0; round < 2; round++ {
		_, err = CopyAsync(0, 0, s, []Copy{{Dst: q, Src: p, N: n}, {Dst: p, Src: q, N: n}}, ev)
		require.NoError(t, err)
		done, err = ev.Query()
		require.NoError(t, err)
		if double {
			assert.False(t, done, "round %d: done before the stream ran the copies", round)
		}
		require.Eventually(t, func() bool {
			done, err := ev.Query()
			require.NoError(t, err)
			return done
		}, 10*time.Second, time.Millisecond)
	}
	require.NoError(t, s.Synchronize())
	// A record on a stream of another device is refused.
	if n, _ := DeviceCount(); n > 1 {
		s1, err := NewStream(1)
		require.NoError(t, err)
		defer s1.Destroy()
		require.Error(t, ev.Record(s1))
	}
}

// inChild runs the calling test again in a new process with
// RDT_CUDA_CHILD=name and env added, and reports true once it passed
// there; in that process it reports false, and the test goes on.
func inChild(t *testing.T, name string, env ...string) bool {
	t.Helper()
	if os.Getenv("RDT_CUDA_CHILD") == name {
		return false
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^"+t.Name()+"$", "-test.v")
	cmd.Env = append(append(os.Environ(), "RDT_CUDA_CHILD="+name), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "--- PASS: "+t.Name())
	return true
}

func testDouble() bool { return strings.HasPrefix(DeviceName(0), "rdt fake CUDA device") }

// waitEvent polls e until it is done.
func waitEvent(t *testing.T, e *Event) {
	t.Helper()
	require.Eventually(t, func() bool {
		done, err := e.Query()
		require.NoError(t, err)
		return done
	}, 10*time.Second, time.Millisecond)
}

// cuMemFree synchronizes the device: it returns once everything enqueued
// on the device's streams is done, work that never touches the freed
// memory included. The test double delays each copy so that the work
// still runs when Free is called.
func TestFreeWaitsForTheDevice(t *testing.T) {
	requireGPU(t)
	if inChild(t, "free", "RDT_FAKECUDA_COPY_DELAY_US=200000") {
		return
	}
	const n = 1 << 20
	p, q, s, ev := copyFixture(t, n)
	_, err := CopyAsync(0, 0, s, []Copy{{Dst: q, Src: p, N: n}}, ev)
	require.NoError(t, err)
	if done, _ := ev.Query(); testDouble() {
		require.False(t, done, "the copy is delayed: it cannot be done yet")
	}
	other, err := Alloc(0, 4096)
	require.NoError(t, err)
	require.NoError(t, Free(0, other))
	done, err := ev.Query()
	require.NoError(t, err)
	assert.True(t, done, "cuMemFree returned while a copy still ran on the device")

	// In the double, the work of another device is not waited for.
	if n, _ := DeviceCount(); n > 1 && testDouble() {
		s1, err := NewStream(1)
		require.NoError(t, err)
		defer s1.Destroy()
		p1, err := Alloc(1, 4096)
		require.NoError(t, err)
		defer Free(1, p1)
		ev1, err := NewEvent(1)
		require.NoError(t, err)
		defer ev1.Destroy()
		_, err = CopyAsync(1, 1, s1, []Copy{{Dst: p1, Src: p1 + 2048, N: 2048}}, ev1)
		require.NoError(t, err)
		other, err := Alloc(0, 4096)
		require.NoError(t, err)
		require.NoError(t, Free(0, other))
		done, err := ev1.Query()
		require.NoError(t, err)
		assert.False(t, done, "cuMemFree on cuda:0 waited for cuda:1")
		waitEvent(t, ev1)
	}
}

// Copies between a device and pageable host memory (any host memory the
// driver was not asked to pin or register) are synchronous, "Async" or
// not: into host memory the call returns once the bytes are there (the
// driver stages them through pinned memory inside the call), and from host
// memory once the bytes are staged, so the caller may reuse its buffer at
// once. The test double delays each copy, which then shows in the call.
func TestPageableHostCopiesAreSynchronous(t *testing.T) {
	requireGPU(t)
	const delay = 200 * time.Millisecond
	if inChild(t, "pageable", fmt.Sprintf("RDT_FAKECUDA_COPY_DELAY_US=%d", delay.Microseconds())) {
		return
	}
	const n = 1 << 20
	p, err := Alloc(0, n)
	require.NoError(t, err)
	defer Free(0, p)
	s, err := NewStream(0)
	require.NoError(t, err)
	defer s.Destroy()
	ev, err := NewEvent(0)
	require.NoError(t, err)
	defer ev.Destroy()

	src := hostBuffer(t, n)
	pattern(src, 5)
	_, err = CopyAsync(0, -1, s, []Copy{{Dst: p, Src: addr(src), N: n}}, ev)
	require.NoError(t, err)
	pattern(src, 99) // staged already: the device gets the bytes as they were
	waitEvent(t, ev)

	back := hostBuffer(t, n)
	start := time.Now()
	_, err = CopyAsync(0, -1, s, []Copy{{Dst: addr(back), Src: p, N: n}}, nil)
	require.NoError(t, err)
	took := time.Since(start)
	want := hostBuffer(t, n)
	pattern(want, 5)
	assert.True(t, bytes.Equal(want, back), "the bytes were not all there when the copy into host memory returned")
	if testDouble() {
		assert.GreaterOrEqual(t, took, delay, "the copy into host memory returned before it ran")
	}
	require.NoError(t, s.Synchronize())
}

// Only cuMemAlloc's memory is legacy IPC's to share. Memory from a pool
// (cuMemAllocAsync: PyTorch's cudaMallocAsync backend) and memory mapped
// with cuMemCreate and cuMemMap (PyTorch's expandable segments) is device
// memory that copies use like any other, but its pointer attributes say
// that legacy IPC cannot share it, and cuIpcGetMemHandle refuses it with
// CUDA_ERROR_INVALID_VALUE.
func TestMemoryLegacyIPCCannotShare(t *testing.T) {
	requireGPU(t)
	const n = 1 << 20
	kinds := []struct {
		name  string
		alloc func() (Ptr, func() error, error)
		pool  bool
	}{
		{"cuMemAllocAsync", func() (Ptr, func() error, error) {
			p, err := AllocAsync(0, n)
			return p, func() error { return FreeAsync(0, p) }, err
		}, true},
		{"cuMemCreate", func() (Ptr, func() error, error) {
			p, size, err := AllocVMM(0, n)
			if err == nil {
				assert.GreaterOrEqual(t, size, uint64(n))
			}
			return p, func() error { return FreeVMM(0, p, size) }, err
		}, false},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			p, free, err := k.alloc()
			var ce *Error
			if errors.As(err, &ce) && ce.Code == ErrorMissingCall && !testDouble() {
				t.Skipf("the driver is too old: %v", err)
			}
			require.NoError(t, err)
			info, err := GetPointerInfo(0, p+4096)
			require.NoError(t, err)
			assert.Equal(t, MemoryDevice, info.MemoryType)
			assert.Equal(t, 0, info.Device)
			assert.False(t, info.Managed)
			assert.False(t, info.LegacyIPC, "legacy IPC cannot share it")
			assert.Equal(t, k.pool, info.Pool, "from a memory pool")

			src := hostBuffer(t, n)
			pattern(src, 9)
			require.NoError(t, Memcpy(0, p, addr(src), n))
			back := hostBuffer(t, n)
			require.NoError(t, Memcpy(0, addr(back), p, n))
			assert.True(t, bytes.Equal(src, back))

			_, err = IPCGetMemHandle(0, p)
			require.ErrorAs(t, err, &ce)
			t.Logf("cuIpcGetMemHandle: %v", err)
			if testDouble() || k.pool {
				// Seen from drivers for pool memory; for cuMemCreate's, the
				// double's guess.
				assert.Equal(t, Result(1), ce.Code, "%v", err)
			}
			require.NoError(t, free())
		})
	}
	// cuMemAlloc's memory: legacy IPC's, from no pool.
	p, err := Alloc(0, n)
	require.NoError(t, err)
	defer Free(0, p)
	info, err := GetPointerInfo(0, p)
	require.NoError(t, err)
	assert.True(t, info.LegacyIPC)
	assert.False(t, info.Pool)
}

// A handle opens in a context of any device with peer access to the
// exporting one, even where this process does not see the exporting device
// (another CUDA_VISIBLE_DEVICES); the mapping is then read from that
// device. Without peer access, opening fails. Here: exported on cuda:0,
// opened on cuda:1 by a child that sees both, and by one that sees cuda:1
// only (its cuda:0).
func TestIPCOpensOnAPeerDevice(t *testing.T) {
	if os.Getenv("RDT_CUDA_CHILD") == "ipc-peer" {
		ipcPeerChild(t)
		return
	}
	requireGPU(t)
	if n, _ := DeviceCount(); n < 2 {
		t.Skip("needs two CUDA devices")
	}
	const n = 1 << 20
	p, err := Alloc(0, n)
	require.NoError(t, err)
	defer Free(0, p)
	src := hostBuffer(t, n)
	pattern(src, 3)
	require.NoError(t, Memcpy(0, p, addr(src), n))
	h, err := IPCGetMemHandle(0, p)
	require.NoError(t, err)
	can, err := CanAccessPeer(1, 0)
	require.NoError(t, err)
	u1, err := DeviceUUID(1)
	require.NoError(t, err)
	for _, c := range []struct {
		env []string
		dev int
	}{
		{nil, 1},
		{[]string{"CUDA_VISIBLE_DEVICES=1"}, 0},
	} {
		var arg bytes.Buffer
		arg.Write(h[:])
		binary.Write(&arg, binary.LittleEndian, uint64(n))
		cmd := exec.Command(os.Args[0], "-test.run", "^TestIPCOpensOnAPeerDevice$", "-test.v")
		cmd.Env = append(append(os.Environ(), c.env...), "RDT_CUDA_CHILD=ipc-peer",
			fmt.Sprintf("RDT_CUDA_IPC_DEV=%d", c.dev), fmt.Sprintf("RDT_CUDA_IPC_PEER=%v", can), "RDT_CUDA_IPC_UUID="+u1.String())
		cmd.Stdin = &arg
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%v: %s", c.env, out)
		assert.Contains(t, string(out), "--- PASS: TestIPCOpensOnAPeerDevice", "%v", c.env)
	}
}

func ipcPeerChild(t *testing.T) {
	requireGPU(t)
	var h IPCHandle
	_, err := io.ReadFull(os.Stdin, h[:])
	require.NoError(t, err)
	var n uint64
	require.NoError(t, binary.Read(os.Stdin, binary.LittleEndian, &n))
	dev, err := strconv.Atoi(os.Getenv("RDT_CUDA_IPC_DEV"))
	require.NoError(t, err)
	u, err := DeviceUUID(dev)
	require.NoError(t, err)
	require.Equal(t, os.Getenv("RDT_CUDA_IPC_UUID"), u.String(), "the device the handle is opened on")
	p, err := IPCOpenMemHandle(dev, h)
	if os.Getenv("RDT_CUDA_IPC_PEER") != "true" {
		require.Error(t, err, "opened without peer access")
		t.Logf("without peer access: %v", err)
		if testDouble() {
			var ce *Error
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, Result(217), ce.Code)
		}
		return
	}
	require.NoError(t, err)
	back := hostBuffer(t, int(n))
	require.NoError(t, Memcpy(dev, addr(back), p, n))
	want := hostBuffer(t, int(n))
	pattern(want, 3)
	assert.True(t, bytes.Equal(want, back))
	require.NoError(t, IPCCloseMemHandle(dev, p))
}

// Memory of virtual memory management made exportable as POSIX file
// descriptors (as PyTorch's expandable segments make it) is shared chunk
// by chunk: each mapping is found from any address in it, exported as a
// file descriptor, and imported and mapped again, here in the same process
// (the double allows it; the transport imports in another).
func TestVMMShareThroughFileDescriptors(t *testing.T) {
	requireGPU(t)
	const chunks = 2
	p, size, err := AllocVMMChunks(0, 4<<20, chunks, true)
	var ce *Error
	if errors.As(err, &ce) && ce.Code == ErrorMissingCall && !testDouble() {
		t.Skipf("the driver is too old: %v", err)
	}
	require.NoError(t, err)
	defer FreeVMMChunks(0, p, size, chunks)
	src := hostBuffer(t, int(size))
	pattern(src, 3)
	require.NoError(t, Memcpy(0, p, addr(src), size))

	chunk := size / chunks
	var fds []int
	var sizes []uint64
	for i := uint64(0); i < chunks; i++ {
		c, err := VMMChunkAt(0, p+i*chunk+12345)
		require.NoError(t, err)
		assert.Equal(t, VMMChunk{Base: p + i*chunk, Size: chunk, Handle: c.Handle, PosixFD: true}, c)
		fd, err := VMMExport(0, c.Base+1)
		require.NoError(t, err)
		defer unix.Close(fd)
		fds, sizes = append(fds, fd), append(sizes, c.Size)
	}
	q, err := VMMImport(0, fds, sizes)
	require.NoError(t, err)
	back := hostBuffer(t, int(size))
	require.NoError(t, Memcpy(0, addr(back), q, size))
	assert.True(t, bytes.Equal(src, back), "the bytes through the imported mapping")
	require.NoError(t, VMMUnmap(0, q, sizes))

	// Without the handle type requested: not exportable.
	p2, size2, err := AllocVMMChunks(0, 2<<20, 1, false)
	require.NoError(t, err)
	defer FreeVMMChunks(0, p2, size2, 1)
	c, err := VMMChunkAt(0, p2)
	require.NoError(t, err)
	assert.False(t, c.PosixFD)
	_, err = VMMExport(0, p2)
	require.ErrorAs(t, err, &ce)
	t.Logf("cuMemExportToShareableHandle: %v", err)
}

// copyFixture is two allocations of n bytes on device 0, a stream and an
// event, freed at cleanup (the allocations last).
func copyFixture(t *testing.T, n uint64) (p, q Ptr, s *Stream, ev *Event) {
	t.Helper()
	var err error
	p, err = Alloc(0, n)
	require.NoError(t, err)
	t.Cleanup(func() { Free(0, p) })
	q, err = Alloc(0, n)
	require.NoError(t, err)
	t.Cleanup(func() { Free(0, q) })
	s, err = NewStream(0)
	require.NoError(t, err)
	t.Cleanup(func() { s.Destroy() })
	ev, err = NewEvent(0)
	require.NoError(t, err)
	t.Cleanup(func() { ev.Destroy() })
	return p, q, s, ev
}
