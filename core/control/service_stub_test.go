package control

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

// stubService stands in for a runtime's answers to its peers, so that the
// control plane can be tested without the engine: it knows the objects put
// in it, counts each peer's borrows of them (returning more than a peer
// holds changes nothing, as a runtime refuses it), grants leases, and drops
// a peer's borrows when the control plane reports it gone.
type stubService struct {
	key ed25519.PrivateKey

	mu        sync.Mutex
	info      transport.PeerInfo
	objects   map[transport.ObjectID]bool
	borrows   map[transport.RuntimeID]map[transport.ObjectID]uint64
	nextToken uint64
	gone      int
	// writes admitted, and the outcome each WriteDone reported, by
	// transfer id
	writes     map[uint64]WriteOpen
	writesDone map[uint64]transport.Status
	writeEnds  []WriteEnd // every WriteDone of an admitted write, in order
	runs       []WriteEnd // every WriteRun, in order (Tag: the run's)
	// every WriteRun and WriteDone of an admitted write, in the order they
	// came: "run TAG", "done TAG"
	writeOrder []string
	// withdrawn admissions this runtime was told of, by transfer id
	withdrawn map[uint64]error
	// slowMeta, when set, holds every metadata request for the transport
	// "slowmeta" until it is closed.
	slowMeta chan struct{}
	// slowOpen, when set, holds every write admission until it is closed.
	slowOpen chan struct{}
}

// stubHost is the host identity of every stub: they share this process,
// so the pid a peer claims on a Unix socket is checked as a runtime's is.
const stubHost = "stub-host"

// stubConfig is a stub service named name and the configuration that
// makes it reachable over sockets in a fresh private directory; opts
// adjust the configuration before it is used.
func stubConfig(t *testing.T, name string, opts ...func(*ListenConfig)) (*stubService, ListenConfig) {
	key, id := NewIdentityKey()
	svc := &stubService{
		key:        key,
		info:       transport.PeerInfo{RuntimeID: id, Name: name, HostID: stubHost, Pid: os.Getpid()},
		objects:    map[transport.ObjectID]bool{},
		borrows:    map[transport.RuntimeID]map[transport.ObjectID]uint64{},
		writes:     map[uint64]WriteOpen{},
		writesDone: map[uint64]transport.Status{},
		withdrawn:  map[uint64]error{},
	}
	cfg := ListenConfig{
		Service: svc, Log: transport.NewLogger(name, transport.LogOff), SocketDir: t.TempDir(),
		Secret: transport.RandomID().String() + transport.RandomID().String(), Key: key,
	}
	for _, f := range opts {
		f(&cfg)
	}
	return svc, cfg
}

// listenStub makes a stub service reachable over sockets until the test
// ends.
func listenStub(t *testing.T, name string, opts ...func(*ListenConfig)) (*stubService, Endpoint) {
	t.Helper()
	svc, cfg := stubConfig(t, name, opts...)
	ep, err := Sockets{}.Listen(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { ep.Close() })
	svc.mu.Lock()
	svc.info.Address = ep.Address()
	svc.mu.Unlock()
	return svc, ep
}

// twoStubs is an owner holding an object, and another runtime.
type twoStubs struct {
	owner, other     *stubService
	ownerEP, otherEP Endpoint
	obj              transport.ObjectID
}

func newTwoStubs(t *testing.T, other string) twoStubs {
	var s twoStubs
	s.owner, s.ownerEP = listenStub(t, "owner")
	s.other, s.otherEP = listenStub(t, other)
	s.obj = s.owner.put()
	return s
}

// connect is the other runtime's connection to the owner.
func (s twoStubs) connect(t *testing.T) Peer {
	peer, err := connectTo(s.otherEP, s.ownerEP.Address())
	require.NoError(t, err)
	return peer
}

// borrow has the other runtime borrow the object, and returns its
// connection to the owner.
func (s twoStubs) borrow(t *testing.T) Peer {
	peer, err := borrowAt(s.otherEP, s.ownerEP.Address(), s.obj)
	require.NoError(t, err)
	return peer
}

// put adds an object peers may borrow, lease and ask metadata of.
func (s *stubService) put() transport.ObjectID {
	id := transport.RandomID()
	s.mu.Lock()
	s.objects[id] = true
	s.mu.Unlock()
	return id
}

// Borrows counts the borrows every peer holds.
func (s *stubService) Borrows() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n uint64
	for _, objs := range s.borrows {
		for _, c := range objs {
			n += c
		}
	}
	return n
}

// Gone counts the peers the control plane reported gone.
func (s *stubService) Gone() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gone
}

func (s *stubService) Identity() transport.PeerInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info
}

func (s *stubService) known(obj transport.ObjectID) error {
	if !s.objects[obj] {
		return transport.Errorf(transport.ErrNotFound, "object %s not found", obj)
	}
	return nil
}

// panicToken, as a borrow's token, makes the stub's Borrow panic; the
// transport name "panics" its Metadata: how a test finds out what a panic
// in a runtime's answer does to the control plane.
const panicToken = 0xdead

func (s *stubService) Borrow(from transport.PeerInfo, obj transport.ObjectID, token uint64) error {
	if token == panicToken {
		panic("the stub's Borrow panicked")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.known(obj); err != nil {
		return err
	}
	if s.borrows[from.RuntimeID] == nil {
		s.borrows[from.RuntimeID] = map[transport.ObjectID]uint64{}
	}
	s.borrows[from.RuntimeID][obj]++
	return nil
}

func (s *stubService) Unborrow(from transport.RuntimeID, obj transport.ObjectID, n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if held := s.borrows[from][obj]; held >= n {
		s.borrows[from][obj] = held - n
	}
}

func (s *stubService) Lease(from transport.RuntimeID, obj transport.ObjectID) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.known(obj); err != nil {
		return 0, err
	}
	s.nextToken++
	return s.nextToken, nil
}

func (s *stubService) Metadata(from transport.RuntimeID, obj transport.ObjectID, transportName string) ([]byte, error) {
	s.mu.Lock()
	err := s.known(obj)
	slow := s.slowMeta
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if transportName == "slowmeta" && slow != nil {
		<-slow
	}
	if transportName == "panics" {
		panic("the stub's Metadata panicked")
	}
	return []byte(transportName), nil
}

func (s *stubService) Send(ctx context.Context, from transport.PeerInfo, req SendRequest) error {
	return transport.Errorf(transport.ErrUnsupported, "the stub sends nothing")
}

func (s *stubService) JoinGroup(ctx context.Context, from transport.PeerInfo, req GroupJoin) ([]byte, error) {
	return nil, transport.Errorf(transport.ErrNotFound, "the stub has no groups")
}

// stubWriteKey is the only key the stub admits writes with.
var stubWriteKey = [16]byte{'s', 't', 'u', 'b'}

func (s *stubService) OpenWrite(from transport.PeerInfo, req WriteOpen) (Admission, error) {
	s.mu.Lock()
	slow := s.slowOpen
	s.mu.Unlock()
	if slow != nil {
		<-slow
	}
	if err := s.known(req.Object); err != nil {
		return Admission{}, err
	}
	if req.Key != stubWriteKey {
		return Admission{}, transport.Errorf(transport.ErrPermissionDenied, "wrong write key")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes[req.TransferID] = req
	adm := Admission{Meta: []byte("meta of " + req.Transport)}
	if req.Standing {
		adm.Runs = 7
	}
	return adm, nil
}

func (s *stubService) WriteDone(from transport.RuntimeID, end WriteEnd) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.writes[end.TransferID]; ok {
		s.writesDone[end.TransferID] = transport.StatusOf(end.Err)
		s.writeEnds = append(s.writeEnds, end)
		s.writeOrder = append(s.writeOrder, fmt.Sprintf("done %d", end.Tag))
	}
}

func (s *stubService) WriteRun(from transport.RuntimeID, obj transport.ObjectID, transferID, tag uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs = append(s.runs, WriteEnd{Object: obj, TransferID: transferID, Tag: tag})
	if _, ok := s.writes[transferID]; ok {
		s.writeOrder = append(s.writeOrder, fmt.Sprintf("run %d", tag))
	}
}

func (s *stubService) WriteWithdrawn(from transport.RuntimeID, obj transport.ObjectID, transferID uint64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.withdrawn[transferID] = err
}

func (s *stubService) PeerGone(peer transport.PeerInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gone++
	delete(s.borrows, peer.RuntimeID)
}

func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, time.Millisecond, msg)
}

// eventually waits until cond holds, checked under the stub's lock.
func (s *stubService) eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return cond()
	}, msg)
}

// connectTo is ep's connection to the runtime at address, within a few
// seconds.
func connectTo(ep Endpoint, address string) (Peer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return ep.Connect(ctx, address)
}

// borrowAt connects ep to the runtime at address and borrows obj there,
// as a runtime deserializing a ref owned there does.
func borrowAt(ep Endpoint, address string, obj transport.ObjectID) (Peer, error) {
	peer, err := connectTo(ep, address)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return peer, peer.Borrow(ctx, obj, 0)
}

// endpoints are the Unix socket path and TCP host:port of an endpoint's
// address, and the key its TCP part carries.
func endpoints(t *testing.T, ep Endpoint) (unixPath, tcpHostPort, key string) {
	for _, part := range strings.Split(ep.Address(), ",") {
		switch {
		case strings.HasPrefix(part, UnixScheme):
			unixPath = strings.TrimPrefix(part, UnixScheme)
		case strings.HasPrefix(part, TCPScheme):
			key, tcpHostPort = transport.SplitTCPKey(strings.TrimPrefix(part, TCPScheme))
		}
	}
	require.NotEmpty(t, unixPath)
	return
}

// rawConn speaks the handshake by hand, as a hostile or broken peer would
// after it, so tests can send anything.
func rawConn(t *testing.T, ep Endpoint) (net.Conn, *bufio.Reader) {
	path, _, _ := endpoints(t, ep)
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	rd, err := rawHandshake(c, newRawPeer(), "")
	require.NoError(t, err)
	return c, rd
}

// ask sends request m on a raw connection and reads its answer, the next
// frame.
func ask(t *testing.T, c net.Conn, rd *bufio.Reader, m *Message) *Message {
	t.Helper()
	_, err := c.Write(m.Encode())
	require.NoError(t, err)
	resp, err := Expect(rd, KindResponse)
	require.NoError(t, err, "%s is answered", m.Kind)
	require.Equal(t, m.ID, resp.ID)
	return resp
}

// rawPeer is an identity a test speaks for by hand: a key and what it
// claims in its handshake (by default, what it can prove).
type rawPeer struct {
	key  ed25519.PrivateKey
	info transport.PeerInfo
}

func newRawPeer() *rawPeer {
	key, id := NewIdentityKey()
	return &rawPeer{key: key, info: transport.PeerInfo{RuntimeID: id, Name: "raw", Address: "unix:///nonexistent", Pid: os.Getpid()}}
}

// rawHandshake is the client side of the handshake, proving token and
// signing with p's key whatever p claims; it returns the reader positioned
// after the welcome, or the refusal.
func rawHandshake(c net.Conn, p *rawPeer, token string) (*bufio.Reader, error) {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	nonce := transport.NewNonce()
	if _, err := c.Write((&Message{Kind: KindHello, Nonce: nonce}).Encode()); err != nil {
		return nil, err
	}
	rd := bufio.NewReader(c)
	ch, err := Expect(rd, KindChallenge)
	if err != nil {
		return nil, err
	}
	auth := &Message{Kind: KindAuth, Proof: transport.AuthProof(token, ProofClient, ch.Nonce), Peer: p.info,
		Key: p.key.Public().(ed25519.PublicKey), Sig: ed25519.Sign(p.key, IdentityTranscript(SignClient, nonce, ch.Nonce, ch.Key))}
	if _, err := c.Write(auth.Encode()); err != nil {
		return nil, err
	}
	if _, err := Expect(rd, KindWelcome); err != nil {
		return nil, err
	}
	return rd, nil
}

// numConns counts ep's open connections, to every peer.
func (ep *sockEndpoint) numConns() int {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return len(ep.conns)
}
