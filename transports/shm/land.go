package shm

import (
	"io"
	"net"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"golang.org/x/sys/unix"
)

// The owner's side of writes: its segment server lands the bytes of writes
// its runtime admitted (Host.WriteInto) in the exposed tensors. See
// protocol.go for the messages and write.go for the writer's side.

// ExtractExposedMetadata describes an object exposed for writing: where
// its owner's segment server listens and its tensors' sizes. Nothing is
// staged: writes land in the tensors themselves, and the segment server
// serves no fetch of it.
func (t *Transport) ExtractExposedMetadata(obj transport.ObjectID, tensors []transport.Tensor) ([]byte, error) {
	m, err := t.srv.describe(obj, tensors)
	if err != nil {
		return nil, err
	}
	return m.encode(), nil
}

const (
	// wchunk is the largest slot of a staging area (measured: 16 MiB moved
	// 1 GiB faster than 8 or 2 MiB on two cores): a write moves through
	// two slots of at most this size, the writer filling one while the
	// owner drains the other.
	wchunk = 16 << 20
	// stagingHeader is the page before the slots; its first word is the
	// id of a write its writer aborted.
	stagingHeader = 4096
	// maxStaging bounds the staging area a writer maps.
	maxStaging = stagingHeader + 2*wchunk
	// landStep is copied between looks at the abort word.
	landStep = 1 << 20
)

// lander lands writes for the segment server, under the runtime's
// admission of each (Host.WriteInto).
type lander struct {
	h transport.Host
}

// landing is a served connection's state for writes: its staging area,
// made at the first write that needs one and kept for the next.
type landing struct {
	mem  []byte // header and two slots; nil before the first staged write
	slot uint64 // the size of each slot
	buf  []byte // an inline write's bytes
}

func (w *landing) close() {
	if w.mem != nil {
		unix.Munmap(w.mem)
		w.mem = nil
	}
}

// abortedID is the id of the write the writer aborted (0: none).
func (w *landing) abortedID() uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&w.mem[0])))
}

// slotSize is the slot a write of total bytes moves through: whole in two
// slots when it fits, else in slots of wchunk.
func slotSize(total uint64) uint64 {
	half := (total + 1) / 2
	return min(wchunk, (half+4095)&^4095)
}

// stage makes sure the connection has a staging area with slots of at
// least size bytes; fd is the new area's descriptor for the writer (-1
// when the one it has will do), which the caller closes.
func (w *landing) stage(size uint64) (fd int, err error) {
	if w.mem != nil && w.slot >= size {
		return -1, nil
	}
	total := stagingHeader + 2*size
	fd, err = unix.MemfdCreate("rdt-shm-write", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		if exhausted := outOfResources("memfd_create for a write", "the owner", err); exhausted != nil {
			return -1, exhausted
		}
		return -1, transport.Errorf(transport.ErrTransport, "memfd_create for a write: %v", err)
	}
	fail := func(what string, err error) (int, error) {
		unix.Close(fd)
		if exhausted := outOfResources(what+" of a write's staging area", "the owner", err); exhausted != nil {
			return -1, exhausted
		}
		return -1, transport.Errorf(transport.ErrTransport, "%s of a write's %d-byte staging area: %v", what, total, err)
	}
	if err := unix.Ftruncate(fd, int64(total)); err != nil {
		return fail("ftruncate", err)
	}
	// Neither side can shrink what the other maps (a read past the end
	// would fault), and nothing can add seals the writer does not expect.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail("sealing", err)
	}
	mem, err := unix.Mmap(fd, 0, int(total), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	w.close()
	w.mem, w.slot = mem, size
	return fd, nil
}

// land serves one write request, whose first bytes are got; ok false ends
// the connection (it is out of step, or failed), small says the write went
// inline.
func (l *lander) land(c *net.UnixConn, got []byte, w *landing) (ok, small bool) {
	var hb [writeHeaderLen]byte
	n := copy(hb[:], got)
	if _, err := io.ReadFull(c, hb[n:]); err != nil {
		return false, false
	}
	h, err := decodeWriteHeader(hb[:])
	if err != nil {
		l.refuseWrite(c, err)
		return false, false
	}
	raw := make([]byte, int(h.count)*pieceLen) // at most maxRegions pieces
	if _, err := io.ReadFull(c, raw); err != nil {
		return false, false
	}
	pieces, total, err := decodePieces(raw)
	if err != nil {
		l.refuseWrite(c, err)
		return false, false
	}
	if total <= inlineMax {
		return l.landInline(c, h, pieces, total, w), true
	}
	// Checked before the writer copies a byte: the write is open, and its
	// pieces lie inside the tensors and what was admitted.
	if err := l.checkWrite(h, pieces); err != nil {
		l.refuseWrite(c, err)
		return true, false
	}
	size := slotSize(total)
	fd, err := w.stage(size)
	if err != nil {
		l.refuseWrite(c, err)
		return true, false
	}
	c.SetWriteDeadline(time.Now().Add(ioTimeout))
	if fd >= 0 {
		_, _, err = c.WriteMsgUnix(encodeReply(transport.OK, "", uint64(len(w.mem)), flagStaging), unix.UnixRights(fd), nil)
		unix.Close(fd)
	} else {
		_, err = c.Write(encodeReply(transport.OK, "", uint64(len(w.mem)), 0))
	}
	if err != nil {
		return false, false
	}
	return l.landChunks(c, h, pieces, total, w), false
}

// refuseWrite answers a write request or chunk with err.
func (l *lander) refuseWrite(c *net.UnixConn, err error) {
	l.h.Log().Debugf("refused a write: %v", err)
	c.SetWriteDeadline(time.Now().Add(ioTimeout))
	c.Write(encodeReply(transport.StatusOf(err), err.Error(), 0, 0))
}

// checkWrite checks a write's pieces against the object and what its
// write was admitted for.
func (l *lander) checkWrite(h writeHeader, pieces []transport.Piece) error {
	tensors, admitted, done, err := l.h.WriteInto(h.obj, h.writeID)
	if err != nil {
		return err
	}
	defer done()
	return checkPieces(tensors, admitted, pieces)
}

// checkPieces checks that every piece lies inside its tensor, in host
// memory, and inside the admitted pieces (transport.Covered; nil: every
// tensor, whole).
func checkPieces(tensors []transport.Tensor, admitted, pieces []transport.Piece) error {
	for i, p := range pieces {
		if uint64(p.Tensor) >= uint64(len(tensors)) {
			return transport.Errorf(transport.ErrInvalidArgument, "piece %d of the write is for tensor %d; object has %d", i, p.Tensor, len(tensors))
		}
		tn := tensors[p.Tensor]
		if !p.Within(tn.Nbytes) {
			return transport.Errorf(transport.ErrInvalidArgument, "piece %d of the write, bytes [%d, +%d) of tensor %d, lies outside its %d bytes", i, p.Offset, p.Length, p.Tensor, tn.Nbytes)
		}
		if !tn.Device.Type.HostAccessible() {
			return transport.Errorf(transport.ErrUnsupported, "tensor %d of the object is in %s memory; shm writes host memory", p.Tensor, tn.Device)
		}
		if !transport.Covered(admitted, p) {
			return transport.Errorf(transport.ErrInvalidArgument, "bytes [%d, +%d) of tensor %d are outside the ranges the write was admitted for", p.Offset, p.Length, p.Tensor)
		}
	}
	return nil
}

// landInline reads a small write's bytes, which follow its request, and
// lands them. The bytes are read whole before any lands, so a writer that
// dies while sending lands nothing; a refused write's bytes are read too,
// keeping the connection in step.
func (l *lander) landInline(c *net.UnixConn, h writeHeader, pieces []transport.Piece, total uint64, w *landing) bool {
	if w.buf == nil {
		w.buf = make([]byte, inlineMax)
	}
	buf := w.buf[:total]
	c.SetReadDeadline(time.Now().Add(l.h.PeerTimeout()))
	if _, err := io.ReadFull(c, buf); err != nil {
		return false
	}
	err := l.landWhole(h, pieces, buf)
	c.SetWriteDeadline(time.Now().Add(ioTimeout))
	if err != nil {
		l.h.Log().Debugf("refused a write: %v", err)
		_, werr := c.Write(encodeReply(transport.StatusOf(err), err.Error(), 0, 0))
		return werr == nil
	}
	_, werr := c.Write(encodeReply(transport.OK, "", total, 0))
	return werr == nil
}

// cursor is where the next byte of a write lands: in pieces[i], which
// starts at byte at of the write.
type cursor struct {
	pieces []transport.Piece
	i      int
	at     uint64
}

// landBytes lands the next bytes of a write, b, while the write is open
// (WriteInto: a write ended meanwhile lands nothing more); its pieces were
// checked (checkWrite). With aborted, it looks at the abort word between
// steps of landStep bytes and stops when it is set.
func (l *lander) landBytes(h writeHeader, cur *cursor, b []byte, aborted func() bool) error {
	tensors, _, done, err := l.h.WriteInto(h.obj, h.writeID)
	if err != nil {
		return err
	}
	defer done()
	for len(b) > 0 {
		if aborted != nil && aborted() {
			return transport.Errorf(transport.ErrAborted, "the writer aborted write %d", h.writeID)
		}
		b = cur.copy(tensors, b[:min(len(b), landStep)], b)
	}
	return nil
}

// landWhole lands a small write's bytes, b, all of it, checking its pieces
// first, under one WriteInto.
func (l *lander) landWhole(h writeHeader, pieces []transport.Piece, b []byte) error {
	tensors, admitted, done, err := l.h.WriteInto(h.obj, h.writeID)
	if err != nil {
		return err
	}
	defer done()
	if err := checkPieces(tensors, admitted, pieces); err != nil {
		return err
	}
	cur := cursor{pieces: pieces}
	for len(b) > 0 {
		b = cur.copy(tensors, b, b)
	}
	return nil
}

// copy lands the start of step (at most the rest of the current piece) and
// returns rest after those bytes; step is the start of rest.
func (cur *cursor) copy(tensors []transport.Tensor, step, rest []byte) []byte {
	for cur.pieces[cur.i].Length == 0 {
		cur.i++ // the bytes go on in the next piece that has any
	}
	p := cur.pieces[cur.i]
	n := min(uint64(len(step)), p.Length-cur.at)
	copy(transport.Bytes(tensors[p.Tensor].Data+uintptr(p.Offset+cur.at), n), step[:n])
	if cur.at += n; cur.at == p.Length {
		cur.i, cur.at = cur.i+1, 0
	}
	return rest[n:]
}

// landChunks takes a write's chunks from the staging area's slots, in
// order, answering each once it landed; ok false ends the connection (a
// writer gone, aborted or out of step, or a write refused midway: the
// chunk the writer sent after it would be taken for the next request).
func (l *lander) landChunks(c *net.UnixConn, h writeHeader, pieces []transport.Piece, total uint64, w *landing) bool {
	var landed uint64
	var msg [chunkLen]byte
	cur := cursor{pieces: pieces}
	aborted := func() bool { return w.abortedID() == h.writeID }
	for k := uint64(0); landed < total; k++ {
		// A writer that stops sending lets go after the peer timeout.
		c.SetReadDeadline(time.Now().Add(l.h.PeerTimeout()))
		if _, err := io.ReadFull(c, msg[:]); err != nil {
			return false
		}
		slot, n, err := decodeChunk(msg[:])
		if want := min(w.slot, total-landed); err == nil && (slot != uint32(k%2) || n != want) {
			err = transport.Errorf(transport.ErrCorrupt, "chunk %d of write %d: %d bytes in slot %d, want %d in slot %d", k, h.writeID, n, slot, want, k%2)
		}
		if err == nil {
			from := stagingHeader + uint64(slot)*w.slot
			err = l.landBytes(h, &cur, w.mem[from:from+n], aborted)
		}
		if err != nil {
			l.refuseWrite(c, err)
			return false
		}
		landed += n
		c.SetWriteDeadline(time.Now().Add(ioTimeout))
		if _, err := c.Write(encodeReply(transport.OK, "", landed, 0)); err != nil {
			return false
		}
	}
	return true
}
