package transport

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// WaitReadable blocks the calling thread in poll(2) until c has bytes to
// read, is shut down or closed by its peer, or wait passes (millisecond
// granularity); it reports whether c is ready to read.
//
// Why a thread waits here rather than on the runtime's poller: a goroutine
// parked on the poller is woken by the poller's thread and handed back to
// a thread that can run it. For a small request and answer that hand-off
// costs more than the exchange itself, most of all on a cgo caller's
// thread, to which the goroutine is locked. Use it only for waits expected
// to be short. CloseWaking wakes a waiter early.
func WaitReadable(c syscall.Conn, wait time.Duration) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	ready := false
	rc.Control(func(fd uintptr) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		ms := int((wait + time.Millisecond - 1) / time.Millisecond)
		for {
			n, err := unix.Poll(pfd, ms)
			if err == unix.EINTR {
				continue
			}
			ready = err == nil && n > 0
			return
		}
	})
	return ready
}

// CloseWaking closes c after shutting down its reading side, which wakes
// a thread of this process blocked in WaitReadable on it (Close alone
// would wait for that thread's poll to end).
func CloseWaking(c net.Conn) error {
	if r, ok := c.(interface{ CloseRead() error }); ok {
		r.CloseRead()
	}
	return c.Close()
}
