package shm

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"golang.org/x/sys/unix"
)

func (t *Transport) CommunicatorMetadata(x *transport.Transfer) ([]byte, error) { return nil, nil }

// request is a fetch in progress: it completes when the copy ends.
type request struct {
	*transport.Completion
	t       *Transport
	aborted atomic.Bool
	// asking is the connection waiting for the segment server's answer,
	// which a stopped source would hold for ioTimeout: Abort cuts it short.
	mu     sync.Mutex
	asking *net.UnixConn
}

// Abort makes the copy stop at its next chunk, and a wait for the segment
// server's answer stop now.
func (t *Transport) Abort(x *transport.Transfer, req transport.Request) {
	if r, ok := req.(*request); ok {
		r.aborted.Store(true)
		r.mu.Lock()
		if r.asking != nil {
			r.asking.SetDeadline(time.Now())
		}
		r.mu.Unlock()
	}
}

// ask records c as the connection the request waits on (nil: none); a
// request already aborted finds c's deadline passed.
func (r *request) ask(c *net.UnixConn) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asking = c
	if c != nil && r.aborted.Load() {
		c.SetDeadline(time.Now())
	}
}

// Fetch checks the metadata against the transfer and the targets, and
// starts copying.
func (t *Transport) Fetch(x *transport.Transfer, targets []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	m, err := decodeMetadata(tmeta)
	if err != nil {
		return nil, err
	}
	// Ref bytes are checksummed, not signed: the metadata must name the
	// object fetched (its segment holds nothing else), and the segment
	// server must be its owner's process (checked at connect).
	if m.Object != x.Object {
		return nil, transport.Errorf(transport.ErrCorrupt, "the metadata of object %s names object %s: refusing it", x.Object, m.Object)
	}
	if len(m.Regions) != len(targets) {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "the source describes %d tensors, %d targets given", len(m.Regions), len(targets))
	}
	for i, r := range m.Regions {
		if r.Size != targets[i].Nbytes {
			return nil, transport.Errorf(transport.ErrInvalidArgument, "tensor %d is %d bytes at the source, the target holds %d", i, r.Size, targets[i].Nbytes)
		}
		if !targets[i].Device.Type.HostAccessible() {
			return nil, transport.Errorf(transport.ErrUnsupported, "target %d is in %s memory; only host memory is written", i, targets[i].Device)
		}
	}
	src, err := t.source(x.Source)
	if err != nil {
		return nil, err
	}
	r := &request{Completion: transport.NewCompletion(), t: t}
	// Even small copies run on their own goroutine, so that a fetch of many
	// refs overlaps their socket round trips.
	go func() {
		r.Finish(r.receive(src, x.Source.Pid, m, targets))
	}()
	return r, nil
}

// source is the record of the connections kept to a source runtime.
func (t *Transport) source(peer transport.PeerInfo) (*keptConns, error) {
	t.idleMu.Lock()
	defer t.idleMu.Unlock()
	if t.idle == nil {
		return nil, transport.Errorf(transport.ErrClosed, "the transport is closed")
	}
	k := t.idle[peer.RuntimeID]
	if k == nil {
		// Records that keep nothing go, should a source's end have been
		// reported before its first fetch started.
		for id, other := range t.idle {
			if other.empty() {
				delete(t.idle, id)
			}
		}
		k = &keptConns{peer: peer.RuntimeID, byPath: map[string][]*net.UnixConn{}}
		t.idle[peer.RuntimeID] = k
	}
	return k, nil
}

func (k *keptConns) empty() bool {
	for _, cs := range k.byPath {
		if len(cs) > 0 {
			return false
		}
	}
	return true
}

func (r *request) receive(src *keptConns, owner int, m *metadata, targets []transport.Tensor) error {
	fd, size, err := r.t.getSegment(r, src, owner, m)
	if err != nil {
		if r.aborted.Load() {
			return transport.Errorf(transport.ErrAborted, "transfer aborted while the owner's segment server was asked: %v", err)
		}
		return err
	}
	defer unix.Close(fd)
	if size != m.Size {
		return transport.Errorf(transport.ErrCorrupt, "the source's segment holds %d bytes, its metadata says %d", size, m.Size)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || uint64(st.Size) != size {
		return transport.Errorf(transport.ErrCorrupt, "the received segment is %d bytes, %d expected", st.Size, size)
	}
	if seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0); err != nil || seals&unix.F_SEAL_WRITE == 0 || seals&unix.F_SEAL_SHRINK == 0 {
		return transport.Errorf(transport.ErrPermissionDenied, "the received segment is not sealed against writes; refusing to read it")
	}
	for i, reg := range m.Regions {
		if reg.Size == 0 {
			continue
		}
		if err := readSegment(fd, transport.Bytes(targets[i].Data, reg.Size), reg.Offset, &r.aborted); err != nil {
			return err
		}
	}
	return nil
}

// readSegment copies part of the segment into dst with pread: one copy by
// the kernel and no mapping to set up and tear down, which for a fresh
// mapping of a large segment costs more than the copy itself (measured).
// Large reads are split between two workers.
func readSegment(fd int, dst []byte, off uint64, abort *atomic.Bool) error {
	one := func(d []byte, at uint64) error {
		for done := 0; done < len(d); {
			if abort.Load() {
				return transport.Errorf(transport.ErrAborted, "transfer aborted")
			}
			end := min(done+chunk, len(d))
			n, err := unix.Pread(fd, d[done:end], int64(at)+int64(done))
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return transport.Errorf(transport.ErrTransport, "reading the segment: %v", err)
			}
			if n == 0 {
				return transport.Errorf(transport.ErrCorrupt, "the segment ended early")
			}
			done += n
		}
		return nil
	}
	if len(dst) < parallelMin {
		return one(dst, off)
	}
	half := (len(dst) / 2) &^ 4095
	var err1 error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); err1 = one(dst[half:], off+uint64(half)) }()
	err0 := one(dst[:half], off)
	wg.Wait()
	if err0 != nil {
		return err0
	}
	return err1
}

// getSegment asks the source's segment server for the object's
// descriptor, over a kept connection when there is one. The server must be
// the owner's process: a ref could name any socket.
func (t *Transport) getSegment(r *request, src *keptConns, owner int, m *metadata) (int, uint64, error) {
	if c := t.takeIdle(src, m.Path); c != nil {
		fd, size, err, usable := t.askSegment(r, src, c, m)
		if usable {
			return fd, size, err
		}
		// The kept connection was closed by the server (idle, or a new
		// source at that path): ask once more on a new one.
	}
	d := net.Dialer{Timeout: dialTimeout}
	nc, err := d.Dial("unix", m.Path)
	if err != nil {
		if exhausted := outOfResources("connecting to the owner's segment server", "this process", err); exhausted != nil {
			return -1, 0, exhausted
		}
		return -1, 0, transport.Errorf(transport.ErrPeerUnavailable, "the owner's segment server at %s is gone: %v", m.Path, err)
	}
	c := nc.(*net.UnixConn)
	if pid, err := transport.UnixPeerPid(c); err != nil || pid != owner {
		c.Close()
		if err != nil {
			return -1, 0, transport.Errorf(transport.ErrPermissionDenied, "cannot identify the segment server at %s: %v", m.Path, err)
		}
		return -1, 0, transport.Errorf(transport.ErrCorrupt,
			"the segment server at %s is process %d, but the owner of object %s is process %d: refusing it", m.Path, pid, m.Object, owner)
	}
	fd, size, err, _ := t.askSegment(r, src, c, m)
	return fd, size, err
}

// askSegment does one request on c, then keeps c for the next request or
// closes it. usable is false when c failed before any answer arrived.
func (t *Transport) askSegment(r *request, src *keptConns, c *net.UnixConn, m *metadata) (fd int, size uint64, err error, usable bool) {
	gone := func(err error) error {
		return transport.Errorf(transport.ErrPeerUnavailable, "the owner's segment server at %s is gone: %v", m.Path, err)
	}
	c.SetDeadline(time.Now().Add(ioTimeout))
	r.ask(c)
	defer r.ask(nil)
	if _, err := c.Write(encodeRequest(m.Object)); err != nil {
		c.Close()
		return -1, 0, gone(err), false
	}
	buf := make([]byte, replyLen+maxMessage)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil || n == 0 {
		c.Close()
		if err == nil {
			err = io.EOF
		}
		return -1, 0, gone(err), false
	}
	fds := receivedFDs(oob[:oobn])
	if flags&unix.MSG_CTRUNC != 0 && len(fds) == 0 { // the kernel had no descriptor number to give
		c.Close()
		return -1, 0, outOfResources("receiving the segment", "this process", unix.EMFILE), true
	}
	closeAll := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	st, msg, size, err := decodeReply(buf[:n])
	if err != nil {
		closeAll()
		c.Close() // out of step with the server
		return -1, 0, err, true
	}
	t.keepIdle(src, m.Path, c)
	if st != transport.OK {
		closeAll()
		return -1, 0, transport.Errorf(st, "%s", msg), true
	}
	if len(fds) != 1 {
		closeAll()
		return -1, 0, transport.Errorf(transport.ErrCorrupt, "the source sent %d descriptors, want 1", len(fds)), true
	}
	return fds[0], size, nil, true
}

func (t *Transport) takeIdle(src *keptConns, path string) *net.UnixConn {
	t.idleMu.Lock()
	defer t.idleMu.Unlock()
	cs := src.byPath[path]
	if len(cs) == 0 {
		return nil
	}
	c := cs[len(cs)-1]
	src.byPath[path] = cs[:len(cs)-1]
	return c
}

func (t *Transport) keepIdle(src *keptConns, path string, c *net.UnixConn) {
	t.idleMu.Lock()
	defer t.idleMu.Unlock()
	if t.idle == nil || t.idle[src.peer] != src || len(src.byPath[path]) >= maxIdle {
		c.Close()
		return
	}
	src.byPath[path] = append(src.byPath[path], c)
}

func receivedFDs(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if f, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

// parallelCopy copies src into dst in chunks, checking abort between them,
// with two workers for large copies. It reports false if it was aborted.
func parallelCopy(dst, src []byte, abort *atomic.Bool) bool {
	one := func(d, s []byte) bool {
		for off := 0; off < len(s); off += chunk {
			if abort != nil && abort.Load() {
				return false
			}
			copy(d[off:], s[off:min(off+chunk, len(s))])
		}
		return true
	}
	if len(src) < parallelMin {
		return one(dst, src)
	}
	half := (len(src) / 2) &^ 4095
	var ok [workers]bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); ok[1] = one(dst[half:], src[half:]) }()
	ok[0] = one(dst[:half], src[:half])
	wg.Wait()
	return ok[0] && ok[1]
}
