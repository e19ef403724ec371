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
// was aborted or timed out still never writes into them after rdt_fetch_free.
package nixl

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

// Name is the canonical transport name.
const Name = "nixl"

// maxRemotes bounds the source agents whose metadata a receiver keeps
// loaded. The core does not tell transports when a peer goes away, so the
// least recently used agent is invalidated when a new one would exceed it.
const maxRemotes = 64

// Factory makes the transport for a new runtime. Without NIXL's C API
// library it returns transport.ErrUnsupported and the runtime goes on without it.
func Factory() transport.TransportFactory {
	return transport.TransportFactory{Name: Name, New: New}
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

// remote is a source agent whose metadata this agent loaded.
type remote struct {
	name string
	// mu is held shared by every transfer from the agent and exclusively
	// to (re)load or invalidate it: invalidating an agent makes its
	// in-flight requests fail.
	mu      sync.RWMutex
	valid   bool
	epoch   uint64
	evicted bool
	stale   atomic.Bool // a transfer failed: reload before the next one
	lastUse uint64      // under Transport.remMu
}

// New loads NIXL (once per process) and makes the transport. The agent
// and its UCX backend are created when the transport is first used.
func New(h transport.Host) (transport.Transport, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	if tls, _ := cgetenv("UCX_TLS"); tls != "" && !strings.HasPrefix(tls, "^") && !strings.Contains(tls, "sm") && !strings.Contains(tls, "all") {
		h.Log().Warnf("nixl: UCX_TLS=%s has no shared-memory transport: host transfers on one machine will go over the network stack (add sm)", tls)
	}
	devices := []transport.DeviceType{transport.DeviceCPU, transport.DeviceCUDAHost}
	if n, err := cuda.DeviceCount(); err == nil && n > 0 {
		// VRAM only where a GPU is: elsewhere the automatic choice for
		// CUDA memory must not pick nixl and fail inside UCX.
		devices = append(devices, transport.DeviceCUDA)
	} else {
		h.Log().Debugf("nixl: host memory only: %v", cudaAbsence(n, err))
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
// Release returns.
func (t *Transport) Describe() transport.Descriptor {
	return transport.Descriptor{
		Name:     Name,
		Devices:  t.devices,
		OneSided: true,
		CanAbort: true,
		Auto:     transport.AutoRank{CUDA: 20},
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
		return nil, transport.Errorf(transport.ErrClosed, "nixl: the transport was closed")
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
	t.h.Log().Debugf("nixl: agent %s created (%d bytes of connection metadata)", t.name, len(t.conn))
	return agent, nil
}

// memOf maps a device to NIXL's memory type and device id.
func memOf(d transport.Device) (uint8, uint32, error) {
	switch {
	case d.Type.HostAccessible():
		return memDRAM, 0, nil
	case d.Type == transport.DeviceCUDA:
		if d.ID < 0 {
			return 0, 0, transport.Errorf(transport.ErrInvalidArgument, "nixl: negative CUDA device id %d", d.ID)
		}
		return memVRAM, uint32(d.ID), nil
	}
	return 0, 0, transport.Errorf(transport.ErrUnsupported, "nixl moves host and CUDA memory; tensor on %s", d)
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

// ExtractMetadata registers the tensors' memory with the agent (once per
// region, shared between objects that put the same region) and describes
// it for receivers.
func (t *Transport) ExtractMetadata(obj transport.ObjectID, tensors []transport.Tensor) ([]byte, error) {
	agent, err := t.ensureAgent()
	if err != nil {
		return nil, err
	}
	m := metadata{Agent: t.name, Conn: t.conn}
	var keys []regKey
	for _, x := range tensors {
		mem, dev, err := memOf(x.Device)
		if err != nil {
			return nil, err
		}
		m.Regions = append(m.Regions, region{Addr: uint64(x.Data), Size: x.Nbytes, Dev: dev, Mem: mem})
		if x.Nbytes > 0 {
			keys = append(keys, regKey{mem: mem, addr: uint64(x.Data), size: x.Nbytes, dev: dev})
		}
	}
	if err := t.register(agent, obj, keys); err != nil {
		return nil, err
	}
	m.Epoch = t.epoch.Load()
	for _, mem := range []uint8{memDRAM, memVRAM} {
		these := ofMemory(keys, mem)
		if len(these) == 0 {
			continue
		}
		blob, err := partialMD(agent, these)
		if err != nil {
			t.GarbageCollect(obj, tensors, nil)
			return nil, err
		}
		m.Blobs = append(m.Blobs, blob)
	}
	return m.encode(), nil
}

func partialMD(agent unsafe.Pointer, keys []regKey) ([]byte, error) {
	d, err := dlist(keys)
	if err != nil {
		return nil, err
	}
	defer C.rdtnx_dlist_free(d)
	var data unsafe.Pointer
	var n C.size_t
	var call *C.char
	if st := C.rdtnx_partial_md(agent, d, &data, &n, &call); st != C.RDTNX_SUCCESS {
		return nil, callError(transport.ErrTransport, "metadata of registered memory", call, st)
	}
	defer C.rdtnx_free(data)
	if n == 0 || n > maxBlob {
		return nil, transport.Errorf(transport.ErrTransport, "nixl: the agent's metadata is %d bytes (want 1 to %d)", int(n), maxBlob)
	}
	return C.GoBytes(data, C.int(n)), nil
}

// register registers the regions not yet registered and counts the
// object's use of each.
func (t *Transport) register(agent unsafe.Pointer, obj transport.ObjectID, keys []regKey) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	done := 0
	for _, k := range keys {
		if r, ok := t.regs[k]; ok {
			r.refs++
			done++
			continue
		}
		d, err := dlist([]regKey{k})
		if err == nil {
			var call *C.char
			if st := C.rdtnx_register(agent, d, &call); st != C.RDTNX_SUCCESS {
				C.rdtnx_dlist_free(d)
				err = callError(transport.ErrTransport, "registering memory", call, st)
			}
		}
		if err != nil {
			t.unregisterLocked(agent, keys[:done])
			return err
		}
		t.regs[k] = &registration{dlist: d, refs: 1}
		done++
	}
	t.objs[obj] = append(t.objs[obj], keys...)
	return nil
}

func (t *Transport) unregisterLocked(agent unsafe.Pointer, keys []regKey) {
	for _, k := range keys {
		r, ok := t.regs[k]
		if !ok {
			continue
		}
		if r.refs--; r.refs > 0 {
			continue
		}
		delete(t.regs, k)
		var call *C.char
		if st := C.rdtnx_deregister(agent, r.dlist, &call); st != C.RDTNX_SUCCESS {
			t.h.Log().Warnf("%v", callError(transport.ErrTransport, "deregistering memory", call, st))
		}
		C.rdtnx_dlist_free(r.dlist)
	}
}

func (t *Transport) CommunicatorMetadata(x *transport.Transfer) ([]byte, error) { return nil, nil }

// GarbageCollect deregisters the object's memory (regions other live
// objects also put stay registered).
func (t *Transport) GarbageCollect(obj transport.ObjectID, tensors []transport.Tensor, tmeta []byte) {
	t.agentMu.Lock()
	agent := t.agent
	t.agentMu.Unlock()
	if agent == nil {
		return
	}
	t.epoch.Add(1) // before the memory goes: see Transport.epoch
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := t.objs[obj]
	delete(t.objs, obj)
	t.unregisterLocked(agent, keys)
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

// ---- receiving --------------------------------------------------------------

// remoteEntry finds or adds the cache entry of a source agent, evicting the
// least recently used idle one beyond maxRemotes.
func (t *Transport) remoteEntry(agent unsafe.Pointer, name string) *remote {
	t.remMu.Lock()
	defer t.remMu.Unlock()
	t.useTick++
	if r, ok := t.remotes[name]; ok {
		r.lastUse = t.useTick
		return r
	}
	r := &remote{name: name, lastUse: t.useTick}
	t.remotes[name] = r
	for len(t.remotes) > maxRemotes {
		var old *remote
		for _, c := range t.remotes {
			if c != r && (old == nil || c.lastUse < old.lastUse) {
				old = c
			}
		}
		if old == nil || !t.evictLocked(agent, old) {
			break // in use: try again on the next new agent
		}
	}
	return r
}

// evictLocked forgets the cache entry r and the metadata loaded for it,
// unless a transfer is using it (then it returns false). The caller holds
// remMu.
func (t *Transport) evictLocked(agent unsafe.Pointer, r *remote) bool {
	if !r.mu.TryLock() {
		return false
	}
	if r.valid {
		t.invalidate(agent, r.name)
	}
	r.valid, r.evicted = false, true
	delete(t.remotes, r.name)
	r.mu.Unlock()
	return true
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

func (t *Transport) invalidate(agent unsafe.Pointer, name string) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var call *C.char
	// NOT_FOUND: NIXL already forgot it (it does so when a peer disconnects).
	if st := C.rdtnx_invalidate(agent, cname, &call); st != C.RDTNX_SUCCESS && st != -6 {
		t.h.Log().Debugf("%v", callError(transport.ErrTransport, "forgetting agent "+name, call, st))
	}
}

func loadMD(agent unsafe.Pointer, blob []byte, want string) error {
	p := C.CBytes(blob)
	defer C.free(p)
	var name *C.char
	var call *C.char
	st := C.rdtnx_load_md(agent, p, C.size_t(len(blob)), &name, &call)
	if st != C.RDTNX_SUCCESS {
		return callError(transport.ErrTransport, "loading the source agent's metadata", call, st)
	}
	got := C.GoString(name)
	C.rdtnx_free(unsafe.Pointer(name))
	if got != want {
		return transport.Errorf(transport.ErrCorrupt, "nixl: the metadata names agent %q, expected %q", got, want)
	}
	return nil
}

// acquire makes the source agent's memory of m addressable and returns its
// entry held shared (release with mu.RUnlock once the transfer is over).
func (t *Transport) acquire(agent unsafe.Pointer, m *metadata) (*remote, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		r := t.remoteEntry(agent, m.Agent)
		r.mu.RLock()
		if r.valid && !r.stale.Load() && r.epoch >= m.Epoch {
			var err error
			for _, b := range m.Blobs {
				if err = loadMD(agent, b, m.Agent); err != nil {
					break
				}
			}
			if err == nil {
				return r, nil
			}
			// Refused descriptors mean our view of the agent is out of date.
			lastErr = err
			r.stale.Store(true)
			r.mu.RUnlock()
			continue
		}
		r.mu.RUnlock()
		r.mu.Lock()
		if r.evicted {
			r.mu.Unlock()
			continue
		}
		if !(r.valid && !r.stale.Load() && r.epoch >= m.Epoch) {
			if r.valid {
				t.invalidate(agent, r.name)
				r.valid = false
			}
			if err := loadMD(agent, m.Conn, m.Agent); err != nil {
				r.mu.Unlock()
				return nil, err
			}
			r.valid, r.epoch = true, m.Epoch
			r.stale.Store(false)
		}
		r.mu.Unlock()
	}
	if lastErr == nil {
		lastErr = transport.Errorf(transport.ErrTransport, "nixl: the source agent's metadata kept changing")
	}
	return nil, lastErr
}

const (
	// chunkSize bounds one NIXL request. UCX's shared-memory transports
	// copy inside the post call, so a request is only as abortable as it
	// is small; between chunks the poster checks for an abort.
	chunkSize = 16 << 20
	// syncLimit: transfers up to this size are posted inside Fetch.
	syncLimit = 256 << 10
)

// piece is a byte range of one tensor, read with one descriptor.
type piece struct {
	laddr, raddr, n uint64
	ldev, rdev      uint32
}

// chunk is what one NIXL READ request moves: pieces of one pair of memory
// types, chunkSize bytes at most (or one piece).
type chunk struct {
	local, remote uint8
	pieces        []piece
}

// plan cuts the non-empty tensors into chunks.
func plan(m *metadata, targets []transport.Tensor) ([]chunk, []regKey, uint64, error) {
	var chunks []chunk
	var local []regKey
	var total uint64
	var cur *chunk
	var curBytes uint64
	for i, g := range m.Regions {
		if g.Size != targets[i].Nbytes {
			return nil, nil, 0, transport.Errorf(transport.ErrInvalidArgument, "nixl: tensor %d is %d bytes at the source, the target holds %d", i, g.Size, targets[i].Nbytes)
		}
		mem, dev, err := memOf(targets[i].Device)
		if err != nil {
			return nil, nil, 0, err
		}
		if g.Size == 0 {
			continue
		}
		laddr := uint64(targets[i].Data)
		local = append(local, regKey{mem: mem, addr: laddr, size: g.Size, dev: dev})
		total += g.Size
		for off := uint64(0); off < g.Size; {
			n := min(g.Size-off, chunkSize)
			if cur == nil || cur.local != mem || cur.remote != g.Mem || curBytes+n > chunkSize {
				chunks = append(chunks, chunk{local: mem, remote: g.Mem})
				cur, curBytes = &chunks[len(chunks)-1], 0
			}
			cur.pieces = append(cur.pieces, piece{laddr: laddr + off, raddr: g.Addr + off, n: n, ldev: dev, rdev: g.Dev})
			curBytes += n
			off += n
		}
	}
	return chunks, local, total, nil
}

// Fetch registers the targets and posts READs from the source agent:
// small transfers at once, larger ones chunk by chunk on a goroutine.
func (t *Transport) Fetch(x *transport.Transfer, targets []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	m, err := decodeMetadata(tmeta)
	if err != nil {
		return nil, err
	}
	if len(m.Regions) != len(targets) {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "nixl: the source describes %d tensors, %d targets given", len(m.Regions), len(targets))
	}
	chunks, local, total, err := plan(m, targets)
	if err != nil {
		return nil, err
	}
	agent, err := t.ensureAgent()
	if err != nil {
		return nil, err
	}
	req := &request{t: t, agent: agent, started: time.Now(), chunks: chunks, remoteName: m.Agent, postDone: make(chan struct{})}
	if len(chunks) == 0 {
		close(req.postDone)
		return req, nil
	}
	rem, err := t.acquire(agent, m)
	if err != nil {
		return nil, err
	}
	req.rem = rem
	// Register the targets for this transfer, one list per memory type.
	for _, mem := range []uint8{memDRAM, memVRAM} {
		these := ofMemory(local, mem)
		if len(these) == 0 {
			continue
		}
		d, err := dlist(these)
		if err == nil {
			var call *C.char
			if st := C.rdtnx_register(agent, d, &call); st != C.RDTNX_SUCCESS {
				C.rdtnx_dlist_free(d)
				err = callError(transport.ErrTransport, "registering the targets", call, st)
			}
		}
		if err != nil {
			close(req.postDone)
			req.Release()
			return nil, err
		}
		req.locals = append(req.locals, d)
	}
	if total <= syncLimit {
		req.post()
		if req.postErr != nil {
			err := req.postErr
			req.Release()
			return nil, err
		}
		return req, nil
	}
	go req.post()
	return req, nil
}

// Abort makes Wait return ErrAborted at its next poll. The I/O itself
// cannot be cancelled: Release waits for it.
func (t *Transport) Abort(x *transport.Transfer, r transport.Request) {
	if req, ok := r.(*request); ok {
		req.aborted.Store(true)
	}
}

type xfer struct {
	q    unsafe.Pointer
	done bool // the status left in-progress
	st   C.int
}

type request struct {
	t          *Transport
	agent      unsafe.Pointer
	rem        *remote
	remoteName string
	locals     []unsafe.Pointer // target registrations
	chunks     []chunk
	aborted    atomic.Bool
	started    time.Time
	once       sync.Once

	mu       sync.Mutex
	xfers    []*xfer // posted so far
	postDone chan struct{}
	postErr  error // set before postDone is closed
	failed   bool
}

// post makes and posts one READ per chunk, stopping at an abort or an
// error. It closes postDone when it stops.
func (r *request) post() {
	defer close(r.postDone)
	cname := C.CString(r.remoteName)
	defer C.free(unsafe.Pointer(cname))
	for _, c := range r.chunks {
		if r.aborted.Load() {
			return
		}
		la, ra := newArrays(len(c.pieces)), newArrays(len(c.pieces))
		for j, p := range c.pieces {
			la.set(j, p.laddr, p.n, p.ldev)
			ra.set(j, p.raddr, p.n, p.rdev)
		}
		var q unsafe.Pointer
		var call *C.char
		st := C.rdtnx_read(r.agent, C.int(c.local), la.addr, la.dev, C.int(c.remote), ra.addr, ra.dev, la.n, la.count, cname, &q, &call)
		la.free()
		ra.free()
		if st != C.RDTNX_SUCCESS && st != C.RDTNX_IN_PROG {
			r.mu.Lock()
			r.failed = true
			r.mu.Unlock()
			r.postErr = callError(transport.ErrTransport, "reading from agent "+r.remoteName, call, st)
			return
		}
		r.mu.Lock()
		r.xfers = append(r.xfers, &xfer{q: q, done: st == C.RDTNX_SUCCESS})
		r.mu.Unlock()
	}
}

// poll checks every posted, unfinished NIXL request once, and reports
// whether everything is done.
func (r *request) poll() (bool, error) {
	posted := false
	select {
	case <-r.postDone:
		posted = true
		if r.postErr != nil {
			return true, r.postErr
		}
	default:
	}
	r.mu.Lock()
	xs := r.xfers
	r.mu.Unlock()
	all := posted
	for _, x := range xs {
		if x.done {
			continue
		}
		st := C.rdtnx_status(r.agent, x.q)
		switch {
		case st == C.RDTNX_IN_PROG:
			all = false
		case st == C.RDTNX_SUCCESS:
			x.done = true
		default:
			x.done, x.st = true, st
			r.mu.Lock()
			r.failed = true
			r.mu.Unlock()
			return true, transport.Errorf(transport.ErrTransport, "nixl: the read from agent %s failed: nixl_capi_get_xfer_status returned %d (%s)", r.remoteName, int(st), statusName(st))
		}
	}
	return all, nil
}

// Completed lets the engine skip a goroutine for transfers done in Fetch.
func (r *request) Completed() bool {
	done, err := r.poll()
	return done || err != nil
}

// Wait polls until every chunk was read, one failed, or the request was
// aborted. It spins briefly, then sleeps with a growing interval.
func (r *request) Wait() error {
	for i := 0; ; i++ {
		if r.aborted.Load() {
			return transport.Errorf(transport.ErrAborted, "nixl: transfer aborted")
		}
		done, err := r.poll()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		pause(i)
	}
}

func pause(i int) {
	switch {
	case i < 64:
		runtime.Gosched()
	case i < 256:
		time.Sleep(20 * time.Microsecond)
	default:
		time.Sleep(200 * time.Microsecond)
	}
}

// Release waits until NIXL no longer works on any read (an aborted one
// included), then releases the requests and the target registrations.
func (r *request) Release() { r.once.Do(r.cleanup) }

func (r *request) cleanup() {
	<-r.postDone // the poster may be inside a synchronous post
	var call *C.char
	for _, x := range r.xfers {
		warned := false
		for i := 0; !x.done; i++ {
			st := C.rdtnx_status(r.agent, x.q)
			if st != C.RDTNX_IN_PROG {
				x.done, x.st = true, st
				if st < 0 {
					r.failed = true
				}
				break
			}
			if !warned && i > 0 && i%5000 == 0 {
				warned = true
				r.t.h.Log().Warnf("nixl: a read from agent %s is still in flight after %v; NIXL cannot cancel it, waiting", r.remoteName, time.Since(r.started).Round(time.Millisecond))
			}
			pause(i)
		}
		if st := C.rdtnx_release(r.agent, x.q, &call); st != C.RDTNX_SUCCESS {
			r.t.h.Log().Warnf("%v", callError(transport.ErrTransport, "releasing a request", call, st))
		}
	}
	r.xfers = nil
	for _, d := range r.locals {
		if st := C.rdtnx_deregister(r.agent, d, &call); st != C.RDTNX_SUCCESS {
			r.t.h.Log().Warnf("%v", callError(transport.ErrTransport, "deregistering the targets", call, st))
		}
		C.rdtnx_dlist_free(d)
	}
	r.locals = nil
	if r.rem != nil {
		if r.failed {
			r.rem.stale.Store(true) // NIXL may have dropped the agent
		}
		r.rem.mu.RUnlock()
		r.rem = nil
	}
}
