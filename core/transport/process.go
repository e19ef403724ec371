package transport

import (
	"os"

	"golang.org/x/sys/unix"
)

// ProcessExited reports, without blocking, whether the process a pidfd
// (from pidfd_open) names has exited: the pidfd is then readable. A nil
// pidfd (a kernel without pidfds) reports false. A pidfd closed while this
// runs reports true.
func ProcessExited(pidfd *os.File) bool {
	if pidfd == nil {
		return false
	}
	rc, err := pidfd.SyscallConn()
	if err != nil {
		return true
	}
	gone := true
	err = rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			n, err := unix.Poll(fds, 0)
			if err == unix.EINTR {
				continue
			}
			gone = err != nil || n > 0
			return
		}
	})
	return err != nil || gone
}
