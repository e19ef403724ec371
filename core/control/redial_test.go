package control

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

// listenBacklog listens on a Unix socket at path whose backlog holds one
// connection: the second connect while nobody accepts fails with EAGAIN.
func listenBacklog(t *testing.T, path string) net.Listener {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}))
	require.NoError(t, syscall.Listen(fd, 0))
	ln, err := net.FileListener(f)
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	return ln
}

// signalWriter closes seen once a line written to it contains want.
type signalWriter struct {
	want string
	seen chan struct{}
	once sync.Once
}

func (w *signalWriter) Write(p []byte) (int, error) {
	if strings.Contains(string(p), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

// A dial that fails for a reason that is gone a moment later (here a Unix
// socket's full backlog: EAGAIN) is made again, and the caller gets the
// connection within its deadline rather than the first failure.
func TestSocketsConnectTriesAFullBacklogAgain(t *testing.T) {
	owner, ownerEP := listenStub(t, "owner")
	ownerPath, _, _ := endpoints(t, ownerEP)
	tried := &signalWriter{want: "try 1 failed", seen: make(chan struct{})}
	_, client := listenStub(t, "client", func(cfg *ListenConfig) {
		cfg.Log = transport.NewLoggerTo("client", transport.LogDebug, tried)
	})

	// A socket in front of the owner's, its backlog full.
	path := filepath.Join(t.TempDir(), "front.sock")
	ln := listenBacklog(t, path)
	queued, err := net.Dial("unix", path)
	require.NoError(t, err)
	defer queued.Close()
	if _, err := net.Dial("unix", path); !errors.Is(err, syscall.EAGAIN) {
		t.Skipf("a second connect to a full backlog did not fail with EAGAIN here: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		peer Peer
		err  error
	}
	connected := make(chan result, 1)
	go func() {
		peer, err := client.Connect(ctx, UnixScheme+path)
		connected <- result{peer, err}
	}()
	select {
	case <-tried.seen:
	case r := <-connected:
		t.Fatalf("connect returned before it tried again: %v", r.err)
	}

	// Room in the backlog, and the socket forwards to the owner.
	c, err := ln.Accept()
	require.NoError(t, err)
	c.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			o, err := net.Dial("unix", ownerPath)
			if err != nil {
				c.Close()
				return
			}
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(o, c); o.Close() }()
			go func() { defer wg.Done(); io.Copy(c, o); c.Close() }()
		}
	}()

	r := <-connected
	require.NoError(t, r.err)
	assert.Equal(t, owner.Identity().RuntimeID, r.peer.Info().RuntimeID)
	client.Close() // ends the forwarded connection
}

// A dial that failed while nobody waited for it (a caller that waits in
// slices was between two) answers a caller that comes right after, rather
// than being dialed again; a caller that comes later dials anew.
func TestSocketsFailedDialAnswersTheNextCaller(t *testing.T) {
	_, client := listenStub(t, "client")
	ep := client.(*sockEndpoint)
	path := filepath.Join(t.TempDir(), "closing.sock")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close() // no handshake: the dial fails, and not transiently
		}
	}()
	address := UnixScheme + path

	gone, cancel := context.WithCancel(context.Background())
	cancel()
	client.Connect(gone, address) // returns at once; the dial goes on
	finished := func() bool {
		ep.mu.Lock()
		defer ep.mu.Unlock()
		d := ep.dialing[address]
		if d == nil {
			return false
		}
		select {
		case <-d.done:
			return true
		default:
			return false
		}
	}
	eventually(t, finished, "the dial nobody waits for fails")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = client.Connect(ctx, address)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "no runtime reachable at "+address)
	assert.EqualValues(t, 1, accepted.Load(), "the failed dial's answer, not a new dial")

	eventually(t, func() bool {
		ep.mu.Lock()
		defer ep.mu.Unlock()
		return ep.dialing[address] == nil
	}, "the failed dial is forgotten")
	_, err = client.Connect(ctx, address)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
	assert.EqualValues(t, 2, accepted.Load())
}
