package shm

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"golang.org/x/sys/unix"
)

// The receiver's side of the segment server's protocol: asking an owner's
// server for an object's segment (or its arena, or a view's segment), over
// a kept connection or a new one, and reading its reply, with the bytes of
// a small object inline.

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
func (rcv *receiver) getSegment(r *request, src *keptConns, owner int, m *metadata, targets []transport.Tensor, quick bool) (answer, error) {
	if c := rcv.peers.takeIdle(src, m.Path); c != nil {
		a, err := rcv.askSegment(r, src, c, m, targets, quick)
		if a.pending != nil {
			a.pending.kept = true
		}
		if a.usable {
			return a, err
		}
		// The kept connection was closed by the server (idle, or a new
		// source at that path): ask once more on a new one.
	}
	c, err := dial(m, owner)
	if err != nil {
		return answer{fd: -1}, err
	}
	return rcv.askSegment(r, src, c, m, targets, quick)
}

// dial connects to the segment server of m, which must be the owner's
// process: a ref could name any socket.
func dial(m *metadata, owner int) (*net.UnixConn, error) {
	d := net.Dialer{Timeout: dialTimeout}
	nc, err := d.Dial("unix", m.Path)
	if err != nil {
		if exhausted := outOfResources("connecting to the owner's segment server", "this process", err); exhausted != nil {
			return nil, exhausted
		}
		return nil, gone(m, err)
	}
	c := nc.(*net.UnixConn)
	if pid, err := transport.UnixPeerPid(c); err != nil || pid != owner {
		c.Close()
		if err != nil {
			return nil, transport.Errorf(transport.ErrPermissionDenied, "cannot identify the segment server at %s: %v", m.Path, err)
		}
		return nil, transport.Errorf(transport.ErrCorrupt,
			"the segment server at %s is process %d, but the owner of object %s is process %d: refusing it", m.Path, pid, m.Object, owner)
	}
	return c, nil
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
func (rcv *receiver) resume(r *request, src *keptConns, owner int, m *metadata, targets []transport.Tensor, p *pendingAnswer) (answer, error) {
	a, err := rcv.readReply(r, src, p.c, m, targets, p.limit, false)
	if !a.usable && p.kept && !r.aborted.Load() {
		return rcv.getSegment(r, src, owner, m, targets, false)
	}
	return a, err
}

// askSegment does one request on c, then keeps c for the next request or
// closes it.
func (rcv *receiver) askSegment(r *request, src *keptConns, c *net.UnixConn, m *metadata, targets []transport.Tensor, quick bool) (answer, error) {
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
	return rcv.readReply(r, src, c, m, targets, limit, quick)
}

func gone(m *metadata, err error) error {
	return transport.Errorf(transport.ErrPeerUnavailable, "the owner's segment server at %s is gone: %v", m.Path, err)
}

// readReply reads the answer to the request sent on c. When quick, an
// answer that has not begun within syncWait is returned pending, and the
// rest of one that has is given the peer timeout (its bytes come in the
// same write as its header).
func (rcv *receiver) readReply(r *request, src *keptConns, c *net.UnixConn, m *metadata, targets []transport.Tensor, limit uint32, quick bool) (answer, error) {
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
	got, a, ok, err := rcv.receive(c, m, buf, limit, quick)
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
		rcv.peers.keepIdle(src, m.Path, c)
		return answer{fd: -1, size: got.h.size, usable: true}, nil
	}
	if len(got.early()) != 0 {
		return fail(transport.Errorf(transport.ErrCorrupt, "the source's reply is longer than it says"))
	}
	rcv.peers.keepIdle(src, m.Path, c)
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
func (rcv *receiver) receive(c *net.UnixConn, m *metadata, buf []byte, limit uint32, quick bool) (got reply, a answer, ok bool, err error) {
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
		c.SetDeadline(time.Now().Add(rcv.h.PeerTimeout()))
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
