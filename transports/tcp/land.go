package tcp

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// The owner's side of writes: its data server lands the bytes of write
// frames (see protocol.go) in the exposed object, only for a write its
// runtime admitted (Host.WriteInto) and only inside the ranges admitted.
// See write.go for the writer's side.

// land lands the bytes of one write frame, which follow it, in the
// exposed object's memory, and answers once they are in place. A write
// that is not open, or a range outside what it was admitted for, is
// refused; its bytes are read and dropped. Only a failed read or write is
// returned: it ends the connection. Every read of the bytes has a
// deadline, so a writer that stops sending mid-frame lets go of the write
// after writeTimeout.
func (srv *server) land(c net.Conn, rd *bufio.Reader, req request) error {
	defer c.SetReadDeadline(time.Time{})
	reply := func(st transport.Status, msg string) error {
		c.SetWriteDeadline(time.Now().Add(srv.writeTimeout))
		_, err := c.Write(encodeResponse(nil, req.Tag, st, msg))
		return err
	}
	refuse := func(st transport.Status, msg string) error {
		srv.h.Log().Warnf("refused a write from %s: %s", c.RemoteAddr(), msg)
		for left := int64(req.Length); left > 0; {
			c.SetReadDeadline(time.Now().Add(srv.writeTimeout))
			n, err := io.CopyN(io.Discard, rd, min(left, writeChunk))
			if err != nil {
				return err
			}
			left -= n
		}
		return reply(st, msg)
	}
	tensors, pieces, done, err := srv.h.WriteInto(req.Object, req.Sizes)
	if err != nil {
		return refuse(transport.StatusOf(err), err.Error())
	}
	defer done()
	segs, st, msg := checkWrite(req, tensors, pieces)
	if st != transport.OK {
		return refuse(st, msg)
	}
	for _, span := range spansOf(segs, tensors, nil) {
		for len(span) > 0 {
			n := min(len(span), writeChunk)
			c.SetReadDeadline(time.Now().Add(srv.writeTimeout))
			if _, err := io.ReadFull(rd, span[:n]); err != nil {
				return err
			}
			span = span[n:]
		}
	}
	return reply(transport.OK, "")
}

// checkWrite finds where a write frame's bytes land and checks them, or
// says why not: a range inside one tensor of the object (checkRun) and
// inside the pieces its write was admitted for (transport.Covered; nil:
// every tensor, whole).
func checkWrite(req request, tensors []transport.Tensor, admitted []transport.Piece) ([]segment, transport.Status, string) {
	segs, st, msg := checkRun(req, tensors, nil)
	if st != transport.OK {
		return nil, st, msg
	}
	if !transport.Covered(admitted, transport.Piece{Tensor: req.Tensor, Offset: req.Offset, Length: req.Length}) {
		return nil, transport.ErrInvalidArgument, "bytes [" + strconv.FormatUint(req.Offset, 10) + ", +" + strconv.FormatUint(req.Length, 10) +
			") of tensor " + strconv.FormatUint(uint64(req.Tensor), 10) + " are outside the ranges the write was admitted for"
	}
	return segs, transport.OK, ""
}
