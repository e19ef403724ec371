// Package cuda is the small part of the CUDA driver API that rdt's GPU
// transports use, loaded at run time with dlopen("libcuda.so.1"): rdt builds
// and runs on machines without CUDA, where Load reports transport.ErrUnsupported.
//
// Calls that need a CUDA context take a device ordinal. The context used is
// that device's primary context (the one the CUDA runtime, PyTorch and CuPy
// use), retained on first use and kept for the life of the process. Each
// call makes it current, does its work and restores the calling thread's
// previous context inside one C call, so callers need not lock OS threads
// and an application's own current context is left as it was.
//
// Every failing call returns an *Error naming the call and the CUDA error,
// e.g. "cuIpcOpenMemHandle: CUDA_ERROR_INVALID_VALUE (invalid argument)".
package cuda

/*
#cgo CFLAGS: -g -O2 -Wall -Wextra
#cgo LDFLAGS: -ldl -lpthread
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/dynlib"
)

// DefaultLibrary is the driver library's soname; RDT_CUDA_LIBRARY overrides it.
const DefaultLibrary = "libcuda.so.1"

// IPCHandleSize is the size of a CUipcMemHandle.
const IPCHandleSize = C.RDT_CU_IPC_HANDLE_SIZE

// Ptr is a device address (CUdeviceptr).
type Ptr = uint64

// Result is a CUresult.
type Result int

const (
	Success       Result = 0
	ErrorNotReady Result = 600
	// ErrorMissingCall is rdt's own: the driver lacks a call rdt needs only
	// for tests (AllocAsync, AllocVMM).
	ErrorMissingCall Result = C.RDT_CU_MISSING
	// ErrorVMMRange is rdt's own: cuMemGetAddressRange gave a range that
	// is not one cuMemMap of one allocation (VMMChunkAt).
	ErrorVMMRange Result = C.RDT_CU_VMM_RANGE
)

// Error is a failed driver call.
type Error struct {
	Op   string // the driver call, e.g. "cuIpcOpenMemHandle"
	Code Result
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (%s)", e.Op, e.Code.Name(), e.Code.Description())
}

// RDTStatus maps the error to an rdt status: transport.StatusOf honours it
// wherever the error is wrapped (transport.StatusCarrier).
func (e *Error) RDTStatus() transport.Status {
	switch e.Code {
	case 2: // CUDA_ERROR_OUT_OF_MEMORY
		return transport.ErrNoMemory
	case 100, 101, 217, 801: // no device, invalid device, peer access unsupported, not supported
		return transport.ErrUnsupported
	case 1, 400: // invalid value, invalid handle
		return transport.ErrInvalidArgument
	}
	return transport.ErrTransport
}

// Name is the CUresult's name (CUDA_ERROR_...), from the driver when it is
// loaded and from a table of the common codes otherwise.
func (r Result) Name() string {
	if loaded() {
		if s := C.rdtcu_error_name(C.rdtcu_result(r)); s != nil {
			return C.GoString(s)
		}
	}
	if n, ok := resultNames[r]; ok {
		return n
	}
	switch r {
	case C.RDT_CU_NOT_LOADED:
		return "RDT_CUDA_NOT_LOADED"
	case C.RDT_CU_BAD_DEVICE:
		return "RDT_CUDA_BAD_DEVICE_ORDINAL"
	case C.RDT_CU_MISSING:
		return "RDT_CUDA_MISSING_CALL"
	case C.RDT_CU_VMM_RANGE:
		return "RDT_CUDA_VMM_RANGE"
	}
	return fmt.Sprintf("CUresult(%d)", int(r))
}

// Description is the driver's text for the code.
func (r Result) Description() string {
	if loaded() {
		if s := C.rdtcu_error_string(C.rdtcu_result(r)); s != nil {
			return C.GoString(s)
		}
	}
	if d, ok := resultText[r]; ok {
		return d
	}
	switch r {
	case C.RDT_CU_NOT_LOADED:
		return "the CUDA driver library is not loaded"
	case C.RDT_CU_BAD_DEVICE:
		return fmt.Sprintf("device ordinal outside 0..%d", C.RDT_CU_MAX_DEVICES-1)
	case C.RDT_CU_MISSING:
		return "the CUDA driver lacks this call (too old)"
	case C.RDT_CU_VMM_RANGE:
		return "the driver's address range of the mapping is not one cuMemMap of one allocation"
	}
	return "unknown CUDA error"
}

// The common codes (cuda.h), used when the driver cannot name a code.
var resultNames = map[Result]string{
	0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
	3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED", 100: "CUDA_ERROR_NO_DEVICE",
	101: "CUDA_ERROR_INVALID_DEVICE", 201: "CUDA_ERROR_INVALID_CONTEXT", 205: "CUDA_ERROR_MAP_FAILED",
	208: "CUDA_ERROR_ALREADY_MAPPED", 217: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", 400: "CUDA_ERROR_INVALID_HANDLE",
	600: "CUDA_ERROR_NOT_READY", 700: "CUDA_ERROR_ILLEGAL_ADDRESS", 704: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
	801: "CUDA_ERROR_NOT_SUPPORTED", 999: "CUDA_ERROR_UNKNOWN",
}

var resultText = map[Result]string{
	0: "no error", 1: "invalid argument", 2: "out of memory", 3: "initialization error",
	4: "driver shutting down", 100: "no CUDA-capable device is detected", 101: "invalid device ordinal",
	201: "invalid device context", 205: "mapping of buffer object failed", 208: "resource already mapped",
	217: "peer access is not supported between these two devices", 400: "invalid resource handle",
	600: "device not ready", 700: "an illegal memory access was encountered",
	704: "peer access is already enabled", 801: "operation not supported", 999: "unknown error",
}

func check(op string, r C.rdtcu_result) error {
	if r == 0 {
		return nil
	}
	return &Error{Op: op, Code: Result(r)}
}

var (
	loadOnce dynlib.Once
	isLoaded atomic.Bool // the symbols are resolved (cuInit may still have failed)
)

func loaded() bool { return isLoaded.Load() }

// Library is the path Load opens: RDT_CUDA_LIBRARY, else libcuda.so.1.
func Library() string {
	return dynlib.Path(os.Getenv("RDT_CUDA_LIBRARY"), DefaultLibrary)
}

// Load opens the driver library and calls cuInit(0), once per process; later
// calls return the first result. A missing library, one without the needed
// symbols, or a driver that finds no device is a transport.ErrUnsupported error
// that says which.
func Load() error {
	return loadOnce.Do(func() error { return load(Library()) })
}

func load(path string) error {
	// The handle stays open for the life of the process.
	fns, err := dynlib.OpenLibrary(symbols(), path, "CUDA driver library", "",
		"it is not the CUDA driver library, or a driver older than CUDA 11")
	if err != nil {
		return err
	}
	C.rdtcu_install(&fns[0])
	isLoaded.Store(true)
	if r := C.rdtcu_init(); r != 0 {
		return transport.Errorf(transport.ErrUnsupported, "CUDA driver %s: %v", path, &Error{Op: "cuInit", Code: Result(r)})
	}
	return nil
}

// symbols is the shim's table of driver functions, in its order.
func symbols() []dynlib.Symbol {
	var syms []dynlib.Symbol
	for i := 0; ; i++ {
		var older *C.char
		var optional C.int
		name := C.rdtcu_symbol(C.size_t(i), &older, &optional)
		if name == nil {
			return syms
		}
		s := dynlib.Symbol{Name: C.GoString(name), Optional: optional != 0}
		if older != nil {
			s.Older = C.GoString(older)
		}
		syms = append(syms, s)
	}
}

// DeviceCount is the number of devices this process sees.
//
// The count is fixed once the driver is initialized, so it is asked once
// (fetches check every target's ordinal against it).
func DeviceCount() (int, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	deviceCount.once.Do(func() {
		var n C.int
		deviceCount.err = check("cuDeviceGetCount", C.rdtcu_device_count(&n))
		deviceCount.n = int(n)
	})
	return deviceCount.n, deviceCount.err
}

var deviceCount struct {
	once sync.Once
	n    int
	err  error
}

// UUID identifies a GPU across processes (ordinals depend on
// CUDA_VISIBLE_DEVICES; UUIDs do not). A device in MIG mode has the UUID of
// its MIG compute instance (cuDeviceGetUuid_v2).
type UUID [16]byte

func (u UUID) String() string {
	b := u[:]
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// DeviceUUID returns the UUID of device dev.
func DeviceUUID(dev int) (UUID, error) {
	var u UUID
	if err := Load(); err != nil {
		return u, err
	}
	err := check("cuDeviceGetUuid", C.rdtcu_device_uuid(C.int(dev), (*C.uchar)(unsafe.Pointer(&u[0]))))
	return u, err
}

// DeviceName is the product name of device dev ("" if it cannot be read).
func DeviceName(dev int) string {
	if Load() != nil {
		return ""
	}
	var buf [128]C.char
	if C.rdtcu_device_name(C.int(dev), &buf[0], C.int(len(buf))) != 0 {
		return ""
	}
	return C.GoString(&buf[0])
}

// DeviceByUUID finds the ordinal of the device with this UUID among the
// devices this process sees; ok is false when it sees no such device.
func DeviceByUUID(u UUID) (dev int, ok bool, err error) {
	n, err := DeviceCount()
	if err != nil {
		return 0, false, err
	}
	for i := 0; i < n; i++ {
		v, err := DeviceUUID(i)
		if err != nil {
			return 0, false, err
		}
		if v == u {
			return i, true, nil
		}
	}
	return 0, false, nil
}

// CanAccessPeer reports whether device dev can map memory of device peer.
func CanAccessPeer(dev, peer int) (bool, error) {
	if err := Load(); err != nil {
		return false, err
	}
	var can C.int
	if err := check("cuDeviceCanAccessPeer", C.rdtcu_can_access_peer(C.int(dev), C.int(peer), &can)); err != nil {
		return false, err
	}
	return can != 0, nil
}

// PrimaryContextActive reports whether device dev's primary context is
// active in this process (retained by rdt or by anyone else: the CUDA
// runtime, PyTorch), without retaining it.
func PrimaryContextActive(dev int) (bool, error) {
	if err := Load(); err != nil {
		return false, err
	}
	var active C.int
	if err := check("cuDevicePrimaryCtxGetState", C.rdtcu_primary_active(C.int(dev), &active)); err != nil {
		return false, err
	}
	return active != 0, nil
}

// Memory types (CUmemorytype).
const (
	MemoryHost    = 1
	MemoryDevice  = 2
	MemoryArray   = 3
	MemoryUnified = 4
)

// PointerInfo describes the allocation that holds an address. LegacyIPC
// and Pool are known for device memory only (MemoryType MemoryDevice and
// not Managed); BufferID, Base and Size for the device memory that legacy
// IPC can share (elsewhere they are what the driver says, or zero).
type PointerInfo struct {
	MemoryType int    // Memory*
	Device     int    // ordinal of the device holding the memory
	Managed    bool   // managed (unified) memory
	LegacyIPC  bool   // the allocation can be shared with cuIpcGetMemHandle (cuMemAlloc's)
	Pool       bool   // the allocation comes from a memory pool (cuMemAllocAsync, cudaMallocAsync)
	BufferID   uint64 // unique within the process for the process's lifetime
	Base       Ptr    // start of the allocation (cuMemGetAddressRange)
	Size       uint64 // size of the allocation
}

// GetPointerInfo asks the driver about p, with dev's context current (the
// device the caller believes p is on; the answer's Device is the truth).
func GetPointerInfo(dev int, p Ptr) (PointerInfo, error) {
	if err := Load(); err != nil {
		return PointerInfo{}, err
	}
	var ci C.rdtcu_pointer_info
	if err := check("cuPointerGetAttribute/cuMemGetAddressRange", C.rdtcu_pointer_info_get(C.int(dev), C.rdtcu_ptr(p), &ci)); err != nil {
		return PointerInfo{}, err
	}
	return PointerInfo{
		MemoryType: int(ci.memory_type), Device: int(ci.device), Managed: ci.managed != 0, LegacyIPC: ci.legacy_ipc != 0,
		Pool: ci.pool != 0, BufferID: uint64(ci.buffer_id), Base: Ptr(ci.base), Size: uint64(ci.size),
	}, nil
}

// IPCHandle is a CUipcMemHandle.
type IPCHandle [IPCHandleSize]byte

// IPCGetMemHandle exports the allocation starting at base (an allocation
// base: IPC handles name whole allocations).
func IPCGetMemHandle(dev int, base Ptr) (IPCHandle, error) {
	var h IPCHandle
	if err := Load(); err != nil {
		return h, err
	}
	err := check("cuIpcGetMemHandle", C.rdtcu_ipc_get(C.int(dev), C.rdtcu_ptr(base), (*C.uchar)(unsafe.Pointer(&h[0]))))
	return h, err
}

// IPCOpenMemHandle maps another process's allocation into this one, in
// dev's primary context, with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS. dev may
// be the exporting device or any device with peer access to it, which
// this process need not see; copies then use the mapping from dev.
func IPCOpenMemHandle(dev int, h IPCHandle) (Ptr, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	var p C.rdtcu_ptr
	err := check("cuIpcOpenMemHandle", C.rdtcu_ipc_open(C.int(dev), (*C.uchar)(unsafe.Pointer(&h[0])), &p))
	return Ptr(p), err
}

// IPCCloseMemHandle unmaps what IPCOpenMemHandle mapped.
func IPCCloseMemHandle(dev int, p Ptr) error {
	if err := Load(); err != nil {
		return err
	}
	return check("cuIpcCloseMemHandle", C.rdtcu_ipc_close(C.int(dev), C.rdtcu_ptr(p)))
}

// Stream is a non-blocking CUDA stream of one device.
type Stream struct {
	dev int
	s   C.rdtcu_stream
}

// NewStream creates a stream on dev (CU_STREAM_NON_BLOCKING: it does not
// wait for the legacy default stream).
func NewStream(dev int) (*Stream, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	s := &Stream{dev: dev}
	if err := check("cuStreamCreate", C.rdtcu_stream_create(C.int(dev), &s.s)); err != nil {
		return nil, err
	}
	return s, nil
}

// Device is the stream's device ordinal.
func (s *Stream) Device() int { return s.dev }

// Synchronize waits until everything enqueued on the stream is done.
func (s *Stream) Synchronize() error {
	return check("cuStreamSynchronize", C.rdtcu_stream_sync(C.int(s.dev), s.s))
}

// Destroy frees the stream (work already enqueued still completes).
func (s *Stream) Destroy() error {
	return check("cuStreamDestroy", C.rdtcu_stream_destroy(C.int(s.dev), s.s))
}

// Event is a CUDA event created with CU_EVENT_DISABLE_TIMING.
type Event struct {
	dev int
	e   C.rdtcu_event
}

// NewEvent creates an event on dev.
func NewEvent(dev int) (*Event, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	e := &Event{dev: dev}
	if err := check("cuEventCreate", C.rdtcu_event_create(C.int(dev), &e.e)); err != nil {
		return nil, err
	}
	return e, nil
}

// Device is the event's device ordinal.
func (e *Event) Device() int { return e.dev }

// Query reports whether the work recorded before the event is done
// (cuEventQuery: CUDA_ERROR_NOT_READY is "not yet", not an error).
func (e *Event) Query() (bool, error) {
	r := C.rdtcu_event_query(C.int(e.dev), e.e)
	if Result(r) == ErrorNotReady {
		return false, nil
	}
	if err := check("cuEventQuery", r); err != nil {
		return false, err
	}
	return true, nil
}

// Destroy frees the event.
func (e *Event) Destroy() error {
	return check("cuEventDestroy", C.rdtcu_event_destroy(C.int(e.dev), e.e))
}

// Copy is one copy of N bytes from Src to Dst.
type Copy struct {
	Dst, Src Ptr
	N        uint64
}

// CopyAsync enqueues copies on s, then records done on s (done may be nil).
// dstDev is the device of every Dst and of s. srcDev == dstDev uses
// cuMemcpyDtoDAsync; another device uses cuMemcpyPeerAsync between the two
// primary contexts; srcDev < 0 uses cuMemcpyAsync, where unified addressing
// works out the kinds of memory (host or device, either side). It returns
// how many copies were enqueued, so that a caller knows, on error, whether
// any work may still run.
func CopyAsync(dstDev, srcDev int, s *Stream, ops []Copy, done *Event) (int, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	if s.dev != dstDev || (done != nil && done.dev != dstDev) {
		return 0, &Error{Op: "cuMemcpyAsync", Code: C.RDT_CU_BAD_DEVICE}
	}
	if len(ops) == 0 && done == nil {
		return 0, nil
	}
	cops := (*C.rdtcu_copy)(C.calloc(C.size_t(max(len(ops), 1)), C.size_t(unsafe.Sizeof(C.rdtcu_copy{}))))
	defer C.free(unsafe.Pointer(cops))
	arr := unsafe.Slice(cops, max(len(ops), 1))
	for i, o := range ops {
		arr[i] = C.rdtcu_copy{dst: C.rdtcu_ptr(o.Dst), src: C.rdtcu_ptr(o.Src), n: C.size_t(o.N)}
	}
	var ev C.rdtcu_event
	if done != nil {
		ev = done.e
	}
	var n C.size_t
	r := C.rdtcu_copy_async(C.int(dstDev), C.int(srcDev), s.s, cops, C.size_t(len(ops)), ev, &n)
	op := "cuMemcpyDtoDAsync"
	switch {
	case int(n) == len(ops):
		op = "cuEventRecord" // every copy was enqueued
	case srcDev < 0:
		op = "cuMemcpyAsync"
	case srcDev != dstDev:
		op = "cuMemcpyPeerAsync"
	}
	return int(n), check(op, r)
}

// Alloc allocates n bytes on dev (cuMemAlloc), for tests and benchmarks.
func Alloc(dev int, n uint64) (Ptr, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	var p C.rdtcu_ptr
	err := check("cuMemAlloc", C.rdtcu_mem_alloc(C.int(dev), C.size_t(n), &p))
	return Ptr(p), err
}

// Free frees what Alloc allocated.
func Free(dev int, p Ptr) error {
	if err := Load(); err != nil {
		return err
	}
	return check("cuMemFree", C.rdtcu_mem_free(C.int(dev), C.rdtcu_ptr(p)))
}

// AllocAsync allocates n bytes on dev from the device's current memory
// pool (cuMemAllocAsync on the legacy default stream, waited for), for
// tests: memory that legacy CUDA IPC cannot share, as PyTorch's
// cudaMallocAsync backend makes.
func AllocAsync(dev int, n uint64) (Ptr, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	var p C.rdtcu_ptr
	err := check("cuMemAllocAsync", C.rdtcu_mem_alloc_async(C.int(dev), C.size_t(n), &p))
	return Ptr(p), err
}

// FreeAsync frees what AllocAsync allocated, and waits for it.
func FreeAsync(dev int, p Ptr) error {
	if err := Load(); err != nil {
		return err
	}
	return check("cuMemFreeAsync", C.rdtcu_mem_free_async(C.int(dev), C.rdtcu_ptr(p)))
}

// AllocVMM maps n bytes (rounded up to the allocation granularity: the
// size it returns) of a cuMemCreate allocation on dev into an address
// range reserved for it, readable and writable from dev: CUDA's virtual
// memory management, as PyTorch's expandable segments use it. For tests:
// memory that legacy CUDA IPC cannot share.
func AllocVMM(dev int, n uint64) (Ptr, uint64, error) {
	return AllocVMMChunks(dev, n, 1, false)
}

// AllocVMMChunks is AllocVMM in chunks allocations of equal size (n/chunks
// rounded up to the granularity), mapped one after the other, as PyTorch's
// expandable segments grow; posixFD requests that they be exportable as
// POSIX file descriptors (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), as
// PyTorch does. For tests.
func AllocVMMChunks(dev int, n uint64, chunks int, posixFD bool) (Ptr, uint64, error) {
	if err := Load(); err != nil {
		return 0, 0, err
	}
	var p C.rdtcu_ptr
	var size C.size_t
	fd := C.int(0)
	if posixFD {
		fd = 1
	}
	err := check("cuMemCreate/cuMemMap", C.rdtcu_mem_alloc_vmm(C.int(dev), C.size_t(n), C.size_t(chunks), fd, &p, &size))
	return Ptr(p), uint64(size), err
}

// FreeVMM unmaps and frees what AllocVMM mapped.
func FreeVMM(dev int, p Ptr, size uint64) error {
	return FreeVMMChunks(dev, p, size, 1)
}

// FreeVMMChunks unmaps and frees what AllocVMMChunks mapped.
func FreeVMMChunks(dev int, p Ptr, size uint64, chunks int) error {
	if err := Load(); err != nil {
		return err
	}
	return check("cuMemUnmap/cuMemAddressFree", C.rdtcu_mem_free_vmm(C.int(dev), C.rdtcu_ptr(p), C.size_t(size), C.size_t(chunks)))
}

// VMMChunk is one mapping of virtual memory management: one allocation
// (cuMemCreate's, or an import) mapped with one cuMemMap.
type VMMChunk struct {
	Base    Ptr
	Size    uint64
	Handle  uint64 // the allocation handle mapped there: the same for as long as the mapping lasts
	PosixFD bool   // created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR requested: exportable as a file descriptor
}

// VMMChunkAt describes the mapping that holds p (memory mapped with
// cuMemMap), with dev's context current. Its range is cuMemGetAddressRange's,
// which for such memory is taken to be the one cuMemMap that mapped p; the
// call checks that (the same allocation handle at both ends of the range)
// and fails with ErrorVMMRange when it is not.
func VMMChunkAt(dev int, p Ptr) (VMMChunk, error) {
	if err := Load(); err != nil {
		return VMMChunk{}, err
	}
	var base C.rdtcu_ptr
	var size C.size_t
	var h C.ulonglong
	var fd C.int
	err := check("cuMemGetAddressRange/cuMemRetainAllocationHandle", C.rdtcu_vmm_chunk(C.int(dev), C.rdtcu_ptr(p), &base, &size, &h, &fd))
	return VMMChunk{Base: Ptr(base), Size: uint64(size), Handle: uint64(h), PosixFD: fd != 0}, err
}

// VMMExport exports the allocation mapped at p as a new POSIX file
// descriptor (cuMemExportToShareableHandle), which the caller closes.
func VMMExport(dev int, p Ptr) (int, error) {
	if err := Load(); err != nil {
		return -1, err
	}
	var fd C.int
	if err := check("cuMemExportToShareableHandle", C.rdtcu_vmm_export(C.int(dev), C.rdtcu_ptr(p), &fd)); err != nil {
		return -1, err
	}
	return int(fd), nil
}

// VMMImport maps the allocations of the file descriptors fds (exported by
// VMMExport in any process; the caller keeps and closes them), sizes[i]
// bytes of each, one after the other into a new address range, readable
// and writable from dev, and returns its start.
func VMMImport(dev int, fds []int, sizes []uint64) (Ptr, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	if len(fds) != len(sizes) || len(fds) == 0 {
		return 0, &Error{Op: "cuMemImportFromShareableHandle", Code: 1}
	}
	cfds := make([]C.int, len(fds))
	csizes := make([]C.size_t, len(sizes))
	for i := range fds {
		cfds[i], csizes[i] = C.int(fds[i]), C.size_t(sizes[i])
	}
	var p C.rdtcu_ptr
	err := check("cuMemImportFromShareableHandle/cuMemMap/cuMemSetAccess", C.rdtcu_vmm_import(C.int(dev), &cfds[0], &csizes[0], C.size_t(len(fds)), &p))
	return Ptr(p), err
}

// VMMUnmap unmaps what VMMImport mapped (with the same sizes) and frees
// its address range.
func VMMUnmap(dev int, p Ptr, sizes []uint64) error {
	if err := Load(); err != nil {
		return err
	}
	if len(sizes) == 0 {
		return &Error{Op: "cuMemUnmap", Code: 1}
	}
	csizes := make([]C.size_t, len(sizes))
	for i := range sizes {
		csizes[i] = C.size_t(sizes[i])
	}
	return check("cuMemUnmap/cuMemAddressFree", C.rdtcu_vmm_unmap(C.int(dev), C.rdtcu_ptr(p), &csizes[0], C.size_t(len(sizes))))
}

// Memcpy copies n bytes synchronously between any two addresses that
// unified addressing knows (host or device), with dev's context current.
func Memcpy(dev int, dst, src Ptr, n uint64) error {
	if err := Load(); err != nil {
		return err
	}
	return check("cuMemcpy", C.rdtcu_memcpy(C.int(dev), C.rdtcu_ptr(dst), C.rdtcu_ptr(src), C.size_t(n)))
}
