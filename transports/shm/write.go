package shm

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"golang.org/x/sys/unix"
)

// Writes into objects another runtime exposed: the writer asks the owner's
// segment server to land a write its runtime admitted, and the server lands
// it in the exposed tensors (see land.go and protocol.go). A small write
// goes inline with the request; a larger one through a staging area the
// server hands the writer (a memfd sealed against resizing, kept for the
// connection's next writes), in chunks the writer copies into one slot
// while the owner copies the other out.

// wconn is a writer's connection to an owner's segment server, with the
// staging area the server gave it mapped (nil before one was given).
type wconn struct {
	c   *net.UnixConn
	mem []byte
}

func (w *wconn) close() {
	if w.mem != nil {
		unix.Munmap(w.mem)
		w.mem = nil
	}
	w.c.Close()
}

// writeRequest is a write in progress.
type writeRequest struct {
	*transport.Completion
	id      uint64
	aborted atomic.Bool
	// w is the connection the write is moving on: Abort cuts its waits
	// short and sets its staging area's abort word.
	mu sync.Mutex
	w  *wconn
}

// abort stops the write: the writer copies nothing more, waits for no more
// answers, and the owner's server copies nothing more of it out of the
// staging area (it looks at the abort word every landStep bytes).
func (r *writeRequest) abort() {
	r.aborted.Store(true)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.w != nil {
		r.signal()
	}
}

// signal sets the abort word and the connection's deadline; r.mu is held.
func (r *writeRequest) signal() {
	if r.w.mem != nil {
		atomic.StoreUint64((*uint64)(unsafe.Pointer(&r.w.mem[0])), r.id)
	}
	r.w.c.SetDeadline(time.Now())
}

// use records w as the connection the write moves on (nil: none now).
func (r *writeRequest) use(w *wconn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.w = w
	if w != nil && r.aborted.Load() {
		r.signal()
	}
}

func (r *writeRequest) abortedErr(err error) error {
	if r.aborted.Load() {
		return transport.Errorf(transport.ErrAborted, "write aborted: %v", err)
	}
	return err
}

// writer is a runtime's side as a peer that writes into objects other
// runtimes exposed, over what it keeps for their segment servers.
type writer struct {
	peers *peers
}

// Write checks the sources against the exposed object's metadata and
// starts the write on a goroutine.
func (t *Transport) Write(x *transport.Transfer, sources []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	return t.wr.write(x, sources, tmeta)
}

// write is Write.
func (wr *writer) write(x *transport.Transfer, sources []transport.Tensor, tmeta []byte) (transport.Request, error) {
	m, err := checkTransfer(x, sources, tmeta)
	if err != nil {
		return nil, err
	}
	pieces := make([]transport.Piece, len(sources))
	var total uint64
	for i, s := range sources {
		pieces[i] = x.PieceOf(i, s)
		total += pieces[i].Length
	}
	owner := x.Owner()
	src, err := wr.peers.record(owner)
	if err != nil {
		return nil, err
	}
	r := &writeRequest{Completion: transport.NewCompletion(), id: x.TransferID}
	mv := &move{wr: wr, r: r, src: src, owner: owner.Pid, m: m, pieces: pieces, sources: sources, total: total}
	if total <= inlineMax {
		if w, kept := wr.peers.takeWriteConn(src, m.Path); kept {
			mv.inline(w)
			return r, nil
		}
	}
	go func() { r.Finish(mv.send()) }()
	return r, nil
}

// move is one write's way to the owner's segment server.
type move struct {
	wr      *writer
	r       *writeRequest
	src     *keptConns
	owner   int
	m       *metadata
	pieces  []transport.Piece
	sources []transport.Tensor
	total   uint64
}

// send moves the write over a kept connection or a new one.
func (mv *move) send() error {
	w, kept, err := mv.wr.conn(mv.src, mv.owner, mv.m)
	if err != nil {
		return err
	}
	mv.r.use(w)
	closed, err := w.send(mv.r, mv.m, mv.pieces, mv.sources, mv.total)
	return mv.settle(w, kept, closed, err)
}

// inline moves a small write over the kept connection w as a small fetch
// moves: the request goes out here and, when the answer comes within
// syncWait, the write is finished on the caller's goroutine (the engine
// then needs no hand-off, which costs more than the copy). A slower
// answer, or a connection the server had closed, is seen to on a
// goroutine, where Abort reaches it.
func (mv *move) inline(w *wconn) {
	r := mv.r
	r.use(w)
	closed, err := w.request(r, mv.m, mv.pieces, mv.sources, mv.total)
	if err == nil && !transport.WaitReadable(w.c, syncWait) {
		go func() {
			closed, err := w.answer(r, mv.m, mv.pieces, mv.sources, mv.total)
			r.Finish(mv.settle(w, true, closed, err))
		}()
		return
	}
	if err == nil {
		closed, err = w.answer(r, mv.m, mv.pieces, mv.sources, mv.total)
	}
	if err != nil && closed && !r.aborted.Load() {
		go func() { r.Finish(mv.settle(w, true, closed, err)) }() // it dials
		return
	}
	r.Finish(mv.settle(w, true, closed, err))
}

// settle ends a write that moved on w: a kept connection the server had
// closed while idle (closed before any answer came) is replaced by a new
// one, asked once more; w is kept for the next write when it succeeded,
// closed otherwise.
func (mv *move) settle(w *wconn, kept, closed bool, err error) error {
	r := mv.r
	if err != nil && kept && closed && !r.aborted.Load() {
		r.use(nil)
		w.close()
		if w, _, err = mv.wr.conn(nil, mv.owner, mv.m); err != nil {
			return r.abortedErr(err)
		}
		r.use(w)
		_, err = w.send(r, mv.m, mv.pieces, mv.sources, mv.total)
	}
	r.use(nil)
	if err != nil {
		w.close() // out of step, or gone
		return r.abortedErr(err)
	}
	mv.wr.peers.keepWriteConn(mv.src, mv.m.Path, w)
	return nil
}

// conn is a kept connection to the segment server of m (src nil: a
// new one), or a new one whose server is checked to be the owner's
// process.
func (wr *writer) conn(src *keptConns, owner int, m *metadata) (w *wconn, kept bool, err error) {
	if src != nil {
		if w, kept = wr.peers.takeWriteConn(src, m.Path); kept {
			return w, true, nil
		}
	}
	c, err := dial(m, owner)
	if err != nil {
		return nil, false, err
	}
	return &wconn{c: c}, false, nil
}

// send sends the write request on w and moves the bytes. closed says
// the connection was closed before any answer came (a kept one the server
// had closed while idle).
func (w *wconn) send(r *writeRequest, m *metadata, pieces []transport.Piece, sources []transport.Tensor, total uint64) (closed bool, err error) {
	if closed, err := w.request(r, m, pieces, sources, total); err != nil {
		return closed, err
	}
	return w.answer(r, m, pieces, sources, total)
}

// request sends the write request on w, with the bytes of a small write.
func (w *wconn) request(r *writeRequest, m *metadata, pieces []transport.Piece, sources []transport.Tensor, total uint64) (closed bool, err error) {
	req := encodeWriteRequest(m.Object, r.id, pieces)
	if total <= inlineMax {
		// The bytes follow the request, in the same write.
		for i, s := range sources {
			req = append(req, transport.Bytes(s.Data, pieces[i].Length)...)
		}
	}
	w.c.SetDeadline(time.Now().Add(ioTimeout))
	if r.aborted.Load() {
		return false, transport.Errorf(transport.ErrAborted, "write aborted")
	}
	if _, err := w.c.Write(req); err != nil {
		return isClosed(err), gone(m, err)
	}
	return false, nil
}

// answer reads the owner's answer to the request and, for a larger write,
// moves the bytes through the staging area.
func (w *wconn) answer(r *writeRequest, m *metadata, pieces []transport.Piece, sources []transport.Tensor, total uint64) (closed bool, err error) {
	h, fd, closed, err := w.reply(m)
	if err != nil {
		return closed, err
	}
	if total <= inlineMax {
		if h.size != total || fd >= 0 {
			if fd >= 0 {
				unix.Close(fd)
			}
			return false, transport.Errorf(transport.ErrCorrupt, "the owner landed %d bytes of a %d-byte write", h.size, total)
		}
		return false, nil
	}
	if fd >= 0 {
		// Abort does not reach the staging area while it is replaced.
		r.use(nil)
		err := w.mapStaging(fd, h.size)
		r.use(w)
		if err != nil {
			return false, err
		}
	} else if w.mem == nil || uint64(len(w.mem)) != h.size {
		return false, transport.Errorf(transport.ErrCorrupt, "the owner's segment server named a %d-byte staging area it never sent", h.size)
	}
	return false, w.moveChunks(r, m, sources, pieces, total)
}

// isClosed reports whether err says the other end closed the connection
// (rather than a deadline passing).
func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, unix.EPIPE) || errors.Is(err, unix.ECONNRESET)
}

// mapStaging checks and maps a staging area the owner sent, in place of
// the connection's previous one; it takes fd.
func (w *wconn) mapStaging(fd int, size uint64) error {
	defer unix.Close(fd)
	if size <= stagingHeader || size > maxStaging || (size-stagingHeader)%2 != 0 {
		return transport.Errorf(transport.ErrCorrupt, "the owner's staging area is %d bytes (want two equal slots after %d, at most %d)", size, stagingHeader, maxStaging)
	}
	if err := checkSealedSize(fd, size, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW, "staging area", "sealed against resizing; refusing to map it"); err != nil {
		return err
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		if exhausted := outOfResources("mapping the owner's staging area", "this process", err); exhausted != nil {
			return exhausted
		}
		return transport.Errorf(transport.ErrTransport, "mapping the owner's staging area: %v", err)
	}
	if w.mem != nil {
		unix.Munmap(w.mem)
	}
	w.mem = mem
	return nil
}

// reply reads one answer of the owner's segment server to a write
// request or chunk: its header, and the staging area's descriptor (or -1).
// An answer that is not OK is returned as its error. closed says the
// connection was closed before any of it came.
func (w *wconn) reply(m *metadata) (h replyHeader, fd int, closed bool, err error) {
	var buf [replyLen + maxMessage]byte
	var oob [32]byte
	n, oobn, flags, _, err := w.c.ReadMsgUnix(buf[:replyLen], oob[:])
	fds := receivedFDs(oob[:oobn])
	fail := func(err error) (replyHeader, int, bool, error) {
		closeFDs(fds)
		return replyHeader{}, -1, false, err
	}
	if err != nil || n == 0 {
		if err == nil {
			err = io.EOF
		}
		closeFDs(fds)
		return replyHeader{}, -1, n == 0 && isClosed(err), gone(m, err)
	}
	if flags&unix.MSG_CTRUNC != 0 && len(fds) == 0 {
		return fail(outOfResources("receiving the staging area", "this process", unix.EMFILE))
	}
	if n < replyLen {
		if _, err := readFull(w.c, buf[n:replyLen]); err != nil {
			return fail(gone(m, err))
		}
	}
	h, err = decodeWriteReply(buf[:replyLen])
	if err != nil {
		return fail(err)
	}
	if h.msgLen > 0 {
		if _, err := readFull(w.c, buf[replyLen:replyLen+int(h.msgLen)]); err != nil {
			return fail(gone(m, err))
		}
	}
	if h.status != transport.OK {
		return fail(transport.Errorf(h.status, "the owner refused the write: %s", buf[replyLen:replyLen+int(h.msgLen)]))
	}
	want := 0
	if h.flags&flagStaging != 0 {
		want = 1
	}
	if len(fds) != want {
		return fail(transport.Errorf(transport.ErrCorrupt, "the owner's segment server sent %d descriptors, want %d", len(fds), want))
	}
	if want == 1 {
		return h, fds[0], false, nil
	}
	return h, -1, false, nil
}

// moveChunks copies the sources into the staging area's slots, one chunk
// at a time, and has the owner land each: the writer fills one slot while
// the owner drains the other. It returns once the owner answered the last
// chunk (every byte landed), or at the first error.
func (w *wconn) moveChunks(r *writeRequest, m *metadata, sources []transport.Tensor, pieces []transport.Piece, total uint64) error {
	slot := (uint64(len(w.mem)) - stagingHeader) / 2
	if slotSize(total) > slot {
		return transport.Errorf(transport.ErrCorrupt, "the owner's staging area has %d-byte slots, a %d-byte write needs %d", slot, total, slotSize(total))
	}
	// The sources' bytes in order, i and off being where the next chunk
	// starts.
	i, off := 0, uint64(0)
	fill := func(dst []byte) bool {
		for len(dst) > 0 {
			for pieces[i].Length == off {
				i, off = i+1, 0
			}
			n := min(uint64(len(dst)), pieces[i].Length-off, landStep)
			if r.aborted.Load() {
				return false
			}
			copy(dst[:n], transport.Bytes(sources[i].Data+uintptr(off), n))
			dst, off = dst[n:], off+n
		}
		return true
	}
	var sent, answered uint64 // bytes
	inflight := 0
	await := func() error {
		w.c.SetReadDeadline(time.Now().Add(ioTimeout))
		h, fd, _, err := w.reply(m)
		if fd >= 0 {
			unix.Close(fd)
		}
		if err == nil && (h.flags != 0 || h.size <= answered || h.size > sent) {
			err = transport.Errorf(transport.ErrCorrupt, "the owner answered a chunk with %d bytes landed; %d were sent", h.size, sent)
		}
		if err == nil {
			inflight--
			answered = h.size
		}
		return err
	}
	for k := uint64(0); sent < total; k++ {
		if inflight == 2 {
			if err := await(); err != nil {
				return err
			}
		}
		n := min(slot, total-sent)
		from := stagingHeader + (k%2)*slot
		if !fill(w.mem[from : from+n]) {
			return transport.Errorf(transport.ErrAborted, "write aborted")
		}
		w.c.SetWriteDeadline(time.Now().Add(ioTimeout))
		if _, err := w.c.Write(encodeChunk(uint32(k%2), n)); err != nil {
			return gone(m, err)
		}
		sent += n
		inflight++
	}
	for inflight > 0 {
		if err := await(); err != nil {
			return err
		}
	}
	if answered != total {
		return transport.Errorf(transport.ErrCorrupt, "the owner landed %d bytes of a %d-byte write", answered, total)
	}
	return nil
}

// readFull reads len(b) bytes from c.
func readFull(c *net.UnixConn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := c.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
