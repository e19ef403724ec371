package tcp

import (
	"bytes"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// A source that sends bytes nobody asked for must never make a later get
// return them as its data: the pool refuses a connection with anything
// unread (defence 1), and every answer must carry the tag of the request
// it answers (defence 2), which bytes written before the request was read
// cannot.

// fakeBytes is what the fake sources below serve for a request.
func fakeBytes(req request) []byte {
	b := make([]byte, req.Length)
	for i := range b {
		b[i] = byte(uint64(i)+req.Offset)*7 ^ byte(req.Tensor) ^ 0x5c
	}
	return b
}

// readRequest reads one request frame.
func readRequest(c net.Conn) (request, error) {
	frame := make([]byte, requestLen)
	if _, err := io.ReadFull(c, frame); err != nil {
		return request{}, err
	}
	return decodeRequest(frame)
}

// answerRequest answers req as an honest source would.
func answerRequest(c net.Conn, req request) error {
	_, err := c.Write(append(encodeResponse(nil, req.Tag, transport.OK, ""), fakeBytes(req)...))
	return err
}

// stale is an answer nobody asked for: a well-formed OK header with the
// tag of an earlier request (a duplicate, or one left over from an
// earlier answer) and n bytes that are not the object's.
func stale(tag uint64, n uint64) []byte {
	return append(encodeResponse(nil, tag, transport.OK, ""), bytes.Repeat([]byte{0xee}, int(n))...)
}

// answerAll answers every request on c honestly until the client hangs up.
func answerAll(c net.Conn) {
	for {
		req, err := readRequest(c)
		if err != nil || answerRequest(c, req) != nil {
			return
		}
	}
}

// getOne fetches one tensor of n bytes from the fake source at ep and
// returns what landed in the target.
func getOne(t *testing.T, d *Transport, ep string, n int) ([]byte, error) {
	got, x := transporttest.Buffer(t, n)
	req, err := d.Fetch(&transport.Transfer{}, []transport.Tensor{x}, fakeMeta(ep, 1), nil)
	require.NoError(t, err)
	return got, wait(req)
}

// head is the start of b, for messages.
func head(b []byte) []byte { return b[:min(len(b), 16)] }

// wantBytes is what a get of one tensor of n bytes must return.
func wantBytes(n int) []byte { return fakeBytes(request{Length: uint64(n)}) }

func (t *Transport) pooledTo(ep string) []net.Conn {
	return t.cl.pool.Idle(poolKey{endpoint: ep})
}

// inQueue is how many bytes wait in c's receive queue.
func inQueue(t *testing.T, c net.Conn) int {
	rc, err := c.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	var n int
	var ierr error
	require.NoError(t, rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }))
	require.NoError(t, ierr)
	return n
}

// hungUp reports whether the peer's end of stream has reached c.
func hungUp(t *testing.T, c net.Conn) bool {
	rc, err := c.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	var revents int16
	require.NoError(t, rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
		if n, err := unix.Poll(fds, 0); err == nil && n == 1 {
			revents = fds[0].Revents
		}
	}))
	return revents&(unix.POLLRDHUP|unix.POLLHUP) != 0
}

// answeredFirst is a fake source that answers every request in full,
// except that on its first connection, once it answered the first
// request, then(c, first) takes over. It counts the connections it
// accepted.
func answeredFirst(t *testing.T, then func(c net.Conn, first request)) (string, *atomic.Int32) {
	accepted := new(atomic.Int32)
	return fakeSource(t, "", func(c net.Conn) {
		if accepted.Add(1) > 1 {
			answerAll(c)
			return
		}
		first, err := readRequest(c)
		if err != nil || answerRequest(c, first) != nil {
			return
		}
		then(c, first)
	}), accepted
}

func newReceiver(t *testing.T) *Transport {
	d, err := New(newHost(""))
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d.(*Transport)
}

// (a) A source sends a stale copy of its answer right after the answer.
// Once those bytes sit in the pooled connection, the next get must not
// read them: it takes a fresh connection and gets the right bytes. When
// they come right behind the answer, a get may also fail with ErrCorrupt
// (the bytes came with the answer, or just after the pool's check), but
// never succeed with them.
func TestUnaskedBytesInAPooledConnection(t *testing.T) {
	const n = 4096
	want := wantBytes(n)

	t.Run("before the next get", func(t *testing.T) {
		pollute := make(chan struct{})
		polluted := make(chan struct{})
		ep, accepted := answeredFirst(t, func(c net.Conn, req request) {
			<-pollute // the answer was taken and the connection pooled
			c.Write(stale(req.Tag, req.Length))
			close(polluted)
			answerAll(c)
		})
		d := newReceiver(t)
		got, err := getOne(t, d, ep, n)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got))
		pool := d.pooledTo(ep)
		require.Len(t, pool, 1, "the connection went back to the pool")
		close(pollute)
		<-polluted
		require.Eventually(t, func() bool { return inQueue(t, pool[0]) == responseLen+n }, 10*time.Second, time.Millisecond,
			"the unasked bytes reached the pooled connection")

		got, err = getOne(t, d, ep, n)
		require.NoError(t, err, "a fresh connection serves the get")
		assert.True(t, bytes.Equal(want, got), "the get returned the source's bytes, not the unasked ones: % x...", head(got))
		assert.Equal(t, int32(2), accepted.Load(), "the polluted connection was dropped and a new one dialled")
		assert.NotContains(t, d.pooledTo(ep), pool[0], "the polluted connection is not pooled again")
		_, err = pool[0].Write([]byte{0})
		assert.Error(t, err, "the polluted connection was closed")
	})

	t.Run("immediately", func(t *testing.T) {
		ep := fakeSource(t, "", func(c net.Conn) {
			for {
				req, err := readRequest(c)
				if err != nil || answerRequest(c, req) != nil {
					return
				}
				c.Write(stale(req.Tag, req.Length)) // a second write, right behind
			}
		})
		neverWrongBytes(t, newReceiver(t), ep, want, 30)
	})
}

// neverWrongBytes makes gets gets of want's bytes from ep: each must
// return them or fail with ErrCorrupt, never succeed with other bytes.
func neverWrongBytes(t *testing.T, d *Transport, ep string, want []byte, gets int) {
	t.Helper()
	var ok, corrupt int
	for i := 0; i < gets; i++ {
		got, err := getOne(t, d, ep, len(want))
		switch transport.StatusOf(err) {
		case transport.OK:
			require.True(t, bytes.Equal(want, got), "get %d succeeded with bytes the source was not asked for: % x...", i, head(got))
			ok++
		case transport.ErrCorrupt:
			corrupt++
		default:
			t.Fatalf("get %d: %v", i, err)
		}
	}
	t.Logf("%d gets right, %d ErrCorrupt", ok, corrupt)
}

// (b) The unasked bytes come late: after the pool's check passed, while
// the next request is on its way. The tag binds the answer to the request:
// the stale header is ErrCorrupt, the connection is closed, not pooled, and
// the next get uses a fresh one.
func TestLateUnaskedBytesAreCorrupt(t *testing.T) {
	const n = 4096
	want := wantBytes(n)

	t.Run("during the next request", func(t *testing.T) {
		// Deterministic: the source holds the stale bytes back until the
		// next request has arrived, so the pool's check cannot see them.
		closed := make(chan struct{})
		ep, accepted := answeredFirst(t, func(c net.Conn, first request) {
			next, err := readRequest(c)
			if err != nil {
				return
			}
			c.Write(stale(first.Tag, next.Length))
			answerRequest(c, next)
			io.Copy(io.Discard, c)
			close(closed) // the receiver hung up
		})
		d := newReceiver(t)
		got, err := getOne(t, d, ep, n)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got))
		require.Len(t, d.pooledTo(ep), 1)

		got, err = getOne(t, d, ep, n)
		require.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "the stale answer was taken for data: %v", err)
		assert.Contains(t, err.Error(), "tag")
		// (The target of a failed get holds unspecified bytes: the header
		// and the bytes behind it come in one read.)
		assert.Empty(t, d.pooledTo(ep), "the connection was not pooled")
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("the connection that carried the stale answer was not closed")
		}
		got, err = getOne(t, d, ep, n)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(want, got), "% x...", head(got))
		assert.Equal(t, int32(2), accepted.Load())
	})

	t.Run("delayed", func(t *testing.T) {
		// The stale bytes follow each answer 30 ms later. Whether they
		// arrive before the next get's check (a fresh connection) or while
		// it waits for its answer (ErrCorrupt) depends on the machine; a
		// get never succeeds with them.
		ep := fakeSource(t, "", func(c net.Conn) {
			for {
				req, err := readRequest(c)
				if err != nil || answerRequest(c, req) != nil {
					return
				}
				time.Sleep(30 * time.Millisecond)
				if _, err := c.Write(stale(req.Tag, req.Length)); err != nil {
					return
				}
			}
		})
		neverWrongBytes(t, newReceiver(t), ep, want, 10)
	})
}

// An answer to a request further down the pipeline, or to none, in place
// of the one due is ErrCorrupt, through the diagnostic client too.
func TestAnswerWithTheWrongTagIsCorrupt(t *testing.T) {
	ep := fakeSource(t, "", func(c net.Conn) {
		req, err := readRequest(c)
		if err != nil {
			return
		}
		c.Write(append(encodeResponse(nil, req.Tag+1, transport.OK, ""), fakeBytes(req)...))
		io.Copy(io.Discard, c)
	})
	_, err := RequestRange(t.Context(), "", fakeMeta(ep, 1), 0, 0, 100)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
	d := newReceiver(t)
	_, err = getOne(t, d, ep, 100)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
	assert.Empty(t, d.pooledTo(ep))
}

// The pool hands out only connections with nothing unread: one with bytes
// waiting and one whose peer hung up are closed and skipped.
func TestPoolSkipsConnectionsWithSomethingUnread(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var clients, servers []net.Conn
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		s, err := ln.Accept()
		require.NoError(t, err)
		defer s.Close()
		clients, servers = append(clients, c), append(servers, s)
	}
	clean, junk, gone := clients[0], clients[1], clients[2]
	_, err = servers[1].Write([]byte("junk"))
	require.NoError(t, err)
	servers[2].Close()
	require.Eventually(t, func() bool { return inQueue(t, junk) == 4 && hungUp(t, gone) }, 10*time.Second, time.Millisecond)
	assert.Empty(t, unread(clean))
	assert.NotEmpty(t, unread(junk))
	assert.NotEmpty(t, unread(gone))

	d := newReceiver(t)
	k := poolKey{endpoint: "somewhere"}
	for _, c := range []net.Conn{clean, junk, gone} { // the last in goes out first
		d.cl.pool.Put(k, c)
	}
	assert.Equal(t, clean, d.cl.idleConn(k), "the two bad connections were skipped")
	assert.Nil(t, d.cl.idleConn(k))
	for _, c := range []net.Conn{junk, gone} {
		_, err := c.Write([]byte{0})
		assert.ErrorIs(t, err, net.ErrClosed, "a skipped connection is closed")
	}
	_, err = clean.Write([]byte{0})
	assert.NoError(t, err)
}
