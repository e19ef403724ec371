// Package shm moves host memory between processes on one host through
// shared memory: the source stages an object once into a sealed memfd, a
// receiver gets the file descriptor over a Unix socket (SCM_RIGHTS), maps it
// read-only and copies into its targets. Memfds have no name in any file
// system, so nothing is ever left in /dev/shm, even after a crash.
package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
)

// Name is the canonical transport name.
const Name = "shm"

const (
	align = 64 // tensors start on cache-line boundaries in a segment
	// chunk is copied between checks for an abort.
	chunk = 4 << 20
	// parallelMin: copies at least this large are split between workers.
	parallelMin = 32 << 20
	workers     = 2
	dialTimeout = 5 * time.Second
	ioTimeout   = 30 * time.Second
	// A segment-server connection is kept for the next request; the
	// server closes one idle this long, and a receiver keeps at most
	// maxIdle per source.
	idleTimeout = 60 * time.Second
	maxIdle     = 16
)

// Factory makes the transport for a new runtime.
func Factory() transport.TransportFactory {
	return transport.TransportFactory{Name: Name, New: New}
}

// segment is one staged object.
type segment struct {
	fd   int
	size uint64
}

// Transport is the shm transport of one runtime.
type Transport struct {
	h transport.Host

	mu      sync.Mutex
	segs    map[transport.ObjectID]*segment
	ln      *net.UnixListener
	path    string
	serving sync.WaitGroup
	conns   map[*net.UnixConn]struct{} // served connections, closed by Close
	closed  bool

	idleMu sync.Mutex
	idle   map[transport.RuntimeID]*keptConns // by source runtime; nil once closed
}

// keptConns are a receiver's idle connections to one source runtime's
// segment server, kept for the next request and closed when that runtime
// is gone (PeerGone). A connection that comes back to a record no longer
// in Transport.idle is closed.
type keptConns struct {
	peer   transport.RuntimeID
	byPath map[string][]*net.UnixConn
}

// New makes the transport; its socket appears with the first staged object.
func New(h transport.Host) (transport.Transport, error) {
	return &Transport{h: h, segs: map[transport.ObjectID]*segment{}, conns: map[*net.UnixConn]struct{}{},
		idle: map[transport.RuntimeID]*keptConns{}}, nil
}

// Describe: shm shares memory segments, so only on the same host; a freed
// object's segment is no longer handed out; staging costs a copy, so
// objects put without a transport are staged only when a fetch asks for
// shm (no eager metadata); for host data it comes after cma.
func (t *Transport) Describe() transport.Descriptor {
	return transport.Descriptor{
		Name:                Name,
		Devices:             []transport.DeviceType{transport.DeviceCPU, transport.DeviceCUDAHost},
		OneSided:            true,
		CanAbort:            true,
		SameHostOnly:        true,
		DetectsFreedObjects: true,
		Auto:                transport.AutoRank{Host: 20},
	}
}

func (t *Transport) CommunicatorMetadata(x *transport.Transfer) ([]byte, error) { return nil, nil }

// layout places tensors in a segment, each aligned.
func layout(tensors []transport.Tensor) ([]region, uint64) {
	regions := make([]region, len(tensors))
	var off uint64
	for i, x := range tensors {
		off = (off + align - 1) &^ (align - 1)
		regions[i] = region{Offset: off, Size: x.Nbytes}
		off += x.Nbytes
	}
	return regions, off
}

// ExtractMetadata stages the object into a sealed memfd.
func (t *Transport) ExtractMetadata(obj transport.ObjectID, tensors []transport.Tensor) ([]byte, error) {
	for _, x := range tensors {
		if !x.Device.Type.HostAccessible() {
			return nil, transport.Errorf(transport.ErrUnsupported, "shm moves host memory; tensor on %s", x.Device)
		}
	}
	regions, size := layout(tensors)
	path, err := t.listen()
	if err != nil {
		return nil, err
	}
	m := metadata{Path: path, Object: obj, Size: size, Regions: regions}
	t.mu.Lock()
	_, staged := t.segs[obj]
	t.mu.Unlock()
	if staged {
		return m.encode(), nil
	}
	fd, err := stage(obj, tensors, regions, size)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		unix.Close(fd)
		return nil, transport.Errorf(transport.ErrClosed, "shm transport is closed")
	}
	if _, ok := t.segs[obj]; ok { // staged meanwhile by another caller
		unix.Close(fd)
	} else {
		t.segs[obj] = &segment{fd: fd, size: size}
	}
	return m.encode(), nil
}

// stage copies the tensors into a new memfd and seals it against any
// change, so receivers can trust what they map.
func stage(obj transport.ObjectID, tensors []transport.Tensor, regions []region, size uint64) (int, error) {
	fd, err := unix.MemfdCreate("rdt-"+obj.String(), unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		if exhausted := outOfResources("memfd_create", "this process", err); exhausted != nil {
			return -1, exhausted
		}
		return -1, transport.Errorf(transport.ErrUnsupported, "shm: memfd_create: %v", err)
	}
	fail := func(what string, err error) (int, error) {
		unix.Close(fd)
		st := transport.ErrTransport
		if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.ENOSPC) {
			st = transport.ErrNoMemory
		}
		return -1, transport.Errorf(st, "shm: %s of a %d-byte segment: %v", what, size, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail("ftruncate", err)
	}
	if size > 0 {
		mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return fail("mmap", err)
		}
		for i, x := range tensors {
			r := regions[i]
			parallelCopy(mem[r.Offset:r.Offset+r.Size], transport.Bytes(x.Data, x.Nbytes), nil)
		}
		// F_SEAL_WRITE needs every writable mapping gone.
		if err := unix.Munmap(mem); err != nil {
			return fail("munmap", err)
		}
	}
	seals := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		return fail("sealing", err)
	}
	return fd, nil
}

// outOfResources names a failure of `who` ("this process", "the owner")
// for lack of descriptors or memory, or is nil. Such a failure is a
// process's state, not a sign that shm does not work here: it must reach
// the caller as such, never as UNSUPPORTED (which would let an automatic
// choice of transport move on without a word).
func outOfResources(what, who string, err error) error {
	switch {
	case errors.Is(err, unix.EMFILE):
		return transport.Errorf(transport.ErrTransport, "shm: %s: %s is out of file descriptors (%v); raise its limit (ulimit -n) or hold fewer objects", what, who, err)
	case errors.Is(err, unix.ENFILE):
		return transport.Errorf(transport.ErrTransport, "shm: %s: the system is out of file descriptors (%v)", what, err)
	case errors.Is(err, unix.ENOMEM):
		return transport.Errorf(transport.ErrNoMemory, "shm: %s: %s is out of memory (%v)", what, who, err)
	}
	return nil
}

// GarbageCollect drops the object's segment. Receivers that still map it
// keep their mapping; the kernel frees the memory after the last one.
func (t *Transport) GarbageCollect(obj transport.ObjectID, tensors []transport.Tensor, tmeta []byte) {
	t.mu.Lock()
	s, ok := t.segs[obj]
	delete(t.segs, obj)
	t.mu.Unlock()
	if ok {
		unix.Close(s.fd)
	}
}

// Close stops serving and frees every segment.
func (t *Transport) Close() error {
	t.mu.Lock()
	t.closed = true
	ln := t.ln
	for id, s := range t.segs {
		unix.Close(s.fd)
		delete(t.segs, id)
	}
	for c := range t.conns {
		c.Close() // a served connection waiting for its next request
	}
	t.mu.Unlock()
	if ln != nil {
		ln.Close() // also removes the socket file
	}
	t.serving.Wait()
	t.idleMu.Lock()
	for _, k := range t.idle {
		k.closeLocked()
	}
	t.idle = nil // keepIdle closes what comes back later
	t.idleMu.Unlock()
	return nil
}

// PeerGone closes the connections kept to a source runtime that is gone:
// a receiver fed by many short-lived sources keeps no socket per source.
func (t *Transport) PeerGone(peer transport.PeerInfo) {
	t.idleMu.Lock()
	defer t.idleMu.Unlock()
	if k := t.idle[peer.RuntimeID]; k != nil {
		k.closeLocked()
		delete(t.idle, peer.RuntimeID)
	}
}

// closeLocked closes every kept connection; the caller holds idleMu.
func (k *keptConns) closeLocked() {
	for path, cs := range k.byPath {
		for _, c := range cs {
			c.Close()
		}
		delete(k.byPath, path)
	}
}

// keptCount is the number of idle connections kept, for tests.
func (t *Transport) keptCount() int {
	t.idleMu.Lock()
	defer t.idleMu.Unlock()
	n := 0
	for _, k := range t.idle {
		for _, cs := range k.byPath {
			n += len(cs)
		}
	}
	return n
}

// ---- serving descriptors ----------------------------------------------------

func (t *Transport) listen() (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return "", transport.Errorf(transport.ErrClosed, "shm transport is closed")
	}
	if t.ln != nil {
		return t.path, nil
	}
	var rnd [6]byte
	if _, err := io.ReadFull(randReader{}, rnd[:]); err != nil {
		return "", transport.Errorf(transport.ErrInternal, "shm: %v", err)
	}
	path := filepath.Join(t.h.SocketDir(), fmt.Sprintf("shm-%d-%x.sock", os.Getpid(), rnd))
	if len(path) >= 108 {
		return "", transport.Errorf(transport.ErrInvalidArgument, "shm: socket path %s is too long for a Unix socket (choose a shorter socket_dir)", path)
	}
	removeStaleSockets(t.h.SocketDir())
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return "", transport.Errorf(transport.ErrTransport, "shm: cannot listen on %s: %v", path, err)
	}
	t.ln, t.path = ln, path
	t.serving.Add(1)
	go t.accept(ln)
	return path, nil
}

// removeStaleSockets deletes the sockets of processes that died without
// closing their transport (killed, say). The pid is in the name.
func removeStaleSockets(dir string) {
	names, _ := filepath.Glob(filepath.Join(dir, "shm-*-*.sock"))
	for _, name := range names {
		var pid int
		var rest string
		if n, _ := fmt.Sscanf(filepath.Base(name), "shm-%d-%s", &pid, &rest); n != 2 || pid <= 0 {
			continue
		}
		if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
			os.Remove(name)
		}
	}
}

func (t *Transport) accept(ln *net.UnixListener) {
	defer t.serving.Done()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			t.h.Log().Warnf("shm: accept: %v", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			c.Close()
			continue
		}
		t.conns[c] = struct{}{}
		t.serving.Add(1)
		t.mu.Unlock()
		go func() {
			defer t.serving.Done()
			t.serve(c)
			t.mu.Lock()
			delete(t.conns, c)
			t.mu.Unlock()
			c.Close()
		}()
	}
}

// serve answers a connection's requests for segment descriptors, one
// after the other, until the receiver closes it or leaves it idle.
func (t *Transport) serve(c *net.UnixConn) {
	c.SetDeadline(time.Now().Add(ioTimeout))
	if err := checkSameUser(c); err != nil {
		t.h.Log().Warnf("%v", err)
		c.Write(encodeReply(transport.ErrPermissionDenied, err.Error(), 0))
		return
	}
	buf := make([]byte, requestLen)
	for {
		c.SetDeadline(time.Now().Add(idleTimeout))
		if _, err := io.ReadFull(c, buf); err != nil {
			return
		}
		c.SetDeadline(time.Now().Add(ioTimeout))
		if !t.answer(c, buf) {
			return
		}
	}
}

// answer replies to one request; false ends the connection (a request it
// cannot parse, or a failed write).
func (t *Transport) answer(c *net.UnixConn, req []byte) bool {
	obj, err := decodeRequest(req)
	if err != nil {
		c.Write(encodeReply(transport.StatusOf(err), err.Error(), 0))
		return false
	}
	t.mu.Lock()
	s, ok := t.segs[obj]
	fd := -1
	if ok {
		// A duplicate: GarbageCollect may close the original meanwhile.
		fd, err = unix.FcntlInt(uintptr(s.fd), unix.F_DUPFD_CLOEXEC, 0)
	}
	t.mu.Unlock()
	if !ok {
		_, err := c.Write(encodeReply(transport.ErrNotFound, "shm: object "+obj.String()+" is not staged here (freed, or never put over shm)", 0))
		return err == nil
	}
	if err != nil {
		reply := outOfResources("handing out the segment", "the owner", err)
		if reply == nil {
			reply = transport.Errorf(transport.ErrTransport, "shm: dup: %v", err)
		}
		_, err := c.Write(encodeReply(transport.StatusOf(reply), reply.Error(), 0))
		return err == nil
	}
	defer unix.Close(fd)
	_, _, err = c.WriteMsgUnix(encodeReply(transport.OK, "", s.size), unix.UnixRights(fd), nil)
	return err == nil
}

func checkSameUser(c *net.UnixConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return transport.Errorf(transport.ErrPermissionDenied, "shm: cannot identify the peer: %v", cerr)
	}
	if int(cred.Uid) != os.Getuid() {
		return transport.Errorf(transport.ErrPermissionDenied, "shm: refused a segment request from uid %d (pid %d): only uid %d may map this runtime's memory", cred.Uid, cred.Pid, os.Getuid())
	}
	return nil
}

// ---- receiving --------------------------------------------------------------

// request is a fetch in progress: it completes when the copy ends.
type request struct {
	*transport.Completion
	t       *Transport
	aborted atomic.Bool
}

// Abort makes the copy stop at its next chunk.
func (t *Transport) Abort(x *transport.Transfer, req transport.Request) {
	if r, ok := req.(*request); ok {
		r.aborted.Store(true)
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
		return nil, transport.Errorf(transport.ErrCorrupt, "shm: the metadata of object %s names object %s: refusing it", x.Object, m.Object)
	}
	if len(m.Regions) != len(targets) {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "shm: the source describes %d tensors, %d targets given", len(m.Regions), len(targets))
	}
	for i, r := range m.Regions {
		if r.Size != targets[i].Nbytes {
			return nil, transport.Errorf(transport.ErrInvalidArgument, "shm: tensor %d is %d bytes at the source, the target holds %d", i, r.Size, targets[i].Nbytes)
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
		return nil, transport.Errorf(transport.ErrClosed, "shm transport is closed")
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
	fd, size, err := r.t.getSegment(src, owner, m)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if size != m.Size {
		return transport.Errorf(transport.ErrCorrupt, "shm: the source's segment holds %d bytes, its metadata says %d", size, m.Size)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || uint64(st.Size) != size {
		return transport.Errorf(transport.ErrCorrupt, "shm: the received segment is %d bytes, %d expected", st.Size, size)
	}
	if seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0); err != nil || seals&unix.F_SEAL_WRITE == 0 || seals&unix.F_SEAL_SHRINK == 0 {
		return transport.Errorf(transport.ErrPermissionDenied, "shm: the received segment is not sealed against writes; refusing to read it")
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
				return transport.Errorf(transport.ErrAborted, "shm: transfer aborted")
			}
			end := min(done+chunk, len(d))
			n, err := unix.Pread(fd, d[done:end], int64(at)+int64(done))
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return transport.Errorf(transport.ErrTransport, "shm: reading the segment: %v", err)
			}
			if n == 0 {
				return transport.Errorf(transport.ErrCorrupt, "shm: the segment ended early")
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
func (t *Transport) getSegment(src *keptConns, owner int, m *metadata) (int, uint64, error) {
	if c := t.takeIdle(src, m.Path); c != nil {
		fd, size, err, usable := t.askSegment(src, c, m)
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
		return -1, 0, transport.Errorf(transport.ErrPeerUnavailable, "shm: the owner's segment server at %s is gone: %v", m.Path, err)
	}
	c := nc.(*net.UnixConn)
	if pid, err := transport.UnixPeerPid(c); err != nil || pid != owner {
		c.Close()
		if err != nil {
			return -1, 0, transport.Errorf(transport.ErrPermissionDenied, "shm: cannot identify the segment server at %s: %v", m.Path, err)
		}
		return -1, 0, transport.Errorf(transport.ErrCorrupt,
			"shm: the segment server at %s is process %d, but the owner of object %s is process %d: refusing it", m.Path, pid, m.Object, owner)
	}
	fd, size, err, _ := t.askSegment(src, c, m)
	return fd, size, err
}

// askSegment does one request on c, then keeps c for the next request or
// closes it. usable is false when c failed before any answer arrived.
func (t *Transport) askSegment(src *keptConns, c *net.UnixConn, m *metadata) (fd int, size uint64, err error, usable bool) {
	gone := func(err error) error {
		return transport.Errorf(transport.ErrPeerUnavailable, "shm: the owner's segment server at %s is gone: %v", m.Path, err)
	}
	c.SetDeadline(time.Now().Add(ioTimeout))
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
		return -1, 0, transport.Errorf(transport.ErrCorrupt, "shm: the source sent %d descriptors, want 1", len(fds)), true
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

// randReader reads the kernel's random bytes.
type randReader struct{}

func (randReader) Read(b []byte) (int, error) { return unix.Getrandom(b, 0) }

// ---- wire formats -----------------------------------------------------------

const (
	requestMagic = "RSQ1"
	requestLen   = 4 + 16
	replyLen     = 4 + 4 + 8
	maxMessage   = 1024
	metaMagic    = "RSHM"
	metaVersion  = 1
	maxRegions   = 1 << 16
	maxPath      = 107
)

func encodeRequest(obj transport.ObjectID) []byte {
	return append([]byte(requestMagic), obj[:]...)
}

func decodeRequest(b []byte) (transport.ObjectID, error) {
	var id transport.ObjectID
	if len(b) != requestLen || string(b[:4]) != requestMagic {
		return id, transport.Errorf(transport.ErrCorrupt, "shm: malformed segment request")
	}
	copy(id[:], b[4:])
	return id, nil
}

// A reply: status i32, size u64, message length u32, message.
func encodeReply(st transport.Status, msg string, size uint64) []byte {
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	b := binary.LittleEndian.AppendUint32(nil, uint32(int32(st)))
	b = binary.LittleEndian.AppendUint64(b, size)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(msg)))
	return append(b, msg...)
}

func decodeReply(b []byte) (transport.Status, string, uint64, error) {
	if len(b) < replyLen {
		return 0, "", 0, transport.Errorf(transport.ErrCorrupt, "shm: short reply from the source")
	}
	st := transport.Status(int32(binary.LittleEndian.Uint32(b)))
	size := binary.LittleEndian.Uint64(b[4:])
	n := binary.LittleEndian.Uint32(b[12:])
	if uint64(n) != uint64(len(b)-replyLen) {
		return 0, "", 0, transport.Errorf(transport.ErrCorrupt, "shm: malformed reply from the source")
	}
	return st, string(b[replyLen:]), size, nil
}

type region struct{ Offset, Size uint64 }

// metadata: "RSHM", version u8, path length u16, path, object [16],
// segment size u64, count u32, count × (offset u64, size u64).
type metadata struct {
	Path    string
	Object  transport.ObjectID
	Size    uint64
	Regions []region
}

func (m *metadata) encode() []byte {
	b := append([]byte(metaMagic), metaVersion)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.Path)))
	b = append(b, m.Path...)
	b = append(b, m.Object[:]...)
	b = binary.LittleEndian.AppendUint64(b, m.Size)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Regions)))
	for _, r := range m.Regions {
		b = binary.LittleEndian.AppendUint64(b, r.Offset)
		b = binary.LittleEndian.AppendUint64(b, r.Size)
	}
	return b
}

func decodeMetadata(b []byte) (*metadata, error) {
	bad := func(why string) error {
		return transport.Errorf(transport.ErrCorrupt, "shm: corrupt transport metadata (%s)", why)
	}
	if len(b) < 7 || string(b[:4]) != metaMagic {
		return nil, bad("bad header")
	}
	if b[4] != metaVersion {
		return nil, transport.Errorf(transport.ErrUnsupported, "shm: metadata version %d, this build reads version %d", b[4], metaVersion)
	}
	pl := int(binary.LittleEndian.Uint16(b[5:]))
	if pl == 0 || pl > maxPath || len(b) < 7+pl+16+8+4 {
		return nil, bad("socket path")
	}
	m := &metadata{Path: string(b[7 : 7+pl])}
	if !filepath.IsAbs(m.Path) {
		return nil, bad("socket path is not absolute")
	}
	p := b[7+pl:]
	copy(m.Object[:], p)
	m.Size = binary.LittleEndian.Uint64(p[16:])
	n := binary.LittleEndian.Uint32(p[24:])
	p = p[28:]
	if n > maxRegions || uint64(len(p)) != uint64(n)*16 {
		return nil, bad("tensor count")
	}
	m.Regions = make([]region, n)
	for i := range m.Regions {
		r := region{Offset: binary.LittleEndian.Uint64(p[16*i:]), Size: binary.LittleEndian.Uint64(p[16*i+8:])}
		if r.Offset > m.Size || r.Size > m.Size-r.Offset {
			return nil, bad("a tensor lies outside the segment")
		}
		m.Regions[i] = r
	}
	return m, nil
}
