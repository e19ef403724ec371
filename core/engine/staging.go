package engine

import (
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
)

// A receive across device types that the transport cannot land directly
// (host memory into a CUDA target over cma, shm or tcp) is staged: the
// transport receives into host buffers, and the engine copies those into
// the targets with a transport that copies within a process (cuda_ipc).

// staging is a transfer's host buffers and the targets they stand for.
type staging struct {
	mem     []byte // one mapping for every staged target
	copier  transport.LocalCopier
	name    string
	index   []int              // which targets are staged
	buffers []transport.Tensor // their host stand-ins, in the same order
	targets []transport.Tensor // the targets themselves
	wire    []transport.Tensor // the transfer's targets with stand-ins in place
}

// planLanding checks that transport e can land every target, directly or
// through staging, and prepares the staging.
func (tr *transfer) planLanding(e *registered) error {
	rt, name := tr.f.rt, e.desc.Name
	var staged []int
	for i, tg := range tr.targets {
		src := tr.sourceType(i)
		if !e.desc.Moves(src) {
			return transport.Errorf(transport.ErrUnsupported, "transport %s: tensor %d is in %s memory, which it does not move", name, i, src)
		}
		switch {
		case e.desc.Lands(src, tg.Device.Type):
		case src.HostAccessible() && tg.Device.Type == transport.DeviceCUDA:
			staged = append(staged, i)
		default:
			return transport.Errorf(transport.ErrUnsupported, "transport %s does not receive %s memory into %s memory (nixl does, and cuda_ipc from CUDA into host memory)", name, src, tg.Device.Type)
		}
	}
	if tr.stage != nil {
		tr.stage.free() // planned for a transport tried before
		tr.stage = nil
	}
	if len(staged) == 0 {
		return nil
	}
	copier, cname := rt.reg.localCopier(transport.DeviceCUDA)
	if copier == nil {
		return transport.Errorf(transport.ErrUnsupported, "receiving host memory into CUDA memory over %s is staged through host memory, and copying it to the device needs a transport that can (cuda_ipc; none is registered)", name)
	}
	st, err := newStaging(tr.targets, staged)
	if err != nil {
		return err
	}
	st.copier, st.name = copier, cname
	tr.stage = st
	return nil
}

// sourceType is the device type of what target i receives.
func (tr *transfer) sourceType(i int) transport.DeviceType {
	return tr.ref.desc.Tensors[pieceTensor(tr.pieces, i)].Device.Type
}

// wire is what the transport receives into: the targets, or their staged
// stand-ins.
func (tr *transfer) wire() []transport.Tensor {
	if tr.stage != nil {
		return tr.stage.wire
	}
	return tr.targets
}

func newStaging(targets []transport.Tensor, staged []int) (*staging, error) {
	var total uint64
	for _, i := range staged {
		total += (targets[i].Nbytes + 63) &^ 63
	}
	mem, err := unix.Mmap(-1, 0, int(max(total, 1)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, transport.Errorf(transport.ErrNoMemory, "mapping %d bytes of host memory to stage a receive into CUDA memory: %v", total, err)
	}
	st := &staging{mem: mem, index: staged, wire: append([]transport.Tensor(nil), targets...)}
	base := uintptr(unsafe.Pointer(&mem[0]))
	var off uintptr
	for _, i := range staged {
		b := targets[i]
		b.Device = transport.Device{Type: transport.DeviceCPU}
		b.Data, b.Orig = base+off, base+off
		st.buffers = append(st.buffers, b)
		st.targets = append(st.targets, targets[i])
		st.wire[i] = b
		off += uintptr((targets[i].Nbytes + 63) &^ 63)
	}
	return st, nil
}

// unload copies the staged bytes into their targets, unless the fetch was
// aborted first.
func (st *staging) unload(abort <-chan struct{}) error {
	select {
	case <-abort:
		return transport.Errorf(transport.ErrAborted, "fetch aborted")
	default:
	}
	if err := st.copier.CopyLocal(st.targets, st.buffers); err != nil {
		return transportError(st.name, transport.Wrap(err, "copying staged host memory into CUDA memory"))
	}
	return nil
}

func (st *staging) free() {
	if st.mem != nil {
		_ = unix.Munmap(st.mem)
		st.mem = nil
	}
}
