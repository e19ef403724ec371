package cudaipc

import (
	"runtime"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

func (t *Transport) CommunicatorMetadata(x *transport.Transfer) ([]byte, error) { return nil, nil }

// stream picks one of dev's streams, creating them on first use.
func (t *Transport) stream(dev int) (*cuda.Stream, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, transport.Errorf(transport.ErrClosed, "the transport is closed")
	}
	ss := t.streams[dev]
	if ss == nil {
		ss = &streamSet{}
		for i := 0; i < streamsPerDevice; i++ {
			s, err := cuda.NewStream(dev)
			if err != nil {
				for _, s := range ss.s {
					_ = s.Destroy()
				}
				return nil, err
			}
			ss.s = append(ss.s, s)
		}
		t.streams[dev] = ss
	}
	return ss.s[int(ss.next.Add(1))%len(ss.s)], nil
}

func (t *Transport) event(dev int) (*cuda.Event, error) {
	t.mu.Lock()
	if evs := t.events[dev]; len(evs) > 0 {
		e := evs[len(evs)-1]
		t.events[dev] = evs[:len(evs)-1]
		t.mu.Unlock()
		return e, nil
	}
	t.mu.Unlock()
	e, err := cuda.NewEvent(dev)
	return e, err
}

func (t *Transport) putEvent(dev int, e *cuda.Event) {
	t.mu.Lock()
	if !t.closed && len(t.events[dev]) < 64 {
		t.events[dev] = append(t.events[dev], e)
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	_ = e.Destroy()
}

// devicePair groups the copies that go from one source device to one
// target device: one enqueue, one event.
type devicePair struct{ dst, src int }

// Fetch checks the metadata against the targets, maps the source
// allocations the targets read from (or finds them in the cache) and
// enqueues the copies: each target receives its piece, or its tensor whole.
func (t *Transport) Fetch(x *transport.Transfer, targets []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	return t.start(x, targets, tmeta)
}

// start is Fetch and Write: local are the targets of a fetch, the sources
// of a write (x.Direction).
func (t *Transport) start(x *transport.Transfer, local []transport.Tensor, tmeta []byte) (transport.Request, error) {
	if err := t.checkOpen(); err != nil {
		return nil, err
	}
	m, err := decodeMetadata(tmeta)
	if err != nil {
		return nil, err
	}
	if err := t.checkLocal(x, m, local); err != nil {
		return nil, err
	}
	req := &request{t: t, aborted: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			req.drain()
		}
	}()
	remote, err := t.openSources(req, x, m, local)
	if err != nil {
		return nil, err
	}
	plan, err := planCopies(x, m, local, remote)
	if err != nil {
		return nil, err
	}
	req.small = plan.bytes <= inlineMax
	if err := t.enqueue(req, local, plan); err != nil {
		return nil, err
	}
	req.startHost()
	ok = true
	return req, nil
}

// A fetch of at most inlineMax bytes ends on the caller's goroutine when it
// can: its copies into host memory run inside Fetch (at most inlineMax of
// pageable copy, tens of microseconds, which no deadline needs to
// interrupt), and Completed waits up to inlineBudget for its device copies.
// Small copies end in microseconds; handing them to the engine's waiting
// goroutine instead costs more than the copy (its wake-ups and hand-offs
// were most of a 4 KiB GPU get).
const inlineMax = 256 << 10

var inlineBudget = 200 * time.Microsecond // a variable for tests on slow machines

// checkLocal checks that the local tensors match what the metadata
// describes (the tensors, or the pieces of them x names), and that every
// one that moves bytes is where the transfer's direction needs it: a
// fetch's targets (checkTarget), a write's sources (checkSource).
func (t *Transport) checkLocal(x *transport.Transfer, m *metadata, local []transport.Tensor) error {
	if err := x.CheckPieces(local, len(m.Tensors), func(i int) uint64 { return m.Tensors[i].Nbytes }); err != nil {
		return err
	}
	check := t.checkTarget
	if x.Direction == transport.Write {
		check = t.checkSource
	}
	for i, tg := range local {
		if tg.Nbytes == 0 {
			continue
		}
		if err := check(i, tg); err != nil {
			return err
		}
	}
	return nil
}

// checkTarget checks that a fetch's target is on a CUDA device this
// transport may use, or in host memory.
func (t *Transport) checkTarget(i int, tg transport.Tensor) error {
	switch {
	case tg.Device.Type.HostAccessible():
		return nil // copied from the device with unified addressing
	case tg.Device.Type != transport.DeviceCUDA:
		return transport.Errorf(transport.ErrUnsupported, "it copies into CUDA device or host memory; target %d is on %s", i, tg.Device)
	}
	return t.checkDevice("target", i, tg.Device)
}

// A source allocation is opened on the device of the local tensor that
// reads it (a fetch's target) or writes it (a write's source): the bytes
// move within one context, and the receiver needs neither to see the
// source's GPU (under Ray each process sees its own only) nor to make a
// context on it (hundreds of MiB each). The driver maps a handle in a
// context of any device with peer access to the exporting one. A host
// target opens it on a device the process already has a context on
// (hostDevice). The same allocation read from two devices is opened on
// each.

// opening is a source allocation opened on a device of this process.
type opening struct {
	alloc uint32
	dev   int
}

// mapped is where an opening is readable: at base, an address of device
// dev's context (dev is the opening's device, or the source's own device
// for a source in this very process).
type mapped struct {
	dev  int
	base cuda.Ptr
}

// sources is where each opening of a transfer is readable, and on which
// device each local tensor reads or writes its allocation.
type sources struct {
	at  map[opening]mapped
	dev []int // per local tensor: the device of its opening (-1: it moves nothing)
}

// sourceDevice is the source allocation's GPU as this process numbers it,
// and the device its host targets open it on (-1 until asked).
type sourceDevice struct {
	dev     int
	visible bool
	forHost int
}

// openSources opens every allocation of the owner's object that a local
// tensor moves bytes from or into, on that tensor's device (from the
// cache when it was opened there before, under the owner's runtime; an
// owner in this very process needs no mapping: its addresses are ours).
// The mappings are added to req's entries, so that req.drain hands them
// back.
func (t *Transport) openSources(req *request, x *transport.Transfer, m *metadata, local []transport.Tensor) (sources, error) {
	sameProcess := int(m.Pid) == t.pid && m.Token == procToken
	src := sources{at: map[opening]mapped{}, dev: make([]int, len(local))}
	found := map[uint32]sourceDevice{}
	for i, tg := range local {
		src.dev[i] = -1
		pc := x.PieceOf(i, tg)
		if pc.Length == 0 {
			continue // an empty piece or tensor lies in no allocation
		}
		ai := m.Tensors[pc.Tensor].Alloc
		a := &m.Allocs[ai]
		sd, ok := found[ai]
		if !ok {
			dev, visible, err := cuda.DeviceByUUID(a.Device)
			if err != nil {
				return src, err
			}
			sd = sourceDevice{dev: dev, visible: visible, forHost: -1}
			found[ai] = sd
		}
		if sameProcess {
			if !sd.visible { // cannot be: it is our own memory
				return src, transport.Errorf(transport.ErrInvalidArgument, "the source's GPU %s, in this very process, is not among its devices", a.Device)
			}
			o := opening{alloc: ai, dev: sd.dev}
			src.at[o] = mapped{dev: sd.dev, base: cuda.Ptr(a.Base)}
			src.dev[i] = sd.dev
			continue
		}
		dev := int(tg.Device.ID)
		if tg.Device.Type.HostAccessible() {
			if sd.forHost < 0 {
				d, err := hostDevice(sd)
				if err != nil {
					return src, err
				}
				sd.forHost = d
				found[ai] = sd
			}
			dev = sd.forHost
		} else if sd.visible && dev != sd.dev {
			can, err := cuda.CanAccessPeer(dev, sd.dev)
			if err != nil {
				return src, err
			}
			if !can {
				p := devicePair{dst: dev, src: sd.dev}
				if x.Direction == transport.Write {
					p = devicePair{dst: sd.dev, src: dev}
				}
				return src, noPeerAccess(m, ai, pc.Tensor, i, p, x.Direction)
			}
		}
		src.dev[i] = dev
		o := opening{alloc: ai, dev: dev}
		if _, ok := src.at[o]; ok {
			continue
		}
		if !transport.ProcessAlive(int(m.Pid)) {
			return src, transport.Errorf(transport.ErrPeerUnavailable, "source process %d is gone", m.Pid)
		}
		var e *entry
		var err error
		if a.Chunks != nil {
			e, err = t.cache.acquireWith(cacheKey{source: x.Owner().RuntimeID, chunks: vmmKey(a), dev: dev}, int(m.Pid),
				func() (cuda.Ptr, func() error, error) { return openVMM(int(m.Pid), a, dev) })
			if err != nil {
				if !transport.ProcessAlive(int(m.Pid)) {
					return src, transport.Errorf(transport.ErrPeerUnavailable, "source process %d is gone (%v)", m.Pid, err)
				}
				if _, ok := err.(*cuda.Error); !ok {
					return src, err // pidfdError's explanation
				}
				return src, transport.Wrap(err, "mapping the source's %d chunks of virtual memory management on cuda:%d (%s; the source's GPU is %s)", len(a.Chunks), dev, uuidOf(dev), a.Device)
			}
			req.entries = append(req.entries, e)
			src.at[o] = mapped{dev: dev, base: e.ptr}
			continue
		}
		e, err = t.cache.acquire(cacheKey{source: x.Owner().RuntimeID, handle: a.Handle, dev: dev}, int(m.Pid))
		if err != nil {
			if !transport.ProcessAlive(int(m.Pid)) {
				return src, transport.Errorf(transport.ErrPeerUnavailable, "source process %d is gone (%v)", m.Pid, err)
			}
			if !sd.visible {
				return src, transport.Wrap(err, "opening the source's allocation on cuda:%d (%s, %s) failed; the source's GPU %s is not visible in this process, so whether cuda:%d has peer access to it could not be checked first; without peer access between the two GPUs, %s over another transport",
					dev, cuda.DeviceName(dev), uuidOf(dev), a.Device, dev, x.Direction.Verb())
			}
			return src, transport.Wrap(err, "opening the source's allocation on cuda:%d (%s; the source's GPU is %s)", dev, uuidOf(dev), a.Device)
		}
		req.entries = append(req.entries, e)
		src.at[o] = mapped{dev: dev, base: e.ptr}
	}
	return src, nil
}

// hostDevice is the device whose context opens a source allocation that
// lands in host memory: the source's GPU when this process sees it and
// already has a context there; else the first device it has a context on
// that has peer access to the source's GPU (when it cannot see that GPU,
// access is not known before opening: the first device it has a context
// on); else the source's GPU when it sees it; else its first device. So a
// process makes no new context for it when it has one that serves.
func hostDevice(sd sourceDevice) (int, error) {
	if sd.visible {
		active, err := cuda.PrimaryContextActive(sd.dev)
		if err != nil || active {
			return sd.dev, err
		}
	}
	n, err := cuda.DeviceCount()
	if err != nil {
		return 0, err
	}
	for d := 0; d < n; d++ {
		active, err := cuda.PrimaryContextActive(d)
		if err != nil {
			return 0, err
		}
		if !active {
			continue
		}
		if !sd.visible {
			return d, nil
		}
		if can, err := cuda.CanAccessPeer(d, sd.dev); err != nil || can {
			return d, err
		}
	}
	if sd.visible {
		return sd.dev, nil
	}
	return 0, nil
}

// uuidOf is device dev's UUID as text ("" if it cannot be read).
func uuidOf(dev int) string {
	u, err := cuda.DeviceUUID(dev)
	if err != nil {
		return ""
	}
	return u.String()
}

// copyPlan is a transfer's copies grouped by pair of devices, in the order
// the pairs first appear among the tensors.
type copyPlan struct {
	order   []devicePair
	copies  map[devicePair][]cuda.Copy
	targets map[devicePair][]int // the local tensors each pair's copies move
	bytes   uint64               // in all
}

// planCopies groups the copy of every local tensor that moves bytes by pair
// of devices: into a fetch's target from its piece of the source
// allocation, or from a write's source into its piece of the exposed
// allocation, on a stream of the device the allocation was opened on (the
// local tensor's). Only a source in this very process has its allocation
// on another device than a local tensor: devices that differ then need
// peer access. A piece starts at its offset in its tensor, which lies at
// the tensor's offset in its allocation.
func planCopies(x *transport.Transfer, m *metadata, local []transport.Tensor, remote sources) (copyPlan, error) {
	plan := copyPlan{copies: map[devicePair][]cuda.Copy{}, targets: map[devicePair][]int{}}
	for i, tg := range local {
		pc := x.PieceOf(i, tg)
		if pc.Length == 0 {
			continue
		}
		tr := m.Tensors[pc.Tensor]
		mp := remote.at[opening{alloc: tr.Alloc, dev: remote.dev[i]}]
		there := mp.base + tr.Offset + pc.Offset
		c := cuda.Copy{Dst: cuda.Ptr(tg.Data), Src: there, N: pc.Length}
		p := devicePair{dst: int(tg.Device.ID), src: mp.dev}
		switch {
		case x.Direction == transport.Write:
			c.Dst, c.Src = there, cuda.Ptr(tg.Data)
			p = devicePair{dst: mp.dev, src: int(tg.Device.ID)}
		case tg.Device.Type.HostAccessible():
			// Into host memory: on the opening device's stream, with
			// cuMemcpyAsync working out the kinds of memory.
			p = devicePair{dst: mp.dev, src: -1}
		}
		if p.src >= 0 && p.dst != p.src {
			can, err := cuda.CanAccessPeer(p.dst, p.src)
			if err != nil {
				return plan, err
			}
			if !can {
				return plan, noPeerAccess(m, tr.Alloc, pc.Tensor, i, p, x.Direction)
			}
		}
		if _, ok := plan.copies[p]; !ok {
			plan.order = append(plan.order, p)
		}
		plan.copies[p] = append(plan.copies[p], c)
		plan.targets[p] = append(plan.targets[p], i)
		plan.bytes += c.N
	}
	return plan, nil
}

// noPeerAccess explains a copy between two devices without peer access,
// naming the device the local tensor should be on.
func noPeerAccess(m *metadata, alloc, tensor uint32, i int, p devicePair, dir transport.Direction) error {
	if dir == transport.Write {
		return transport.Errorf(transport.ErrUnsupported, "source %d is on cuda:%d (%s) and tensor %d of the exposed object on cuda:%d (%s, %s), and these devices have no peer access; write from a tensor on cuda:%d",
			i, p.src, cuda.DeviceName(p.src), tensor, p.dst, cuda.DeviceName(p.dst), m.Allocs[alloc].Device, p.dst)
	}
	return transport.Errorf(transport.ErrUnsupported, "tensor %d is on the source's cuda:%d (%s, %s) and target %d on cuda:%d (%s), and these devices have no peer access; fetch into a tensor on cuda:%d",
		tensor, p.src, cuda.DeviceName(p.src), m.Allocs[alloc].Device, i, p.dst, cuda.DeviceName(p.dst), p.src)
}

// enqueue enqueues each pair's copies on a stream of the target device,
// followed by an event that req waits for. When an enqueue fails, the
// copies it did enqueue finish before the error returns. Copies into host
// memory are left to req.startHost.
func (t *Transport) enqueue(req *request, targets []transport.Tensor, plan copyPlan) error {
	for _, p := range plan.order {
		if p.src < 0 {
			req.host = append(req.host, hostJob{dev: p.dst, copies: plan.copies[p], targets: plan.targets[p]})
			continue
		}
		s, err := t.stream(p.dst)
		if err != nil {
			return err
		}
		ev, err := t.event(p.dst)
		if err != nil {
			return err
		}
		n, err := cuda.CopyAsync(p.dst, p.src, s, plan.copies[p], ev)
		if err != nil {
			if n > 0 {
				// Some copies were enqueued: let them finish before the
				// targets are handed back.
				_ = s.Synchronize()
			}
			t.putEvent(p.dst, ev)
			if terr := checkTargets(targets, plan.targets[p]); terr != nil {
				return terr
			}
			if p.src < 0 {
				return transport.Wrap(err, "copying from cuda:%d into host memory", p.dst)
			}
			return transport.Wrap(err, "copying from cuda:%d to cuda:%d", p.src, p.dst)
		}
		req.events = append(req.events, ev)
	}
	return nil
}

// checkTargets explains a copy the driver refused when one of the CUDA
// targets idx is not what it says: memory CUDA does not know (host memory
// described as CUDA), or memory of another device. It asks only after a
// failure, so that fetches pay nothing for it; nil when the targets look
// right.
func checkTargets(targets []transport.Tensor, idx []int) error {
	for _, i := range idx {
		x := targets[i]
		if x.Device.Type != transport.DeviceCUDA || x.Nbytes == 0 {
			continue
		}
		info, err := cuda.GetPointerInfo(int(x.Device.ID), cuda.Ptr(x.Data))
		switch {
		case err != nil:
			return transport.Errorf(transport.ErrInvalidArgument, "target %d at %#x, described as %s, is not CUDA memory this process knows (%v)", i, x.Data, x.Device, err)
		case info.MemoryType != cuda.MemoryDevice:
			return transport.Errorf(transport.ErrInvalidArgument, "target %d at %#x, described as %s, is not device memory (CUDA memory type %d)", i, x.Data, x.Device, info.MemoryType)
		case info.Device != int(x.Device.ID):
			return transport.Errorf(transport.ErrInvalidArgument, "target %d is described as %s but its memory is on cuda:%d", i, x.Device, info.Device)
		}
	}
	return nil
}

// Abort makes Wait return ErrAborted at once. Copies already enqueued on a
// stream cannot be cancelled: Release waits for them (and for the chunk
// being copied into host memory; no later chunk starts), so nothing writes
// into the targets once the engine has released the request.
func (t *Transport) Abort(x *transport.Transfer, r transport.Request) {
	if req, ok := r.(*request); ok {
		req.abort()
	}
}

// CopyLocal copies tensors within this process (a runtime fetching its own
// CUDA object), synchronously.
func (t *Transport) CopyLocal(dst, src []transport.Tensor) error {
	if len(dst) != len(src) {
		return transport.Errorf(transport.ErrInvalidArgument, "%d targets for %d tensors", len(dst), len(src))
	}
	req := &request{t: t, aborted: make(chan struct{})}
	defer req.Release()
	for i := range src {
		if src[i].Nbytes != dst[i].Nbytes {
			return transport.Errorf(transport.ErrInvalidArgument, "tensor %d is %d bytes, the target holds %d", i, src[i].Nbytes, dst[i].Nbytes)
		}
		if src[i].Nbytes == 0 {
			continue
		}
		for _, side := range []struct {
			what string
			x    transport.Tensor
		}{{"tensor", src[i]}, {"target", dst[i]}} {
			if side.x.Device.Type == transport.DeviceCUDA {
				if err := t.checkDevice(side.what, i, side.x.Device); err != nil {
					return err
				}
			}
		}
		// Device to device on one device or between two; anything with host
		// memory on one side goes through cuMemcpyAsync's unified addressing.
		dev, from := int(dst[i].Device.ID), int(src[i].Device.ID)
		switch {
		case dst[i].Device.Type != transport.DeviceCUDA:
			dev, from = from, -1
		case src[i].Device.Type != transport.DeviceCUDA:
			from = -1
		case dev != from:
			can, err := cuda.CanAccessPeer(dev, from)
			if err != nil {
				return err
			}
			if !can {
				from = -1 // unified addressing stages the copy itself
			}
		}
		s, err := t.stream(dev)
		if err != nil {
			return err
		}
		ev, err := t.event(dev)
		if err != nil {
			return err
		}
		n, err := cuda.CopyAsync(dev, from, s, []cuda.Copy{{Dst: cuda.Ptr(dst[i].Data), Src: cuda.Ptr(src[i].Data), N: src[i].Nbytes}}, ev)
		if err != nil {
			if n > 0 {
				_ = s.Synchronize()
			}
			t.putEvent(dev, ev)
			if terr := checkTargets(dst, []int{i}); terr != nil {
				return terr
			}
			return transport.Wrap(err, "local copy of tensor %d", i)
		}
		req.events = append(req.events, ev)
	}
	return req.Wait()
}

// hostChunk bounds each copy into host memory. The driver copies from a
// device into pageable host memory inside the call: it returns only once
// the bytes are there, and nothing interrupts it, neither an event poll
// nor a deadline. So a fetch copies into host memory in chunks of at most
// this size, on a goroutine of its own, and looks for an abort (which is
// how a deadline ends a transfer) between two: the fetch ends within a
// chunk's copy of its abort. 16 MiB is a few milliseconds at the speed of
// pageable copies, and big enough that the cost of a call per chunk does
// not show. A variable for tests.
var hostChunk uint64 = 16 << 20

// hostJob is the copies of a fetch from one device into host memory.
type hostJob struct {
	dev     int
	copies  []cuda.Copy
	targets []int // the local tensors they fill
}

// event is what a request polls; *cuda.Event in production.
type event interface {
	Query() (bool, error)
}

// request is one fetch in flight: an event per device pair, recorded after
// the copies, the copies into host memory running on their own goroutine,
// and the cache entries the copies read from.
type request struct {
	t       *Transport
	events  []*cuda.Event
	entries []*entry

	host     []hostJob
	hostDone chan struct{} // closed when the host copies ended (nil: none)
	hostErr  error         // their outcome, set before hostDone closes

	abortOnce sync.Once
	aborted   chan struct{}
	released  bool

	small bool // at most inlineMax bytes: see inlineBudget
	spun  bool // Completed waited its budget once
}

// startHost starts the copies into host memory, if the fetch has any: on
// a goroutine of their own, or here for a small fetch.
func (r *request) startHost() {
	if len(r.host) == 0 {
		return
	}
	r.hostDone = make(chan struct{})
	if r.small {
		r.hostErr = r.copyToHost()
		close(r.hostDone)
		return
	}
	go func() {
		defer close(r.hostDone)
		r.hostErr = r.copyToHost()
	}()
}

// copyToHost runs the host jobs chunk by chunk, each chunk on a stream of
// the job's device and waited for before the next starts (into pageable
// memory the driver is done when the call returns; into pinned memory the
// event says when). An abort stops it between two chunks.
func (r *request) copyToHost() error {
	for _, job := range r.host {
		if err := r.copyJob(job); err != nil {
			return err
		}
	}
	return nil
}

func (r *request) copyJob(job hostJob) error {
	t := r.t
	s, err := t.stream(job.dev)
	if err != nil {
		return err
	}
	ev, err := t.event(job.dev)
	if err != nil {
		return err
	}
	defer t.putEvent(job.dev, ev)
	for _, c := range job.copies {
		for off := uint64(0); off < c.N; off += hostChunk {
			select {
			case <-r.aborted:
				return errAborted()
			default:
			}
			chunk := cuda.Copy{Dst: c.Dst + off, Src: c.Src + off, N: min(hostChunk, c.N-off)}
			n, err := cuda.CopyAsync(job.dev, -1, s, []cuda.Copy{chunk}, ev)
			if err != nil {
				if n > 0 {
					_ = s.Synchronize()
				}
				return transport.Wrap(err, "copying from cuda:%d into host memory", job.dev)
			}
			if err := waitEvents([]event{ev}, nil); err != nil {
				return transport.Wrap(err, "copying from cuda:%d into host memory", job.dev)
			}
		}
	}
	return nil
}

func errAborted() error {
	return transport.Errorf(transport.ErrAborted, "transfer aborted (the copy already enqueued finishes before the targets are released)")
}

// hostEnded reports whether the host copies, if any, have ended.
func (r *request) hostEnded() bool {
	if r.hostDone == nil {
		return true
	}
	select {
	case <-r.hostDone:
		return true
	default:
		return false
	}
}

func (r *request) abort() { r.abortOnce.Do(func() { close(r.aborted) }) }

func (r *request) evs() []event {
	out := make([]event, len(r.events))
	for i, e := range r.events {
		out[i] = e
	}
	return out
}

// Completed reports whether every copy is done, without blocking but for
// a small fetch's first call, which polls its device copies up to
// inlineBudget.
func (r *request) Completed() bool {
	if !r.hostEnded() {
		return false
	}
	evs := r.evs()
	spin := r.small && !r.spun
	r.spun = true
	for start := time.Now(); ; {
		done, err := allDone(evs)
		if done || err != nil {
			return true
		}
		if !spin || time.Since(start) >= inlineBudget {
			return false
		}
	}
}

// Wait polls the events until the copies are done, an error occurs, or the
// request is aborted; then waits for the copies into host memory, or the
// abort.
func (r *request) Wait() error {
	if err := waitEvents(r.evs(), r.aborted); err != nil || r.hostDone == nil {
		return err
	}
	select {
	case <-r.hostDone:
		return r.hostErr
	case <-r.aborted:
		return errAborted()
	}
}

// Release waits until the copies can no longer write into the targets (an
// aborted request's copies run to the end), then returns the events and the
// cached mappings.
func (r *request) Release() {
	if r.released {
		return
	}
	r.released = true
	r.drain()
}

func (r *request) drain() {
	if r.hostDone != nil {
		<-r.hostDone // at most a chunk once aborted
	}
	if err := waitEvents(r.evs(), nil); err != nil {
		r.t.h.Log().Warnf("waiting for a copy to end: %v", err)
	}
	for _, e := range r.events {
		r.t.putEvent(e.Device(), e)
	}
	r.events = nil
	for _, e := range r.entries {
		r.t.cache.release(e)
	}
	r.entries = nil
}

func allDone(evs []event) (bool, error) {
	for _, e := range evs {
		done, err := e.Query()
		if err != nil {
			return false, err
		}
		if !done {
			return false, nil
		}
	}
	return true, nil
}

// spinFor is how long waitEvents polls without sleeping. It covers a
// small copy (microseconds) and a GiB at device speed (under a millisecond)
// with no wake-up delay: Go wakes a sleep shorter than a millisecond up to
// a millisecond late when the processor is idle, which cost a 4 KiB fetch
// about 200 µs and halved a GiB's bandwidth on an H200.
const spinFor = 5 * time.Millisecond

// waitEvents polls the events, yielding the processor between queries for
// spinFor, then sleeping a millisecond between them (a copy still running
// then takes long enough that a millisecond more is noise). A closed abort
// channel ends the wait with ErrAborted.
func waitEvents(evs []event, aborted <-chan struct{}) error {
	start := time.Now()
	for i := 0; ; i++ {
		done, err := allDone(evs)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-aborted:
			return errAborted()
		default:
		}
		if i%64 != 63 || time.Since(start) < spinFor {
			runtime.Gosched()
			continue
		}
		time.Sleep(time.Millisecond)
	}
}
