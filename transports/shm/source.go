package shm

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"golang.org/x/sys/unix"
)

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

// ExtractMetadata stages the object: in the arena when it fits, else into
// a sealed memfd of its own.
func (t *Transport) ExtractMetadata(obj transport.ObjectID, tensors []transport.Tensor) ([]byte, error) {
	for _, x := range tensors {
		if !x.Device.Type.HostAccessible() {
			return nil, transport.Errorf(transport.ErrUnsupported, "it moves host memory; tensor on %s", x.Device)
		}
	}
	regions, size := layout(tensors)
	path, err := t.listen()
	if err != nil {
		return nil, err
	}
	t.mu.RLock()
	s, staged := t.segs[obj]
	t.mu.RUnlock()
	if staged {
		return s.meta, nil
	}
	m := metadata{Path: path, Object: obj, Size: size, Regions: regions}
	if meta, ok, err := t.stageInArena(&m, tensors); ok || err != nil {
		return meta, err
	}
	fd, err := stage(obj, tensors, regions, size)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		unix.Close(fd)
		return nil, transport.Errorf(transport.ErrClosed, "the transport is closed")
	}
	if s, ok := t.segs[obj]; ok { // staged meanwhile by another caller
		unix.Close(fd)
		return s.meta, nil
	}
	meta := m.encode()
	t.segs[obj] = &segment{fd: fd, size: size, meta: meta, view: -1}
	return meta, nil
}

// stageInArena copies the object into the arena, when there is one and
// room in it; ok is false when the object is to get a segment of its own.
func (t *Transport) stageInArena(m *metadata, tensors []transport.Tensor) (meta []byte, ok bool, err error) {
	if m.Size > arenaObjectMax {
		return nil, false, nil
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, false, transport.Errorf(transport.ErrClosed, "the transport is closed")
	}
	if m.Size+arenaTable > t.arenaBytes { // no arena, or too small for it
		t.mu.Unlock()
		return nil, false, nil
	}
	if t.arena == nil {
		a, err := newArena(t.arenaBytes)
		if err != nil {
			// Objects get segments of their own, as with no arena.
			t.h.Log().Warnf("no arena (%v); every object gets a segment of its own", err)
			t.arenaBytes = 0
			t.mu.Unlock()
			return nil, false, nil
		}
		t.arena = a
	}
	a := t.arena
	slot, tag, off, ok := a.alloc(m.Size)
	t.mu.Unlock()
	if !ok {
		return nil, false, nil // full
	}
	// The range is this call's alone; the read lock keeps Close from
	// unmapping the arena meanwhile.
	t.mu.RLock()
	if t.arena == a {
		copyIn(a.mem[off:off+m.Size], m.Regions, tensors)
	}
	t.mu.RUnlock()
	m.Arena, m.Slot, m.Tag, m.Base = a.id, slot, tag, off
	meta = m.encode()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.arena != a { // closed meanwhile
		return nil, false, transport.Errorf(transport.ErrClosed, "the transport is closed")
	}
	if s, ok := t.segs[m.Object]; ok { // staged meanwhile by another caller
		a.release(slot, off, m.Size)
		return s.meta, true, nil
	}
	a.publish(slot, tag)
	t.segs[m.Object] = &segment{fd: -1, size: m.Size, meta: meta, slot: slot, off: off, view: -1}
	return meta, true, nil
}

// stage copies the tensors into a new memfd and seals it against any
// change, so receivers can trust what they map.
func stage(obj transport.ObjectID, tensors []transport.Tensor, regions []region, size uint64) (int, error) {
	fd, err := unix.MemfdCreate("rdt-"+obj.String(), unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		if exhausted := outOfResources("memfd_create", "this process", err); exhausted != nil {
			return -1, exhausted
		}
		return -1, transport.Errorf(transport.ErrUnsupported, "memfd_create: %v", err)
	}
	fail := func(what string, err error) (int, error) {
		unix.Close(fd)
		st := transport.ErrTransport
		if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.ENOSPC) {
			st = transport.ErrNoMemory
		}
		return -1, transport.Errorf(st, "%s of a %d-byte segment: %v", what, size, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail("ftruncate", err)
	}
	if err := writeIn(fd, regions, tensors); err != nil {
		return fail("pwrite", err)
	}
	seals := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		return fail("sealing", err)
	}
	return fd, nil
}

// writeIn stages the tensors into the memfd fd at their regions with
// pwrite, on two threads when they are large. The kernel's copy into new
// shmem pages takes half the time of faulting them into a mapping and
// copying there (measured: 0.17 s against 0.34 s per 0.5 GB on one
// thread); the padding between regions stays a hole, which reads as zero.
func writeIn(fd int, regions []region, tensors []transport.Tensor) error {
	type part struct {
		off int64
		b   []byte
	}
	var parts []part
	var total int
	for i, x := range tensors {
		b := transport.Bytes(x.Data, x.Nbytes)
		for o := 0; o < len(b); o += chunk {
			parts = append(parts, part{int64(regions[i].Offset) + int64(o), b[o:min(o+chunk, len(b))]})
		}
		total += len(b)
	}
	write := func(parts []part) error {
		for _, p := range parts {
			for len(p.b) > 0 {
				n, err := unix.Pwrite(fd, p.b, p.off)
				if err == unix.EINTR {
					continue
				}
				if err != nil {
					return err
				}
				if n == 0 {
					return unix.EIO
				}
				p.b, p.off = p.b[n:], p.off+int64(n)
			}
		}
		return nil
	}
	if total < parallelMin {
		return write(parts)
	}
	// Two halves of about equal bytes, each written in order.
	half, filled := 0, 0
	for half < len(parts) && filled < total/2 {
		filled += len(parts[half].b)
		half++
	}
	var errs [workers]error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); errs[1] = write(parts[half:]) }()
	errs[0] = write(parts[:half])
	wg.Wait()
	return errors.Join(errs[0], errs[1])
}

// copyIn stages the tensors into seg at their regions.
func copyIn(seg []byte, regions []region, tensors []transport.Tensor) {
	for i, x := range tensors {
		r := regions[i]
		parallelCopy(seg[r.Offset:r.Offset+r.Size], transport.Bytes(x.Data, x.Nbytes), nil)
	}
}

// outOfResources names a failure of `who` ("this process", "the owner")
// for lack of descriptors or memory, or is nil. Such a failure is a
// process's state, not a sign that shm does not work here: it must reach
// the caller as such, never as UNSUPPORTED (which would let an automatic
// choice of transport move on without a word).
func outOfResources(what, who string, err error) error {
	switch {
	case errors.Is(err, unix.EMFILE):
		return transport.Errorf(transport.ErrTransport, "%s: %s is out of file descriptors (%v); raise its limit (ulimit -n) or hold fewer objects", what, who, err)
	case errors.Is(err, unix.ENFILE):
		return transport.Errorf(transport.ErrTransport, "%s: the system is out of file descriptors (%v)", what, err)
	case errors.Is(err, unix.ENOMEM):
		return transport.Errorf(transport.ErrNoMemory, "%s: %s is out of memory (%v)", what, who, err)
	}
	return nil
}

// GarbageCollect drops the object's segment. Receivers that still map it
// keep their mapping; the kernel frees the memory after the last one.
func (t *Transport) GarbageCollect(obj transport.ObjectID, tensors []transport.Tensor, tmeta []byte) {
	t.mu.Lock()
	s, ok := t.segs[obj]
	delete(t.segs, obj)
	if ok && s.inArena() && t.arena != nil {
		t.arena.release(s.slot, s.off, s.size) // its slot first: see arena
	}
	t.mu.Unlock()
	if ok && !s.inArena() {
		unix.Close(s.fd)
	}
	if ok && s.view >= 0 {
		unix.Close(s.view)
	}
}

func (t *Transport) listen() (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return "", transport.Errorf(transport.ErrClosed, "the transport is closed")
	}
	if t.ln != nil {
		return t.path, nil
	}
	var rnd [6]byte
	if _, err := io.ReadFull(randReader{}, rnd[:]); err != nil {
		return "", transport.Errorf(transport.ErrInternal, "%v", err)
	}
	path := filepath.Join(t.h.SocketDir(), fmt.Sprintf("shm-%d-%x.sock", os.Getpid(), rnd))
	if len(path) >= 108 {
		return "", transport.Errorf(transport.ErrInvalidArgument, "socket path %s is too long for a Unix socket (choose a shorter socket_dir)", path)
	}
	removeStaleSockets(t.h.SocketDir())
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return "", transport.Errorf(transport.ErrTransport, "cannot listen on %s: %v", path, err)
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
			t.h.Log().Warnf("accept: %v", err)
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

// serve answers a connection's requests, one after the other, until the
// receiver closes it or leaves it idle. Its buffer holds one reply with a
// segment inline.
func (t *Transport) serve(c *net.UnixConn) {
	c.SetDeadline(time.Now().Add(ioTimeout))
	if err := checkSameUser(c); err != nil {
		t.h.Log().Warnf("%v", err)
		c.Write(encodeReply(transport.ErrPermissionDenied, err.Error(), 0, 0))
		return
	}
	req := make([]byte, requestLen)
	var reply []byte // made at the first inline answer
	var w landing    // the connection's writes: its staging area
	defer w.close()
	hot := false // a small object was answered inline: the next request may follow at once
	for {
		if hot {
			// A thread waits for a prompt next request, which then
			// needs no hand-off from the poller (see WaitReadable). Not
			// after larger answers: while the receiver copies, the
			// runtime would hand this thread's processor to another
			// thread, which then competes with the copy for a core
			// (measured: 15% off 64 MiB gets on two cores).
			transport.WaitReadable(c, hotWait)
		}
		c.SetDeadline(time.Now().Add(idleTimeout))
		// One read takes a whole request, usually; the magic says how
		// long it is (a version-1 request is shorter).
		n, err := io.ReadAtLeast(c, req, 4)
		if err != nil {
			return
		}
		c.SetDeadline(time.Now().Add(ioTimeout))
		if string(req[:4]) == requestMagicV1 {
			if n > requestLenV1 {
				return // a version-1 receiver sends nothing more
			}
			if _, err := io.ReadFull(c, req[n:requestLenV1]); err == nil {
				c.Write(encodeReplyV1(transport.ErrUnsupported, "this segment server speaks protocol version 2, the receiver version 1: use one build of rdt on both sides"))
			}
			return
		}
		if string(req[:4]) == writeMagic {
			ok, small := t.land(c, req[:n], &w)
			if !ok {
				return
			}
			hot = small
			continue
		}
		if _, err := io.ReadFull(c, req[n:]); err != nil {
			return
		}
		ok, inline := t.answer(c, req, &reply)
		if !ok {
			return
		}
		hot = inline
	}
}

// answer replies to one request; ok false ends the connection (a request
// it cannot parse, or a failed write); inline says the object's bytes went
// with the reply. A segment no larger than both the receiver's limit and
// inlineMax goes inline: no descriptor to pass, map or close, which costs
// more than the copy for small objects (measured).
func (t *Transport) answer(c *net.UnixConn, req []byte, reply *[]byte) (ok, inline bool) {
	obj, limit, err := decodeRequest(req)
	if err != nil {
		c.Write(encodeReply(transport.StatusOf(err), err.Error(), 0, 0))
		return false, false
	}
	switch limit {
	case arenaRequest:
		return t.answerArena(c, obj), false
	case viewRequest:
		return t.answerView(c, obj), false
	}
	t.mu.RLock()
	s, ok := t.segs[obj]
	if ok && s.inArena() {
		// A receiver asks for an object of the arena only when the
		// arena's slot did not hold it: its metadata is not this object's.
		t.mu.RUnlock()
		_, err := c.Write(encodeReply(transport.ErrCorrupt, "object "+obj.String()+" is staged in the owner's arena, but not at the slot and tag the receiver's metadata names", 0, 0))
		return err == nil, false
	}
	if ok && s.size <= uint64(min(limit, inlineMax)) {
		if *reply == nil {
			*reply = make([]byte, replyLen+inlineMax)
		}
		// Read under the lock: GarbageCollect cannot close the
		// descriptor meanwhile. The lock is not held while writing, which
		// a receiver that does not read could stall.
		out := append((*reply)[:0], encodeReply(transport.OK, "", s.size, flagInline)...)
		out = out[:replyLen+int(s.size)]
		err = preadFull(s.fd, out[replyLen:], 0)
		t.mu.RUnlock()
		if err != nil {
			_, err := c.Write(encodeReply(transport.StatusOf(err), err.Error(), 0, 0))
			return err == nil, false
		}
		_, err = c.Write(out)
		return err == nil, true
	}
	fd := -1
	if ok {
		// A duplicate: GarbageCollect may close the original meanwhile.
		fd, err = unix.FcntlInt(uintptr(s.fd), unix.F_DUPFD_CLOEXEC, 0)
	}
	t.mu.RUnlock()
	if !ok {
		return refuse(c, notStaged(obj)), false
	}
	if err != nil {
		return refuse(c, handOutError("the segment", err)), false
	}
	return sendFD(c, fd, s.size), false
}

// notStaged is the answer for an object the segment server does not hold.
func notStaged(obj transport.ObjectID) error {
	return transport.Errorf(transport.ErrNotFound, "object %s is not staged here (freed, or never put over shm)", obj)
}

// handOutError is why a descriptor of what could not be made for a
// receiver: the owner out of descriptors or memory, or the call's error.
func handOutError(what string, err error) error {
	if exhausted := outOfResources("handing out "+what, "the owner", err); exhausted != nil {
		return exhausted
	}
	return transport.Errorf(transport.ErrTransport, "handing out %s: %v", what, err)
}

// refuse answers a request with why it failed; false: the answer could
// not be written.
func refuse(c *net.UnixConn, why error) bool {
	_, err := c.Write(encodeReply(transport.StatusOf(why), why.Error(), 0, 0))
	return err == nil
}

// sendFD answers a request with fd (size bytes) attached, and closes it.
func sendFD(c *net.UnixConn, fd int, size uint64) bool {
	defer unix.Close(fd)
	_, _, err := c.WriteMsgUnix(encodeReply(transport.OK, "", size, 0), unix.UnixRights(fd), nil)
	return err == nil
}

// answerArena hands a receiver a descriptor of the arena id.
func (t *Transport) answerArena(c *net.UnixConn, id transport.ObjectID) bool {
	t.mu.RLock()
	a := t.arena
	if a == nil || a.id != id {
		t.mu.RUnlock()
		_, err := c.Write(encodeReply(transport.ErrNotFound, "the owner has no arena "+id.String(), 0, 0))
		return err == nil
	}
	fd, err := a.receiverFD()
	size := uint64(len(a.mem))
	t.mu.RUnlock()
	if err != nil {
		return refuse(c, handOutError("the arena", err))
	}
	return sendFD(c, fd, size)
}

// preadFull reads len(b) bytes of fd at off.
func preadFull(fd int, b []byte, off int64) error {
	for done := 0; done < len(b); {
		n, err := unix.Pread(fd, b[done:], off+int64(done))
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
		return transport.Errorf(transport.ErrPermissionDenied, "cannot identify the peer: %v", cerr)
	}
	if int(cred.Uid) != os.Getuid() {
		return transport.Errorf(transport.ErrPermissionDenied, "refused a segment request from uid %d (pid %d): only uid %d may map this runtime's memory", cred.Uid, cred.Pid, os.Getuid())
	}
	return nil
}

// randReader reads the kernel's random bytes.
type randReader struct{}

func (randReader) Read(b []byte) (int, error) { return unix.Getrandom(b, 0) }
