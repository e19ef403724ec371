package engine

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
)

// readable polls fd for up to timeout and reports whether it is readable.
func readable(t *testing.T, fd int, timeout time.Duration) bool {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(timeout.Milliseconds()))
		if err == unix.EINTR {
			continue
		}
		require.NoError(t, err)
		return n == 1 && fds[0].Revents&unix.POLLIN != 0
	}
}

// isEventFD reports whether fd is an open eventfd (the number may have been
// reused for something else since it was closed).
func isEventFD(fd int) bool {
	link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	return err == nil && link == "anon_inode:[eventfd]"
}

func TestFetchEventFDBecomesReadableAtCompletion(t *testing.T) {
	p, gate := gatedPair(t, nil)
	refs, targets, src, dst := p.shareToFetch(t, 2, 4096)
	f := p.startFetch(t, refs, targets, FetchOptions{})
	fd, err := f.EventFD()
	require.NoError(t, err)
	require.True(t, isEventFD(fd))
	again, err := f.EventFD()
	require.NoError(t, err)
	assert.Equal(t, fd, again, "one eventfd per fetch")
	assert.False(t, readable(t, fd, 50*time.Millisecond), "readable before the transfers finished")
	close(gate)
	require.True(t, readable(t, fd, 5*time.Second), "not readable after completion")
	require.NoError(t, f.Wait(0), "readable means Wait(0) has the result")
	assert.True(t, readable(t, fd, 0), "it stays readable")
	assertLanded(t, src, dst)
	f.Free()
	assert.False(t, isEventFD(fd), "Free closes the eventfd")
	_, err = f.EventFD()
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "no eventfd for a freed fetch")
}

func TestFetchEventFDAfterCompletionAndAbort(t *testing.T) {
	p, _ := gatedPair(t, nil)
	refs, targets, _, _ := p.shareToFetch(t, 1, 4096)
	f := p.startFetch(t, refs, targets, FetchOptions{})
	eventually(t, func() bool { return p.dst.fetched.Load() == 1 }, "the transfer started")
	f.Abort()
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(f.Wait(5*time.Second)))
	// Asked for only after the fetch ended: readable at once.
	fd, err := f.EventFD()
	require.NoError(t, err)
	assert.True(t, readable(t, fd, 0))
	f.Free()
	assert.False(t, isEventFD(fd))
}
