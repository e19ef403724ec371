// Package tcp moves host memory between any two hosts: the receiver pulls
// byte ranges of an object from the source's data listener, over several
// streams for large tensors, straight into its targets. The source serves
// only objects its runtime holds, by id and range, checked against their
// sizes; it never reads an address taken from the wire.
//
// The listener starts when an object first needs it (a put naming tcp, or
// a peer asking for an object's tcp metadata), not with the runtime. It
// requires the configured token, or without one a key derived from the
// runtime's random secret that reaches receivers only inside the metadata.
package tcp

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/transport"
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
	// maxAuthenticating bounds the data connections in their handshake at
	// once: before it, a connection proves nothing, so whoever can reach
	// the port could otherwise hold any number of goroutines and sockets.
	// Past it the listener stops accepting until one finishes (within
	// authTimeout): further connections wait in the kernel's backlog, and a
	// burst of honest fetches is slowed down rather than refused.
	maxAuthenticating = 64
	maxIdle           = 16 // idle connections kept per source endpoint
	// A small pull on a pooled connection is finished on the caller's
	// goroutine when the engine asks whether it completed: a goroutine
	// hand-off costs more than the round trip. inlineMax bounds the bytes
	// read that way and inlineBudget the time spent waiting for them.
	inlineMax = 1 << 20
	// writeChunk is how much of an answer one write may carry: each chunk
	// gets its own deadline, so a receiver that stops reading is given up
	// on after the peer timeout while a slow one that keeps reading is not.
	writeChunk = 1 << 20
	// keyPurpose labels the data key derived from the runtime's secret.
	keyPurpose = "rdt-tcp-data-key"
)

var (
	inlineBudget = time.Millisecond // a variable for tests on slow machines
	// idleTimeout closes pooled connections nobody used for this long.
	idleTimeout = time.Minute
)

// Factory makes the transport for a new runtime.
func Factory() transport.TransportFactory {
	return transport.TransportFactory{Name: Name, New: New}
}

// Transport is the tcp transport of one runtime.
type Transport struct {
	h       transport.Host
	streams int
	// key is what clients of our data listener must prove; metaKey is
	// handed to receivers in the metadata ("" when a token is configured:
	// receivers then use their own).
	key, metaKey string
	writeTimeout time.Duration // a serving write that makes no progress this long fails
	slots        chan struct{} // one per data connection in its handshake

	lmu      sync.Mutex
	ln       net.Listener // nil until an object needs it
	endpoint string
	serving  sync.WaitGroup
	sconns   map[net.Conn]transport.RuntimeID // serving connections, by the runtime id the client claimed
	lclosed  bool                             // the server side's closed, under lmu
	refused  *transport.FloodLog              // wrong keys; made with the listener

	pmu    sync.Mutex
	idle   map[poolKey][]pooled // pooled client connections
	reaper *time.Timer          // closes connections idle too long; nil when none pooled
	active map[*fetchRequest]struct{}
	closed bool
}

// poolKey says which pooled connections a fetch may reuse: those to the
// same endpoint of the same source runtime, authenticated with the same key.
type poolKey struct {
	endpoint string
	source   transport.RuntimeID // zero for a client without a runtime
	key      string
}

type pooled struct {
	c     net.Conn
	since time.Time
}

// New makes the transport; the data listener starts when an object first
// needs it.
func New(h transport.Host) (transport.Transport, error) {
	streams := h.Settings().TCPStreams // RDT_TCP_STREAMS, checked by the runtime
	if streams < 1 || streams > transport.MaxTCPStreams {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "%d streams: want 1 to %d", streams, transport.MaxTCPStreams)
	}
	t := &Transport{h: h, streams: streams, sconns: map[net.Conn]transport.RuntimeID{}, slots: make(chan struct{}, maxAuthenticating),
		idle: map[poolKey][]pooled{}, active: map[*fetchRequest]struct{}{}}
	t.key = h.AuthToken()
	if t.key == "" {
		// Without a token an HMAC would be keyed with nothing anyone
		// could not compute: require a key derived from the runtime's
		// secret (never the secret itself, which guards other ports).
		secret := h.RuntimeSecret()
		if secret == "" {
			secret = hex.EncodeToString(transport.NewNonce())
		}
		t.key = hex.EncodeToString(transport.AuthProof(secret, keyPurpose, nil))
		t.metaKey = t.key
	}
	t.writeTimeout = h.PeerTimeout()
	if t.writeTimeout <= 0 {
		t.writeTimeout = transport.DefaultPeerTimeout
	}
	return t, nil
}

// Describe: tcp moves memory the CPU can address (pinned CUDA host memory
// included) to any host, the last automatic choice for host data; the
// source serves only objects it holds, so a freed one is noticed.
// Once the listener runs, the metadata costs nothing, so objects put
// without a transport carry it. Before, they do not: a runtime whose
// objects never travel over tcp never opens a TCP port, and a peer that
// wants tcp asks the owner for the metadata, which starts it.
func (t *Transport) Describe() transport.Descriptor {
	return transport.Descriptor{
		Name:                Name,
		Devices:             []transport.DeviceType{transport.DeviceCPU, transport.DeviceCUDAHost},
		OneSided:            true,
		CanAbort:            true,
		DetectsFreedObjects: true,
		EagerMetadata:       true,
		EagerWhile:          t.listening,
		Auto:                transport.AutoRank{Host: 30},
	}
}

// listening reports whether the listener runs.
func (t *Transport) listening() bool {
	t.lmu.Lock()
	defer t.lmu.Unlock()
	return t.ln != nil
}

func (t *Transport) CommunicatorMetadata(x *transport.Transfer) ([]byte, error) { return nil, nil }

// GarbageCollect has nothing to free: the source serves live objects only,
// through PinObject, so a freed object is simply no longer found.
func (t *Transport) GarbageCollect(obj transport.ObjectID, tensors []transport.Tensor, tmeta []byte) {
}

// ExtractMetadata names this runtime's data endpoint and the object.
func (t *Transport) ExtractMetadata(obj transport.ObjectID, tensors []transport.Tensor) ([]byte, error) {
	for _, x := range tensors {
		if !x.Device.Type.HostAccessible() {
			return nil, transport.Errorf(transport.ErrUnsupported, "tcp moves host memory; tensor on %s", x.Device)
		}
	}
	if len(tensors) > transport.MaxTensors {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "tcp: %d tensors exceed the limit of %d", len(tensors), transport.MaxTensors)
	}
	ep, err := t.listen()
	if err != nil {
		return nil, err
	}
	m := metadata{Endpoint: ep, Object: obj, Tensors: uint32(len(tensors)), Key: t.metaKey}
	return m.encode(), nil
}

// ---- source side ------------------------------------------------------------

func (t *Transport) listen() (string, error) {
	t.lmu.Lock()
	defer t.lmu.Unlock()
	if t.lclosed {
		return "", transport.Errorf(transport.ErrClosed, "tcp transport is closed")
	}
	if t.ln != nil {
		return t.endpoint, nil
	}
	// Without a token the core keeps BindHost on loopback.
	ln, err := net.Listen("tcp", net.JoinHostPort(t.h.BindHost(), "0"))
	if err != nil {
		return "", transport.Errorf(transport.ErrTransport, "tcp: cannot listen on %s: %v", t.h.BindHost(), err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	t.ln = ln
	t.endpoint = net.JoinHostPort(t.h.AdvertiseHost(), strconv.Itoa(port))
	// A flood of wrong keys writes a few lines, not one a connection.
	t.refused = transport.NewFloodLog(t.h.Log(), transport.LogWarn, time.Second,
		"tcp: refused a data connection", "tcp: refused %d more data connections since %s")
	t.serving.Add(1)
	go t.accept(ln)
	t.h.Log().Debugf("tcp: serving data on %s (advertised as %s)", ln.Addr(), t.endpoint)
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
			t.h.Log().Warnf("tcp: accept: %v", err)
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
			c.SetWriteDeadline(time.Now().Add(t.writeTimeout))
			c.Write(encodeResponse(hdr[:0], transport.StatusOf(err), err.Error()))
			return
		}
		if err := t.answer(c, req, hdr[:0]); err != nil {
			return
		}
	}
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
		c.Write(encodeResponse(nil, transport.ErrPermissionDenied, t.refusal()))
		return false
	}
	// The client's runtime id is not proven: it is used only to close
	// this connection when that runtime is gone (PeerGone).
	t.lmu.Lock()
	t.sconns[c] = transport.RuntimeID(answer[proofLen:])
	t.lmu.Unlock()
	if _, err := c.Write(encodeResponse(nil, transport.OK, "")); err != nil {
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
		_, err := c.Write(encodeResponse(hdr, st, msg))
		return err
	}
	tensors, unpin, err := t.h.PinObject(req.Object)
	if err != nil {
		return refuse(transport.StatusOf(err), err.Error())
	}
	defer unpin()
	src, st, msg := checkRange(req, tensors)
	if st != transport.OK {
		t.h.Log().Warnf("tcp: refused a request from %s: %s", c.RemoteAddr(), msg)
		return refuse(st, msg)
	}
	hdr = encodeResponse(hdr, transport.OK, "")
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

// PeerGone closes what this transport keeps for a runtime that is gone:
// the connections it is served on (a write blocked on a receiver that
// vanished would hold its object until the write timeout) and the pooled
// connections to its data endpoint.
func (t *Transport) PeerGone(peer transport.PeerInfo) {
	if peer.RuntimeID.IsZero() {
		return
	}
	t.lmu.Lock()
	for c, id := range t.sconns {
		if id == peer.RuntimeID {
			c.Close() // serve's deferred cleanup removes it
		}
	}
	t.lmu.Unlock()
	t.pmu.Lock()
	var drop []pooled
	for k, l := range t.idle {
		if k.source == peer.RuntimeID {
			drop = append(drop, l...)
			delete(t.idle, k)
		}
	}
	t.pmu.Unlock()
	for _, p := range drop {
		p.c.Close()
	}
}

// checkRange finds the tensor a request reads and checks that the range
// lies inside it, or says why not.
func checkRange(req request, tensors []transport.Tensor) (transport.Tensor, transport.Status, string) {
	if uint64(req.Tensor) >= uint64(len(tensors)) {
		return transport.Tensor{}, transport.ErrInvalidArgument, "tcp: object " + req.Object.String() + " has " + strconv.Itoa(len(tensors)) +
			" tensors; tensor " + strconv.FormatUint(uint64(req.Tensor), 10) + " was asked for"
	}
	if req.Length > maxChunk {
		return transport.Tensor{}, transport.ErrInvalidArgument, "tcp: request for " + strconv.FormatUint(req.Length, 10) +
			" bytes exceeds the " + strconv.Itoa(maxChunk) + "-byte limit"
	}
	src := tensors[req.Tensor]
	// Written so that neither side can overflow.
	if req.Offset > src.Nbytes || req.Length > src.Nbytes-req.Offset {
		return transport.Tensor{}, transport.ErrInvalidArgument, "tcp: range [" + strconv.FormatUint(req.Offset, 10) + ", +" +
			strconv.FormatUint(req.Length, 10) + ") is outside tensor " + strconv.FormatUint(uint64(req.Tensor), 10) +
			" (" + strconv.FormatUint(src.Nbytes, 10) + " bytes)"
	}
	if !src.Device.Type.HostAccessible() {
		return transport.Tensor{}, transport.ErrUnsupported, "tcp: the object is in " + src.Device.Type.String() + " memory"
	}
	return src, transport.OK, ""
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
	refused := t.refused
	t.lmu.Unlock()
	t.serving.Wait()
	if refused != nil {
		refused.Close() // writes the count held at the end of a burst
	}
	t.pmu.Lock()
	t.closed = true
	for k, l := range t.idle {
		for _, p := range l {
			p.c.Close()
		}
		delete(t.idle, k)
	}
	if t.reaper != nil {
		t.reaper.Stop()
		t.reaper = nil
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

// idleConn takes a pooled connection, or returns nil. The most recently
// used goes first, so connections beyond what is needed age out.
func (t *Transport) idleConn(k poolKey) net.Conn {
	t.pmu.Lock()
	defer t.pmu.Unlock()
	l := t.idle[k]
	if len(l) == 0 {
		return nil
	}
	p := l[len(l)-1]
	if len(l) == 1 {
		delete(t.idle, k)
	} else {
		t.idle[k] = l[:len(l)-1]
	}
	return p.c
}

// conn takes a pooled connection or dials and authenticates one.
func (t *Transport) conn(ctx context.Context, k poolKey) (net.Conn, error) {
	t.pmu.Lock()
	closed := t.closed
	t.pmu.Unlock()
	if closed {
		return nil, transport.Errorf(transport.ErrClosed, "tcp transport is closed")
	}
	if c := t.idleConn(k); c != nil {
		return c, nil
	}
	ep := k.endpoint
	d := net.Dialer{Timeout: dialTimeout}
	c, err := d.DialContext(ctx, "tcp", ep)
	if err != nil {
		if ctx.Err() != nil {
			return nil, transport.Errorf(transport.ErrAborted, "tcp: dialing %s was cancelled", ep)
		}
		return nil, transport.Errorf(transport.ErrPeerUnavailable, "tcp: cannot reach the source's data endpoint %s: %v", ep, err)
	}
	tune(c)
	// Cancelling ctx (an abort) also cuts a handshake with a source that
	// accepted but does not answer.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	err = t.authenticate(c, ep, k.key)
	if !stop() {
		c.Close()
		return nil, transport.Errorf(transport.ErrAborted, "tcp: the handshake with %s was cancelled", ep)
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
		return transport.Errorf(transport.ErrCorrupt, "tcp data connection to %s: not an rdt data endpoint", ep)
	}
	if err != nil {
		return transport.Errorf(transport.ErrPeerUnavailable, "tcp data connection to %s: handshake failed: %v", ep, err)
	}
	if v := hello[len(helloMagic)]; v != protoVersion {
		return transport.Errorf(transport.ErrUnsupported, "tcp data connection to %s: it speaks data protocol version %d, this build speaks %d", ep, v, protoVersion)
	}
	id := t.h.Identity().RuntimeID
	answer := append(transport.AuthProof(key, authPurpose, hello[len(helloMagic)+1:]), id[:]...)
	if _, err := c.Write(answer); err != nil {
		return transport.Errorf(transport.ErrPeerUnavailable, "tcp data connection to %s: handshake failed: %v", ep, err)
	}
	st, msg, err := readResponse(c)
	if err != nil {
		// A server that refuses the key says so (below); a connection
		// that ends without an answer means the peer went away, say
		// killed while we connected.
		if transport.StatusOf(err) == transport.ErrPeerUnavailable {
			return transport.Errorf(transport.ErrPeerUnavailable, "tcp data connection to %s: the peer closed the connection during authentication: %v", ep, err)
		}
		return err
	}
	if st == transport.OK {
		return nil
	}
	return transport.Errorf(st, "tcp data connection to %s: %s", ep, msg)
}

// readResponse reads one response header and its message (handshake only;
// pulls read theirs in stream.advance).
func readResponse(c net.Conn) (transport.Status, string, error) {
	var hdr [responseLen]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return 0, "", transport.Errorf(transport.ErrPeerUnavailable, "tcp: reading from %s: %v", c.RemoteAddr(), err)
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
		return 0, "", transport.Errorf(transport.ErrPeerUnavailable, "tcp: reading from %s: %v", c.RemoteAddr(), err)
	}
	return st, string(msg), nil
}

// put returns a healthy connection to the pool.
func (t *Transport) put(k poolKey, c net.Conn) {
	t.pmu.Lock()
	defer t.pmu.Unlock()
	if t.closed || len(t.idle[k]) >= maxIdle {
		c.Close()
		return
	}
	t.idle[k] = append(t.idle[k], pooled{c: c, since: time.Now()})
	if t.reaper == nil {
		t.reaper = time.AfterFunc(idleTimeout, t.reapIdle)
	}
}

// reapIdle closes pooled connections unused for idleTimeout, and runs
// again while any are left.
func (t *Transport) reapIdle() {
	now := time.Now()
	var drop []pooled
	t.pmu.Lock()
	next := idleTimeout
	for k, l := range t.idle {
		keep := l[:0]
		for _, p := range l {
			if age := now.Sub(p.since); age >= idleTimeout {
				drop = append(drop, p)
			} else {
				keep = append(keep, p)
				next = min(next, idleTimeout-age)
			}
		}
		clear(l[len(keep):])
		if len(keep) == 0 {
			delete(t.idle, k)
		} else {
			t.idle[k] = keep
		}
	}
	t.reaper = nil
	if len(t.idle) > 0 && !t.closed {
		t.reaper = time.AfterFunc(next, t.reapIdle)
	}
	t.pmu.Unlock()
	for _, p := range drop {
		p.c.Close()
	}
}

// dropIdle closes the pooled connections to a source that went away.
func (t *Transport) dropIdle(k poolKey) {
	t.pmu.Lock()
	l := t.idle[k]
	delete(t.idle, k)
	t.pmu.Unlock()
	for _, p := range l {
		p.c.Close()
	}
}
