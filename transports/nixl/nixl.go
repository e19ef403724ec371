// Package nixl moves host and GPU memory with NVIDIA's NIXL library
// (through its C API, libnixl_capi.so, loaded at run time): the source
// registers the memory of a put and hands the agent's metadata out in the
// ref; the receiver loads it, registers its targets and READs. One-sided:
// the source application does nothing per transfer.
//
// NIXL cannot cancel a posted request. Abort makes Wait return at once,
// but Release waits until NIXL reports the request finished before it
// releases it (releasing a request in flight is unsafe); the core calls
// Release before the caller's buffers are handed back, so a fetch that
// was aborted or timed out still never writes into them after rdt_pending_free.
package nixl

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

// Name is the canonical transport name.
const Name = "nixl"

// Factory makes the transport for a new runtime. Without NIXL's C API
// library it returns transport.ErrUnsupported and the runtime goes on without it.
func Factory() transport.TransportFactory {
	return transport.TransportFactory{Name: Name, New: New, Settings: Settings()}
}

// Transport is the nixl transport of one runtime: one NIXL agent (named
// after the runtime id) with a UCX backend, created on first use.
type Transport struct {
	h    transport.Host
	name string

	agentMu  sync.Mutex
	agent    unsafe.Pointer
	backend  unsafe.Pointer
	conn     []byte // the agent's connection metadata
	agentErr error
	closed   bool

	// epoch counts deregistrations. It is raised before memory is
	// deregistered and read after memory is registered, so a receiver that
	// meets an epoch above the one it loaded the agent at knows that the
	// agent's memory it has descriptors for may have gone (and the
	// addresses been registered again): it reloads the agent.
	epoch atomic.Uint64

	devices []transport.DeviceType // cuda only where the CUDA driver sees a GPU

	mu   sync.Mutex
	regs map[regKey]*registration
	objs map[transport.ObjectID][]regKey

	remMu   sync.Mutex
	remotes map[string]*remote
	useTick uint64
}

type regKey struct {
	mem        uint8
	addr, size uint64
	dev        uint32
}

// registration is one registered region, shared by the objects that put it.
type registration struct {
	dlist unsafe.Pointer
	refs  int
}

// New loads NIXL (once per process) and makes the transport. The agent
// and its UCX backend are created when the transport is first used.
func New(h transport.Host) (transport.Transport, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	setTCPTimeouts(h.PeerTimeout())
	if tls, _ := cgetenv("UCX_TLS"); tls != "" && !strings.HasPrefix(tls, "^") && !strings.Contains(tls, "sm") && !strings.Contains(tls, "all") {
		h.Log().Warnf("UCX_TLS=%s has no shared-memory transport: host transfers on one machine will go over the network stack (add sm)", tls)
	}
	devices := []transport.DeviceType{transport.DeviceCPU, transport.DeviceCUDAHost}
	if n, err := cuda.DeviceCount(); err == nil && n > 0 {
		// VRAM only where a GPU is: elsewhere the automatic choice for
		// CUDA memory must not pick nixl and fail inside UCX.
		devices = append(devices, transport.DeviceCUDA)
	} else {
		h.Log().Debugf("host memory only: %v", cudaAbsence(n, err))
	}
	return &Transport{
		h:       h,
		devices: devices,
		name:    h.Identity().RuntimeID.String(),
		regs:    map[regKey]*registration{},
		objs:    map[transport.ObjectID][]regKey{},
		remotes: map[string]*remote{},
	}, nil
}

// Describe: nixl reads remote memory over UCX (one-sided, any host), CUDA
// memory only where the CUDA driver saw a GPU at creation; for CUDA data it
// comes after cuda_ipc and before nccl. Abort returns control at once (the
// engine needs that for deadlines), though NIXL finishes the I/O before
// Release returns. A read names any range of registered memory, so partial
// fetches read only their pieces; its two sides may be of either memory
// type, so it lands host memory on a device and device memory in host
// memory where it moves CUDA memory at all.
func (t *Transport) Describe() transport.Descriptor {
	var cross []transport.DevicePair
	if slices.Contains(t.devices, transport.DeviceCUDA) {
		for _, host := range []transport.DeviceType{transport.DeviceCPU, transport.DeviceCUDAHost} {
			cross = append(cross, transport.DevicePair{Source: host, Target: transport.DeviceCUDA},
				transport.DevicePair{Source: transport.DeviceCUDA, Target: host})
		}
	}
	return transport.Descriptor{
		Name:        Name,
		Devices:     t.devices,
		OneSided:    true,
		CanAbort:    true,
		Ranges:      true,
		Writes:      true,
		CrossDevice: cross,
		Auto:        transport.AutoRank{CUDA: 20},
	}
}

// ofMemory is the regions of one memory type: NIXL takes one descriptor
// list per type.
func ofMemory(keys []regKey, mem uint8) []regKey {
	var these []regKey
	for _, k := range keys {
		if k.mem == mem {
			these = append(these, k)
		}
	}
	return these
}

func cudaAbsence(n int, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("the CUDA driver sees %d devices", n)
}

// ensureAgent creates the agent and its UCX backend on first use.
func (t *Transport) ensureAgent() (unsafe.Pointer, error) {
	t.agentMu.Lock()
	defer t.agentMu.Unlock()
	if t.closed {
		return nil, transport.Errorf(transport.ErrClosed, "the transport was closed")
	}
	if t.agent != nil || t.agentErr != nil {
		return t.agent, t.agentErr
	}
	cname := C.CString(t.name)
	defer C.free(unsafe.Pointer(cname))
	var agent, backend unsafe.Pointer
	var call *C.char
	if st := C.rdtnx_agent_new(cname, &agent, &backend, &call); st != C.RDTNX_SUCCESS {
		t.agentErr = callError(transport.ErrUnsupported, "creating the agent and its UCX backend", call, st)
		return nil, t.agentErr
	}
	var data unsafe.Pointer
	var n C.size_t
	if st := C.rdtnx_partial_md(agent, nil, &data, &n, &call); st != C.RDTNX_SUCCESS {
		C.rdtnx_agent_free(agent, backend, &call)
		t.agentErr = callError(transport.ErrTransport, "connection metadata", call, st)
		return nil, t.agentErr
	}
	t.conn = C.GoBytes(data, C.int(n))
	C.rdtnx_free(data)
	t.agent, t.backend = agent, backend
	t.h.Log().Debugf("agent %s created (%d bytes of connection metadata)", t.name, len(t.conn))
	return agent, nil
}

// memOf maps a device to NIXL's memory type and device id.
func memOf(d transport.Device) (uint8, uint32, error) {
	switch {
	case d.Type.HostAccessible():
		return memDRAM, 0, nil
	case d.Type == transport.DeviceCUDA:
		if d.ID < 0 {
			return 0, 0, transport.Errorf(transport.ErrInvalidArgument, "negative CUDA device id %d", d.ID)
		}
		return memVRAM, uint32(d.ID), nil
	}
	return 0, 0, transport.Errorf(transport.ErrUnsupported, "it moves host and CUDA memory; tensor on %s", d)
}

// cArrays holds the C copies of a descriptor list's fields.
type cArrays struct {
	p            unsafe.Pointer
	addr, n, dev *C.uint64_t
	count        C.size_t
}

func newArrays(count int) *cArrays {
	if count == 0 {
		count = 1
	}
	p := C.calloc(C.size_t(3*count), 8)
	s := unsafe.Slice((*C.uint64_t)(p), 3*count)
	return &cArrays{p: p, addr: &s[0], n: &s[count], dev: &s[2*count]}
}

func (a *cArrays) set(i int, addr, size uint64, dev uint32) {
	stride := uintptr(8)
	*(*C.uint64_t)(unsafe.Add(unsafe.Pointer(a.addr), uintptr(i)*stride)) = C.uint64_t(addr)
	*(*C.uint64_t)(unsafe.Add(unsafe.Pointer(a.n), uintptr(i)*stride)) = C.uint64_t(size)
	*(*C.uint64_t)(unsafe.Add(unsafe.Pointer(a.dev), uintptr(i)*stride)) = C.uint64_t(dev)
	if C.size_t(i+1) > a.count {
		a.count = C.size_t(i + 1)
	}
}

func (a *cArrays) free() { C.free(a.p) }

// dlist makes a registration descriptor list of keys (all of one type).
func dlist(keys []regKey) (unsafe.Pointer, error) {
	a := newArrays(len(keys))
	defer a.free()
	for i, k := range keys {
		a.set(i, k.addr, k.size, k.dev)
	}
	var d unsafe.Pointer
	var call *C.char
	if st := C.rdtnx_dlist_new(C.int(keys[0].mem), a.addr, a.n, a.dev, a.count, &d, &call); st != C.RDTNX_SUCCESS {
		return nil, callError(transport.ErrTransport, "descriptor list", call, st)
	}
	return d, nil
}

// Close deregisters what is left and destroys the agent. The core frees
// every fetch of the runtime before it closes its transports.
func (t *Transport) Close() error {
	t.agentMu.Lock()
	defer t.agentMu.Unlock()
	t.closed = true
	if t.agent == nil {
		return nil
	}
	t.mu.Lock()
	for k, r := range t.regs {
		var call *C.char
		C.rdtnx_deregister(t.agent, r.dlist, &call)
		C.rdtnx_dlist_free(r.dlist)
		delete(t.regs, k)
	}
	t.objs = map[transport.ObjectID][]regKey{}
	t.mu.Unlock()
	t.remMu.Lock()
	t.remotes = map[string]*remote{}
	t.remMu.Unlock()
	var call *C.char
	st := C.rdtnx_agent_free(t.agent, t.backend, &call)
	t.agent, t.backend = nil, nil
	if st != C.RDTNX_SUCCESS {
		return callError(transport.ErrTransport, "destroying the agent", call, st)
	}
	return nil
}

// PeerGone forgets the agent of a runtime that is gone: its cache entry
// and the metadata loaded for it. An entry a transfer is using is left to
// the least-recently-used eviction.
func (t *Transport) PeerGone(peer transport.PeerInfo) {
	t.agentMu.Lock() // the agent stays while it is used here
	defer t.agentMu.Unlock()
	if t.agent == nil {
		return
	}
	name := peer.RuntimeID.String()
	t.remMu.Lock()
	defer t.remMu.Unlock()
	if r := t.remotes[name]; r != nil {
		t.evictLocked(t.agent, r)
	}
}
