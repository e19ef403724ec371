package main

/*
#include "capi.h"
*/
import "C"

import (
	"sync"
	"unsafe"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

//export rdtgo_register_transport
func rdtgo_register_transport(h C.uintptr_t, name *C.char, devices *C.int32_t, ndev C.size_t,
	vt *C.rdt_transport_vtable) C.int {
	// vt is the library's own copy. Only a success hands it (and the user
	// data) to the runtime; on failure rdt_register_transport in abi.c frees
	// both, so no failure path here may keep or free them.
	return guardRuntime("rdt_register_transport", h, func(rt *engine.Runtime) error {
		if name == nil {
			return invalid("name is NULL")
		}
		canon, err := transport.CanonicalName(C.GoString(name))
		if err != nil {
			return err
		}
		if ndev == 0 || devices == nil {
			return invalid("transport %q lists no device types", canon)
		}
		if ndev > C.RDT_MAX_DEVICES {
			return invalid("transport %q lists %d device types, over the limit of %d", canon, ndev, C.RDT_MAX_DEVICES)
		}
		var devs []transport.DeviceType
		for _, d := range unsafe.Slice(devices, int(ndev)) {
			if d <= 0 {
				return invalid("device type %d is not a DLPack device type", d)
			}
			devs = append(devs, transport.DeviceType(d))
		}
		flags := uint32(vt.flags)
		if flags&^uint32(C.RDT_TRANSPORT_ONE_SIDED|C.RDT_TRANSPORT_CAN_ABORT|C.RDT_TRANSPORT_RANGES|C.RDT_TRANSPORT_WRITES) != 0 {
			return invalid("unknown transport flags %#x", flags)
		}
		t := &foreign{name: canon, devices: devs, vt: vt, log: rt.Log(),
			oneSided: flags&C.RDT_TRANSPORT_ONE_SIDED != 0, canAbort: flags&C.RDT_TRANSPORT_CAN_ABORT != 0,
			ranges: flags&C.RDT_TRANSPORT_RANGES != 0, writes: flags&C.RDT_TRANSPORT_WRITES != 0}
		if err := checkVTable(canon, t, vt); err != nil {
			return err
		}
		return rt.RegisterTransport(t)
	})
}

// checkVTable refuses a vtable whose callbacks do not match its flags.
func checkVTable(canon string, t *foreign, vt *C.rdt_transport_vtable) error {
	given := func(p unsafe.Pointer) bool { return p != nil }
	fetch, write, writeStart := given(unsafe.Pointer(vt.fetch)), given(unsafe.Pointer(vt.write)), given(unsafe.Pointer(vt.write_start))
	wait, release := given(unsafe.Pointer(vt.wait)), given(unsafe.Pointer(vt.release_request))
	switch {
	case fetch && !(wait && release):
		return invalid("transport %q: fetch, wait and release_request must be given together", canon)
	case writeStart && !(wait && release):
		return invalid("transport %q: write_start, wait and release_request must be given together", canon)
	case (wait || release) && !fetch && !writeStart:
		return invalid("transport %q: wait and release_request serve the requests of fetch or write_start, and it has neither", canon)
	case !fetch && vt.recv == nil:
		return invalid("transport %q has neither recv nor fetch/wait/release_request", canon)
	case !t.oneSided && vt.send == nil:
		return invalid("transport %q is two-sided but has no send", canon)
	case t.canAbort && vt.abort == nil:
		return invalid("transport %q sets RDT_TRANSPORT_CAN_ABORT but has no abort", canon)
	case t.writes && !t.oneSided:
		return invalid("transport %q sets RDT_TRANSPORT_WRITES without RDT_TRANSPORT_ONE_SIDED: "+
			"a write is one-sided (the owner runs none of the transport's callbacks during it)", canon)
	case t.writes && !write && !writeStart:
		return invalid("transport %q sets RDT_TRANSPORT_WRITES but has neither write nor write_start", canon)
	case !t.writes && (write || writeStart):
		return invalid("transport %q gives write or write_start without setting RDT_TRANSPORT_WRITES", canon)
	}
	return nil
}

//export rdtgo_transport_list
func rdtgo_transport_list(h C.uintptr_t, infos *C.rdt_transport_info, capacity C.size_t, count *C.size_t) C.int {
	return guardList("rdt_transport_list", h, infos, capacity, count,
		func(rt *engine.Runtime) []engine.TransportInfo { return rt.Registry().List() },
		func(ti engine.TransportInfo, o *C.rdt_transport_info) {
			copyName(o.name[:], ti.Name)
			var flags uint32
			for _, f := range []struct {
				set bool
				bit uint32
			}{
				{ti.OneSided, C.RDT_TRANSPORT_ONE_SIDED},
				{ti.CanAbort, C.RDT_TRANSPORT_CAN_ABORT},
				{ti.Builtin, C.RDT_TRANSPORT_BUILTIN},
				{ti.SameHostOnly, C.RDT_TRANSPORT_SAME_HOST_ONLY},
				{ti.Ranges, C.RDT_TRANSPORT_RANGES},
				{ti.Writes, C.RDT_TRANSPORT_WRITES},
			} {
				if f.set {
					flags |= f.bit
				}
			}
			o.flags = C.uint32_t(flags)
			n := min(len(ti.Devices), C.RDT_MAX_DEVICES)
			o.num_devices = C.uint32_t(n)
			for j := 0; j < n; j++ {
				o.devices[j] = C.int32_t(ti.Devices[j])
			}
			o.transfers_completed = C.uint64_t(ti.TransfersCompleted)
			o.transfers_failed = C.uint64_t(ti.TransfersFailed)
			o.bytes_received = C.uint64_t(ti.BytesReceived)
			o.sends_completed = C.uint64_t(ti.SendsCompleted)
			o.bytes_sent = C.uint64_t(ti.BytesSent)
			o.auto_rank_host = C.uint32_t(max(ti.Auto.Host, 0))
			o.auto_rank_cuda = C.uint32_t(max(ti.Auto.CUDA, 0))
			o.writes_completed = C.uint64_t(ti.WritesCompleted)
			o.writes_failed = C.uint64_t(ti.WritesFailed)
			o.bytes_written = C.uint64_t(ti.BytesWritten)
		})
}

//export rdtgo_transport_list_unavailable
func rdtgo_transport_list_unavailable(h C.uintptr_t, infos *C.rdt_unavailable_transport, capacity C.size_t, count *C.size_t) C.int {
	return guardList("rdt_transport_list_unavailable", h, infos, capacity, count,
		func(rt *engine.Runtime) []engine.Unavailable { return rt.Registry().Unavailable() },
		func(u engine.Unavailable, o *C.rdt_unavailable_transport) {
			o.status = C.int32_t(transport.StatusOf(u.Reason))
			copyName(o.name[:], u.Name)
			copyName(o.reason[:], u.Reason.Error())
		})
}

// guardList is guardRuntime for the calls that copy a list of the
// runtime's into the caller's array: it reports the list's length in
// *count and fills the first min(length, capacity) entries of out, one
// per item (capacity 0: the caller only asks how many).
func guardList[I, O any](fn string, h C.uintptr_t, out *O, capacity C.size_t, count *C.size_t,
	list func(*engine.Runtime) []I, fill func(item I, o *O)) C.int {
	return guardRuntime(fn, h, func(rt *engine.Runtime) error {
		items := list(rt)
		*count = C.size_t(len(items))
		if capacity == 0 {
			return nil
		}
		dst := unsafe.Slice(out, int(capacity))
		for i, item := range items[:min(len(items), len(dst))] {
			fill(item, &dst[i])
		}
		return nil
	})
}

// foreign is a transport implemented by the application through a C
// vtable. It is a transport.Transport like any built-in one.
type foreign struct {
	name               string
	devices            []transport.DeviceType
	oneSided, canAbort bool
	ranges, writes     bool
	vt                 *C.rdt_transport_vtable // C memory, freed at Close
	log                *transport.Logger       // the runtime's, at its RDT_LOG level
	closeOnce          sync.Once
}

// Describe is read from the vtable's flags at registration. A foreign
// transport is only used when named (no automatic rank, no group backend),
// and the engine checks nothing for it that the C ABI cannot express. It
// implements transport.Writer; the engine uses that only when Writes is set.
func (f *foreign) Describe() transport.Descriptor {
	return transport.Descriptor{Name: f.name, Devices: f.devices, OneSided: f.oneSided, CanAbort: f.canAbort,
		Ranges: f.ranges, Writes: f.writes}
}

// callbackError turns a callback's status and message into an error.
func (f *foreign) callbackError(callback string, st C.rdt_status, msg *C.char) error {
	if st == C.RDT_OK {
		return nil
	}
	text := "no message (call rdt_set_error() in the callback to give one)"
	if msg != nil {
		text = C.GoString(msg)
		C.free(unsafe.Pointer(msg))
	}
	code := transport.Status(st)
	if code > 0 || (code > transport.ErrUser && !code.Known()) {
		code = transport.ErrUser // not an rdt status: the callback's own code
	}
	return transport.Errorf(code, "%s failed (%s): %s", callback, code, text) // the core prefixes the transport name
}

// cTransfer is a transfer description for callbacks, in C memory with its
// strings.
type cTransfer struct {
	x       *C.rdt_transfer
	strings []*C.char
	ranges  *C.rdt_range // a partial fetch's, in C memory
}

func newCTransfer(x *transport.Transfer) *cTransfer {
	c := &cTransfer{x: (*C.rdt_transfer)(C.calloc(1, C.size_t(unsafe.Sizeof(C.rdt_transfer{}))))}
	if c.x == nil {
		panic("rdt: out of memory")
	}
	str := func(s string) *C.char {
		p := C.CString(s)
		c.strings = append(c.strings, p)
		return p
	}
	c.x.struct_size = C.uint32_t(unsafe.Sizeof(*c.x))
	c.x.role = C.uint32_t(x.Role)
	c.x.object_id = str(x.Object.String())
	c.x.transfer_id = C.uint64_t(x.TransferID)
	c.x.transport = str(x.Transport)
	c.x.source_runtime = str(x.Source.RuntimeID.String())
	c.x.source_address = str(x.Source.Address)
	c.x.destination_runtime = str(x.Destination.RuntimeID.String())
	c.x.destination_address = str(x.Destination.Address)
	if x.Pieces != nil {
		c.ranges = (*C.rdt_range)(C.calloc(C.size_t(max(1, len(x.Pieces))), C.size_t(unsafe.Sizeof(C.rdt_range{}))))
		if c.ranges == nil {
			panic("rdt: out of memory")
		}
		for i, p := range x.Pieces {
			r := (*C.rdt_range)(unsafe.Add(unsafe.Pointer(c.ranges), i*int(unsafe.Sizeof(*c.ranges))))
			r.tensor, r.offset, r.length = C.uint32_t(p.Tensor), C.uint64_t(p.Offset), C.uint64_t(p.Length)
		}
		c.x.ranges, c.x.num_ranges = c.ranges, C.size_t(len(x.Pieces))
	}
	return c
}

func (c *cTransfer) free() {
	for _, p := range c.strings {
		C.free(unsafe.Pointer(p))
	}
	c.strings = nil
	C.free(unsafe.Pointer(c.ranges))
	c.ranges = nil
	C.free(unsafe.Pointer(c.x))
	c.x = nil
}

// bytesArg passes borrowed metadata bytes to C. C must not keep them.
func bytesArg(b []byte) (unsafe.Pointer, C.size_t) {
	if len(b) == 0 {
		return nil, 0
	}
	return unsafe.Pointer(&b[0]), C.size_t(len(b))
}

// takeBuffer copies a callback's output buffer into Go and frees it.
func takeBuffer(buf *C.struct_rdt_buffer) []byte {
	if buf.data == nil {
		return []byte{}
	}
	b := C.GoBytes(buf.data, C.int(buf.size))
	C.free(buf.data)
	buf.data, buf.size = nil, 0
	return b
}

func (f *foreign) ExtractMetadata(obj transport.ObjectID, tensors []transport.Tensor) ([]byte, error) {
	if f.vt.extract_metadata == nil {
		return []byte{}, nil
	}
	ts := newCTensors(tensors)
	defer ts.free()
	oid := C.CString(obj.String())
	defer C.free(unsafe.Pointer(oid))
	buf := (*C.struct_rdt_buffer)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_rdt_buffer{}))))
	defer C.free(unsafe.Pointer(buf))
	var msg *C.char
	st := C.rdtc_cb_extract(f.vt, oid, ts.arr, ts.n, buf, &msg)
	out := takeBuffer(buf)
	if err := f.callbackError("extract_metadata", st, msg); err != nil {
		return nil, err
	}
	return out, nil
}

func (f *foreign) CommunicatorMetadata(x *transport.Transfer) ([]byte, error) {
	if f.vt.communicator_metadata == nil {
		return []byte{}, nil
	}
	cx := newCTransfer(x)
	defer cx.free()
	buf := (*C.struct_rdt_buffer)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_rdt_buffer{}))))
	defer C.free(unsafe.Pointer(buf))
	var msg *C.char
	st := C.rdtc_cb_comm(f.vt, cx.x, buf, &msg)
	out := takeBuffer(buf)
	if err := f.callbackError("communicator_metadata", st, msg); err != nil {
		return nil, err
	}
	return out, nil
}

func (f *foreign) Send(x *transport.Transfer, tensors []transport.Tensor, tmeta, cmeta []byte) error {
	cx := newCTransfer(x)
	defer cx.free()
	ts := newCTensors(tensors)
	defer ts.free()
	tm, tms := bytesArg(tmeta)
	cm, cms := bytesArg(cmeta)
	var msg *C.char
	st := C.rdtc_cb_send(f.vt, cx.x, ts.arr, ts.n, tm, tms, cm, cms, &msg)
	return f.callbackError("send", st, msg)
}

// foreignRequest is an in-progress receive or write of a foreign
// transport: either its own request (fetch or write_start, then wait) or a
// synchronous recv or write running on a goroutine. The C copies of the
// transfer and tensors live until Release.
type foreignRequest struct {
	f       *foreign
	x       *cTransfer
	tensors *cTensors // the targets of a receive, the sources of a write
	tmeta   []byte    // kept reachable: C borrows them during recv and write
	cmeta   []byte
	req     C.uintptr_t       // the transport's opaque request: any bits, so never a Go pointer type
	sync    transport.Request // the goroutine running recv or write
}

func (f *foreign) Fetch(x *transport.Transfer, targets []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	return f.start(x, targets, tmeta, cmeta)
}

// Write implements transport.Writer: write_start's request, or write run
// on a goroutine.
func (f *foreign) Write(x *transport.Transfer, sources []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	if !f.writes {
		return nil, transport.Errorf(transport.ErrUnsupported, "transport %s was registered without RDT_TRANSPORT_WRITES", f.name)
	}
	return f.start(x, sources, tmeta, cmeta)
}

// start begins a transfer of tensors the way x.Direction says: a receive
// (fetch, else recv) or a write (write_start, else write).
func (f *foreign) start(x *transport.Transfer, tensors []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	r := &foreignRequest{f: f, x: newCTransfer(x), tensors: newCTensors(tensors), tmeta: tmeta, cmeta: cmeta}
	dir := x.Direction
	if !f.startsRequests(dir) {
		r.sync = transport.RecvFunc(func() error { return r.call(dir) })
		return r, nil
	}
	reqSlot := (*C.uintptr_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.uintptr_t(0)))))
	if reqSlot == nil {
		r.x.free()
		r.tensors.free()
		return nil, transport.Errorf(transport.ErrNoMemory, "out of memory")
	}
	defer C.free(unsafe.Pointer(reqSlot))
	if err := r.begin(dir, reqSlot); err != nil {
		r.x.free()
		r.tensors.free()
		return nil, err
	}
	r.req = *reqSlot
	return r, nil
}

// startsRequests reports whether the vtable starts requests (then waited
// for) in direction dir: it has fetch, or write_start for a write.
func (f *foreign) startsRequests(dir transport.Direction) bool {
	if dir == transport.Write {
		return f.vt.write_start != nil
	}
	return f.vt.fetch != nil
}

// call runs the synchronous callback of direction dir, recv or write.
func (r *foreignRequest) call(dir transport.Direction) error {
	tm, tms := bytesArg(r.tmeta)
	cm, cms := bytesArg(r.cmeta)
	var msg *C.char
	if dir == transport.Write {
		st := C.rdtc_cb_write(r.f.vt, r.x.x, r.tensors.arr, r.tensors.n, tm, tms, cm, cms, &msg)
		return r.f.callbackError("write", st, msg)
	}
	st := C.rdtc_cb_recv(r.f.vt, r.x.x, r.tensors.arr, r.tensors.n, tm, tms, cm, cms, &msg)
	return r.f.callbackError("recv", st, msg)
}

// begin runs the callback that starts a request of direction dir, fetch
// or write_start, which leaves its request in slot.
func (r *foreignRequest) begin(dir transport.Direction, slot *C.uintptr_t) error {
	tm, tms := bytesArg(r.tmeta)
	cm, cms := bytesArg(r.cmeta)
	var msg *C.char
	if dir == transport.Write {
		st := C.rdtc_cb_write_start(r.f.vt, r.x.x, r.tensors.arr, r.tensors.n, tm, tms, cm, cms, slot, &msg)
		return r.f.callbackError("write_start", st, msg)
	}
	st := C.rdtc_cb_fetch(r.f.vt, r.x.x, r.tensors.arr, r.tensors.n, tm, tms, cm, cms, slot, &msg)
	return r.f.callbackError("fetch", st, msg)
}

func (r *foreignRequest) Wait() error {
	if r.sync != nil {
		return r.sync.Wait()
	}
	var msg *C.char
	st := C.rdtc_cb_wait(r.f.vt, r.req, -1, &msg)
	return r.f.callbackError("wait", st, msg)
}

func (r *foreignRequest) Release() {
	if r.sync == nil {
		C.rdtc_cb_release_request(r.f.vt, r.req)
	}
	r.x.free()
	r.tensors.free()
}

func (f *foreign) GarbageCollect(obj transport.ObjectID, tensors []transport.Tensor, tmeta []byte) {
	if f.vt.garbage_collect == nil {
		return
	}
	ts := newCTensors(tensors)
	defer ts.free()
	oid := C.CString(obj.String())
	defer C.free(unsafe.Pointer(oid))
	tm, tms := bytesArg(tmeta)
	C.rdtc_cb_gc(f.vt, oid, ts.arr, ts.n, tm, tms)
}

func (f *foreign) Abort(x *transport.Transfer, req transport.Request) {
	if f.vt.abort == nil {
		return
	}
	var cx *C.rdt_transfer
	var creq C.uintptr_t
	if r, ok := req.(*foreignRequest); ok {
		cx, creq = r.x.x, r.req
	} else {
		tmp := newCTransfer(x)
		defer tmp.free()
		cx = tmp.x
	}
	var msg *C.char
	if err := f.callbackError("abort", C.rdtc_cb_abort(f.vt, cx, creq, &msg), msg); err != nil {
		f.log.Warnf("%v", err)
	}
}

func (f *foreign) Close() error {
	f.closeOnce.Do(func() {
		C.rdtc_call_free_user_data(f.vt)
		C.free(unsafe.Pointer(f.vt))
	})
	return nil
}
