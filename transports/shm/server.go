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

// The owner's segment server: it hands receivers the segments and the
// arena its runtime staged (source.go), a view's sealed segment (view.go),
// and lands writes through its lander (land.go). protocol.go has the
// messages.

// server is a runtime's side as the owner of objects: what it staged, by
// object, and the segment server that hands it out.
type server struct {
	h      transport.Host
	lander lander

	mu      sync.RWMutex // segs: readers serve, writers stage and free
	segs    map[transport.ObjectID]*segment
	ln      *net.UnixListener
	path    string
	serving sync.WaitGroup
	conns   map[*net.UnixConn]struct{} // served connections, closed by close
	closed  bool
	// arena stages small objects (made at the first); arenaBytes is its
	// size, 0 for none.
	arena      *arena
	arenaBytes uint64
}

func newServer(h transport.Host) *server {
	return &server{h: h, lander: lander{h: h}, segs: map[transport.ObjectID]*segment{}, conns: map[*net.UnixConn]struct{}{},
		arenaBytes: uint64(arenaSetting.In(h.Settings())) << 20}
}

// close stops serving and frees every segment.
func (srv *server) close() {
	srv.mu.Lock()
	srv.closed = true
	ln := srv.ln
	for id, s := range srv.segs {
		if !s.inArena() {
			unix.Close(s.fd)
		}
		if s.view >= 0 {
			unix.Close(s.view)
		}
		delete(srv.segs, id)
	}
	if srv.arena != nil {
		srv.arena.close() // receivers still mapping it read nothing more from it
		srv.arena = nil
	}
	for c := range srv.conns {
		transport.CloseWaking(c) // a served connection waiting for its next request
	}
	srv.mu.Unlock()
	if ln != nil {
		ln.Close() // also removes the socket file
	}
	srv.serving.Wait()
}

func (srv *server) listen() (string, error) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.closed {
		return "", transport.Errorf(transport.ErrClosed, "the transport is closed")
	}
	if srv.ln != nil {
		return srv.path, nil
	}
	var rnd [6]byte
	if _, err := io.ReadFull(randReader{}, rnd[:]); err != nil {
		return "", transport.Errorf(transport.ErrInternal, "%v", err)
	}
	path := filepath.Join(srv.h.SocketDir(), fmt.Sprintf("shm-%d-%x.sock", os.Getpid(), rnd))
	if len(path) >= 108 {
		return "", transport.Errorf(transport.ErrInvalidArgument, "socket path %s is too long for a Unix socket (choose a shorter socket_dir)", path)
	}
	removeStaleSockets(srv.h.SocketDir())
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return "", transport.Errorf(transport.ErrTransport, "cannot listen on %s: %v", path, err)
	}
	srv.ln, srv.path = ln, path
	srv.serving.Add(1)
	go srv.accept(ln)
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

func (srv *server) accept(ln *net.UnixListener) {
	defer srv.serving.Done()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			srv.h.Log().Warnf("accept: %v", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		srv.mu.Lock()
		if srv.closed {
			srv.mu.Unlock()
			c.Close()
			continue
		}
		srv.conns[c] = struct{}{}
		srv.serving.Add(1)
		srv.mu.Unlock()
		go func() {
			defer srv.serving.Done()
			srv.serve(c)
			srv.mu.Lock()
			delete(srv.conns, c)
			srv.mu.Unlock()
			c.Close()
		}()
	}
}

// serve answers a connection's requests, one after the other, until the
// receiver closes it or leaves it idle. Its buffer holds one reply with a
// segment inline.
func (srv *server) serve(c *net.UnixConn) {
	c.SetDeadline(time.Now().Add(ioTimeout))
	if err := checkSameUser(c); err != nil {
		srv.h.Log().Warnf("%v", err)
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
			ok, small := srv.lander.land(c, req[:n], &w)
			if !ok {
				return
			}
			hot = small
			continue
		}
		if _, err := io.ReadFull(c, req[n:]); err != nil {
			return
		}
		ok, inline := srv.answer(c, req, &reply)
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
func (srv *server) answer(c *net.UnixConn, req []byte, reply *[]byte) (ok, inline bool) {
	obj, limit, err := decodeRequest(req)
	if err != nil {
		c.Write(encodeReply(transport.StatusOf(err), err.Error(), 0, 0))
		return false, false
	}
	switch limit {
	case arenaRequest:
		return srv.answerArena(c, obj), false
	case viewRequest:
		return srv.answerView(c, obj), false
	}
	srv.mu.RLock()
	s, ok := srv.segs[obj]
	if ok && s.inArena() {
		// A receiver asks for an object of the arena only when the
		// arena's slot did not hold it: its metadata is not this object's.
		srv.mu.RUnlock()
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
		err = preadv(s.fd, [][]byte{out[replyLen:]}, 0, nil)
		srv.mu.RUnlock()
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
	srv.mu.RUnlock()
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
func (srv *server) answerArena(c *net.UnixConn, id transport.ObjectID) bool {
	srv.mu.RLock()
	a := srv.arena
	if a == nil || a.id != id {
		srv.mu.RUnlock()
		_, err := c.Write(encodeReply(transport.ErrNotFound, "the owner has no arena "+id.String(), 0, 0))
		return err == nil
	}
	fd, err := a.receiverFD()
	size := uint64(len(a.mem))
	srv.mu.RUnlock()
	if err != nil {
		return refuse(c, handOutError("the arena", err))
	}
	return sendFD(c, fd, size)
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
