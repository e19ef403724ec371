package tcp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// GarbageCollect has nothing to free: the source serves live objects only,
// through PinObject, so a freed object is simply no longer found.
func (t *Transport) GarbageCollect(obj transport.ObjectID, tensors []transport.Tensor, tmeta []byte) {
}

// ExtractMetadata names this runtime's data endpoint and the object.
func (t *Transport) ExtractMetadata(obj transport.ObjectID, tensors []transport.Tensor) ([]byte, error) {
	return t.srv.extract(obj, tensors)
}

// extract is ExtractMetadata.
func (srv *server) extract(obj transport.ObjectID, tensors []transport.Tensor) ([]byte, error) {
	for _, x := range tensors {
		if !x.Device.Type.HostAccessible() {
			return nil, transport.Errorf(transport.ErrUnsupported, "it moves host memory; tensor on %s", x.Device)
		}
	}
	if len(tensors) > transport.MaxTensors {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "%d tensors exceed the limit of %d", len(tensors), transport.MaxTensors)
	}
	ep, err := srv.listen()
	if err != nil {
		return nil, err
	}
	m := metadata{Endpoint: ep, Object: obj, Tensors: uint32(len(tensors)), Key: srv.metaKey}
	return m.encode(), nil
}

func (srv *server) listen() (string, error) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.closed {
		return "", transport.Errorf(transport.ErrClosed, "the transport is closed")
	}
	if srv.ln != nil {
		return srv.endpoint, nil
	}
	// Without a token the core keeps BindHost on loopback.
	ln, err := net.Listen("tcp", net.JoinHostPort(srv.h.BindHost(), "0"))
	if err != nil {
		return "", transport.Errorf(transport.ErrTransport, "cannot listen on %s: %v", srv.h.BindHost(), err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	srv.ln = ln
	srv.endpoint = net.JoinHostPort(srv.h.AdvertiseHost(), strconv.Itoa(port))
	// A flood of wrong keys writes a few lines, not one a connection.
	srv.refused = transport.NewFloodLog(srv.h.Log(), transport.LogWarn, time.Second,
		"refused a data connection", "refused %d more data connections since %s")
	srv.serving.Add(1)
	go srv.accept(ln)
	srv.h.Log().Debugf("serving data on %s (advertised as %s)", ln.Addr(), srv.endpoint)
	return srv.endpoint, nil
}

// accept takes every connection into its handshake at once: one costs a
// goroutine and a few bytes until it proves the key, and the listener's
// transport.PreAuth bounds how many it holds (see there).
func (srv *server) accept(ln net.Listener) {
	defer srv.serving.Done()
	pending := transport.NewPreAuth(transport.MaxPreAuth, transport.MaxPreAuthPerSource)
	defer pending.Close()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			srv.h.Log().Warnf("accept: %v", err)
			time.Sleep(10 * time.Millisecond) // say, out of descriptors: do not spin
			continue
		}
		srv.mu.Lock()
		if srv.closed {
			srv.mu.Unlock()
			c.Close()
			return
		}
		s := &served{}
		srv.sconns[c] = s
		srv.serving.Add(1)
		srv.mu.Unlock()
		go srv.serve(c, s, pending.Admit(c))
	}
}

// served is a connection of the data port.
type served struct {
	peer   transport.RuntimeID // the runtime the client names, once in (under mu)
	authed bool                // counted in nserved and perPeer (under mu)
	// idle is when it began waiting for a request (Unix nanoseconds); 0
	// while it reads or answers one, -1 once closed to make room.
	idle atomic.Int64
}

// serve authenticates a client, then answers its requests until it hangs
// up. A request the source cannot honour gets an error response and the
// connection stays usable; a malformed frame closes it.
func (srv *server) serve(c net.Conn, s *served, p *transport.Pending) {
	defer srv.serving.Done()
	defer func() {
		srv.mu.Lock()
		delete(srv.sconns, c)
		srv.uncountLocked(s)
		srv.mu.Unlock()
		c.Close()
	}()
	if !srv.handshake(c, s, p) {
		return
	}
	// Buffered: a pipelined batch of frames is one read, not one per frame.
	rd := bufio.NewReaderSize(c, batchFrames*requestLen)
	frame := make([]byte, requestLen)
	b := &answers{}
	for {
		if err := srv.nextRequest(c, rd, s, frame); err != nil {
			return // the client hung up or stalled, or the transport is closing
		}
		req, err := decodeRequest(frame)
		if err != nil {
			srv.malformed(c, frameTag(frame), err)
			return
		}
		if req.Write {
			if srv.land(c, rd, req) != nil {
				return
			}
			continue
		}
		if req.Length > smallAnswer {
			if err := srv.answer(c, req, b.hdrs[:0]); err != nil {
				return
			}
			continue
		}
		// Small answers to the frames already here go out together: one
		// writev for a run of pipelined requests, not one per request.
		b.add(srv, c, req)
		for b.n < batchFrames && b.bytes < batchBytes && rd.Buffered() >= requestLen {
			io.ReadFull(rd, frame)
			req, err := decodeRequest(frame)
			if err != nil {
				b.flush(srv, c)
				srv.malformed(c, frameTag(frame), err)
				return
			}
			if req.Write {
				if b.flush(srv, c) != nil || srv.land(c, rd, req) != nil {
					return
				}
				continue
			}
			if req.Length > smallAnswer {
				if b.flush(srv, c) != nil || srv.answer(c, req, b.hdrs[:0]) != nil {
					return
				}
				continue
			}
			b.add(srv, c, req)
		}
		if b.flush(srv, c) != nil {
			return
		}
	}
}

// malformed answers a frame that breaks the framing, before the
// connection is closed; the answer echoes the frame's tag field.
func (srv *server) malformed(c net.Conn, tag uint64, err error) {
	srv.h.Log().Warnf("closing data connection from %s: %v", c.RemoteAddr(), err)
	c.SetWriteDeadline(time.Now().Add(srv.writeTimeout))
	c.Write(encodeResponse(nil, tag, transport.StatusOf(err), err.Error()))
}

// answers gathers the responses to a run of small requests, each header
// followed by its bytes (straight from the tensors, pinned until written)
// or by its refusal, to be written with one writev.
type answers struct {
	hdrs   []byte   // every header and refusal message of the run
	parts  [][3]int // per answer: its header's span in hdrs, then its end in data
	data   [][]byte // the answers' bytes, one span or more each
	segs   []segment
	unpins []func()
	n      int
	bytes  int
	// The object pinned last in this run, kept until the flush: the
	// requests of one fetch pin it once, not once per tensor.
	pinned  transport.ObjectID
	tensors []transport.Tensor
}

func (b *answers) add(srv *server, c net.Conn, req request) {
	start, size := len(b.hdrs), 0
	tensors, err := b.pin(srv, req.Object)
	st, msg := transport.StatusOf(err), ""
	if err != nil {
		msg = err.Error()
	} else if b.segs, st, msg = checkRun(req, tensors, b.segs[:0]); st != transport.OK {
		srv.h.Log().Warnf("refused a request from %s: %s", c.RemoteAddr(), msg)
	}
	b.hdrs = encodeResponse(b.hdrs, req.Tag, st, msg)
	if err == nil && st == transport.OK {
		b.data = spansOf(b.segs, tensors, b.data)
		size = int(req.Length)
	}
	b.parts = append(b.parts, [3]int{start, len(b.hdrs), len(b.data)})
	b.n++
	b.bytes += len(b.hdrs) - start + size
}

// pin pins obj until the flush, or finds it pinned already in this run.
func (b *answers) pin(srv *server, obj transport.ObjectID) ([]transport.Tensor, error) {
	if b.tensors != nil && b.pinned == obj {
		return b.tensors, nil
	}
	tensors, unpin, err := srv.h.PinObject(obj)
	if err != nil {
		return nil, err
	}
	b.unpins = append(b.unpins, unpin)
	b.pinned, b.tensors = obj, tensors
	return tensors, nil
}

// flush writes the run and lets go of its pins.
func (b *answers) flush(srv *server, c net.Conn) error {
	if b.n == 0 {
		return nil
	}
	bufs := make(net.Buffers, 0, b.n+len(b.data))
	d := 0
	for _, p := range b.parts {
		bufs = append(bufs, b.hdrs[p[0]:p[1]])
		bufs = append(bufs, b.data[d:p[2]]...)
		d = p[2]
	}
	c.SetWriteDeadline(time.Now().Add(srv.writeTimeout))
	_, err := bufs.WriteTo(c)
	for _, u := range b.unpins {
		u()
	}
	clear(b.unpins)
	clear(b.data)
	b.tensors = nil
	b.hdrs, b.parts, b.data, b.unpins = b.hdrs[:0], b.parts[:0], b.data[:0], b.unpins[:0]
	b.n, b.bytes = 0, 0
	return err
}

// nextRequest reads the next request frame into frame. While it waits
// for one the connection is idle: closed after serveIdle, or before to
// make room for another (admit). Once a frame's first byte is in, the rest
// must follow within the write timeout, so a client that stops mid-frame
// is let go.
func (srv *server) nextRequest(c net.Conn, rd *bufio.Reader, s *served, frame []byte) error {
	if rd.Buffered() == 0 {
		now := time.Now()
		// Idle since its admission (admit) for its first request, else
		// since now: so that the connection idle longest is the one
		// admitted first, however late its goroutine got here.
		since := s.idle.Load()
		if since < 0 {
			return net.ErrClosed // closed to make room before it got here
		}
		if since == 0 {
			since = now.UnixNano()
			s.idle.Store(since)
		}
		c.SetReadDeadline(now.Add(serveIdle))
		_, err := rd.Peek(1)
		if !s.idle.CompareAndSwap(since, 0) {
			return net.ErrClosed // closed to make room
		}
		if err != nil {
			return err
		}
	}
	if rd.Buffered() < len(frame) {
		c.SetReadDeadline(time.Now().Add(srv.writeTimeout))
	}
	_, err := io.ReadFull(rd, frame)
	return err
}

// handshake authenticates a client of the data listener within
// transport.PreAuthTimeout and admits it (admit); false means the
// connection is to be closed.
func (srv *server) handshake(c net.Conn, s *served, p *transport.Pending) bool {
	defer p.Done()
	tune(c)
	nonce := transport.NewNonce()
	hello := append(append([]byte(helloMagic), protoVersion), nonce...)
	// A client that does not finish the handshake in time is dropped.
	c.SetDeadline(time.Now().Add(transport.PreAuthTimeout))
	if _, err := c.Write(hello); err != nil {
		return false
	}
	answer := make([]byte, clientLen)
	if _, err := io.ReadFull(c, answer); err != nil {
		if !p.Done() {
			srv.refused.Event(fmt.Sprintf("from %s: %v", c.RemoteAddr(), transport.PushedOut()))
		}
		return false
	}
	if !transport.CheckAuthProof(srv.key, authPurpose, nonce, answer[:proofLen]) {
		srv.refused.Event(fmt.Sprintf("from %s: wrong key", c.RemoteAddr()))
		c.Write(encodeResponse(nil, 0, transport.ErrPermissionDenied, srv.refusal()))
		return false
	}
	if !p.Done() {
		return false // closed to make room
	}
	// The client's runtime id is not proven: it is used only to close
	// this connection when that runtime is gone (PeerGone), and for
	// maxServedPerPeer.
	if why := srv.admit(s, transport.RuntimeID(answer[proofLen:])); why != "" {
		srv.refused.Event(fmt.Sprintf("from %s: %s", c.RemoteAddr(), why))
		c.Write(encodeResponse(nil, 0, transport.ErrNoMemory, why))
		return false
	}
	if _, err := c.Write(encodeResponse(nil, 0, transport.OK, "")); err != nil {
		return false
	}
	c.SetDeadline(time.Time{})
	return true
}

// admit counts an authenticated connection of the runtime id, first
// closing the connection idle longest (that runtime's, or anyone's) when
// it would pass maxServedPerPeer or maxServed. It returns why it refused
// the connection, or "".
func (srv *server) admit(s *served, id transport.RuntimeID) string {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.perPeer[id] >= maxServedPerPeer && !srv.closeIdleLocked(func(o *served) bool { return o.peer == id }) {
		return fmt.Sprintf("the source serves at most %d data connections to one runtime, and all %d of this one's are busy", maxServedPerPeer, srv.perPeer[id])
	}
	if srv.nserved >= maxServed && !srv.closeIdleLocked(func(*served) bool { return true }) {
		return fmt.Sprintf("the source serves at most %d data connections, and all are busy", maxServed)
	}
	s.peer, s.authed = id, true
	s.idle.Store(time.Now().UnixNano()) // idle until its first request (nextRequest)
	srv.perPeer[id]++
	srv.nserved++
	return ""
}

// closeIdleLocked closes the authenticated connection that has waited
// longest for a request among those match accepts, and uncounts it; it
// reports whether it found one.
func (srv *server) closeIdleLocked(match func(*served) bool) bool {
	var oldest *served
	var conn net.Conn
	var since int64
	for c, s := range srv.sconns {
		if idle := s.idle.Load(); s.authed && idle > 0 && (oldest == nil || idle < since) && match(s) {
			oldest, conn, since = s, c, idle
		}
	}
	// The connection may have just taken a request: then it is not idle.
	if oldest == nil || !oldest.idle.CompareAndSwap(since, -1) {
		return false
	}
	srv.uncountLocked(oldest)
	conn.Close()
	return true
}

// uncountLocked takes an authenticated connection out of the counts.
func (srv *server) uncountLocked(s *served) {
	if !s.authed {
		return
	}
	s.authed = false
	srv.nserved--
	if srv.perPeer[s.peer]--; srv.perPeer[s.peer] == 0 {
		delete(srv.perPeer, s.peer)
	}
}

// refusal tells a client with the wrong key what to check.
func (srv *server) refusal() string {
	if srv.metaKey == "" {
		return "the peer refused our auth token (set the same RDT_AUTH_TOKEN on both sides)"
	}
	return "the peer refused our key (the source has no auth token: its data port takes only the key inside its refs)"
}

// answer writes one response. Only a failed write is returned: it ends the
// connection. Every write has a deadline, so a client that stops reading
// releases the object's pin after writeTimeout.
func (srv *server) answer(c net.Conn, req request, hdr []byte) error {
	refuse := func(st transport.Status, msg string) error {
		c.SetWriteDeadline(time.Now().Add(srv.writeTimeout))
		_, err := c.Write(encodeResponse(hdr, req.Tag, st, msg))
		return err
	}
	tensors, unpin, err := srv.h.PinObject(req.Object)
	if err != nil {
		return refuse(transport.StatusOf(err), err.Error())
	}
	defer unpin()
	segs, st, msg := checkRun(req, tensors, nil)
	if st != transport.OK {
		srv.h.Log().Warnf("refused a request from %s: %s", c.RemoteAddr(), msg)
		return refuse(st, msg)
	}
	// The header and the bytes, straight from the tensors' memory (the pin
	// keeps it alive meanwhile), in writes of about writeChunk: one
	// segment for a small answer, no copy for a large one. Each write gets
	// a fresh deadline: the bound is on a stall, not on the whole answer.
	bufs := net.Buffers{encodeResponse(hdr, req.Tag, transport.OK, "")}
	left := writeChunk
	for _, span := range spansOf(segs, tensors, nil) {
		for len(span) > 0 {
			n := min(len(span), left)
			bufs = append(bufs, span[:n])
			span, left = span[n:], left-n
			if left == 0 {
				if err := srv.write(c, &bufs); err != nil {
					return err
				}
				left = writeChunk
			}
		}
	}
	return srv.write(c, &bufs)
}

// write writes bufs under a fresh deadline and empties it.
func (srv *server) write(c net.Conn, bufs *net.Buffers) error {
	if len(*bufs) == 0 {
		return nil
	}
	all := *bufs // WriteTo consumes the slice: keep its array for the next write
	c.SetWriteDeadline(time.Now().Add(srv.writeTimeout))
	_, err := bufs.WriteTo(c)
	clear(all)
	*bufs = all[:0]
	return err
}

// segment is the part of one tensor a request reads.
type segment struct {
	tensor         int
	offset, length uint64
}

// checkRun finds what a request reads and checks it, or says why not: a
// range inside one tensor, or a run of whole tensors (see the protocol)
// whose sizes add up to its length and digest to its Sizes. It appends a
// segment per tensor read to segs.
func checkRun(req request, tensors []transport.Tensor, segs []segment) ([]segment, transport.Status, string) {
	tensor := strconv.FormatUint(uint64(req.Tensor), 10)
	if uint64(req.Tensor) >= uint64(len(tensors)) {
		return segs, transport.ErrInvalidArgument, "object " + req.Object.String() + " has " + strconv.Itoa(len(tensors)) +
			" tensors; tensor " + tensor + " was asked for"
	}
	if req.Length > maxChunk {
		return segs, transport.ErrInvalidArgument, "request for " + strconv.FormatUint(req.Length, 10) +
			" bytes exceeds the " + strconv.Itoa(maxChunk) + "-byte limit"
	}
	if req.Tensors <= 1 {
		src := tensors[req.Tensor]
		// Written so that neither side can overflow.
		if req.Offset > src.Nbytes || req.Length > src.Nbytes-req.Offset {
			return segs, transport.ErrInvalidArgument, "range [" + strconv.FormatUint(req.Offset, 10) + ", +" +
				strconv.FormatUint(req.Length, 10) + ") is outside tensor " + tensor + " (" + strconv.FormatUint(src.Nbytes, 10) + " bytes)"
		}
		if !src.Device.Type.HostAccessible() {
			return segs, transport.ErrUnsupported, "the object is in " + src.Device.Type.String() + " memory"
		}
		return append(segs, segment{tensor: int(req.Tensor), offset: req.Offset, length: req.Length}), transport.OK, ""
	}
	last := uint64(req.Tensor) + uint64(req.Tensors) - 1
	run := "tensors " + tensor + ".." + strconv.FormatUint(last, 10)
	if req.Tensors > maxRunTensors || last >= uint64(len(tensors)) || req.Offset != 0 {
		return segs, transport.ErrInvalidArgument, "a run of " + run + " from offset " + strconv.FormatUint(req.Offset, 10) +
			" is not whole tensors of this object of " + strconv.Itoa(len(tensors)) + " (at most " + strconv.Itoa(maxRunTensors) + " a run)"
	}
	var total uint64
	digest := uint64(sizeDigestStart)
	start := len(segs)
	for i := int(req.Tensor); i <= int(last); i++ {
		src := tensors[i]
		if !src.Device.Type.HostAccessible() {
			return segs[:start], transport.ErrUnsupported, "tensor " + strconv.Itoa(i) + " is in " + src.Device.Type.String() + " memory"
		}
		total += src.Nbytes // at most maxRunTensors sizes of what fits in memory: no overflow
		digest = sizeDigest(digest, src.Nbytes)
		segs = append(segs, segment{tensor: i, length: src.Nbytes})
	}
	if total != req.Length || digest != req.Sizes {
		return segs[:start], transport.ErrInvalidArgument, run + " are " + strconv.FormatUint(total, 10) +
			" bytes at the source, split other than the " + strconv.FormatUint(req.Length, 10) + " bytes of the targets asked for"
	}
	return segs, transport.OK, ""
}

// spansOf appends the memory of segs to spans, as few spans as the
// tensors' memory allows: views of one buffer are one span.
func spansOf(segs []segment, tensors []transport.Tensor, spans [][]byte) [][]byte {
	var start, end uintptr
	for _, sg := range segs {
		if sg.length == 0 {
			continue
		}
		a := tensors[sg.tensor].Data + uintptr(sg.offset)
		if end != 0 && a == end {
			end += uintptr(sg.length)
			continue
		}
		if end != 0 {
			spans = append(spans, transport.Bytes(start, uint64(end-start)))
		}
		start, end = a, a+uintptr(sg.length)
	}
	if end != 0 {
		spans = append(spans, transport.Bytes(start, uint64(end-start)))
	}
	return spans
}
