package shm

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"golang.org/x/sys/unix"
)

func (t *Transport) CommunicatorMetadata(x *transport.Transfer) ([]byte, error) { return nil, nil }

// request is a fetch in progress: it completes when the copy ends.
type request struct {
	*transport.Completion
	t       *Transport
	aborted atomic.Bool
	// asking is the connection waiting for the segment server's answer,
	// which a stopped source would hold for ioTimeout: Abort cuts it short.
	mu     sync.Mutex
	asking *net.UnixConn
}

// Abort makes the copy stop at its next chunk, and a wait for the segment
// server's answer stop now.
func (t *Transport) Abort(x *transport.Transfer, req transport.Request) {
	if r, ok := req.(*writeRequest); ok {
		r.abort()
		return
	}
	if r, ok := req.(*request); ok {
		r.aborted.Store(true)
		r.mu.Lock()
		if r.asking != nil {
			r.asking.SetDeadline(time.Now())
		}
		r.mu.Unlock()
	}
}

// ask records c as the connection the request waits on (nil: none); a
// request already aborted finds c's deadline passed.
func (r *request) ask(c *net.UnixConn) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asking = c
	if c != nil && r.aborted.Load() {
		c.SetDeadline(time.Now())
	}
}

// Fetch checks the metadata against the transfer and the targets, and
// starts copying.
func (t *Transport) Fetch(x *transport.Transfer, targets []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	m, err := checkTransfer(x, targets, tmeta, "target")
	if err != nil {
		return nil, err
	}
	if x.Pieces != nil {
		m.takePieces(x.Pieces)
	}
	owner := x.Owner()
	src, err := t.source(owner)
	if err != nil {
		return nil, err
	}
	r := &request{Completion: transport.NewCompletion(), t: t}
	if m.inArena() {
		// With the source's arena mapped, the object is read here and
		// now, asking nothing; else the arena is asked for (once per
		// source) on a goroutine, where Abort reaches the wait.
		if v := t.mappedArena(src, m.Arena); v != nil {
			if done, err := v.read(m, targets); done {
				r.Finish(err)
				return r, nil
			}
		}
		go func() { r.Finish(t.fetchFromArena(r, src, owner.Pid, m, targets)) }()
		return r, nil
	}
	if m.Size <= inlineMax {
		// A small object is asked for here and, when its answer comes
		// within syncWait, finished on the caller's goroutine (the engine
		// then needs no hand-off, which costs more than the copy). A
		// slower answer is waited for on a goroutine, where Abort reaches
		// it.
		a, err := t.getSegment(r, src, owner.Pid, m, targets, true)
		if a.pending == nil {
			r.Finish(r.check(a, err, m, targets))
			return r, nil
		}
		go func() {
			a, err := t.resume(r, src, owner.Pid, m, targets, a.pending)
			r.Finish(r.check(a, err, m, targets))
		}()
		return r, nil
	}
	// Larger objects are read on a goroutine, so that a fetch of many refs
	// overlaps their socket round trips and copies.
	go func() {
		a, err := t.getSegment(r, src, owner.Pid, m, targets, false)
		r.Finish(r.check(a, err, m, targets))
	}()
	return r, nil
}

// checkTransfer is what a fetch and a write check before anything moves:
// the metadata decodes and names the object of the transfer, and the local
// tensors (targets, or a write's sources: what) fit it and lie in host
// memory. Ref bytes are checksummed, not signed: the metadata must name the
// object (its segment holds nothing else), and the segment server must be
// its owner's process (checked at connect).
func checkTransfer(x *transport.Transfer, local []transport.Tensor, tmeta []byte, what string) (*metadata, error) {
	m, err := decodeMetadata(tmeta)
	if err != nil {
		return nil, err
	}
	if m.Object != x.Object {
		return nil, transport.Errorf(transport.ErrCorrupt, "the metadata of object %s names object %s: refusing it", x.Object, m.Object)
	}
	if err := x.CheckPieces(local, len(m.Regions), func(i int) uint64 { return m.Regions[i].Size }); err != nil {
		return nil, err
	}
	for i, tg := range local {
		if !tg.Device.Type.HostAccessible() {
			return nil, transport.Errorf(transport.ErrUnsupported, "%s %d is in %s memory; shm moves host memory", what, i, tg.Device)
		}
	}
	return m, nil
}

// mappedArena is the arena id of the source, when this receiver mapped it.
func (t *Transport) mappedArena(src *keptConns, id transport.ObjectID) *arenaView {
	t.idleMu.Lock()
	defer t.idleMu.Unlock()
	return src.arenas[id]
}

// fetchFromArena maps the source's arena if need be and reads the object
// from it. When the arena's slot does not hold the object, the segment
// server says why: freed (NOT_FOUND), or metadata that is not this
// object's (CORRUPT); a source that is gone is PEER_UNAVAILABLE.
func (t *Transport) fetchFromArena(r *request, src *keptConns, owner int, m *metadata, targets []transport.Tensor) error {
	v, kept, err := t.arenaFor(r, src, owner, m)
	if err != nil {
		return r.check(answer{fd: -1}, err, m, targets)
	}
	if !kept {
		defer v.unmap()
	}
	if done, err := v.read(m, targets); done {
		return err
	}
	a, err := t.getSegment(r, src, owner, m, nil, false)
	if err == nil {
		if a.fd >= 0 {
			unix.Close(a.fd)
		}
		err = transport.Errorf(transport.ErrCorrupt, "the owner's segment server answered for object %s of its arena as if it had a segment of its own", m.Object)
	}
	return r.check(answer{fd: -1}, err, m, targets)
}

// arenaFor is the view of the arena m names: the one mapped, or one mapped
// now after asking the source's segment server for it (which hands out
// only its own). kept is false for a view mapped for this fetch alone: the
// source's record was dropped meanwhile (the source reported gone, or the
// record pruned as empty), so nothing would unmap it later; the caller
// unmaps it.
func (t *Transport) arenaFor(r *request, src *keptConns, owner int, m *metadata) (v *arenaView, kept bool, err error) {
	if v := t.mappedArena(src, m.Arena); v != nil {
		return v, true, nil
	}
	a, err := t.getSegment(r, src, owner, &metadata{Path: m.Path, Object: m.Arena, askArena: true}, nil, false)
	if err != nil {
		return nil, false, err
	}
	if a.fd < 0 {
		return nil, false, transport.Errorf(transport.ErrCorrupt, "the owner's segment server sent no descriptor for its arena")
	}
	v, err = mapArena(a.fd, a.size, owner)
	if err != nil {
		return nil, false, err
	}
	t.idleMu.Lock()
	defer t.idleMu.Unlock()
	if t.idle == nil || t.idle[src.peer] != src {
		return v, false, nil
	}
	if mapped := src.arenas[m.Arena]; mapped != nil { // by another fetch meanwhile
		v.unmap()
		return mapped, true, nil
	}
	src.arenas[m.Arena] = v
	return v, true, nil
}

// source is the record of the connections kept to a source runtime.
func (t *Transport) source(peer transport.PeerInfo) (*keptConns, error) {
	t.idleMu.Lock()
	defer t.idleMu.Unlock()
	if t.idle == nil {
		return nil, transport.Errorf(transport.ErrClosed, "the transport is closed")
	}
	k := t.idle[peer.RuntimeID]
	if k == nil {
		// Records that keep nothing go, should a source's end have been
		// reported before its first fetch started.
		for id, other := range t.idle {
			if t.keepsNothingLocked(other) {
				delete(t.idle, id)
			}
		}
		k = &keptConns{peer: peer.RuntimeID, arenas: map[transport.ObjectID]*arenaView{}}
		t.idle[peer.RuntimeID] = k
	}
	return k, nil
}

// keepsNothingLocked reports whether a record holds no arena and no
// connection; the caller holds idleMu.
func (t *Transport) keepsNothingLocked(k *keptConns) bool {
	return len(k.arenas) == 0 && t.kept.PeerLen(k.peer) == 0 && t.wkept.PeerLen(k.peer) == 0
}

// check finishes a fetch once the segment server answered: nothing more
// for an object that came inline (fd -1), else the received segment is
// checked and read.
func (r *request) check(a answer, err error, m *metadata, targets []transport.Tensor) error {
	if err != nil {
		if r.aborted.Load() && transport.StatusOf(err) != transport.ErrAborted {
			return transport.Errorf(transport.ErrAborted, "transfer aborted while the owner's segment server was asked: %v", err)
		}
		return err
	}
	if a.fd < 0 { // it came inline, straight into the targets
		return nil
	}
	fd, size := a.fd, a.size
	defer unix.Close(fd)
	if size != m.Size {
		return transport.Errorf(transport.ErrCorrupt, "the source's segment holds %d bytes, its metadata says %d", size, m.Size)
	}
	if err := checkSealedSize(fd, size, unix.F_SEAL_WRITE|unix.F_SEAL_SHRINK, "segment", "sealed against writes and shrinking; refusing to read it"); err != nil {
		return err
	}
	return readRegions(fd, m.Regions, targets, &r.aborted)
}

const (
	// maxGap: regions at most this far apart are read by one call, the
	// bytes between them (alignment padding) into a scratch buffer.
	maxGap = 4096
	// maxIovecs per preadv call (the kernel's IOV_MAX is 1024).
	maxIovecs = 1024
)

// mappedCopyMin: a run at least this large whose targets are misaligned
// with its bytes in the segment is copied from a mapping (see misaligned).
const mappedCopyMin = 256 << 10

// run is one preadv: iovecs that are contiguous in the segment from off.
type run struct {
	off   uint64
	iovs  [][]byte
	bytes uint64
}

// extend adds b to the run's iovecs, as part of the last one when it
// follows it in memory (targets that are views of one buffer, say: the
// kernel's cost is per iovec more than per byte) and nothing lies between
// them in the segment (joinable).
func (r *run) extend(b []byte, joinable bool) {
	if n := len(r.iovs); n > 0 && joinable {
		if joined, ok := transport.Join(r.iovs[n-1], b); ok {
			r.iovs[n-1] = joined
			return
		}
	}
	r.iovs = append(r.iovs, b)
}

// planRuns groups the regions into runs of at most chunk bytes and
// maxIovecs iovecs, so an object of many tensors costs one call per run,
// not one per tensor. Regions the metadata lists out of order or far apart
// start a new run.
func planRuns(regions []region, targets []transport.Tensor, scratch []byte) []run {
	var runs []run
	var cur *run
	for i, reg := range regions {
		dst := transport.Bytes(targets[i].Data, reg.Size)
		for done := uint64(0); done < reg.Size; {
			at := reg.Offset + done
			var gap uint64
			if cur != nil && at >= cur.off+cur.bytes {
				gap = at - (cur.off + cur.bytes)
			}
			if cur == nil || at < cur.off+cur.bytes || gap > maxGap || len(cur.iovs)+2 > maxIovecs || cur.bytes+gap >= chunk {
				runs = append(runs, run{off: at})
				cur = &runs[len(runs)-1]
				gap = 0
			}
			if gap > 0 {
				cur.iovs = append(cur.iovs, scratch[:gap])
				cur.bytes += gap
			}
			n := min(reg.Size-done, chunk-cur.bytes)
			cur.extend(dst[done:done+n], gap == 0)
			cur.bytes += n
			done += n
		}
	}
	return runs
}

// readRegions copies the regions of the segment into the targets with
// preadv: one copy by the kernel, no mapping to set up and tear down (for a
// fresh mapping of a large segment that costs more than the copy itself,
// measured), and one call per run of up to chunk bytes, checking for an
// abort between them; runs whose targets are misaligned with the segment
// are copied from a mapping instead (see run.misaligned). Large objects are
// split between two workers.
func readRegions(fd int, regions []region, targets []transport.Tensor, abort *atomic.Bool) error {
	scratch := make([]byte, maxGap)
	runs := planRuns(regions, targets, scratch)
	var total uint64
	for _, r := range runs {
		total += r.bytes
	}
	if total < parallelMin {
		return readRuns(fd, runs, abort)
	}
	half, sum := 0, uint64(0)
	for half < len(runs) && sum < total/2 {
		sum += runs[half].bytes
		half++
	}
	var err1 error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); err1 = readRuns(fd, runs[half:], abort) }()
	err0 := readRuns(fd, runs[:half], abort)
	wg.Wait()
	if err0 != nil {
		return err0
	}
	return err1
}

func readRuns(fd int, runs []run, abort *atomic.Bool) error {
	for _, r := range runs {
		if r.bytes >= mappedCopyMin && r.misaligned() {
			if abort.Load() {
				return transport.Errorf(transport.ErrAborted, "transfer aborted")
			}
			if err := copyMapped(fd, r); err != nil {
				return err
			}
			continue
		}
		iovs, off := r.iovs, int64(r.off)
		for len(iovs) > 0 {
			if abort.Load() {
				return transport.Errorf(transport.ErrAborted, "transfer aborted")
			}
			n, err := unix.Preadv(fd, iovs, off)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return transport.Errorf(transport.ErrTransport, "reading the segment: %v", err)
			}
			if n == 0 {
				return transport.Errorf(transport.ErrCorrupt, "the segment ended early")
			}
			off += int64(n)
			for n > 0 { // a short read: go on after what arrived
				if n >= len(iovs[0]) {
					n -= len(iovs[0])
					iovs = iovs[1:]
				} else {
					iovs[0] = iovs[0][n:]
					n = 0
				}
			}
			for len(iovs) > 0 && len(iovs[0]) == 0 {
				iovs = iovs[1:]
			}
		}
	}
	return nil
}

// answer is what the segment server answered: a segment's descriptor and
// size; or fd -1, for an object that came inline (read straight into the
// targets) or an answer still pending (asked quickly).
type answer struct {
	fd      int
	size    uint64
	pending *pendingAnswer
	// usable (askSegment, readReply) is false when the connection failed
	// before any answer arrived: a kept one the server closed meanwhile.
	usable bool
}

// getSegment asks the source's segment server for the object, over a kept
// connection when there is one. The server must be the owner's process: a
// ref could name any socket. With targets, an object of at most inlineMax
// bytes may come inline (in a whole fetch). When quick, an answer that has
// not begun within syncWait is left pending on its connection, for resume.
func (t *Transport) getSegment(r *request, src *keptConns, owner int, m *metadata, targets []transport.Tensor, quick bool) (answer, error) {
	if c := t.takeIdle(src, m.Path); c != nil {
		a, err := t.askSegment(r, src, c, m, targets, quick)
		if a.pending != nil {
			a.pending.kept = true
		}
		if a.usable {
			return a, err
		}
		// The kept connection was closed by the server (idle, or a new
		// source at that path): ask once more on a new one.
	}
	d := net.Dialer{Timeout: dialTimeout}
	nc, err := d.Dial("unix", m.Path)
	if err != nil {
		if exhausted := outOfResources("connecting to the owner's segment server", "this process", err); exhausted != nil {
			return answer{fd: -1}, exhausted
		}
		return answer{fd: -1}, transport.Errorf(transport.ErrPeerUnavailable, "the owner's segment server at %s is gone: %v", m.Path, err)
	}
	c := nc.(*net.UnixConn)
	if pid, err := transport.UnixPeerPid(c); err != nil || pid != owner {
		c.Close()
		if err != nil {
			return answer{fd: -1}, transport.Errorf(transport.ErrPermissionDenied, "cannot identify the segment server at %s: %v", m.Path, err)
		}
		return answer{fd: -1}, transport.Errorf(transport.ErrCorrupt,
			"the segment server at %s is process %d, but the owner of object %s is process %d: refusing it", m.Path, pid, m.Object, owner)
	}
	return t.askSegment(r, src, c, m, targets, quick)
}

// pendingAnswer is a request sent on c whose answer had not begun within
// syncWait.
type pendingAnswer struct {
	c     *net.UnixConn
	limit uint32
	kept  bool // c was a kept connection (the server may have closed it)
}

// resume waits for a pending answer, with Abort able to cut it short, and
// asks again on a new connection should a kept one turn out closed.
func (t *Transport) resume(r *request, src *keptConns, owner int, m *metadata, targets []transport.Tensor, p *pendingAnswer) (answer, error) {
	a, err := t.readReply(r, src, p.c, m, targets, p.limit, false)
	if !a.usable && p.kept && !r.aborted.Load() {
		return t.getSegment(r, src, owner, m, targets, false)
	}
	return a, err
}

// askSegment does one request on c, then keeps c for the next request or
// closes it.
func (t *Transport) askSegment(r *request, src *keptConns, c *net.UnixConn, m *metadata, targets []transport.Tensor, quick bool) (answer, error) {
	// The most bytes this receiver takes inline. A partial fetch takes
	// none: inline, the whole object would cross the socket, not just
	// the pieces that preadv or the mapping reads from the descriptor.
	var limit uint32
	switch {
	case m.askArena:
		limit = arenaRequest
	case m.askView:
		limit = viewRequest
	case targets != nil && m.Size <= inlineMax && !m.partial:
		limit = uint32(m.Size)
	}
	c.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := c.Write(encodeRequest(m.Object, limit)); err != nil {
		c.Close()
		return answer{fd: -1}, gone(m, err)
	}
	return t.readReply(r, src, c, m, targets, limit, quick)
}

func gone(m *metadata, err error) error {
	return transport.Errorf(transport.ErrPeerUnavailable, "the owner's segment server at %s is gone: %v", m.Path, err)
}

// readReply reads the answer to the request sent on c. When quick, an
// answer that has not begun within syncWait is returned pending, and the
// rest of one that has is given the peer timeout (its bytes come in the
// same write as its header).
func (t *Transport) readReply(r *request, src *keptConns, c *net.UnixConn, m *metadata, targets []transport.Tensor, limit uint32, quick bool) (answer, error) {
	if quick {
		c.SetDeadline(time.Now().Add(syncWait))
	} else {
		c.SetDeadline(time.Now().Add(ioTimeout))
		r.ask(c)
		defer r.ask(nil)
	}
	if limit == arenaRequest || limit == viewRequest {
		limit = 0 // the arena, or a view's segment, comes as a descriptor, nothing inline
	}
	var small [replyLen + maxMessage]byte
	buf := small[:]
	// Room for an inline answer's bytes too: one read takes the whole
	// reply, and the bytes go on to the targets only once the reply is
	// checked, so a refused one writes nothing there. (Reading straight
	// into the targets would save that copy of at most inlineMax bytes, but
	// put an error's message or a hostile reply's bytes in them.)
	if limit > 0 {
		bp := inlineBuffers.Get().(*[]byte)
		defer inlineBuffers.Put(bp)
		buf = (*bp)[:replyLen+maxMessage+int(limit)]
	}
	got, a, ok, err := t.receive(c, m, buf, limit, quick)
	if !ok {
		return a, err
	}
	fail := func(err error) (answer, error) {
		closeFDs(got.fds)
		c.Close() // out of step with the server
		return answer{fd: -1, usable: true}, err
	}
	if err := got.complete(c, m); err != nil {
		return fail(err)
	}
	if got.h.flags&flagInline != 0 {
		if err := got.takeInline(r, c, m, targets, limit); err != nil {
			return fail(err)
		}
		t.keepIdle(src, m.Path, c)
		return answer{fd: -1, size: got.h.size, usable: true}, nil
	}
	if len(got.early()) != 0 {
		return fail(transport.Errorf(transport.ErrCorrupt, "the source's reply is longer than it says"))
	}
	t.keepIdle(src, m.Path, c)
	return got.segment()
}

// reply is a segment server's answer as it is read: n bytes of buf, the
// descriptors that came with them and the read's flags, then (complete)
// the header and where its message ends.
type reply struct {
	buf    []byte
	n      int
	fds    []int
	flags  int
	h      replyHeader
	msgEnd int
}

// receive makes the first read of a reply. ok is false when the read
// settles the answer itself: pending (quick, and nothing came within
// syncWait), or a server that is gone (c is then closed).
func (t *Transport) receive(c *net.UnixConn, m *metadata, buf []byte, limit uint32, quick bool) (got reply, a answer, ok bool, err error) {
	var oob [32]byte // room for one descriptor (unix.CmsgSpace(4) is 24)
	if quick {
		// On this thread, not parked on the poller: see WaitReadable.
		transport.WaitReadable(c, syncWait)
	}
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob[:])
	if quick && n <= 0 && oobn == 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		return got, answer{fd: -1, usable: true, pending: &pendingAnswer{c: c, limit: limit}}, false, nil
	}
	if quick {
		c.SetDeadline(time.Now().Add(t.h.PeerTimeout()))
	}
	if err != nil || n <= 0 {
		c.Close()
		if err == nil {
			err = io.EOF
		}
		return got, answer{fd: -1}, false, gone(m, err)
	}
	return reply{buf: buf, n: n, fds: receivedFDs(oob[:oobn]), flags: flags}, answer{}, true, nil
}

// complete checks the start of the reply and reads the rest of its header
// and message, should the reply have arrived in pieces.
func (p *reply) complete(c *net.UnixConn, m *metadata) error {
	if p.flags&unix.MSG_CTRUNC != 0 && len(p.fds) == 0 { // the kernel had no descriptor number to give
		return outOfResources("receiving the segment", "this process", unix.EMFILE)
	}
	if p.n >= len(replyMagic) && string(p.buf[:len(replyMagic)]) != replyMagic {
		return transport.Errorf(transport.ErrCorrupt, "the source's segment server speaks another protocol version (is it an older build of rdt?)")
	}
	if p.n < replyLen {
		if _, err := io.ReadFull(c, p.buf[p.n:replyLen]); err != nil {
			return gone(m, err)
		}
		p.n = replyLen
	}
	h, err := decodeReplyHeader(p.buf[:replyLen])
	if err != nil {
		return err
	}
	p.h = h
	p.msgEnd = replyLen + int(h.msgLen)
	if p.n < p.msgEnd {
		if _, err := io.ReadFull(c, p.buf[p.n:p.msgEnd]); err != nil {
			return gone(m, err)
		}
		p.n = p.msgEnd
	}
	return nil
}

// early is the inline bytes that came with the header.
func (p *reply) early() []byte { return p.buf[p.msgEnd:p.n] }

// takeInline checks an inline answer against what this receiver announced
// (limit) and the metadata says, never the source's word alone, and reads
// its bytes into the targets.
func (p *reply) takeInline(r *request, c *net.UnixConn, m *metadata, targets []transport.Tensor, limit uint32) error {
	early := p.early()
	if limit == 0 || p.h.size != m.Size || uint64(len(early)) > p.h.size || len(p.fds) != 0 {
		return transport.Errorf(transport.ErrCorrupt, "the source sent %d bytes inline with %d descriptors; %d announced, the metadata says %d", p.h.size, len(p.fds), limit, m.Size)
	}
	if err := readInline(c, m.Size, m.Regions, targets, early); err != nil {
		if r != nil && r.aborted.Load() {
			return transport.Errorf(transport.ErrAborted, "transfer aborted: %v", err)
		}
		return gone(m, err)
	}
	return nil
}

// segment is the answer of a reply that carries no bytes inline: the
// source's refusal, or the one descriptor of the segment.
func (p *reply) segment() (answer, error) {
	if p.h.status != transport.OK {
		closeFDs(p.fds)
		return answer{fd: -1, usable: true}, transport.Errorf(p.h.status, "%s", p.buf[replyLen:p.msgEnd])
	}
	if len(p.fds) != 1 {
		closeFDs(p.fds)
		return answer{fd: -1, usable: true}, transport.Errorf(transport.ErrCorrupt, "the source sent %d descriptors, want 1", len(p.fds))
	}
	return answer{fd: p.fds[0], size: p.h.size, usable: true}, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// inlineBuffers hold a reply with an inline segment.
var inlineBuffers = sync.Pool{New: func() any { b := make([]byte, replyLen+maxMessage+inlineMax); return &b }}

// readInline reads an inline segment (len(early) of its bytes already
// read, usually all) from c into the targets: the rest straight into a
// target that is the whole segment, else through a buffer. Abort cuts the
// read short through c's deadline (request.ask).
func readInline(c *net.UnixConn, size uint64, regions []region, targets []transport.Tensor, early []byte) error {
	if len(regions) == 1 && regions[0].Offset == 0 && regions[0].Size == size {
		dst := transport.Bytes(targets[0].Data, regions[0].Size)
		k := copy(dst, early)
		_, err := io.ReadFull(c, dst[k:])
		return err
	}
	// size is the metadata's, at most inlineMax, and its regions lie
	// within it.
	seg := early
	if uint64(len(early)) < size {
		bp := inlineBuffers.Get().(*[]byte)
		defer inlineBuffers.Put(bp)
		seg = (*bp)[:size]
		k := copy(seg, early)
		if _, err := io.ReadFull(c, seg[k:]); err != nil {
			return err
		}
	}
	for i, reg := range regions {
		copy(transport.Bytes(targets[i].Data, reg.Size), seg[reg.Offset:reg.Offset+reg.Size])
	}
	return nil
}

// takeIdle takes a connection kept for src's segment server at path (a
// record dropped meanwhile has none).
func (t *Transport) takeIdle(src *keptConns, path string) *net.UnixConn {
	t.idleMu.Lock()
	defer t.idleMu.Unlock()
	if t.idle == nil || t.idle[src.peer] != src {
		return nil
	}
	c, _ := t.kept.Take(keptKey{peer: src.peer, path: path})
	return c
}

// keepIdle keeps c for the next request to the segment server at path,
// unless src's record was dropped or keeps maxIdle for that path already.
func (t *Transport) keepIdle(src *keptConns, path string, c *net.UnixConn) {
	t.idleMu.Lock()
	defer t.idleMu.Unlock()
	if t.idle == nil || t.idle[src.peer] != src {
		c.Close()
		return
	}
	t.kept.Put(keptKey{peer: src.peer, path: path}, c)
}

func receivedFDs(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if f, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

// parallelCopy copies src into dst in chunks, checking abort between them,
// with two workers for large copies. It reports false if it was aborted.
func parallelCopy(dst, src []byte, abort *atomic.Bool) bool {
	one := func(d, s []byte) bool {
		for off := 0; off < len(s); off += chunk {
			if abort != nil && abort.Load() {
				return false
			}
			copy(d[off:], s[off:min(off+chunk, len(s))])
		}
		return true
	}
	if len(src) < parallelMin {
		return one(dst, src)
	}
	half := (len(src) / 2) &^ 4095
	var ok [workers]bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); ok[1] = one(dst[half:], src[half:]) }()
	ok[0] = one(dst[:half], src[:half])
	wg.Wait()
	return ok[0] && ok[1]
}

// misaligned reports whether a target of the run starts at another address
// modulo align than its bytes in the segment. The kernel's copy behind
// preadv runs about 3x slower on such buffers (measured: numpy's arrays are
// 16-byte aligned, tensors sit 64-byte aligned in a segment), a user-space
// copy from a mapping does not.
func (r run) misaligned() bool {
	off := r.off
	for _, iov := range r.iovs {
		if len(iov) > 0 && (uintptr(unsafe.Pointer(&iov[0]))-uintptr(off))%align != 0 {
			return true
		}
		off += uint64(len(iov))
	}
	return false
}

// copyMapped copies the run from a read-only mapping of its pages. The
// segment is sealed against shrinking (checked before), so no page of the
// mapping can vanish under the copy.
func copyMapped(fd int, r run) error {
	page := uint64(os.Getpagesize())
	start := r.off &^ (page - 1)
	mem, err := unix.Mmap(fd, int64(start), int(r.off+r.bytes-start), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return transport.Errorf(transport.ErrTransport, "mapping the segment: %v", err)
	}
	src := mem[r.off-start:]
	for _, iov := range r.iovs {
		src = src[copy(iov, src):]
	}
	if err := unix.Munmap(mem); err != nil {
		return transport.Errorf(transport.ErrTransport, "unmapping the segment: %v", err)
	}
	return nil
}

// checkSealedSize checks that a memfd from a source carries the seals want
// and is size bytes. The seals come first: until they are set the source
// can still resize the file, so a size read before them proves nothing (a
// file shrunk after its size was read, then sealed, passes both checks and
// faults the receiver with SIGBUS on its first read of the mapping).
func checkSealedSize(fd int, size uint64, want int, what, refusal string) error {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&want != want {
		return transport.Errorf(transport.ErrPermissionDenied, "the source's %s is not %s", what, refusal)
	}
	if betweenSealsAndSize != nil {
		betweenSealsAndSize(fd)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || uint64(st.Size) != size {
		return transport.Errorf(transport.ErrCorrupt, "the source's %s is %d bytes, it said %d", what, st.Size, size)
	}
	return nil
}

// betweenSealsAndSize, set by tests only, runs between the two checks of
// checkSealedSize: where a hostile source would act.
var betweenSealsAndSize func(fd int)
