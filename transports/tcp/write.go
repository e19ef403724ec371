package tcp

import (
	"context"
	"net"

	"github.com/rdt-project/rdt/core/transport"
)

// writeWindow is how many write frames a connection keeps unanswered. A
// frame carries its bytes, so a few keep the link busy; the answers they
// owe (a header, or a refusal of a few hundred bytes) always fit the
// socket buffers while the writer is still sending.
const writeWindow = 16

// wchunk is one write frame: bytes of a source for a range of one tensor.
type wchunk struct {
	tensor uint32
	offset uint64
	data   []byte
}

// Write pushes each source into its piece of the exposed object over the
// owner's data port: frames of at most maxWrite bytes, on several
// connections when there is much to move, each answered once its bytes are
// in place. The owner's server takes them only for the write its runtime
// admitted (x.TransferID) and only inside the admitted ranges.
func (t *Transport) Write(x *transport.Transfer, sources []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	return t.cl.write(x, sources, tmeta)
}

// write is Write.
func (cl *client) write(x *transport.Transfer, sources []transport.Tensor, tmeta []byte) (transport.Request, error) {
	m, err := cl.checkRequest(x, sources, tmeta)
	if err != nil {
		return nil, err
	}
	for i, s := range sources {
		if !s.Device.Type.HostAccessible() {
			return nil, transport.Errorf(transport.ErrUnsupported, "source %d is in %s memory; tcp moves host memory", i, s.Device)
		}
	}
	shares := planWrite(x, sources, cl.streams)
	r := cl.newRequest(x, m)
	if len(shares) == 0 {
		return r, nil
	}
	if err := cl.activate(r); err != nil {
		return nil, err
	}
	if len(shares) == 1 && r.writeInline(x.TransferID, shares[0]) {
		return r, nil
	}
	r.ctx, r.cancel = context.WithCancel(cl.h.Context())
	for _, share := range shares {
		r.run(func() error { return r.push(x.TransferID, share) })
	}
	return r, nil
}

// inlineWriteMax bounds a write whose frames go out on the caller's
// thread and whose answers are read there (Completed, Wait), as a small
// fetch's are: small enough for the socket to take at once.
const inlineWriteMax = 64 << 10

// writeInline sends a small write's frames on a pooled connection now,
// its answers read by Completed or Wait with no goroutine of ours; false
// when the write is larger, no connection is idle, or the one taken
// failed.
func (r *fetchRequest) writeInline(writeID uint64, share []wchunk) bool {
	var n int
	for _, ch := range share {
		n += len(ch.data)
	}
	if n > inlineWriteMax {
		return false
	}
	c := r.cl.idleConn(r.pool)
	if c == nil {
		return false
	}
	pieces := make([]piece, len(share))
	for i, ch := range share {
		pieces[i] = piece{tensor: ch.tensor, offset: ch.offset, src: ch.data}
	}
	s := &stream{r: r, c: c, pieces: pieces, writeID: writeID}
	r.track(c)
	if err := s.sendMore(); err != nil {
		// A stale pooled connection. Frames that went (whole or in part)
		// land the same bytes again when a goroutine pushes them anew.
		r.untrack(c)
		c.Close()
		r.cl.pool.Drop(r.pool) // its siblings are most likely dead too
		return false
	}
	r.inline = s
	return true
}

// planWrite cuts the sources into frames and deals them to the streams:
// one stream unless there is at least streamMin to move.
func planWrite(x *transport.Transfer, sources []transport.Tensor, streams int) [][]wchunk {
	var all []wchunk
	var total uint64
	for i, s := range sources {
		p := x.PieceOf(i, s)
		data := transport.Bytes(s.Data, s.Nbytes)
		for off := uint64(0); off < p.Length; off += maxWrite {
			n := min(p.Length-off, maxWrite)
			all = append(all, wchunk{tensor: p.Tensor, offset: p.Offset + off, data: data[off : off+n]})
		}
		total += p.Length
	}
	if len(all) == 0 {
		return nil
	}
	n := 1
	if total >= streamMin {
		n = min(streams, len(all))
	}
	shares := make([][]wchunk, n)
	for i, c := range all {
		shares[i%n] = append(shares[i%n], c)
	}
	return shares
}

// push sends the frames of one share on one connection, pooled or new,
// keeping writeWindow of them unanswered, and checks every answer.
func (r *fetchRequest) push(writeID uint64, share []wchunk) error {
	c, err := r.takeConn()
	if err != nil {
		return err
	}
	err = r.pushOn(c, writeID, share)
	r.finishConn(c, err)
	return err
}

func (r *fetchRequest) pushOn(c net.Conn, writeID uint64, share []wchunk) error {
	var tags []uint64 // of the frames not answered yet, in order
	hdr := make([]byte, 0, requestLen)
	for _, ch := range share {
		if r.aborted.Load() {
			return abortedErr()
		}
		tag := newTag()
		req := request{Object: r.meta.Object, Tensor: ch.tensor, Offset: ch.offset, Length: uint64(len(ch.data)), Tag: tag, Sizes: writeID, Write: true}
		bufs := net.Buffers{req.encode(hdr[:0]), ch.data}
		if _, err := bufs.WriteTo(c); err != nil {
			return r.ioError(err)
		}
		tags = append(tags, tag)
		if len(tags) == writeWindow {
			if err := r.answered(c, tags[0]); err != nil {
				return err
			}
			tags = tags[1:]
		}
	}
	for _, tag := range tags {
		if err := r.answered(c, tag); err != nil {
			return err
		}
	}
	return nil
}

// answered reads the answer to the frame tagged tag.
func (r *fetchRequest) answered(c net.Conn, tag uint64) error {
	st, got, msg, err := readResponse(c)
	if err != nil {
		return r.ioError(err)
	}
	if got != tag {
		return transport.Errorf(transport.ErrCorrupt, "the owner's data endpoint %s answered tag %#x, expected %#x", r.meta.Endpoint, got, tag)
	}
	if st != transport.OK {
		return transport.Errorf(st, "the owner refused a write: %s", msg)
	}
	return nil
}
