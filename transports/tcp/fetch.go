package tcp

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"golang.org/x/sys/unix"
)

// piece is one request's worth of targets: a byte range of one tensor, or
// a run of whole tensors (tensors of them, their sizes digesting to
// sizes), at most maxChunk long, and the memory it lands in.
type piece struct {
	tensor  uint32
	tensors uint32
	offset  uint64
	dst     []byte
	tag     uint64 // of its request, drawn when the request is sent
	sizes   uint64
}

// stream pulls a list of pieces over one connection. It keeps up to window
// request frames in flight and reads each answer straight into its piece's
// target: one readv takes the current field and, laid out behind it, the
// headers and bytes of the answers requested after it, so a run of small
// answers costs one system call and no copy. It remembers partial
// progress, so a read that stops early (the inline budget) can be resumed
// by another goroutine.
type stream struct {
	r      *fetchRequest
	c      net.Conn
	pieces []piece
	sent   int // request frames written
	done   int // pieces fully received
	hdrGot int // of pieces[done]'s header
	st     transport.Status
	msg    []byte // a refusal's message
	msgGot int
	got    int // bytes of pieces[done] received
	frames []byte
	// hdrs holds the headers of the current piece and of those read
	// ahead, piece i's at i % ring.
	hdrs [ring][responseLen]byte
	// ahead bytes were already received into look, the fields after the
	// one the last read was for, in the order the state machine asks for
	// them (an answer assumed not refused: see advance).
	ahead int
	look  [][]byte
	iovs  [][]byte
	extra [1]byte // behind the last answer: bytes nobody asked for land here
}

const (
	// lookAhead is how many answers one read may take beyond the current
	// one (two iovecs each, within the kernel's IOV_MAX of 1024), and
	// lookBytes about how many bytes: a read of larger answers gains
	// nothing from more iovecs, which the kernel sets up at every call.
	lookAhead = 255
	lookBytes = 256 << 10
	ring      = lookAhead + 1
)

// field kinds of readInto.
const (
	fieldHeader = iota
	fieldMessage
	fieldData
)

// readInto reads into dst, the rest of the current piece's header, message
// or bytes: from what an earlier read already put there, or with one
// readv that also takes what follows (not after a message: a refusal ends
// the stream). It returns how much of dst is filled.
func (s *stream) readInto(read func([][]byte) (int, error), kind int, dst []byte) (int, error) {
	if s.ahead > 0 {
		// The bytes are in place: dst is look[0] (past empty targets).
		s.look = skip(s.look, 0)
		n := min(s.ahead, len(s.look[0]))
		s.look = skip(s.look, n)
		s.ahead -= n
		return n, nil
	}
	s.iovs = append(s.iovs[:0], dst)
	if kind != fieldMessage {
		next, bytes := s.done+1, len(dst)
		if kind == fieldHeader {
			s.iovs = append(s.iovs, s.pieces[s.done].dst)
			bytes += len(s.pieces[s.done].dst)
		}
		for ; next < s.sent && next <= s.done+lookAhead && bytes < lookBytes; next++ {
			s.iovs = append(s.iovs, s.hdrs[next%ring][:], s.pieces[next].dst)
			bytes += responseLen + len(s.pieces[next].dst)
		}
		if next == len(s.pieces) && s.sent == len(s.pieces) {
			s.iovs = append(s.iovs, s.extra[:])
		}
	}
	n, err := read(s.iovs)
	if n <= len(dst) {
		return n, err
	}
	s.ahead = n - len(dst)
	s.look = append(s.look[:0], s.iovs[1:]...)
	return len(dst), nil
}

// skip drops the first n bytes of bufs, and the empty buffers then in
// front.
func skip(bufs [][]byte, n int) [][]byte {
	for len(bufs) > 0 && (n > 0 || len(bufs[0]) == 0) {
		k := min(n, len(bufs[0]))
		bufs[0] = bufs[0][k:]
		n -= k
		if len(bufs[0]) == 0 {
			bufs = bufs[1:]
		}
	}
	return bufs
}

func (s *stream) bytesLeft() uint64 {
	var n uint64
	for _, p := range s.pieces[s.done:] {
		n += uint64(len(p.dst))
	}
	return n - uint64(s.got)
}

// sendMore tops the window up once half of it has been answered.
func (s *stream) sendMore() error {
	if s.sent == len(s.pieces) || s.sent-s.done > window/2 {
		return nil
	}
	b := s.frames[:0]
	for s.sent < len(s.pieces) && s.sent-s.done < window {
		p := &s.pieces[s.sent]
		p.tag = newTag()
		b = (&request{Object: s.r.meta.Object, Tensor: p.tensor, Tensors: p.tensors, Offset: p.offset, Length: uint64(len(p.dst)), Tag: p.tag, Sizes: p.sizes}).encode(b)
		s.sent++
	}
	s.frames = b
	_, err := s.c.Write(b)
	return err
}

// errBudget: the inline reader ran out of time; the stream is intact.
var errBudget = errors.New("inline budget spent")

// advance receives until every piece is in. read fills the buffers in
// order and returns at least one byte or an error. Errors other than
// errBudget come back as rdt errors.
func (s *stream) advance(read func([][]byte) (int, error)) error {
	for s.done < len(s.pieces) {
		if err := s.sendMore(); err != nil {
			return s.r.ioError(err)
		}
		p := &s.pieces[s.done]
		hdr := s.hdrs[s.done%ring][:]
		var n int
		var err error
		switch {
		case s.hdrGot < responseLen:
			n, err = s.readInto(read, fieldHeader, hdr[s.hdrGot:])
			s.hdrGot += n
			if err == nil && s.hdrGot == responseLen {
				var mlen int
				var tag uint64
				s.st, mlen, tag, err = decodeResponseHeader(hdr)
				if err == nil && tag != p.tag {
					// Bytes nobody asked for (left over from an earlier
					// answer, or sent ahead), or answers out of order.
					err = transport.Errorf(transport.ErrCorrupt, "%s answered with tag %#x where the answer to tensor %d bytes [%d, +%d) (tag %#x) was due",
						s.r.meta.Endpoint, tag, p.tensor, p.offset, len(p.dst), p.tag)
				}
				if err == nil && s.st == transport.OK && mlen != 0 {
					err = transport.Errorf(transport.ErrCorrupt, "%s answered OK with a message", s.r.meta.Endpoint)
				}
				if err != nil {
					return err
				}
				s.msg, s.msgGot = make([]byte, mlen), 0
				if mlen > 0 && s.ahead > 0 {
					// A refusal: its message was read ahead into the
					// places meant for the bytes after it.
					s.msgGot = min(s.ahead, mlen)
					gather(s.msg[:s.msgGot], s.look)
					s.ahead, s.look = 0, s.look[:0]
				}
			}
		case s.msgGot < len(s.msg):
			n, err = s.readInto(read, fieldMessage, s.msg[s.msgGot:])
			s.msgGot += n
		case s.st != transport.OK:
			return transport.Errorf(s.st, "the source %s refused tensor %d bytes [%d, +%d): %s",
				s.r.meta.Endpoint, p.tensor, p.offset, len(p.dst), s.msg)
		case s.got < len(p.dst):
			n, err = s.readInto(read, fieldData, p.dst[s.got:])
			s.got += n
		default:
			s.done++
			s.hdrGot, s.got = 0, 0
		}
		if err != nil {
			if err == errBudget {
				return err
			}
			return s.r.ioError(err)
		}
	}
	if s.ahead != 0 {
		return transport.Errorf(transport.ErrCorrupt, "%s sent bytes nobody asked for", s.r.meta.Endpoint)
	}
	return nil
}

// gather fills dst from the front of bufs.
func gather(dst []byte, bufs [][]byte) {
	for _, b := range bufs {
		if len(dst) == 0 {
			return
		}
		dst = dst[copy(dst, b):]
	}
}

// advanceInline drives the stream on the calling goroutine's own thread:
// it blocks in ppoll on the socket rather than parking in the netpoller,
// so the answer wakes this thread directly (a parked goroutine called from
// C is woken through two other threads). It gives up after budget.
func (s *stream) advanceInline(budget time.Duration) error {
	tc, ok := s.c.(*net.TCPConn)
	if !ok {
		return errBudget
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return errBudget
	}
	deadline := time.Now().Add(budget)
	var aerr error
	if err := rc.Read(func(fd uintptr) bool {
		aerr = s.advance(func(b [][]byte) (int, error) { return pollRead(int(fd), b, deadline) })
		return true
	}); err != nil {
		return s.r.ioError(err)
	}
	return aerr
}

// pollRead reads what is there, waiting in ppoll until deadline for the
// first byte. Abort shuts the socket down, which wakes the wait.
func pollRead(fd int, b [][]byte, deadline time.Time) (int, error) {
	for {
		n, err := unix.Readv(fd, b)
		switch {
		case n > 0:
			return n, nil
		case err == nil:
			return 0, io.EOF
		case err == unix.EINTR:
			continue
		case err != unix.EAGAIN:
			return 0, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return 0, errBudget
		}
		ts := unix.NsecToTimespec(left.Nanoseconds())
		fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Ppoll(fds[:], &ts, nil); err != nil && err != unix.EINTR {
			return 0, err
		}
	}
}

// readv is c's vectored read, waiting for c to be readable (and for its
// deadline) as c's own reads do.
func readv(c net.Conn) func([][]byte) (int, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return func(b [][]byte) (int, error) { return c.Read(b[0]) }
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return func([][]byte) (int, error) { return 0, err }
	}
	return func(b [][]byte) (int, error) {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			for {
				n, rerr = unix.Readv(int(fd), b)
				if rerr != unix.EINTR {
					return rerr != unix.EAGAIN
				}
			}
		}); err != nil {
			return 0, err
		}
		if rerr == nil && n == 0 {
			return 0, io.EOF
		}
		if rerr != nil {
			return 0, rerr
		}
		return n, nil
	}
}

// fetchRequest is one Fetch: an inline stream for small tensors when a
// pooled connection was at hand, and goroutines for the rest.
type fetchRequest struct {
	t    *Transport
	meta *metadata
	pool poolKey // which pooled connections it may use

	aborted atomic.Bool
	ctx     context.Context // cancels dials; nil when no goroutine runs
	cancel  context.CancelFunc

	dir transport.Direction // a write pushes into the owner (write.go), a read pulls from it

	mu    sync.Mutex
	conns map[net.Conn]struct{} // connections in use, closed by abort
	err   error                 // the first error

	wg      sync.WaitGroup
	pending atomic.Int32 // goroutines still running

	// The inline stream is driven by whoever holds imu: Completed (with a
	// budget) or Wait.
	imu    sync.Mutex
	inline *stream
	idone  bool
}

// Fetch starts pulling into each target its piece of the object: the
// tensor of its index, whole, or in a partial fetch its piece's range.
func (t *Transport) Fetch(x *transport.Transfer, targets []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	m, err := t.checkRequest(x, targets, tmeta)
	if err != nil {
		return nil, err
	}
	small, shares, err := plan(x, targets, t.streams)
	if err != nil {
		return nil, err
	}
	r := t.newRequest(x, m)
	if len(small) == 0 && len(shares) == 0 {
		return r, nil // nothing to move
	}
	if err := t.activate(r); err != nil {
		return nil, err
	}
	if len(small) > 0 {
		// With a pooled connection the requests go out now and the answers
		// are read by Completed or Wait, with no goroutine of ours.
		if c := t.idleConn(r.pool); c != nil {
			s := &stream{r: r, c: c, pieces: small}
			r.track(c)
			if err := s.sendMore(); err != nil {
				r.untrack(c)
				c.Close()
				t.pool.Drop(r.pool) // its siblings are most likely dead too
			} else {
				r.inline = s
				small = nil
			}
		}
	}
	if len(small) > 0 || len(shares) > 0 {
		r.ctx, r.cancel = context.WithCancel(t.h.Context())
	}
	if len(small) > 0 {
		r.spawn(small)
	}
	for _, ps := range shares {
		r.spawn(ps)
	}
	return r, nil
}

// newRequest is the request of a fetch or a write of the object m
// describes. Its pooled connections are recorded with the owner's runtime,
// so that they are closed when it is gone (PeerGone).
func (t *Transport) newRequest(x *transport.Transfer, m *metadata) *fetchRequest {
	return &fetchRequest{t: t, meta: m, dir: x.Direction, conns: map[net.Conn]struct{}{},
		pool: poolKey{endpoint: m.Endpoint, source: x.Owner().RuntimeID, key: t.clientKey(m)}}
}

// checkRequest decodes the metadata of the object a request moves and
// checks the local tensors (a fetch's targets, a write's sources) against
// it. The metadata counts the tensors but has no sizes: the source checks
// every range it is asked for against its tensors (checkRun), so here a
// tensor's size is taken as its local tensor's in a whole transfer and as
// unbounded in a partial one (which still catches a wrapping range).
func (t *Transport) checkRequest(x *transport.Transfer, local []transport.Tensor, tmeta []byte) (*metadata, error) {
	m, err := decodeMetadata(tmeta)
	if err != nil {
		return nil, err
	}
	size := func(i int) uint64 {
		if x.Pieces == nil {
			return local[i].Nbytes
		}
		return math.MaxUint64
	}
	if err := x.CheckPieces(local, int(m.Tensors), size); err != nil {
		return nil, err
	}
	return m, nil
}

// activate records a request that moves bytes, for Close to abort.
func (t *Transport) activate(r *fetchRequest) error {
	t.pmu.Lock()
	defer t.pmu.Unlock()
	if t.closed {
		return transport.Errorf(transport.ErrClosed, "the transport is closed")
	}
	t.active[r] = struct{}{}
	return nil
}

// plan cuts what the targets receive (x.PieceOf: a whole tensor, or a
// range of one) into requests: those under streamMin all go on one
// stream, pipelined, their answers batched at the source; a larger one is
// split into one share per stream (page-aligned), each share into requests
// of at most maxChunk. A request asks for bytes of its target's range
// alone, so nothing else crosses the wire. Small pieces that follow each
// other both at the source and in the targets' memory become one request
// (see the protocol), of up to streamMin bytes and maxRunTensors tensors.
func plan(x *transport.Transfer, targets []transport.Tensor, streams int) (small []piece, shares [][]piece, err error) {
	var runLast uint32 // the tensor the last small piece ends in
	var runEnd uint64  // and the byte it ends before
	joinable := false  // nothing moved between the last small piece and this one
	for i, tg := range targets {
		if !tg.Device.Type.HostAccessible() {
			return nil, nil, transport.Errorf(transport.ErrUnsupported, "target %d is in %s memory; tcp writes host memory", i, tg.Device)
		}
		p := x.PieceOf(i, tg)
		if p.Length == 0 {
			continue // a run goes on through an empty tensor
		}
		dst := transport.Bytes(tg.Data, p.Length)
		if p.Length < streamMin {
			if !joinable || !joinRun(x, targets, &small[len(small)-1], p, dst, runLast, runEnd) {
				small = append(small, piece{tensor: p.Tensor, offset: p.Offset, dst: dst, tensors: 1, sizes: sizeDigest(sizeDigestStart, p.Length)})
			}
			runLast, runEnd, joinable = p.Tensor, p.End(), true
			continue
		}
		joinable = false
		share := (p.Length + uint64(streams) - 1) / uint64(streams)
		share = (share + 4095) &^ 4095
		for off := uint64(0); off < p.Length; off += share {
			end := min(off+share, p.Length)
			var ps []piece
			for o := off; o < end; o += maxChunk {
				e := min(o+maxChunk, end)
				ps = append(ps, piece{tensor: p.Tensor, offset: p.Offset + o, dst: dst[o:e]})
			}
			shares = append(shares, ps)
		}
	}
	small, more := spread(small, streams)
	return small, append(shares, more...), nil
}

// joinRun adds p, landing in dst, to the run last, which ends before
// byte runEnd of tensor runLast, when p follows it both at the source and
// in memory and the run stays within its bounds; it reports whether it
// did. At the source, in a whole fetch pieces are whole tensors in order,
// so each follows the one before (empty ones between take no bytes, and
// the source checks the run's sizes); in a partial fetch only pieces of
// one tensor are known to touch, the metadata having no sizes.
func joinRun(x *transport.Transfer, targets []transport.Tensor, last *piece, p transport.Piece, dst []byte, runLast uint32, runEnd uint64) bool {
	follows := x.Pieces == nil || p.Tensor == runLast && p.Offset == runEnd
	if !follows || len(last.dst)+len(dst) > streamMin || p.Tensor-last.tensor >= maxRunTensors {
		return false
	}
	joined, ok := transport.Join(last.dst, dst)
	if !ok {
		return false
	}
	last.dst = joined
	if x.Pieces == nil { // a run of whole tensors, the empty ones between included
		for j := runLast + 1; j <= p.Tensor; j++ {
			last.sizes = sizeDigest(last.sizes, targets[j].Nbytes)
		}
		last.tensors = p.Tensor - last.tensor + 1
	}
	return true
}

// spreadMin is the average piece from which a run of small pieces is
// spread over the streams: below it a fetch costs per request more than
// per byte, which one pipelined stream batches best (measured: 10,000
// pieces of 105 KiB went from 1.29x to 1.0x one tensor of the same bytes
// when spread, 100,000 of 10 KiB gained nothing).
const spreadMin = 96 << 10

// spread cuts a run of small pieces that together is large and made of
// mid-sized pieces (views of one buffer, the tensors of a state dict) into
// up to `streams` runs of about equal bytes, kept in order, so that it
// moves over as many connections as one large tensor of the same bytes:
// the first run stays the inline one, the others become shares.
func spread(small []piece, streams int) ([]piece, [][]piece) {
	var total uint64
	for _, p := range small {
		total += uint64(len(p.dst))
	}
	k := min(uint64(streams), total/streamMin)
	if k < 2 || total < spreadMin*uint64(len(small)) {
		return small, nil
	}
	per := (total + k - 1) / k
	var runs [][]piece
	start, acc := 0, uint64(0)
	for i, p := range small {
		acc += uint64(len(p.dst))
		if acc >= per && len(runs) < int(k)-1 {
			runs = append(runs, small[start:i+1])
			start, acc = i+1, 0
		}
	}
	if start < len(small) {
		runs = append(runs, small[start:])
	}
	return runs[0], runs[1:]
}

func (r *fetchRequest) spawn(ps []piece) {
	r.run(func() error { return r.pull(ps) })
}

// pull runs pieces on one connection, pooled or new.
func (r *fetchRequest) pull(ps []piece) error {
	c, err := r.takeConn()
	if err != nil {
		return err
	}
	s := &stream{r: r, c: c, pieces: ps}
	err = s.advance(readv(c))
	r.finishConn(c, err)
	return err
}

// takeConn takes a pooled connection or dials one, tracked for abort.
func (r *fetchRequest) takeConn() (net.Conn, error) {
	if r.aborted.Load() {
		return nil, abortedErr()
	}
	c, err := r.t.conn(r.ctx, r.pool)
	if err != nil {
		if r.aborted.Load() {
			return nil, abortedErr()
		}
		return nil, err
	}
	if !r.track(c) {
		c.Close()
		return nil, abortedErr()
	}
	return c, nil
}

// finishConn pools a connection that ended cleanly and closes one that saw
// any error (its stream position is unknown).
func (r *fetchRequest) finishConn(c net.Conn, err error) {
	r.mu.Lock()
	delete(r.conns, c)
	if err == nil && r.aborted.Load() {
		// abort may have closed it already: never pool a closed conn.
		err = abortedErr()
	}
	r.mu.Unlock()
	if err != nil {
		c.Close()
		if transport.StatusOf(err) == transport.ErrPeerUnavailable {
			r.t.pool.Drop(r.pool)
		}
		return
	}
	r.t.pool.Put(r.pool, c)
}

// driveInline advances the inline stream (imu held): within budget when
// budget > 0, else to the end.
func (r *fetchRequest) driveInline(budget time.Duration) {
	s := r.inline
	var err error
	if budget > 0 {
		err = s.advanceInline(budget)
		if err == errBudget {
			return
		}
	} else {
		err = s.advance(readv(s.c))
	}
	r.idone = true
	r.finishConn(s.c, err)
	if err != nil {
		r.fail(err)
	}
}

// Completed reports whether everything arrived. For a small inline pull it
// first waits up to inlineBudget for the answers, on this goroutine: the
// engine then finishes the transfer without a goroutine hand-off.
func (r *fetchRequest) Completed() bool {
	if r.inline != nil {
		if !r.imu.TryLock() {
			return false
		}
		if !r.idone && r.pending.Load() == 0 && r.inline.bytesLeft() <= inlineMax {
			r.driveInline(inlineBudget)
		}
		done := r.idone
		r.imu.Unlock()
		if !done {
			return false
		}
	}
	return r.pending.Load() == 0
}

// Wait finishes the inline stream on this goroutine, waits for the others
// and returns the first error.
func (r *fetchRequest) Wait() error {
	if r.inline != nil {
		r.imu.Lock()
		if !r.idone {
			r.driveInline(0)
		}
		r.imu.Unlock()
	}
	r.wg.Wait()
	r.done()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Release frees the request; after Wait there is nothing left to free, and
// a request released without Wait is aborted and waited for.
func (r *fetchRequest) Release() {
	if !r.Completed() {
		r.abort()
		r.Wait()
	}
	r.done()
}

// done drops what a finished request holds in its transport.
func (r *fetchRequest) done() {
	if r.cancel != nil {
		r.cancel()
	}
	r.t.pmu.Lock()
	delete(r.t.active, r)
	r.t.pmu.Unlock()
}

// fail records the first error and stops the rest of the request.
func (r *fetchRequest) fail(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
	r.abort()
}

func (r *fetchRequest) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.aborted.Load() {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *fetchRequest) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}

// abort closes the request's connections so that blocked reads return: a
// shutdown first, which also wakes a thread waiting in ppoll (a close alone
// would wait for it).
func (r *fetchRequest) abort() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.aborted.Store(true)
	if r.cancel != nil {
		r.cancel()
	}
	for c := range r.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.CloseRead()
		}
		c.Close()
	}
}

func abortedErr() error { return transport.Errorf(transport.ErrAborted, "transfer aborted") }

// ioError names what a failed read or write on a data connection means.
func (r *fetchRequest) ioError(err error) error {
	if r.aborted.Load() {
		return abortedErr()
	}
	var carrier transport.StatusCarrier
	if errors.As(err, &carrier) {
		return err
	}
	peer := "source"
	if r.dir == transport.Write {
		peer = "owner"
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.EPIPE) {
		return transport.Errorf(transport.ErrPeerUnavailable, "the %s %s went away during the transfer", peer, r.meta.Endpoint)
	}
	return transport.Errorf(transport.ErrPeerUnavailable, "transfer with the %s %s failed: %v", peer, r.meta.Endpoint, err)
}

// Abort stops a transfer in progress; Wait then returns ErrAborted.
func (t *Transport) Abort(x *transport.Transfer, req transport.Request) {
	if r, ok := req.(*fetchRequest); ok {
		r.abort()
	}
}

func (t *Transport) CommunicatorMetadata(x *transport.Transfer) ([]byte, error) { return nil, nil }

// idleConn takes a pooled connection, or returns nil. The most recently
// used goes first, so connections beyond what is needed age out. A pooled
// connection must hold nothing unread: one with bytes waiting (a source
// that sent what nobody asked for) or an end of stream (a source that hung
// up) is closed, and the next one tried.
func (t *Transport) idleConn(k poolKey) net.Conn {
	for {
		c, ok := t.pool.Take(k)
		if !ok {
			return nil
		}
		why := unread(c)
		if why == "" {
			return c
		}
		t.h.Log().Debugf("closing a pooled data connection to %s: %s", k.endpoint, why)
		c.Close()
	}
}

// unread checks, without blocking, that nothing is waiting to be read on
// an idle connection: it returns "" when the connection is clean, else
// what is wrong with it.
func unread(c net.Conn) string {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return ""
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err.Error()
	}
	var n int
	var rerr error
	if err := rc.Control(func(fd uintptr) {
		var b [1]byte
		for {
			n, _, rerr = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			if rerr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return err.Error()
	}
	switch {
	case rerr == unix.EAGAIN:
		return ""
	case rerr != nil:
		return rerr.Error()
	case n == 0:
		return "the source closed it"
	default:
		return "the source sent bytes nobody asked for"
	}
}

// conn takes a pooled connection or dials and authenticates one.
func (t *Transport) conn(ctx context.Context, k poolKey) (net.Conn, error) {
	t.pmu.Lock()
	closed := t.closed
	t.pmu.Unlock()
	if closed {
		return nil, transport.Errorf(transport.ErrClosed, "the transport is closed")
	}
	if c := t.idleConn(k); c != nil {
		return c, nil
	}
	ep := k.endpoint
	// A transient failure (no route to the source's host, say, right after
	// a partition healed) is dialed again until ctx ends, which the engine
	// sees to at the caller's deadline, or for authTimeout.
	c, err := transport.Redial(ctx, authTimeout, t.h.Log(), "dialing "+ep, func(ctx context.Context) (net.Conn, error) {
		d := net.Dialer{Timeout: dialTimeout}
		return d.DialContext(ctx, "tcp", ep)
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, transport.Errorf(transport.ErrAborted, "dialing %s was cancelled", ep)
		}
		return nil, transport.Errorf(transport.ErrPeerUnavailable, "cannot reach the source's data endpoint %s: %v", ep, err)
	}
	tune(c)
	// Cancelling ctx (an abort) also cuts a handshake with a source that
	// accepted but does not answer.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	err = t.authenticate(c, ep, k.key)
	if !stop() {
		c.Close()
		return nil, transport.Errorf(transport.ErrAborted, "the handshake with %s was cancelled", ep)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// clientKey is the key to prove to the source of m: the one in its
// metadata, else our configured token.
func (t *Transport) clientKey(m *metadata) string {
	if m.Key != "" {
		return m.Key
	}
	return t.h.AuthToken()
}

func (t *Transport) authenticate(c net.Conn, ep, key string) error {
	c.SetDeadline(time.Now().Add(authTimeout))
	defer c.SetDeadline(time.Time{})
	hello := make([]byte, helloLen)
	n, err := io.ReadFull(c, hello)
	if m := min(n, len(helloMagic)); string(hello[:m]) != helloMagic[:m] {
		return transport.Errorf(transport.ErrCorrupt, "data connection to %s: not an rdt data endpoint", ep)
	}
	if err != nil {
		return transport.Errorf(transport.ErrPeerUnavailable, "data connection to %s: handshake failed: %v", ep, err)
	}
	if v := hello[len(helloMagic)]; v != protoVersion {
		return transport.Errorf(transport.ErrUnsupported, "data connection to %s: it speaks data protocol version %d, this build speaks %d", ep, v, protoVersion)
	}
	id := t.h.Identity().RuntimeID
	answer := append(transport.AuthProof(key, authPurpose, hello[len(helloMagic)+1:]), id[:]...)
	if _, err := c.Write(answer); err != nil {
		return transport.Errorf(transport.ErrPeerUnavailable, "data connection to %s: handshake failed: %v", ep, err)
	}
	st, tag, msg, err := readResponse(c)
	if err == nil && tag != 0 {
		err = transport.Errorf(transport.ErrCorrupt, "data connection to %s: the handshake's answer carries tag %#x, not 0", ep, tag)
	}
	if err != nil {
		// A server that refuses the key says so (below); a connection
		// that ends without an answer means the peer went away, say
		// killed while we connected.
		if transport.StatusOf(err) == transport.ErrPeerUnavailable {
			return transport.Errorf(transport.ErrPeerUnavailable, "data connection to %s: the peer closed the connection during authentication: %v", ep, err)
		}
		return err
	}
	if st == transport.OK {
		return nil
	}
	return transport.Errorf(st, "data connection to %s: %s", ep, msg)
}

// readResponse reads one response header and its message, and returns the
// tag the header carries for the caller to check (handshake only; pulls
// read theirs in stream.advance).
func readResponse(c net.Conn) (transport.Status, uint64, string, error) {
	var hdr [responseLen]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return 0, 0, "", transport.Errorf(transport.ErrPeerUnavailable, "reading from %s: %v", c.RemoteAddr(), err)
	}
	st, n, tag, err := decodeResponseHeader(hdr[:])
	if err != nil {
		return 0, 0, "", err
	}
	if n == 0 {
		return st, tag, "", nil
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(c, msg); err != nil {
		return 0, 0, "", transport.Errorf(transport.ErrPeerUnavailable, "reading from %s: %v", c.RemoteAddr(), err)
	}
	return st, tag, string(msg), nil
}

// run runs f on a goroutine of the request; its error fails the request.
func (r *fetchRequest) run(f func() error) {
	r.wg.Add(1)
	r.pending.Add(1)
	go func() {
		defer r.wg.Done()
		if err := f(); err != nil {
			r.fail(err)
		}
		r.pending.Add(-1)
	}()
}
