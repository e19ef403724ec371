package cudaipc

import (
	"encoding/binary"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

// Memory mapped with CUDA's virtual memory management (cuMemCreate,
// cuMemMap: PyTorch's expandable segments) cannot be shared with legacy
// IPC handles. It is shared as PyTorch shares it between its own
// processes: each chunk (one cuMemCreate allocation, mapped with one
// cuMemMap) that holds a tensor is exported as a POSIX file descriptor
// (cuMemExportToShareableHandle), which the source keeps open while the
// object is exposed; the metadata names the descriptors' numbers; the
// receiver takes duplicates of them with pidfd_getfd (ptrace permission
// over the source, Linux 5.6), imports them, and maps them one after the
// other into one address range of its own, readable by the device that
// opens them (fetch.go's rule, as for legacy handles). A chunk can only be
// exported when it was created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
// in its requested handle types, which PyTorch asks for; others are refused.
//
// The chunks that hold an object's tensors are grouped into runs of chunks
// next to each other (and on one device): one allocation of the metadata
// each, so that a tensor across a chunk boundary is one range to copy.
//
// The chunk under an address is found with cuMemGetAddressRange, taken to
// give the one cuMemMap that holds it (the documentation says "the
// allocation that contains the pointer"); the loader checks that the same
// allocation handle is mapped at both ends of that range and refuses the
// memory otherwise.

// vmmTensor is a tensor of the object in virtual memory management.
type vmmTensor struct {
	i      int
	dev    int
	chunks []cuda.VMMChunk // those it covers, in order
}

// vmmObject collects an object's tensors in virtual memory management and
// the exports they hold, while ExtractMetadata runs.
type vmmObject struct {
	tensors []vmmTensor
	held    []uint64 // export ids acquired: released again on failure
}

// add finds the chunks tensor i covers, refusing one that cannot be
// exported.
func (o *vmmObject) add(i int, x transport.Tensor) error {
	dev := int(x.Device.ID)
	vt := vmmTensor{i: i, dev: dev}
	for p, end := cuda.Ptr(x.Data), cuda.Ptr(x.Data)+x.Nbytes; p < end; {
		c, err := cuda.VMMChunkAt(dev, p)
		if err != nil {
			return vmmError(i, x, err)
		}
		if !c.PosixFD {
			return transport.Errorf(transport.ErrUnsupported, "tensor %d at %#x lives in memory mapped with CUDA's virtual memory management (cuMemCreate/cuMemMap, as PyTorch allocates with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) in a chunk at %#x created without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR among its requested handle types, which CUDA IPC cannot share; fetch it over another transport (nixl or nccl), or allocate it with plain cudaMalloc/cuMemAlloc (PyTorch without expandable_segments), or request that handle type when creating the chunks (PyTorch does)", i, x.Data, c.Base)
		}
		vt.chunks = append(vt.chunks, c)
		p = c.Base + c.Size
	}
	o.tensors = append(o.tensors, vt)
	return nil
}

// vmmError explains a failure to find or export tensor i's chunks.
func vmmError(i int, x transport.Tensor, err error) error {
	var ce *cuda.Error
	if errors.As(err, &ce) {
		switch ce.Code {
		case cuda.ErrorMissingCall:
			return transport.Errorf(transport.ErrUnsupported, "tensor %d at %#x lives in memory mapped with CUDA's virtual memory management, and this CUDA driver lacks the calls that share it (%v); fetch it over another transport (nixl or nccl)", i, x.Data, err)
		case cuda.ErrorVMMRange:
			return transport.Errorf(transport.ErrUnsupported, "tensor %d at %#x lives in memory mapped with CUDA's virtual memory management, but the driver's address range for it is not one mapped chunk (%v), so its chunks cannot be told apart; fetch it over another transport (nixl or nccl)", i, x.Data, err)
		}
	}
	return transport.Wrap(err, "tensor %d at %#x in memory mapped with CUDA's virtual memory management", i, x.Data)
}

// export exports the chunks of the object's VMM tensors (or finds them
// exported already), groups them into allocations and places the tensors
// in them.
func (o *vmmObject) export(m *metadata, tensors []transport.Tensor) error {
	if len(o.tensors) == 0 {
		return nil
	}
	type devChunk struct {
		dev int
		c   cuda.VMMChunk
	}
	seen := map[cuda.Ptr]devChunk{}
	for _, vt := range o.tensors {
		for _, c := range vt.chunks {
			seen[c.Base] = devChunk{vt.dev, c}
		}
	}
	all := make([]devChunk, 0, len(seen))
	for _, dc := range seen {
		all = append(all, dc)
	}
	slices.SortFunc(all, func(a, b devChunk) int {
		if a.c.Base < b.c.Base {
			return -1
		}
		return 1
	})
	// Runs of chunks next to each other on one device: an allocation each.
	runOf := map[cuda.Ptr]uint32{} // chunk base -> allocation index
	for k, dc := range all {
		if k > 0 {
			prev := all[k-1]
			if prev.dev == dc.dev && prev.c.Base+prev.c.Size == dc.c.Base {
				idx := runOf[prev.c.Base]
				if err := o.appendChunk(&m.Allocs[idx], dc.dev, dc.c); err != nil {
					return err
				}
				runOf[dc.c.Base] = idx
				continue
			}
		}
		u, err := cuda.DeviceUUID(dc.dev)
		if err != nil {
			return err
		}
		idx := uint32(len(m.Allocs))
		m.Allocs = append(m.Allocs, allocation{Base: dc.c.Base, Device: u, Chunks: []chunk{}})
		if err := o.appendChunk(&m.Allocs[idx], dc.dev, dc.c); err != nil {
			return err
		}
		runOf[dc.c.Base] = idx
	}
	for _, vt := range o.tensors {
		x := tensors[vt.i]
		idx := runOf[vt.chunks[0].Base]
		m.Tensors[vt.i] = tensorRef{Alloc: idx, Offset: uint64(x.Data) - m.Allocs[idx].Base, Nbytes: x.Nbytes}
	}
	return nil
}

func (o *vmmObject) appendChunk(a *allocation, dev int, c cuda.VMMChunk) error {
	e, err := exports.acquire(dev, c)
	if err != nil {
		return transport.Wrap(err, "exporting the chunk at %#x (%d bytes) of virtual memory management on cuda:%d as a file descriptor", c.Base, c.Size, dev)
	}
	o.held = append(o.held, e.id)
	a.Chunks = append(a.Chunks, chunk{FD: int32(e.fd), ID: e.id, Size: c.Size})
	a.Size += c.Size
	return nil
}

// release gives back the exports taken by an extraction that failed.
func (o *vmmObject) release() {
	for _, id := range o.held {
		exports.release(id)
	}
	o.held = nil
}

// exportKey names a mapped chunk: its range, and the allocation handle
// mapped there (the same value for as long as the mapping lasts).
type exportKey struct {
	base   cuda.Ptr
	size   uint64
	handle uint64
}

type export struct {
	key  exportKey
	fd   int
	id   uint64
	refs int // exposed objects that use it
}

// exportTable is the process's exported chunks: one file descriptor per
// chunk, shared by the objects that use it, closed when the last of them
// is garbage-collected.
type exportTable struct {
	mu     sync.Mutex
	byKey  map[exportKey]*export
	byID   map[uint64]*export
	nextID uint64
}

var exports = &exportTable{byKey: map[exportKey]*export{}, byID: map[uint64]*export{}}

func (t *exportTable) acquire(dev int, c cuda.VMMChunk) (*export, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := exportKey{base: c.Base, size: c.Size, handle: c.Handle}
	if e, ok := t.byKey[k]; ok {
		e.refs++
		return e, nil
	}
	fd, err := cuda.VMMExport(dev, c.Base)
	if err != nil {
		return nil, err
	}
	t.nextID++
	e := &export{key: k, fd: fd, id: t.nextID, refs: 1}
	t.byKey[k] = e
	t.byID[e.id] = e
	return e, nil
}

func (t *exportTable) release(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byID[id]
	if !ok {
		return
	}
	if e.refs--; e.refs > 0 {
		return
	}
	delete(t.byID, id)
	delete(t.byKey, e.key)
	_ = unix.Close(e.fd)
}

// open is the number of exported chunks (for tests).
func (t *exportTable) open() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byID)
}

// vmmKey is the cache key's chunks field for a VMM allocation: its export
// ids, which the source never reuses.
func vmmKey(a *allocation) string {
	b := make([]byte, 0, 4+8*len(a.Chunks))
	b = append(b, "vmm:"...)
	for _, c := range a.Chunks {
		b = binary.LittleEndian.AppendUint64(b, c.ID)
	}
	return string(b)
}

// openVMM maps a VMM allocation of source process pid for device dev:
// duplicates of its chunks' descriptors (pidfd_getfd), imported and mapped
// in one range. It returns the range and how to unmap it.
func openVMM(pid int, a *allocation, dev int) (cuda.Ptr, func() error, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0, nil, pidfdError("pidfd_open", pid, -1, err)
	}
	defer unix.Close(pidfd)
	fds := make([]int, 0, len(a.Chunks))
	defer func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}()
	sizes := make([]uint64, len(a.Chunks))
	for i, c := range a.Chunks {
		fd, err := unix.PidfdGetfd(pidfd, int(c.FD), 0)
		if err != nil {
			return 0, nil, pidfdError("pidfd_getfd", pid, int(c.FD), err)
		}
		fds = append(fds, fd)
		sizes[i] = c.Size
	}
	p, err := cuda.VMMImport(dev, fds, sizes)
	if err != nil {
		return 0, nil, err
	}
	return p, func() error { return cuda.VMMUnmap(dev, p, sizes) }, nil
}

// pidfdError explains why the source's descriptors could not be taken.
func pidfdError(call string, pid, fd int, err error) error {
	switch {
	case errors.Is(err, unix.ESRCH):
		return transport.Errorf(transport.ErrPeerUnavailable, "source process %d is gone (%s: %v)", pid, call, err)
	case errors.Is(err, unix.EPERM):
		return transport.Errorf(transport.ErrPermissionDenied,
			"%s of source process %d was refused (%v): taking its file descriptors needs ptrace permission over it (the same user, Yama ptrace_scope %s, no seccomp filter against it; rdt's cma transport lets same-user processes in under ptrace_scope 1 unless RDT_CMA_SET_PTRACER=0); fetch over another transport (nixl or nccl), or allocate without expandable_segments",
			call, pid, err, ptraceScope())
	case errors.Is(err, unix.ENOSYS):
		return transport.Errorf(transport.ErrUnsupported, "%s is not available (Linux older than 5.6, or seccomp): chunks of virtual memory management cannot be taken from the source; fetch over another transport (nixl or nccl), or allocate without expandable_segments", call)
	case errors.Is(err, unix.EBADF) && fd >= 0:
		return transport.Errorf(transport.ErrInvalidArgument, "source process %d no longer holds file descriptor %d of the object's memory (%s: %v): was the object freed?", pid, fd, call, err)
	}
	return transport.Errorf(transport.ErrTransport, "%s of source process %d: %v", call, pid, err)
}

func ptraceScope() string {
	b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
	if err != nil {
		return "unknown (no Yama)"
	}
	return strings.TrimSpace(string(b))
}
