package nccl

/*
#cgo CFLAGS: -g -O2 -Wall -Wextra
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
	"github.com/rdt-project/rdt/transports/internal/dynlib"
)

// DefaultLibrary is NCCL's soname; RDT_NCCL_LIBRARY overrides it.
const DefaultLibrary = "libnccl.so.2"

// UniqueIDSize is sizeof(ncclUniqueId).
const UniqueIDSize = C.RDT_NCCL_UNIQUE_ID_BYTES

// UniqueID is an ncclUniqueId: what every rank needs to join a communicator.
type UniqueID [UniqueIDSize]byte

// Result is an ncclResult_t.
type Result int

// The ncclResult_t values (nccl.h).
const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2
	InternalError      Result = 3
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5
	RemoteError        Result = 6
	InProgress         Result = 7
	Timeout            Result = 8 // NCCL 2.30 and later
)

var resultNames = map[Result]string{
	Success: "ncclSuccess", UnhandledCudaError: "ncclUnhandledCudaError", SystemError: "ncclSystemError",
	InternalError: "ncclInternalError", InvalidArgument: "ncclInvalidArgument", InvalidUsage: "ncclInvalidUsage",
	RemoteError: "ncclRemoteError", InProgress: "ncclInProgress", Timeout: "ncclTimeout",
}

func (r Result) String() string {
	if n, ok := resultNames[r]; ok {
		return n
	}
	if r == C.RDT_NCCL_NOT_LOADED {
		return "RDT_NCCL_NOT_LOADED"
	}
	return fmt.Sprintf("ncclResult_t(%d)", int(r))
}

// Error is a failed NCCL call.
type Error struct {
	Op     string // the NCCL call, e.g. "ncclCommInitRank"
	Code   Result
	Detail string // ncclGetLastError, when NCCL gave one
}

func (e *Error) Error() string {
	text := "the NCCL library is not loaded"
	if C.rdt_nccl_loaded() != 0 {
		if s := C.rdt_nccl_error_string(C.rdt_nccl_result(e.Code)); s != nil {
			text = C.GoString(s)
		}
	}
	msg := fmt.Sprintf("%s: %s (%s)", e.Op, e.Code, text)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// RDTStatus maps the error to an rdt status (transport.StatusCarrier).
func (e *Error) RDTStatus() transport.Status {
	switch e.Code {
	case InvalidArgument, InvalidUsage:
		return transport.ErrInvalidArgument
	case RemoteError:
		return transport.ErrPeerUnavailable
	case Timeout:
		return transport.ErrTimeout
	}
	return transport.ErrTransport
}

func check(op string, r C.rdt_nccl_result, comm C.rdt_nccl_comm) error {
	if r == 0 {
		return nil
	}
	e := &Error{Op: op, Code: Result(r)}
	if comm != nil || r != C.RDT_NCCL_NOT_LOADED {
		if s := C.rdt_nccl_last_error(comm); s != nil {
			e.Detail = C.GoString(s)
		}
	}
	return e
}

// Library is the path Load opens: RDT_NCCL_LIBRARY, else libnccl.so.2.
func Library() string {
	return dynlib.Path(os.Getenv("RDT_NCCL_LIBRARY"), DefaultLibrary)
}

var (
	loadOnce dynlib.Once
	version  atomic.Int64
)

// Load opens the NCCL library once per process; later calls return the
// first result. A missing library, or one without the needed symbols, is a
// transport.ErrUnsupported error that names the library (and the symbol).
func Load() error {
	return loadOnce.Do(func() error { return load(Library()) })
}

func load(path string) error {
	// The handle stays open for the life of the process.
	fns, err := dynlib.OpenLibrary(symbols(), path, "NCCL library", " (set RDT_NCCL_LIBRARY to its path)",
		"it is not the NCCL library, or an NCCL older than 2.14 (non-blocking communicators)")
	if err != nil {
		return err
	}
	C.rdt_nccl_install(&fns[0])
	var v C.int
	if err := check("ncclGetVersion", C.rdt_nccl_version(&v), nil); err != nil {
		return transport.Errorf(transport.ErrUnsupported, "NCCL library %s: %v", path, err)
	}
	version.Store(int64(v))
	return nil
}

// symbols is the shim's table of NCCL functions, in its order.
func symbols() []dynlib.Symbol {
	var syms []dynlib.Symbol
	for i := 0; ; i++ {
		var optional C.int
		name := C.rdt_nccl_symbol(C.size_t(i), &optional)
		if name == nil {
			return syms
		}
		syms = append(syms, dynlib.Symbol{Name: C.GoString(name), Optional: optional != 0})
	}
}

// Version is NCCL's version code (e.g. 22105 for 2.21.5); 0 before Load.
func Version() int {
	return int(version.Load())
}

// VersionString formats Version as "2.21.5".
func VersionString() string {
	v := Version()
	if v >= 10000 { // NCCL_VERSION(X,Y,Z) = X*10000 + Y*100 + Z since 2.9
		return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100)
	}
	return fmt.Sprintf("%d.%d.%d", v/1000, v/100%10, v%100)
}

// NewUniqueID calls ncclGetUniqueId (on rank 0 of a group).
func NewUniqueID() (UniqueID, error) {
	var id UniqueID
	if err := Load(); err != nil {
		return id, err
	}
	err := check("ncclGetUniqueId", C.rdt_nccl_unique_id((*C.uchar)(unsafe.Pointer(&id[0]))), nil)
	return id, err
}

// Comm is a non-blocking NCCL communicator of one device: no call on it
// waits for other ranks, so an abort always reaches it. A call NCCL
// answers with ncclInProgress is over once Ready says so; until then no
// other call may be made on the communicator, except Abort.
type Comm struct {
	c   C.rdt_nccl_comm
	dev int
}

// InitRank joins the communicator named by id as rank of nranks on device
// dev (ncclCommInitRankConfig with blocking = 0, dev's primary context
// current on a locked OS thread) and polls until it is formed, NCCL fails,
// or ctx ends. On failure a non-nil Comm is the handle NCCL made, which
// only Abort may free.
func InitRank(ctx context.Context, dev, nranks, rank int, id UniqueID) (*Comm, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	c := &Comm{dev: dev}
	var r C.rdt_nccl_result
	err := cuda.OnDevice(dev, func() error {
		r = C.rdt_nccl_comm_init_rank(&c.c, C.int(nranks), (*C.uchar)(unsafe.Pointer(&id[0])), C.int(rank))
		if Result(r) == InProgress {
			return nil
		}
		return check("ncclCommInitRankConfig", r, nil)
	})
	if c.c == nil {
		if err == nil {
			err = &Error{Op: "ncclCommInitRankConfig", Code: InternalError, Detail: "NCCL returned no communicator"}
		}
		return nil, err
	}
	if err != nil {
		return c, err
	}
	if err := c.Await(ctx, nil); err != nil {
		return c, err
	}
	return c, nil
}

// Ready asks whether the last call NCCL answered with ncclInProgress is
// over (ncclCommGetAsyncError): true when it is, an error when it or the
// communicator failed.
func (c *Comm) Ready() (bool, error) {
	var r C.rdt_nccl_result
	if err := check("ncclCommGetAsyncError", C.rdt_nccl_comm_async_error(c.c, &r), c.c); err != nil {
		return false, err
	}
	switch Result(r) {
	case Success:
		return true, nil
	case InProgress:
		return false, nil
	}
	return false, check("NCCL communicator", r, c.c)
}

// Await polls Ready until the communicator is ready, fails, ctx ends
// (ErrTimeout) or stop is closed (ErrAborted). The caller keeps Abort
// away meanwhile, or owns the communicator alone.
func (c *Comm) Await(ctx context.Context, stop <-chan struct{}) error {
	for delay := 5 * time.Microsecond; ; delay = min(delay*2, time.Millisecond) {
		ok, err := c.Ready()
		if ok || err != nil {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return transport.Errorf(transport.ErrTimeout, "NCCL did not finish in time")
		case <-stop:
			t.Stop()
			return transport.Errorf(transport.ErrAborted, "aborted while NCCL was busy")
		case <-t.C:
		}
	}
}

// Destroy frees the communicator after its pending work (ncclCommDestroy).
// NCCL waits there for the communicator's peers on this host to tear
// down theirs too.
func (c *Comm) Destroy() error {
	return cuda.OnDevice(c.dev, func() error {
		return check("ncclCommDestroy", C.rdt_nccl_comm_destroy(c.c), nil)
	})
}

// Abort stops the communicator's pending work and frees it (ncclCommAbort),
// waiting, as Destroy does, for its peers on this host.
func (c *Comm) Abort() error {
	return cuda.OnDevice(c.dev, func() error {
		return check("ncclCommAbort", C.rdt_nccl_comm_abort(c.c), nil)
	})
}

// AsyncError is ncclCommGetAsyncError: nil while the communicator is
// healthy (ready or busy).
func (c *Comm) AsyncError() error {
	_, err := c.Ready()
	return err
}

// Buffer is device memory to send from or receive into.
type Buffer struct {
	Ptr    uintptr
	Nbytes uint64
}

// P2P enqueues ncclSend (send) or ncclRecv of each buffer to or from peer on
// stream s, inside one ncclGroupStart/ncclGroupEnd, with the communicator's
// device current. busy: NCCL connects and launches on its own thread, and
// the work is on the stream once Ready says so.
func (c *Comm) P2P(send bool, peer int, bufs []Buffer, s *cuda.Stream) (busy bool, err error) {
	op := "ncclRecv"
	cs := C.int(0)
	if send {
		op, cs = "ncclSend", 1
	}
	arr := (*C.rdt_nccl_buffer)(C.calloc(C.size_t(max(len(bufs), 1)), C.size_t(unsafe.Sizeof(C.rdt_nccl_buffer{}))))
	defer C.free(unsafe.Pointer(arr))
	cb := unsafe.Slice(arr, max(len(bufs), 1))
	for i, b := range bufs {
		cb[i] = C.rdt_nccl_buffer{buf: C.uintptr_t(b.Ptr), nbytes: C.size_t(b.Nbytes)}
	}
	err = cuda.OnDevice(c.dev, func() error {
		r := C.rdt_nccl_p2p(c.c, cs, C.int(peer), arr, C.size_t(len(bufs)), s.Handle())
		busy = Result(r) == InProgress
		if busy {
			return nil
		}
		return check(op, r, c.c)
	})
	return busy, err
}

// Connect makes NCCL connect this rank with its peers in one direction
// (up: sends to every higher rank, receives from every lower one; else the
// other way round), with one group of one-byte operations on stream s: the
// sends read scratch, the receive from peer writes scratch+1+peer (scratch
// is nranks+1 bytes of the communicator's device). busy: as for P2P, the
// work is enqueued (every peer having called it too) once Ready says so.
func (c *Comm) Connect(rank, nranks int, up bool, scratch uintptr, s *cuda.Stream) (busy bool, err error) {
	cup := C.int(0)
	if up {
		cup = 1
	}
	err = cuda.OnDevice(c.dev, func() error {
		r := C.rdt_nccl_connect(c.c, C.int(nranks), C.int(rank), cup, C.uintptr_t(scratch), C.uintptr_t(scratch+1), s.Handle())
		busy = Result(r) == InProgress
		if busy {
			return nil
		}
		return check("ncclGroupEnd", r, c.c)
	})
	return busy, err
}
