package tcp

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Fetches that end early: aborted, or from a source that is silent, closed,
// dead, unreachable or no rdt endpoint at all.

func TestAbortStopsALargeTransfer(t *testing.T) {
	p := newPair(t, "", "")
	const n = 512 << 20
	meta, _ := p.put(t, 12, n)
	_, x := transporttest.Buffer(t, n)
	req, err := p.dst.Fetch(&transport.Transfer{}, []transport.Tensor{x}, meta, nil)
	require.NoError(t, err)
	time.Sleep(5 * time.Millisecond)
	start := time.Now()
	p.dst.Abort(&transport.Transfer{}, req)
	err = req.Wait()
	req.Release()
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "%v", err)
	assert.Less(t, time.Since(start), 5*time.Second)
	// The source is fine afterwards.
	meta2, want := p.put(t, 13, 4096)
	got, err := p.fetch(t, meta2, 4096)
	require.NoError(t, err)
	assert.Equal(t, want[0], got[0])
	require.Eventually(t, func() bool { return p.host.Pinned() == 0 }, 5*time.Second, time.Millisecond)
}

// fakeSource is a data endpoint that authenticates with token and then
// hands every connection to serve.
func fakeSource(t *testing.T, token string, serve func(c net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				nonce := transport.NewNonce()
				c.Write(append(append([]byte(helloMagic), protoVersion), nonce...))
				answer := make([]byte, clientLen)
				if _, err := io.ReadFull(c, answer); err != nil || !transport.CheckAuthProof(token, authPurpose, nonce, answer[:proofLen]) {
					return
				}
				c.Write(encodeResponse(nil, 0, transport.OK, ""))
				serve(c)
			}()
		}
	}()
	return ln.Addr().String()
}

func fakeMeta(ep string, tensors uint32) []byte {
	return (&metadata{Endpoint: ep, Object: transport.ObjectID{0xfa}, Tensors: tensors}).encode()
}

// silent reads requests and never answers.
func silent(c net.Conn) { io.Copy(io.Discard, c) }

func TestAbortWhileTheSourceIsSilent(t *testing.T) {
	ep := fakeSource(t, "", silent)
	d, err := New(newHost(""))
	require.NoError(t, err)
	defer d.Close()
	dst := d.(*Transport)
	_, small := transporttest.Buffer(t, 4096)
	_, large := transporttest.Buffer(t, 16<<20)

	// A dialled stream and parallel streams, blocked in reads.
	req, err := dst.Fetch(&transport.Transfer{}, []transport.Tensor{small, large}, fakeMeta(ep, 2), nil)
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	assert.False(t, req.(transport.CompletedRequest).Completed())
	start := time.Now()
	dst.Abort(&transport.Transfer{}, req)
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(wait(req)))
	assert.Less(t, time.Since(start), 2*time.Second)

	// An inline stream, blocked in Wait, and one blocked in Completed's
	// ppoll: both are woken by Abort.
	for _, inCompleted := range []bool{false, true} {
		k := poolKey{endpoint: ep}
		c, err := dst.cl.conn(context.Background(), k)
		require.NoError(t, err)
		dst.cl.pool.Put(k, c)
		req, err = dst.Fetch(&transport.Transfer{}, []transport.Tensor{small}, fakeMeta(ep, 1), nil)
		require.NoError(t, err)
		require.NotNil(t, req.(*fetchRequest).inline)
		old := inlineBudget
		inlineBudget = time.Minute
		go func(req transport.Request) {
			time.Sleep(50 * time.Millisecond)
			dst.Abort(&transport.Transfer{}, req)
		}(req)
		start = time.Now()
		if inCompleted {
			// Abort wakes the ppoll; the request is then over.
			assert.True(t, req.(transport.CompletedRequest).Completed())
			assert.Less(t, time.Since(start), 5*time.Second)
		}
		err = req.Wait()
		inlineBudget = old
		req.Release()
		assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "%v", err)
		assert.Less(t, time.Since(start), 5*time.Second)
	}
}

func TestAbortDuringTheHandshake(t *testing.T) {
	// A source that accepts and never says hello.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	d, err := New(newHost(""))
	require.NoError(t, err)
	defer d.Close()
	_, x := transporttest.Buffer(t, 10)
	req, err := d.Fetch(&transport.Transfer{}, []transport.Tensor{x}, fakeMeta(ln.Addr().String(), 1), nil)
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	d.Abort(&transport.Transfer{}, req)
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(wait(req)))
	assert.Less(t, time.Since(start), authTimeout/2)
}

func TestCloseStopsFetchesInFlight(t *testing.T) {
	ep := fakeSource(t, "", silent)
	d, err := New(newHost(""))
	require.NoError(t, err)
	_, x := transporttest.Buffer(t, 16<<20)
	req, err := d.Fetch(&transport.Transfer{}, []transport.Tensor{x}, fakeMeta(ep, 1), nil)
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, d.Close())
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(wait(req)))
	_, err = d.Fetch(&transport.Transfer{}, []transport.Tensor{x}, fakeMeta(ep, 1), nil)
	assert.Equal(t, transport.ErrClosed, transport.StatusOf(err))
}

func TestSourceClosedIsPeerUnavailable(t *testing.T) {
	p := newPair(t, "", "")
	meta, _ := p.put(t, 14, 64, 9<<20)
	_, err := p.fetch(t, meta, 64, 9<<20) // leaves pooled connections behind
	require.NoError(t, err)
	p.src.Close()
	for round := 0; round < 2; round++ { // stale pooled connections, then dials
		_, err = p.fetch(t, meta, 64, 9<<20)
		assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
		assert.Contains(t, err.Error(), p.src.srv.endpoint)
	}
}

func TestSourceDiesMidTransfer(t *testing.T) {
	// The source answers OK, sends half the bytes and goes away.
	ep := fakeSource(t, "", func(c net.Conn) {
		frame := make([]byte, requestLen)
		if _, err := io.ReadFull(c, frame); err != nil {
			return
		}
		req, _ := decodeRequest(frame)
		c.Write(encodeResponse(nil, req.Tag, transport.OK, ""))
		c.Write(make([]byte, req.Length/2))
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // a reset, as from a killed process
		}
	})
	d, err := New(newHost(""))
	require.NoError(t, err)
	defer d.Close()
	for _, n := range []int{4096, 16 << 20} {
		_, x := transporttest.Buffer(t, n)
		req, err := d.Fetch(&transport.Transfer{}, []transport.Tensor{x}, fakeMeta(ep, 1), nil)
		require.NoError(t, err)
		err = wait(req)
		assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
		assert.Contains(t, err.Error(), ep)
	}
}

func TestUnreachableSourceIsPeerUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ep := ln.Addr().String()
	ln.Close()
	d, err := New(newHost(""))
	require.NoError(t, err)
	defer d.Close()
	_, x := transporttest.Buffer(t, 10)
	req, err := d.Fetch(&transport.Transfer{}, []transport.Tensor{x}, fakeMeta(ep, 1), nil)
	require.NoError(t, err)
	err = wait(req)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err))
	assert.Contains(t, err.Error(), ep)
}

func TestNotAnRDTEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			c.Close()
		}
	}()
	_, err = RequestRange(context.Background(), "", fakeMeta(ln.Addr().String(), 1), 0, 0, 1)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
}

// A source that dies while we authenticate (it sent its hello, then closed
// without answering our proof) is gone, not a token mismatch: a server that
// refuses a token says so.
func TestPeerGoneDuringAuthenticationIsPeerUnavailable(t *testing.T) {
	tr, err := New(newHost("token"))
	require.NoError(t, err)
	defer tr.Close()
	client, server := net.Pipe()
	go func() {
		hello := append([]byte(helloMagic), protoVersion)
		hello = append(hello, make([]byte, nonceLen)...)
		server.Write(hello)
		io.ReadFull(server, make([]byte, clientLen)) // the proof and runtime id
		server.Close()
	}()
	err = tr.(*Transport).cl.authenticate(client, "a dying source", "token")
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "closed the connection during authentication")
}
