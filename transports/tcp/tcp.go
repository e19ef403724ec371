// Package tcp moves host memory between any two hosts: the receiver pulls
// byte ranges of an object from the source's data listener, over several
// streams for large tensors, straight into its targets. The source serves
// only objects its runtime holds, by id and range, checked against their
// sizes; it never reads an address taken from the wire.
//
// The listener starts when an object first needs it (a put naming tcp, or
// a peer asking for an object's tcp metadata), not with the runtime. It
// requires the configured token, or without one a key derived from the
// runtime's random secret that reaches receivers only inside the metadata.
package tcp

import (
	"encoding/hex"
	"net"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/peerpool"
)

// Name is the canonical transport name.
const Name = "tcp"

const (
	// streamMin: tensors at least this large are pulled over several
	// connections at once; smaller ones share one connection.
	streamMin = 8 << 20
	// window is how many request frames a connection keeps in flight.
	// Frames are 60 bytes, so a full window (15 KiB) always fits the socket
	// buffers and the client's writes never wait on the server's: the
	// client writes its requests on the goroutine that reads the answers,
	// and the server answers on the one that reads the requests, so a
	// window past the buffers would deadlock both in their writes
	// (TestPipelinedRequestsWithTheSmallestSocketBuffers).
	window      = 256
	dialTimeout = 5 * time.Second
	authTimeout = 10 * time.Second
	maxIdle     = 16 // idle connections kept per source endpoint
	// maxServed bounds the authenticated connections the data port serves,
	// and maxServedPerPeer those of one client runtime (as the client names
	// itself: unproven, so maxServed is the bound that holds). A receiver
	// keeps up to maxIdle idle connections per source and opens up to
	// `streams` more for each fetch in flight, so one peer may run about 60
	// large fetches at once on 4 streams. Past a cap the connection idle
	// longest (of that peer, or of all) is closed to make room: a receiver
	// checks a pooled connection before reusing it, and dials anew. Only
	// when none is idle is the newcomer refused, with NO_MEMORY.
	maxServed        = 1024
	maxServedPerPeer = 256
	// A small pull on a pooled connection is finished on the caller's
	// goroutine when the engine asks whether it completed: a goroutine
	// hand-off costs more than the round trip. inlineMax bounds the bytes
	// read that way and inlineBudget the time spent waiting for them.
	inlineMax = 1 << 20
	// writeChunk is how much of an answer one write may carry: each chunk
	// gets its own deadline, so a receiver that stops reading is given up
	// on after the peer timeout while a slow one that keeps reading is not.
	writeChunk = 1 << 20
	// The source answers a run of pipelined requests for at most
	// smallAnswer bytes each with one writev: up to batchFrames of them,
	// and no more than about writeChunk under one deadline (a run is
	// closed once it holds batchBytes), so that many small tensors cost a
	// few system calls rather than one per tensor. A larger answer goes
	// alone, in writeChunk pieces.
	smallAnswer = 256 << 10
	batchFrames = 128
	batchBytes  = writeChunk - smallAnswer
	// keyPurpose labels the data key derived from the runtime's secret.
	keyPurpose = "rdt-tcp-data-key"
)

var (
	inlineBudget = time.Millisecond // a variable for tests on slow machines
	// idleTimeout closes pooled connections nobody used for this long: a
	// bound on descriptors held for live sources (PeerGone drops gone ones).
	idleTimeout = time.Minute
	// serveIdle closes a served connection that waited this long for a
	// request: longer than receivers pool one, so it ends only connections
	// nobody pools.
	serveIdle = 2 * idleTimeout
)

// Factory makes the transport for a new runtime.
func Factory() transport.TransportFactory {
	return transport.TransportFactory{Name: Name, New: New, Settings: Settings()}
}

// Transport is the tcp transport of one runtime, in its two roles: the
// server of its objects' bytes (srv: the data listener, which also lands
// writes into its exposed objects) and the client that pulls other
// runtimes' bytes and pushes its writes into theirs (cl: its pooled
// connections and the requests in flight).
type Transport struct {
	srv *server
	cl  *client
}

// server is the data listener and what it serves.
type server struct {
	h transport.Host
	// key is what clients of our data listener must prove; metaKey is
	// handed to receivers in the metadata ("" when a token is configured:
	// receivers then use their own).
	key, metaKey string
	writeTimeout time.Duration // a serving write, or a request's rest, that makes no progress this long fails

	mu       sync.Mutex
	ln       net.Listener // nil until an object needs it
	endpoint string
	serving  sync.WaitGroup
	sconns   map[net.Conn]*served // serving connections, those in their handshake included
	nserved  int                  // authenticated ones (maxServed)
	perPeer  map[transport.RuntimeID]int
	closed   bool                // under mu
	refused  *transport.FloodLog // wrong keys; made with the listener
}

// client is the side that fetches from and writes to other runtimes'
// data listeners.
type client struct {
	h       transport.Host
	streams int

	pool   *peerpool.Pool[poolKey, net.Conn] // pooled connections
	mu     sync.Mutex
	active map[*fetchRequest]struct{}
	closed bool
}

// New makes the transport; the data listener starts when an object first
// needs it.
func New(h transport.Host) (transport.Transport, error) {
	streams := streamsSetting.In(h.Settings()) // checked by the runtime
	if streams < 1 || streams > maxStreams {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "%d streams: want 1 to %d", streams, maxStreams)
	}
	srv := &server{h: h, sconns: map[net.Conn]*served{}, perPeer: map[transport.RuntimeID]int{}}
	srv.key = h.AuthToken()
	if srv.key == "" {
		// Without a token an HMAC would be keyed with nothing anyone
		// could not compute: require a key derived from the runtime's
		// secret (never the secret itself, which guards other ports).
		secret := h.RuntimeSecret()
		if secret == "" {
			secret = hex.EncodeToString(transport.NewNonce())
		}
		srv.key = hex.EncodeToString(transport.AuthProof(secret, keyPurpose, nil))
		srv.metaKey = srv.key
	}
	srv.writeTimeout = h.PeerTimeout()
	if srv.writeTimeout <= 0 {
		srv.writeTimeout = transport.DefaultPeerTimeout
	}
	cl := &client{h: h, streams: streams, pool: newPool(), active: map[*fetchRequest]struct{}{}}
	return &Transport{srv: srv, cl: cl}, nil
}

// Describe: tcp moves memory the CPU can address (pinned CUDA host memory
// included) to any host, the last automatic choice for host data; the
// source serves only objects it holds, so a freed one is noticed; it
// serves byte ranges, so a partial fetch asks for just its pieces.
// It writes into exposed objects, pushing the bytes to the owner's data
// port (write.go). Once the listener runs, the metadata costs nothing, so objects put
// without a transport carry it. Before, they do not: a runtime whose
// objects never travel over tcp never opens a TCP port, and a peer that
// wants tcp asks the owner for the metadata, which starts it.
func (t *Transport) Describe() transport.Descriptor {
	return transport.Descriptor{
		Name:                Name,
		Devices:             []transport.DeviceType{transport.DeviceCPU, transport.DeviceCUDAHost},
		OneSided:            true,
		CanAbort:            true,
		DetectsFreedObjects: true,
		Ranges:              true,
		EagerMetadata:       true,
		EagerWhile:          t.srv.listening,
		Writes:              true,
		Auto:                transport.AutoRank{Host: 30},
	}
}

// listening reports whether the listener runs.
func (srv *server) listening() bool {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return srv.ln != nil
}

// PeerGone closes what this transport keeps for a runtime that is gone:
// the connections it is served on (a write blocked on a receiver that
// vanished would hold its object until the write timeout) and the pooled
// connections to its data endpoint.
func (t *Transport) PeerGone(peer transport.PeerInfo) {
	if peer.RuntimeID.IsZero() {
		return
	}
	t.srv.dropPeer(peer.RuntimeID)
	t.cl.pool.DropPeer(peer.RuntimeID)
}

// Close stops serving, closes every connection and waits for the serving
// goroutines to end; fetches and writes still running stop.
func (t *Transport) Close() error {
	t.srv.close()
	t.cl.close()
	return nil
}

// dropPeer closes the connections served to a runtime that is gone.
func (srv *server) dropPeer(peer transport.RuntimeID) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for c, s := range srv.sconns {
		if s.peer == peer {
			c.Close() // serve's deferred cleanup removes it
		}
	}
}

// close stops serving, closes every served connection and waits for the
// serving goroutines to end.
func (srv *server) close() {
	srv.mu.Lock()
	srv.closed = true
	if srv.ln != nil {
		srv.ln.Close()
	}
	for c := range srv.sconns {
		c.Close()
	}
	refused := srv.refused
	srv.mu.Unlock()
	srv.serving.Wait()
	if refused != nil {
		refused.Close() // writes the count held at the end of a burst
	}
}

// close closes the pooled connections and aborts the requests in flight:
// they stop reading into their targets.
func (cl *client) close() {
	cl.mu.Lock()
	cl.closed = true
	active := cl.active
	cl.active = map[*fetchRequest]struct{}{}
	cl.mu.Unlock()
	cl.pool.Close()
	for r := range active {
		r.abort()
	}
}

func tune(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		// Fixed socket buffers (1, 4, 16 MiB) measured no better than the
		// kernel's autotuning, 4 MiB and more worse, so they are left alone.
	}
}
