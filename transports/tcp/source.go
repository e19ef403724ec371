package tcp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// GarbageCollect has nothing to free: the source serves live objects only,
// through PinObject, so a freed object is simply no longer found.
func (t *Transport) GarbageCollect(obj transport.ObjectID, tensors []transport.Tensor, tmeta []byte) {
}

// ExtractMetadata names this runtime's data endpoint and the object.
func (t *Transport) ExtractMetadata(obj transport.ObjectID, tensors []transport.Tensor) ([]byte, error) {
	for _, x := range tensors {
		if !x.Device.Type.HostAccessible() {
			return nil, transport.Errorf(transport.ErrUnsupported, "it moves host memory; tensor on %s", x.Device)
		}
	}
	if len(tensors) > transport.MaxTensors {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "%d tensors exceed the limit of %d", len(tensors), transport.MaxTensors)
	}
	ep, err := t.listen()
	if err != nil {
		return nil, err
	}
	m := metadata{Endpoint: ep, Object: obj, Tensors: uint32(len(tensors)), Key: t.metaKey}
	return m.encode(), nil
}

func (t *Transport) listen() (string, error) {
	t.lmu.Lock()
	defer t.lmu.Unlock()
	if t.lclosed {
		return "", transport.Errorf(transport.ErrClosed, "the transport is closed")
	}
	if t.ln != nil {
		return t.endpoint, nil
	}
	// Without a token the core keeps BindHost on loopback.
	ln, err := net.Listen("tcp", net.JoinHostPort(t.h.BindHost(), "0"))
	if err != nil {
		return "", transport.Errorf(transport.ErrTransport, "cannot listen on %s: %v", t.h.BindHost(), err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	t.ln = ln
	t.endpoint = net.JoinHostPort(t.h.AdvertiseHost(), strconv.Itoa(port))
	// A flood of wrong keys writes a few lines, not one a connection.
	t.refused = transport.NewFloodLog(t.h.Log(), transport.LogWarn, time.Second,
		"refused a data connection", "refused %d more data connections since %s")
	t.serving.Add(1)
	go t.accept(ln)
	t.h.Log().Debugf("serving data on %s (advertised as %s)", ln.Addr(), t.endpoint)
	return t.endpoint, nil
}

func (t *Transport) accept(ln net.Listener) {
	defer t.serving.Done()
	for {
		t.slots <- struct{}{} // released when a handshake ends, or here
		c, err := ln.Accept()
		if err != nil {
			<-t.slots
			if errors.Is(err, net.ErrClosed) {
				return
			}
			t.h.Log().Warnf("accept: %v", err)
			time.Sleep(10 * time.Millisecond) // say, out of descriptors: do not spin
			continue
		}
		t.lmu.Lock()
		if t.lclosed {
			t.lmu.Unlock()
			c.Close()
			<-t.slots
			return
		}
		t.sconns[c] = transport.RuntimeID{}
		t.serving.Add(1)
		t.lmu.Unlock()
		go t.serve(c)
	}
}

// serve authenticates a client, then answers its requests until it hangs
// up. A request the source cannot honour gets an error response and the
// connection stays usable; a malformed frame closes it.
func (t *Transport) serve(c net.Conn) {
	defer t.serving.Done()
	defer func() {
		t.lmu.Lock()
		delete(t.sconns, c)
		t.lmu.Unlock()
		c.Close()
	}()
	if !t.handshake(c) {
		return
	}
	// Buffered: a pipelined batch of frames is one read, not one per frame.
	rd := bufio.NewReaderSize(c, batchFrames*requestLen)
	frame := make([]byte, requestLen)
	b := &answers{}
	for {
		if _, err := io.ReadFull(rd, frame); err != nil {
			return // the client hung up, or the transport is closing
		}
		req, err := decodeRequest(frame)
		if err != nil {
			t.malformed(c, frameTag(frame), err)
			return
		}
		if req.Length > smallAnswer {
			if err := t.answer(c, req, b.hdrs[:0]); err != nil {
				return
			}
			continue
		}
		// Small answers to the frames already here go out together: one
		// writev for a run of pipelined requests, not one per request.
		b.add(t, c, req)
		for b.n < batchFrames && b.bytes < batchBytes && rd.Buffered() >= requestLen {
			io.ReadFull(rd, frame)
			req, err := decodeRequest(frame)
			if err != nil {
				b.flush(t, c)
				t.malformed(c, frameTag(frame), err)
				return
			}
			if req.Length > smallAnswer {
				if b.flush(t, c) != nil || t.answer(c, req, b.hdrs[:0]) != nil {
					return
				}
				continue
			}
			b.add(t, c, req)
		}
		if b.flush(t, c) != nil {
			return
		}
	}
}

// malformed answers a frame that breaks the framing, before the
// connection is closed; the answer echoes the frame's tag field.
func (t *Transport) malformed(c net.Conn, tag uint64, err error) {
	t.h.Log().Warnf("closing data connection from %s: %v", c.RemoteAddr(), err)
	c.SetWriteDeadline(time.Now().Add(t.writeTimeout))
	c.Write(encodeResponse(nil, tag, transport.StatusOf(err), err.Error()))
}

// answers gathers the responses to a run of small requests, each header
// followed by its bytes (straight from the tensor, pinned until written)
// or by its refusal, to be written with one writev.
type answers struct {
	hdrs   []byte // every header and refusal message of the run
	spans  [][2]int
	data   [][]byte // per request: its bytes, or nil
	unpins []func()
	n      int
	bytes  int
	// The object pinned last in this run, kept until the flush: the
	// requests of one fetch pin it once, not once per tensor.
	pinned  transport.ObjectID
	tensors []transport.Tensor
}

func (b *answers) add(t *Transport, c net.Conn, req request) {
	start := len(b.hdrs)
	var data []byte
	tensors, err := b.pin(t, req.Object)
	if err != nil {
		b.hdrs = encodeResponse(b.hdrs, req.Tag, transport.StatusOf(err), err.Error())
	} else if src, st, msg := checkRange(req, tensors); st != transport.OK {
		t.h.Log().Warnf("refused a request from %s: %s", c.RemoteAddr(), msg)
		b.hdrs = encodeResponse(b.hdrs, req.Tag, st, msg)
	} else {
		b.hdrs = encodeResponse(b.hdrs, req.Tag, transport.OK, "")
		if req.Length > 0 {
			data = transport.Bytes(src.Data+uintptr(req.Offset), req.Length)
		}
	}
	b.spans = append(b.spans, [2]int{start, len(b.hdrs)})
	b.data = append(b.data, data)
	b.n++
	b.bytes += len(b.hdrs) - start + len(data)
}

// pin pins obj until the flush, or finds it pinned already in this run.
func (b *answers) pin(t *Transport, obj transport.ObjectID) ([]transport.Tensor, error) {
	if b.tensors != nil && b.pinned == obj {
		return b.tensors, nil
	}
	tensors, unpin, err := t.h.PinObject(obj)
	if err != nil {
		return nil, err
	}
	b.unpins = append(b.unpins, unpin)
	b.pinned, b.tensors = obj, tensors
	return tensors, nil
}

// flush writes the run and lets go of its pins.
func (b *answers) flush(t *Transport, c net.Conn) error {
	if b.n == 0 {
		return nil
	}
	bufs := make(net.Buffers, 0, 2*b.n)
	for i, sp := range b.spans {
		bufs = append(bufs, b.hdrs[sp[0]:sp[1]])
		if b.data[i] != nil {
			bufs = append(bufs, b.data[i])
		}
	}
	c.SetWriteDeadline(time.Now().Add(t.writeTimeout))
	_, err := bufs.WriteTo(c)
	for _, u := range b.unpins {
		u()
	}
	clear(b.unpins)
	clear(b.data)
	b.tensors = nil
	b.hdrs, b.spans, b.data, b.unpins = b.hdrs[:0], b.spans[:0], b.data[:0], b.unpins[:0]
	b.n, b.bytes = 0, 0
	return err
}

// handshake authenticates a client of the data listener within
// authTimeout; false means the connection is to be closed.
func (t *Transport) handshake(c net.Conn) bool {
	defer func() { <-t.slots }()
	tune(c)
	nonce := transport.NewNonce()
	hello := append(append([]byte(helloMagic), protoVersion), nonce...)
	// A client that does not finish the handshake in time is dropped.
	c.SetDeadline(time.Now().Add(authTimeout))
	if _, err := c.Write(hello); err != nil {
		return false
	}
	answer := make([]byte, clientLen)
	if _, err := io.ReadFull(c, answer); err != nil {
		return false
	}
	if !transport.CheckAuthProof(t.key, authPurpose, nonce, answer[:proofLen]) {
		t.refused.Event(fmt.Sprintf("from %s: wrong key", c.RemoteAddr()))
		c.Write(encodeResponse(nil, 0, transport.ErrPermissionDenied, t.refusal()))
		return false
	}
	// The client's runtime id is not proven: it is used only to close
	// this connection when that runtime is gone (PeerGone).
	t.lmu.Lock()
	t.sconns[c] = transport.RuntimeID(answer[proofLen:])
	t.lmu.Unlock()
	if _, err := c.Write(encodeResponse(nil, 0, transport.OK, "")); err != nil {
		return false
	}
	c.SetDeadline(time.Time{})
	return true
}

// refusal tells a client with the wrong key what to check.
func (t *Transport) refusal() string {
	if t.metaKey == "" {
		return "the peer refused our auth token (set the same RDT_AUTH_TOKEN on both sides)"
	}
	return "the peer refused our key (the source has no auth token: its data port takes only the key inside its refs)"
}

// answer writes one response. Only a failed write is returned: it ends the
// connection. Every write has a deadline, so a client that stops reading
// releases the object's pin after writeTimeout.
func (t *Transport) answer(c net.Conn, req request, hdr []byte) error {
	refuse := func(st transport.Status, msg string) error {
		c.SetWriteDeadline(time.Now().Add(t.writeTimeout))
		_, err := c.Write(encodeResponse(hdr, req.Tag, st, msg))
		return err
	}
	tensors, unpin, err := t.h.PinObject(req.Object)
	if err != nil {
		return refuse(transport.StatusOf(err), err.Error())
	}
	defer unpin()
	src, st, msg := checkRange(req, tensors)
	if st != transport.OK {
		t.h.Log().Warnf("refused a request from %s: %s", c.RemoteAddr(), msg)
		return refuse(st, msg)
	}
	hdr = encodeResponse(hdr, req.Tag, transport.OK, "")
	c.SetWriteDeadline(time.Now().Add(t.writeTimeout))
	if req.Length == 0 {
		_, err = c.Write(hdr)
		return err
	}
	// Header and first chunk in one writev, the bytes straight from the
	// tensor's memory (the pin keeps it alive meanwhile): one segment for a
	// small answer, no copy for a large one. Each further chunk gets a
	// fresh deadline: the bound is on a stall, not on the whole answer.
	data := transport.Bytes(src.Data+uintptr(req.Offset), req.Length)
	first := min(len(data), writeChunk)
	bufs := net.Buffers{hdr, data[:first]}
	if _, err := bufs.WriteTo(c); err != nil {
		return err
	}
	for off := first; off < len(data); off += writeChunk {
		c.SetWriteDeadline(time.Now().Add(t.writeTimeout))
		if _, err := c.Write(data[off:min(off+writeChunk, len(data))]); err != nil {
			return err
		}
	}
	return nil
}

// checkRange finds the tensor a request reads and checks that the range
// lies inside it, or says why not.
func checkRange(req request, tensors []transport.Tensor) (transport.Tensor, transport.Status, string) {
	if uint64(req.Tensor) >= uint64(len(tensors)) {
		return transport.Tensor{}, transport.ErrInvalidArgument, "object " + req.Object.String() + " has " + strconv.Itoa(len(tensors)) +
			" tensors; tensor " + strconv.FormatUint(uint64(req.Tensor), 10) + " was asked for"
	}
	if req.Length > maxChunk {
		return transport.Tensor{}, transport.ErrInvalidArgument, "request for " + strconv.FormatUint(req.Length, 10) +
			" bytes exceeds the " + strconv.Itoa(maxChunk) + "-byte limit"
	}
	src := tensors[req.Tensor]
	// Written so that neither side can overflow.
	if req.Offset > src.Nbytes || req.Length > src.Nbytes-req.Offset {
		return transport.Tensor{}, transport.ErrInvalidArgument, "range [" + strconv.FormatUint(req.Offset, 10) + ", +" +
			strconv.FormatUint(req.Length, 10) + ") is outside tensor " + strconv.FormatUint(uint64(req.Tensor), 10) +
			" (" + strconv.FormatUint(src.Nbytes, 10) + " bytes)"
	}
	if !src.Device.Type.HostAccessible() {
		return transport.Tensor{}, transport.ErrUnsupported, "the object is in " + src.Device.Type.String() + " memory"
	}
	return src, transport.OK, ""
}
