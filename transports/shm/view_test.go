package shm

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// viewOf maps the object meta names from src (a transport of this process).
func viewOf(t *testing.T, dst *Transport, meta []byte, private bool) (transport.Mapping, error) {
	return dst.View(transferOf(t, meta), meta, private, time.Now().Add(10*time.Second))
}

// viewed is the bytes of tensor i of a mapping.
func viewed(m transport.Mapping, i, n int) []byte {
	return transport.Bytes(m.Data()[i], uint64(n))
}

// protection is the permissions /proc/self/maps gives the mapping holding
// addr ("r--s", say).
func protection(t *testing.T, addr uintptr) string {
	f, err := os.Open("/proc/self/maps")
	require.NoError(t, err)
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		var lo, hi uintptr
		var perms string
		if _, err := fmt.Sscanf(s.Text(), "%x-%x %s", &lo, &hi, &perms); err == nil && lo <= addr && addr < hi {
			return perms
		}
	}
	t.Fatalf("no mapping holds %#x", addr)
	return ""
}

// A view maps the staged bytes, read-only and shared, in both places an
// object is staged: a segment of its own and the arena (a small object).
// Its bytes stay what was put after the object is freed, the arena's range
// reused and the source's transport closed.
func TestViewMapsTheStagedBytesReadOnly(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sizes []int
	}{{"arena", []int{100, 0, 4096}}, {"segment", []int{5 << 20, 3}}} {
		t.Run(tc.name, func(t *testing.T) {
			src, dst := newTransport(t), newTransport(t)
			meta, want := stageObject(t, src, 7, tc.sizes...)
			m, err := viewOf(t, dst, meta, false)
			require.NoError(t, err)
			defer m.Close()
			require.Len(t, m.Data(), len(tc.sizes))
			for i, n := range tc.sizes {
				assert.Equal(t, want[i], viewed(m, i, n), "tensor %d", i)
			}
			assert.Equal(t, "r--s", protection(t, m.Data()[0]), "a view is mapped shared and read-only")
			src.GarbageCollect(transport.ObjectID{7}, nil, meta)
			// The freed object's arena range goes to the next object.
			stageObject(t, src, 8, tc.sizes...)
			require.NoError(t, src.Close())
			for i, n := range tc.sizes {
				assert.Equal(t, want[i], viewed(m, i, n), "tensor %d after the object was freed", i)
			}
			_, err = viewOf(t, dst, meta, false)
			require.Error(t, err, "a freed object is not handed out")
		})
	}
}

// A private view is copy-on-write: its writes stay in it, and shared
// views, earlier or later, see the put's bytes.
func TestViewsShareOneCopyAndPrivateWritesStayPrivate(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	const n = 8 << 20
	meta, want := stageObject(t, src, 9, n)
	a, err := viewOf(t, dst, meta, false)
	require.NoError(t, err)
	defer a.Close()
	b, err := viewOf(t, dst, meta, true)
	require.NoError(t, err)
	defer b.Close()
	assert.Equal(t, "rw-p", protection(t, b.Data()[0]))
	pb := viewed(b, 0, n)
	pb[0], pb[n-1] = ^want[0][0], ^want[0][n-1]
	assert.Equal(t, want[0], viewed(a, 0, n), "the shared view does not see the private view's writes")
	c, err := viewOf(t, dst, meta, false)
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, want[0], viewed(c, 0, n), "nor does a later view")
	assert.Equal(t, ^want[0][0], pb[0])
}

// A segment server that hands out a descriptor without the seals is
// refused before anything is mapped; so is a view of part of an object.
func TestViewRefusesUnsealedSegmentsAndPieces(t *testing.T) {
	src, dst := newSegmentTransport(t), newTransport(t)
	meta, _ := stageObject(t, src, 10, 1<<20)
	// Replace the sealed segment by an unsealed memfd of the same size.
	fd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.Ftruncate(fd, 1<<20))
	src.srv.mu.Lock()
	s := src.srv.segs[transport.ObjectID{10}]
	sealed := s.fd
	s.fd = fd
	src.srv.mu.Unlock()
	_, err = viewOf(t, dst, meta, false)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	src.srv.mu.Lock()
	s.fd = sealed
	src.srv.mu.Unlock()
	unix.Close(fd)

	x := transferOf(t, meta)
	x.Pieces = []transport.Piece{{Tensor: 0, Offset: 0, Length: 10}}
	_, err = dst.View(x, meta, false, time.Time{})
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)

	m, err := viewOf(t, dst, meta, false)
	require.NoError(t, err, "the sealed segment back, a view works")
	require.NoError(t, m.Close())
}

// A view whose owner does not answer ends at its deadline.
func TestViewEndsAtItsDeadline(t *testing.T) {
	src, dst := newSegmentTransport(t), newTransport(t)
	meta, _ := stageObject(t, src, 11, 4096)
	// Hold the segment server's lock: the server cannot answer.
	src.srv.mu.Lock()
	start := time.Now()
	_, err := dst.View(transferOf(t, meta), meta, false, time.Now().Add(200*time.Millisecond))
	src.srv.mu.Unlock()
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.True(t, strings.Contains(err.Error(), "deadline"), "%v", err)
}
