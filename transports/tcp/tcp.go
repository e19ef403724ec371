// Package tcp moves host memory between any two hosts: the receiver pulls
// byte ranges of an object from the source's data listener, over several
// streams for large tensors, straight into its targets. The source serves
// only objects its runtime holds, by id and range, checked against their
// sizes; it never reads an address taken from the wire.
package tcp

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdt-project/rdt/core"
)

// Name is the canonical transport name.
const Name = "tcp"

const (
	// streamMin: tensors at least this large are pulled over several
	// connections at once.
	streamMin = 8 << 20
	// piece bounds one request, so that a large tensor is a few requests
	// per stream rather than one huge one.
	piece       = 256 << 20
	dialTimeout = 5 * time.Second
	authTimeout = 10 * time.Second
	maxIdle     = 16 // idle connections kept per endpoint
)

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

	pmu    sync.Mutex
	idle   map[string][]net.Conn // pooled client connections by endpoint
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
	return &Transport{h: h, streams: streams, sconns: map[net.Conn]struct{}{}, idle: map[string][]net.Conn{}}, nil
}

func (t *Transport) Name() string               { return Name }
func (t *Transport) Devices() []core.DeviceType { return []core.DeviceType{core.DeviceCPU, core.DeviceCUDAHost} }
func (t *Transport) OneSided() bool             { return true }
func (t *Transport) CanAbort() bool             { return true }

// EagerMetadata: the endpoint and the object id are all a receiver needs.
func (t *Transport) EagerMetadata() bool { return true }

func (t *Transport) CommunicatorMetadata(x *core.Transfer) ([]byte, error) { return nil, nil }

func (t *Transport) Send(x *core.Transfer, tensors []core.Tensor, tmeta, cmeta []byte) error {
	return core.Errorf(core.ErrInternal, "tcp is one-sided: send is never called on it")
}

func (t *Transport) GarbageCollect(obj core.ObjectID, tensors []core.Tensor, tmeta []byte) {}

// ExtractMetadata names this runtime's data endpoint and the object.
func (t *Transport) ExtractMetadata(obj core.ObjectID, tensors []core.Tensor) ([]byte, error) {
	for _, x := range tensors {
		if !x.Device.Type.HostAccessible() {
			return nil, core.Errorf(core.ErrUnsupported, "tcp moves host memory; tensor on %s", x.Device)
		}
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
	if t.ln != nil {
		return t.endpoint, nil
	}
	if t.closed {
		return "", core.Errorf(core.ErrClosed, "tcp transport is closed")
	}
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
			time.Sleep(10 * time.Millisecond)
			continue
		}
		t.lmu.Lock()
		if t.closed {
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
		c.Write(encodeResponse(nil, core.ErrPermissionDenied, "the source refused our auth token (set the same RDT_AUTH_TOKEN on both sides)"))
		return
	}
	if _, err := c.Write(encodeResponse(nil, core.OK, "")); err != nil {
		return
	}
	c.SetDeadline(time.Time{})
	frame := make([]byte, requestLen)
	hdr := make([]byte, 0, responseLen+maxMessage)
	for {
		if _, err := io.ReadFull(c, frame); err != nil {
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
	tensors, unpin, err := t.h.PinObject(req.Object)
	if err != nil {
		_, werr := c.Write(encodeResponse(hdr, core.StatusOf(err), err.Error()))
		return werr
	}
	defer unpin()
	if int(req.Tensor) >= len(tensors) {
		_, werr := c.Write(encodeResponse(hdr, core.ErrInvalidArgument, "tcp: object "+req.Object.String()+" has "+strconv.Itoa(len(tensors))+" tensors; tensor "+strconv.FormatUint(uint64(req.Tensor), 10)+" was asked for"))
		return werr
	}
	src := tensors[req.Tensor]
	if req.Offset > src.Nbytes || req.Length > src.Nbytes-req.Offset {
		msg := "tcp: range [" + strconv.FormatUint(req.Offset, 10) + ", +" + strconv.FormatUint(req.Length, 10) + ") is outside tensor " + strconv.FormatUint(uint64(req.Tensor), 10) + " (" + strconv.FormatUint(src.Nbytes, 10) + " bytes)"
		t.h.Log().Warnf("tcp: refused a request from %s: %s", c.RemoteAddr(), msg)
		_, werr := c.Write(encodeResponse(hdr, core.ErrInvalidArgument, msg))
		return werr
	}
	if !src.Device.Type.HostAccessible() {
		_, werr := c.Write(encodeResponse(hdr, core.ErrUnsupported, "tcp: the object is in "+src.Device.Type.String()+" memory"))
		return werr
	}
	if _, err := c.Write(encodeResponse(hdr, core.OK, "")); err != nil {
		return err
	}
	if req.Length == 0 {
		return nil
	}
	// Straight from the tensor's memory: the pin keeps it alive meanwhile.
	_, err = c.Write(core.Bytes(src.Data+uintptr(req.Offset), req.Length))
	return err
}

// Close stops serving, closes every connection and waits for the serving
// goroutines to end.
func (t *Transport) Close() error {
	t.lmu.Lock()
	t.closed = true
	if t.ln != nil {
		t.ln.Close()
	}
	for c := range t.sconns {
		c.Close()
	}
	t.lmu.Unlock()
	t.serving.Wait()
	t.pmu.Lock()
	for ep, conns := range t.idle {
		for _, c := range conns {
			c.Close()
		}
		delete(t.idle, ep)
	}
	t.pmu.Unlock()
	return nil
}

func tune(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		// Kernel autotuning beats fixed buffers on loopback (measured).
	}
}

// ---- destination side -------------------------------------------------------

// conn takes a pooled connection to ep or dials and authenticates one.
func (t *Transport) conn(ctx context.Context, ep string) (net.Conn, error) {
	t.pmu.Lock()
	if t.closed {
		t.pmu.Unlock()
		return nil, core.Errorf(core.ErrClosed, "tcp transport is closed")
	}
	if l := t.idle[ep]; len(l) > 0 {
		c := l[len(l)-1]
		t.idle[ep] = l[:len(l)-1]
		t.pmu.Unlock()
		return c, nil
	}
	t.pmu.Unlock()
	d := net.Dialer{Timeout: dialTimeout}
	c, err := d.DialContext(ctx, "tcp", ep)
	if err != nil {
		return nil, core.Errorf(core.ErrPeerUnavailable, "tcp: cannot reach the source's data endpoint %s: %v", ep, err)
	}
	tune(c)
	if err := t.authenticate(c, ep); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (t *Transport) authenticate(c net.Conn, ep string) error {
	c.SetDeadline(time.Now().Add(authTimeout))
	defer c.SetDeadline(time.Time{})
	hello := make([]byte, helloLen)
	if _, err := io.ReadFull(c, hello); err != nil {
		return core.Errorf(core.ErrPeerUnavailable, "tcp: handshake with %s: %v", ep, err)
	}
	if string(hello[:len(helloMagic)]) != helloMagic {
		return core.Errorf(core.ErrCorrupt, "tcp: %s is not an rdt data endpoint", ep)
	}
	if v := hello[len(helloMagic)]; v != protoVersion {
		return core.Errorf(core.ErrUnsupported, "tcp: %s speaks data protocol version %d, this build speaks %d", ep, v, protoVersion)
	}
	proof := core.AuthProof(t.h.AuthToken(), authPurpose, hello[len(helloMagic)+1:])
	if _, err := c.Write(proof); err != nil {
		return core.Errorf(core.ErrPeerUnavailable, "tcp: handshake with %s: %v", ep, err)
	}
	st, msg, err := readResponse(c)
	if err != nil {
		if core.StatusOf(err) == core.ErrPeerUnavailable {
			return core.Errorf(core.ErrPermissionDenied, "tcp: %s closed the connection during authentication (a wrong auth token?)", ep)
		}
		return err
	}
	if st != core.OK {
		return core.Errorf(st, "tcp data connection to %s: %s", ep, msg)
	}
	return nil
}

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

// job is a byte range of one target, pulled on one connection.
type job struct {
	tensor uint32
	offset uint64
	dst    []byte
}

type fetchRequest struct {
	t       *Transport
	meta    *metadata
	aborted atomic.Bool
	mu      sync.Mutex
	active  map[net.Conn]struct{}
	done    chan struct{}
	err     error
}

func (r *fetchRequest) Wait() error { <-r.done; return r.err }
func (r *fetchRequest) Release()    {}
func (r *fetchRequest) Completed() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// Fetch starts pulling every tensor of the object into targets.
func (t *Transport) Fetch(x *core.Transfer, targets []core.Tensor, tmeta, cmeta []byte) (core.Request, error) {
	m, err := decodeMetadata(tmeta)
	if err != nil {
		return nil, err
	}
	if int(m.Tensors) != len(targets) {
		return nil, core.Errorf(core.ErrInvalidArgument, "tcp: the source describes %d tensors, %d targets given", m.Tensors, len(targets))
	}
	var small uint64
	var big []job
	var smallJobs []job
	for i, tg := range targets {
		if tg.Nbytes == 0 {
			continue
		}
		dst := core.Bytes(tg.Data, tg.Nbytes)
		if tg.Nbytes < streamMin {
			smallJobs = append(smallJobs, job{tensor: uint32(i), dst: dst})
			small += tg.Nbytes
			continue
		}
		// Cut into one share per stream, each share into pieces.
		share := (tg.Nbytes + uint64(t.streams) - 1) / uint64(t.streams)
		for off := uint64(0); off < tg.Nbytes; off += share {
			end := min(off+share, tg.Nbytes)
			big = append(big, job{tensor: uint32(i), offset: off, dst: dst[off:end]})
		}
	}
	r := &fetchRequest{t: t, meta: m, active: map[net.Conn]struct{}{}, done: make(chan struct{})}
	// Even small pulls run on their own goroutine: a fetch of many refs then
	// overlaps their round trips instead of paying them one after another.
	go func() {
		var wg sync.WaitGroup
		var once sync.Once
		fail := func(err error) {
			once.Do(func() { r.err = err })
			r.abort()
		}
		if len(smallJobs) > 0 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := r.pull(smallJobs); err != nil {
					fail(err)
				}
			}()
		}
		for _, j := range big {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := r.pull([]job{j}); err != nil {
					fail(err)
				}
			}()
		}
		wg.Wait()
		close(r.done)
	}()
	return r, nil
}

// pull runs jobs one after another on one connection.
func (r *fetchRequest) pull(jobs []job) error {
	if r.aborted.Load() {
		return core.Errorf(core.ErrAborted, "tcp: transfer aborted")
	}
	ep := r.meta.Endpoint
	c, err := r.t.conn(r.t.h.Context(), ep)
	if err != nil {
		return err
	}
	if !r.track(c) {
		c.Close()
		return core.Errorf(core.ErrAborted, "tcp: transfer aborted")
	}
	frame := make([]byte, 0, requestLen)
	for _, j := range jobs {
		for off := uint64(0); off < uint64(len(j.dst)); off += piece {
			n := min(uint64(len(j.dst))-off, piece)
			req := request{Object: r.meta.Object, Tensor: j.tensor, Offset: j.offset + off, Length: n}
			if err := r.one(c, frame[:0], req, j.dst[off:off+n]); err != nil {
				r.untrack(c)
				c.Close()
				return err
			}
		}
	}
	r.untrack(c)
	r.t.put(ep, c)
	return nil
}

// one sends a request and reads the answer into dst.
func (r *fetchRequest) one(c net.Conn, frame []byte, req request, dst []byte) error {
	if _, err := c.Write(req.encode(frame)); err != nil {
		return r.ioError(err)
	}
	st, msg, err := readResponse(c)
	if err != nil {
		if r.aborted.Load() {
			return core.Errorf(core.ErrAborted, "tcp: transfer aborted")
		}
		return err
	}
	if st != core.OK {
		return core.Errorf(st, "tcp: the source %s refused: %s", r.meta.Endpoint, msg)
	}
	if _, err := io.ReadFull(c, dst); err != nil {
		return r.ioError(err)
	}
	return nil
}

func (r *fetchRequest) ioError(err error) error {
	if r.aborted.Load() {
		return core.Errorf(core.ErrAborted, "tcp: transfer aborted")
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.EPIPE) {
		return core.Errorf(core.ErrPeerUnavailable, "tcp: the source %s went away during the transfer", r.meta.Endpoint)
	}
	return core.Errorf(core.ErrPeerUnavailable, "tcp: transfer from %s failed: %v", r.meta.Endpoint, err)
}

func (r *fetchRequest) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.aborted.Load() {
		return false
	}
	r.active[c] = struct{}{}
	return true
}

func (r *fetchRequest) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.active, c)
	r.mu.Unlock()
}

// abort closes the request's connections so that blocked reads return.
func (r *fetchRequest) abort() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.aborted.Store(true)
	for c := range r.active {
		c.Close()
	}
}

// Abort stops a transfer in progress.
func (t *Transport) Abort(x *core.Transfer, req core.Request) {
	if r, ok := req.(*fetchRequest); ok {
		r.abort()
	}
}

// RequestRange pulls one byte range of one tensor of an object from the
// data endpoint named in tmeta (the object's tcp metadata), authenticating
// with token, and returns the bytes or the source's refusal. It is a
// diagnostic client, independent of any runtime: fetches go through Fetch.
func RequestRange(ctx context.Context, token string, tmeta []byte, tensor uint32, offset, length uint64) ([]byte, error) {
	m, err := decodeMetadata(tmeta)
	if err != nil {
		return nil, err
	}
	if length > maxRequest {
		return nil, core.Errorf(core.ErrInvalidArgument, "tcp: at most %d bytes per request", maxRequest)
	}
	t := &Transport{h: probeHost{token: token, ctx: ctx}, streams: 1, sconns: map[net.Conn]struct{}{}, idle: map[string][]net.Conn{}}
	c, err := t.conn(ctx, m.Endpoint)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	}
	r := &fetchRequest{t: t, meta: m, active: map[net.Conn]struct{}{}}
	buf := make([]byte, length)
	if err := r.one(c, nil, request{Object: m.Object, Tensor: tensor, Offset: offset, Length: length}, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// probeHost is the Host of a RequestRange client: it has a token and a
// context and nothing to serve.
type probeHost struct {
	token string
	ctx   context.Context
}

func (p probeHost) Identity() core.PeerInfo  { return core.PeerInfo{Name: "tcp-probe"} }
func (p probeHost) Log() *core.Logger        { return core.NewLogger("tcp-probe", core.LogOff) }
func (p probeHost) Context() context.Context { return p.ctx }
func (p probeHost) AuthToken() string        { return p.token }
func (p probeHost) BindHost() string         { return "127.0.0.1" }
func (p probeHost) AdvertiseHost() string    { return "127.0.0.1" }
func (p probeHost) SocketDir() string        { return "" }
func (p probeHost) PinObject(core.ObjectID) ([]core.Tensor, func(), error) {
	return nil, nil, core.Errorf(core.ErrNotFound, "a probe holds no objects")
}
