// Package tcp moves host memory between any two hosts: the receiver pulls
// byte ranges of an object from the source's data listener, over several
// streams for large tensors, straight into its targets. The source serves
// only objects its runtime holds, by id and range, checked against their
// sizes; it never reads an address taken from the wire.
package tcp

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core"
)

// Name is the canonical transport name.
const Name = "tcp"

const (
	// streamMin: tensors at least this large are pulled over several
	// connections at once; smaller ones share one connection.
	streamMin = 8 << 20
	// window is how many request frames a connection keeps in flight.
	// Frames are 44 bytes, so a full window always fits the socket buffers
	// and the client's writes never wait on the server's.
	window      = 32
	dialTimeout = 5 * time.Second
	authTimeout = 10 * time.Second
	maxIdle     = 16 // idle connections kept per endpoint
	// A small pull on a pooled connection is finished on the caller's
	// goroutine when the engine asks whether it completed: a goroutine
	// hand-off costs more than the round trip. inlineMax bounds the bytes
	// read that way and inlineBudget the time spent waiting for them.
	inlineMax = 1 << 20
)

var inlineBudget = time.Millisecond // a variable for tests on slow machines

// Factory makes the transport for a new runtime.
func Factory() core.TransportFactory {
	return core.TransportFactory{Name: Name, New: New}
}

// Transport is the tcp transport of one runtime.
type Transport struct {
	h       core.Host
	streams int

	lmu      sync.Mutex
	ln       net.Listener // nil until the first put
	endpoint string
	serving  sync.WaitGroup
	sconns   map[net.Conn]struct{}
	lclosed  bool // the server side's closed, under lmu

	pmu    sync.Mutex
	idle   map[string][]net.Conn // pooled client connections by endpoint
	active map[*fetchRequest]struct{}
	closed bool
}

// New makes the transport; the data listener starts with the first put.
func New(h core.Host) (core.Transport, error) {
	streams := 4
	if s := os.Getenv("RDT_TCP_STREAMS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > 16 {
			return nil, core.Errorf(core.ErrInvalidArgument, "RDT_TCP_STREAMS=%q: want 1 to 16", s)
		}
		streams = v
	}
	return &Transport{h: h, streams: streams, sconns: map[net.Conn]struct{}{},
		idle: map[string][]net.Conn{}, active: map[*fetchRequest]struct{}{}}, nil
}

func (t *Transport) Name() string { return Name }

// Devices: memory the CPU can address (pinned CUDA host memory included).
func (t *Transport) Devices() []core.DeviceType {
	return []core.DeviceType{core.DeviceCPU, core.DeviceCUDAHost}
}
func (t *Transport) OneSided() bool { return true }
func (t *Transport) CanAbort() bool { return true }

// ChecksFreedObjects: the source serves only objects it holds.
func (t *Transport) ChecksFreedObjects() bool { return true }

// EagerMetadata: the endpoint and the object id are all a receiver needs.
func (t *Transport) EagerMetadata() bool { return true }

func (t *Transport) CommunicatorMetadata(x *core.Transfer) ([]byte, error) { return nil, nil }

func (t *Transport) Send(x *core.Transfer, tensors []core.Tensor, tmeta, cmeta []byte) error {
	return core.Errorf(core.ErrInternal, "tcp is one-sided: send is never called on it")
}

// GarbageCollect has nothing to free: the source serves live objects only,
// through PinObject, so a freed object is simply no longer found.
func (t *Transport) GarbageCollect(obj core.ObjectID, tensors []core.Tensor, tmeta []byte) {}

// ExtractMetadata names this runtime's data endpoint and the object.
func (t *Transport) ExtractMetadata(obj core.ObjectID, tensors []core.Tensor) ([]byte, error) {
	for _, x := range tensors {
		if !x.Device.Type.HostAccessible() {
			return nil, core.Errorf(core.ErrUnsupported, "tcp moves host memory; tensor on %s", x.Device)
		}
	}
	if len(tensors) > core.MaxTensors {
		return nil, core.Errorf(core.ErrInvalidArgument, "tcp: %d tensors exceed the limit of %d", len(tensors), core.MaxTensors)
	}
	ep, err := t.listen()
	if err != nil {
		return nil, err
	}
	m := metadata{Endpoint: ep, Object: obj, Tensors: uint32(len(tensors))}
	return m.encode(), nil
}

// ---- source side ------------------------------------------------------------

func (t *Transport) listen() (string, error) {
	t.lmu.Lock()
	defer t.lmu.Unlock()
	if t.lclosed {
		return "", core.Errorf(core.ErrClosed, "tcp transport is closed")
	}
	if t.ln != nil {
		return t.endpoint, nil
	}
	// Without a token the core keeps BindHost on loopback.
	ln, err := net.Listen("tcp", net.JoinHostPort(t.h.BindHost(), "0"))
	if err != nil {
		return "", core.Errorf(core.ErrTransport, "tcp: cannot listen on %s: %v", t.h.BindHost(), err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	t.ln = ln
	t.endpoint = net.JoinHostPort(t.h.AdvertiseHost(), strconv.Itoa(port))
	t.serving.Add(1)
	go t.accept(ln)
	t.h.Log().Debugf("tcp: serving data on %s (advertised as %s)", ln.Addr(), t.endpoint)
	return t.endpoint, nil
}

func (t *Transport) accept(ln net.Listener) {
	defer t.serving.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			t.h.Log().Warnf("tcp: accept: %v", err)
			time.Sleep(10 * time.Millisecond) // say, out of descriptors: do not spin
			continue
		}
		t.lmu.Lock()
		if t.lclosed {
			t.lmu.Unlock()
			c.Close()
			return
		}
		t.sconns[c] = struct{}{}
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
	tune(c)
	nonce := core.NewNonce()
	hello := append(append([]byte(helloMagic), protoVersion), nonce...)
	// A client that does not finish the handshake in time is dropped.
	c.SetDeadline(time.Now().Add(authTimeout))
	if _, err := c.Write(hello); err != nil {
		return
	}
	proof := make([]byte, proofLen)
	if _, err := io.ReadFull(c, proof); err != nil {
		return
	}
	if !core.CheckAuthProof(t.h.AuthToken(), authPurpose, nonce, proof) {
		t.h.Log().Warnf("tcp: refused a data connection from %s: wrong auth token", c.RemoteAddr())
		c.Write(encodeResponse(nil, core.ErrPermissionDenied, "the peer refused our auth token (set the same RDT_AUTH_TOKEN on both sides)"))
		return
	}
	if _, err := c.Write(encodeResponse(nil, core.OK, "")); err != nil {
		return
	}
	c.SetDeadline(time.Time{})
	// Buffered: a pipelined batch of frames is one read, not one per frame.
	rd := bufio.NewReaderSize(c, 64*requestLen)
	frame := make([]byte, requestLen)
	hdr := make([]byte, 0, responseLen+maxMessage)
	for {
		if _, err := io.ReadFull(rd, frame); err != nil {
			return // the client hung up, or the transport is closing
		}
		req, err := decodeRequest(frame)
		if err != nil {
			t.h.Log().Warnf("tcp: closing data connection from %s: %v", c.RemoteAddr(), err)
			c.Write(encodeResponse(hdr[:0], core.StatusOf(err), err.Error()))
			return
		}
		if err := t.answer(c, req, hdr[:0]); err != nil {
			return
		}
	}
}

// answer writes one response. Only a failed write is returned: it ends the
// connection.
func (t *Transport) answer(c net.Conn, req request, hdr []byte) error {
	refuse := func(st core.Status, msg string) error {
		_, err := c.Write(encodeResponse(hdr, st, msg))
		return err
	}
	tensors, unpin, err := t.h.PinObject(req.Object)
	if err != nil {
		return refuse(core.StatusOf(err), err.Error())
	}
	defer unpin()
	src, st, msg := checkRange(req, tensors)
	if st != core.OK {
		t.h.Log().Warnf("tcp: refused a request from %s: %s", c.RemoteAddr(), msg)
		return refuse(st, msg)
	}
	hdr = encodeResponse(hdr, core.OK, "")
	if req.Length == 0 {
		_, err = c.Write(hdr)
		return err
	}
	// Header and bytes in one writev, the bytes straight from the tensor's
	// memory (the pin keeps it alive meanwhile): one segment for a small
	// answer, no copy for a large one.
	bufs := net.Buffers{hdr, core.Bytes(src.Data+uintptr(req.Offset), req.Length)}
	_, err = bufs.WriteTo(c)
	return err
}

// checkRange finds the tensor a request reads and checks that the range
// lies inside it, or says why not.
func checkRange(req request, tensors []core.Tensor) (core.Tensor, core.Status, string) {
	if uint64(req.Tensor) >= uint64(len(tensors)) {
		return core.Tensor{}, core.ErrInvalidArgument, "tcp: object " + req.Object.String() + " has " + strconv.Itoa(len(tensors)) +
			" tensors; tensor " + strconv.FormatUint(uint64(req.Tensor), 10) + " was asked for"
	}
	if req.Length > maxChunk {
		return core.Tensor{}, core.ErrInvalidArgument, "tcp: request for " + strconv.FormatUint(req.Length, 10) +
			" bytes exceeds the " + strconv.Itoa(maxChunk) + "-byte limit"
	}
	src := tensors[req.Tensor]
	// Written so that neither side can overflow.
	if req.Offset > src.Nbytes || req.Length > src.Nbytes-req.Offset {
		return core.Tensor{}, core.ErrInvalidArgument, "tcp: range [" + strconv.FormatUint(req.Offset, 10) + ", +" +
			strconv.FormatUint(req.Length, 10) + ") is outside tensor " + strconv.FormatUint(uint64(req.Tensor), 10) +
			" (" + strconv.FormatUint(src.Nbytes, 10) + " bytes)"
	}
	if !src.Device.Type.HostAccessible() {
		return core.Tensor{}, core.ErrUnsupported, "tcp: the object is in " + src.Device.Type.String() + " memory"
	}
	return src, core.OK, ""
}

// Close stops serving, closes every connection and waits for the serving
// goroutines to end.
func (t *Transport) Close() error {
	t.lmu.Lock()
	t.lclosed = true
	if t.ln != nil {
		t.ln.Close()
	}
	for c := range t.sconns {
		c.Close()
	}
	t.lmu.Unlock()
	t.serving.Wait()
	t.pmu.Lock()
	t.closed = true
	for ep, conns := range t.idle {
		for _, c := range conns {
			c.Close()
		}
		delete(t.idle, ep)
	}
	active := t.active
	t.active = map[*fetchRequest]struct{}{}
	t.pmu.Unlock()
	// Fetches still running stop reading into their targets.
	for r := range active {
		r.abort()
	}
	return nil
}

func tune(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		// Fixed socket buffers (1, 4, 16 MiB) measured no better than the
		// kernel's autotuning, 4 MiB and more worse, so they are left alone.
	}
}

// ---- destination side -------------------------------------------------------

// idleConn takes a pooled connection to ep, or returns nil.
func (t *Transport) idleConn(ep string) net.Conn {
	t.pmu.Lock()
	defer t.pmu.Unlock()
	l := t.idle[ep]
	if len(l) == 0 {
		return nil
	}
	c := l[len(l)-1]
	t.idle[ep] = l[:len(l)-1]
	return c
}

// conn takes a pooled connection to ep or dials and authenticates one.
func (t *Transport) conn(ctx context.Context, ep string) (net.Conn, error) {
	t.pmu.Lock()
	closed := t.closed
	t.pmu.Unlock()
	if closed {
		return nil, core.Errorf(core.ErrClosed, "tcp transport is closed")
	}
	if c := t.idleConn(ep); c != nil {
		return c, nil
	}
	d := net.Dialer{Timeout: dialTimeout}
	c, err := d.DialContext(ctx, "tcp", ep)
	if err != nil {
		if ctx.Err() != nil {
			return nil, core.Errorf(core.ErrAborted, "tcp: dialing %s was cancelled", ep)
		}
		return nil, core.Errorf(core.ErrPeerUnavailable, "tcp: cannot reach the source's data endpoint %s: %v", ep, err)
	}
	tune(c)
	// Cancelling ctx (an abort) also cuts a handshake with a source that
	// accepted but does not answer.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	err = t.authenticate(c, ep)
	if !stop() {
		c.Close()
		return nil, core.Errorf(core.ErrAborted, "tcp: the handshake with %s was cancelled", ep)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (t *Transport) authenticate(c net.Conn, ep string) error {
	c.SetDeadline(time.Now().Add(authTimeout))
	defer c.SetDeadline(time.Time{})
	hello := make([]byte, helloLen)
	n, err := io.ReadFull(c, hello)
	if m := min(n, len(helloMagic)); string(hello[:m]) != helloMagic[:m] {
		return core.Errorf(core.ErrCorrupt, "tcp data connection to %s: not an rdt data endpoint", ep)
	}
	if err != nil {
		return core.Errorf(core.ErrPeerUnavailable, "tcp data connection to %s: handshake failed: %v", ep, err)
	}
	if v := hello[len(helloMagic)]; v != protoVersion {
		return core.Errorf(core.ErrUnsupported, "tcp data connection to %s: it speaks data protocol version %d, this build speaks %d", ep, v, protoVersion)
	}
	proof := core.AuthProof(t.h.AuthToken(), authPurpose, hello[len(helloMagic)+1:])
	if _, err := c.Write(proof); err != nil {
		return core.Errorf(core.ErrPeerUnavailable, "tcp data connection to %s: handshake failed: %v", ep, err)
	}
	st, msg, err := readResponse(c)
	if err != nil {
		// A server that refuses the token says so (below); a connection
		// that ends without an answer means the peer went away, say
		// killed while we connected.
		if core.StatusOf(err) == core.ErrPeerUnavailable {
			return core.Errorf(core.ErrPeerUnavailable, "tcp data connection to %s: the peer closed the connection during authentication: %v", ep, err)
		}
		return err
	}
	switch st {
	case core.OK:
		return nil
	case core.ErrPermissionDenied:
		return core.Errorf(st, "tcp data connection to %s: the peer refused our auth token (set the same RDT_AUTH_TOKEN on both sides)", ep)
	}
	return core.Errorf(st, "tcp data connection to %s: %s", ep, msg)
}

// readResponse reads one response header and its message (handshake only;
// pulls read theirs in stream.advance).
func readResponse(c net.Conn) (core.Status, string, error) {
	var hdr [responseLen]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return 0, "", core.Errorf(core.ErrPeerUnavailable, "tcp: reading from %s: %v", c.RemoteAddr(), err)
	}
	st, n, err := decodeResponseHeader(hdr[:])
	if err != nil {
		return 0, "", err
	}
	if n == 0 {
		return st, "", nil
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(c, msg); err != nil {
		return 0, "", core.Errorf(core.ErrPeerUnavailable, "tcp: reading from %s: %v", c.RemoteAddr(), err)
	}
	return st, string(msg), nil
}

// put returns a healthy connection to the pool.
func (t *Transport) put(ep string, c net.Conn) {
	t.pmu.Lock()
	defer t.pmu.Unlock()
	if t.closed || len(t.idle[ep]) >= maxIdle {
		c.Close()
		return
	}
	t.idle[ep] = append(t.idle[ep], c)
}

// dropIdle closes the pooled connections to a source that went away.
func (t *Transport) dropIdle(ep string) {
	t.pmu.Lock()
	conns := t.idle[ep]
	delete(t.idle, ep)
	t.pmu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}
