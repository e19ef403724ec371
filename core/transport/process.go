package transport

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// ProcessAlive reports whether process pid (of this host) still runs. A
// process that has exited but that its parent has not yet waited for (a
// zombie) still answers kill(pid, 0), but its memory is gone: /proc says
// which it is. A pid reused since by another process reads as alive.
func ProcessAlive(pid int) bool {
	if errors.Is(unix.Kill(pid, 0), unix.ESRCH) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist) // reaped since; or no /proc to ask
	}
	// "pid (comm) state ...": comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return true
	}
	state := b[i+2]
	return state != 'Z' && state != 'X'
}

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
