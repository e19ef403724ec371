package tcp

import (
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"golang.org/x/sys/unix"
)

// The receiver's stream: the requests of one fetch's pieces pipelined on
// one data connection and their answers read straight into the targets,
// on a goroutine of the request (readv) or on the caller's own thread
// (advanceInline). fetch.go plans the pieces and runs the streams.

// piece is one request's worth of targets: a byte range of one tensor, or
// a run of whole tensors (tensors of them, their sizes digesting to
// sizes), at most maxChunk long, and the memory it lands in.
type piece struct {
	tensor  uint32
	tensors uint32
	offset  uint64
	dst     []byte
	src     []byte // a write's bytes (its answer carries none: dst is empty)
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
	// writeID, when not zero, makes it a write's: each piece's frame
	// carries its src into the open write of that id (write.go).
	writeID uint64
	sent    int // request frames written
	done    int // pieces fully received
	hdrGot  int // of pieces[done]'s header
	st      transport.Status
	msg     []byte // a refusal's message
	msgGot  int
	got     int // bytes of pieces[done] received
	frames  []byte
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

// sendMore tops the window up once half of it has been answered (a
// write's window is writeWindow: its frames carry their bytes).
func (s *stream) sendMore() error {
	w := window
	if s.writeID != 0 {
		w = writeWindow
	}
	if s.sent == len(s.pieces) || s.sent-s.done > w/2 {
		return nil
	}
	b := s.frames[:0]
	bufs := s.iovs[:0]
	for s.sent < len(s.pieces) && s.sent-s.done < w {
		p := &s.pieces[s.sent]
		p.tag = newTag()
		req := request{Object: s.r.meta.Object, Tensor: p.tensor, Tensors: p.tensors, Offset: p.offset, Length: uint64(len(p.dst)), Tag: p.tag, Sizes: p.sizes}
		if s.writeID != 0 {
			req.Length, req.Sizes, req.Write = uint64(len(p.src)), s.writeID, true
			at := len(b)
			b = req.encode(b)
			bufs = append(bufs, b[at:], p.src)
		} else {
			b = req.encode(b)
		}
		s.sent++
	}
	s.frames = b
	if s.writeID == 0 {
		_, err := s.c.Write(b)
		return err
	}
	// Each header's slice keeps its bytes whether or not b grew after it.
	nb := net.Buffers(bufs)
	_, err := nb.WriteTo(s.c)
	clear(bufs)
	s.iovs = bufs[:0]
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
		case s.st != transport.OK && s.writeID != 0:
			return transport.Errorf(s.st, "the owner refused a write: %s", s.msg)
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
