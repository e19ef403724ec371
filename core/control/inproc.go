package control

import (
	"context"
	"strings"
	"sync"

	"github.com/rdt-project/rdt/core/transport"
)

// InProcess is the control plane between runtimes of one process: calls go
// straight to the peer runtime's PeerService. It is what several runtimes in
// one process (tests, or a host embedding several) use, and the reference
// behaviour the socket network must match.
type InProcess struct{}

const inprocScheme = "inproc://"

var inprocEndpoints = struct {
	sync.Mutex
	m map[string]*inprocEndpoint
}{m: map[string]*inprocEndpoint{}}

type inprocEndpoint struct {
	svc     PeerService
	id      transport.RuntimeID
	address string
	closed  chan struct{}

	mu     sync.Mutex
	isDown bool
	peers  map[transport.RuntimeID]*inprocEndpoint // connected either way
	cache  map[string]*inprocPeer
}

// Listen registers svc under "inproc://<runtime id>".
func (InProcess) Listen(cfg ListenConfig) (Endpoint, error) {
	svc := cfg.Service
	id := svc.Identity().RuntimeID
	ep := &inprocEndpoint{
		svc: svc, id: id, address: inprocScheme + id.String(),
		closed: make(chan struct{}),
		peers:  map[transport.RuntimeID]*inprocEndpoint{}, cache: map[string]*inprocPeer{},
	}
	inprocEndpoints.Lock()
	defer inprocEndpoints.Unlock()
	if _, dup := inprocEndpoints.m[ep.address]; dup {
		return nil, transport.Errorf(transport.ErrAlreadyExists, "runtime %s is already listening", id)
	}
	inprocEndpoints.m[ep.address] = ep
	return ep, nil
}

func (e *inprocEndpoint) Address() string { return e.address }

// PeersLost implements Endpoint: in-process peers only leave by closing.
func (e *inprocEndpoint) PeersLost() uint64 { return 0 }

func (e *inprocEndpoint) NumPeers() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.peers)
}

func (e *inprocEndpoint) Connect(ctx context.Context, address string) (Peer, error) {
	if !strings.HasPrefix(address, inprocScheme) {
		return nil, transport.Errorf(transport.ErrUnsupported, "address %q is not reachable from an in-process runtime", address)
	}
	e.mu.Lock()
	if e.isDown {
		e.mu.Unlock()
		return nil, transport.Errorf(transport.ErrClosed, "runtime is destroyed")
	}
	if p, ok := e.cache[address]; ok {
		e.mu.Unlock()
		return p, nil
	}
	e.mu.Unlock()

	inprocEndpoints.Lock()
	remote, ok := inprocEndpoints.m[address]
	inprocEndpoints.Unlock()
	if !ok {
		return nil, transport.Errorf(transport.ErrPeerUnavailable, "no runtime at %s (destroyed, or in another process)", address)
	}
	if !remote.link(e) {
		return nil, transport.Errorf(transport.ErrPeerUnavailable, "runtime at %s is shutting down", address)
	}
	p := &inprocPeer{local: e, remote: remote, info: remote.svc.Identity()}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.isDown {
		return nil, transport.Errorf(transport.ErrClosed, "runtime is destroyed")
	}
	if cached, ok := e.cache[address]; ok {
		return cached, nil
	}
	e.cache[address] = p
	e.peers[remote.id] = remote
	return p, nil
}

// link records that other talks to e, so that e's closing reaches it.
func (e *inprocEndpoint) link(other *inprocEndpoint) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.isDown {
		return false
	}
	if other != e {
		e.peers[other.id] = other
	}
	return true
}

func (e *inprocEndpoint) unlink(id transport.RuntimeID) {
	e.mu.Lock()
	delete(e.peers, id)
	for addr, p := range e.cache {
		if p.remote.id == id {
			delete(e.cache, addr)
		}
	}
	e.mu.Unlock()
}

func (e *inprocEndpoint) Close() error {
	inprocEndpoints.Lock()
	delete(inprocEndpoints.m, e.address)
	inprocEndpoints.Unlock()

	e.mu.Lock()
	if e.isDown {
		e.mu.Unlock()
		return nil
	}
	e.isDown = true
	close(e.closed)
	peers := e.peers
	e.peers = map[transport.RuntimeID]*inprocEndpoint{}
	e.cache = map[string]*inprocPeer{}
	e.mu.Unlock()

	me := e.svc.Identity()
	for _, p := range peers {
		if p == e {
			continue
		}
		p.unlink(e.id)
		p.svc.PeerGone(me)
	}
	return nil
}

type inprocPeer struct {
	local, remote *inprocEndpoint
	mu            sync.Mutex
	info          transport.PeerInfo
}

func (p *inprocPeer) Info() transport.PeerInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.info
}

// check fails when either side is gone.
func (p *inprocPeer) check() error {
	select {
	case <-p.remote.closed:
		return transport.Errorf(transport.ErrPeerUnavailable, "runtime at %s is gone", p.remote.address)
	default:
	}
	select {
	case <-p.local.closed:
		return transport.Errorf(transport.ErrClosed, "runtime is destroyed")
	default:
	}
	return nil
}

func (p *inprocPeer) from() transport.PeerInfo { return p.local.svc.Identity() }

func (p *inprocPeer) Refresh(ctx context.Context) (transport.PeerInfo, error) {
	if err := p.check(); err != nil {
		return transport.PeerInfo{}, err
	}
	info := p.remote.svc.Identity()
	p.mu.Lock()
	p.info = info
	p.mu.Unlock()
	return info, nil
}

func (p *inprocPeer) Borrow(ctx context.Context, obj transport.ObjectID, token uint64) error {
	if err := p.check(); err != nil {
		return err
	}
	return p.remote.svc.Borrow(p.from(), obj, token)
}

func (p *inprocPeer) BorrowAsync(ctx context.Context, obj transport.ObjectID, token uint64, done func(error)) {
	done(p.Borrow(ctx, obj, token))
}

func (p *inprocPeer) Unborrow(obj transport.ObjectID, n uint64) {
	if p.check() == nil {
		p.remote.svc.Unborrow(p.local.id, obj, n)
	}
}

func (p *inprocPeer) Lease(ctx context.Context, obj transport.ObjectID) (uint64, error) {
	if err := p.check(); err != nil {
		return 0, err
	}
	return p.remote.svc.Lease(p.local.id, obj)
}

func (p *inprocPeer) Metadata(ctx context.Context, obj transport.ObjectID, transportName string) ([]byte, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	return p.remote.svc.Metadata(p.local.id, obj, transportName)
}

func (p *inprocPeer) Send(ctx context.Context, req SendRequest) error {
	if err := p.check(); err != nil {
		return err
	}
	// The peer's send must also stop if this runtime goes away.
	ctx, cancel := p.untilLocalCloses(ctx)
	defer cancel()
	return p.remote.svc.Send(ctx, p.from(), req)
}

// untilLocalCloses derives a context that is also cancelled when this
// runtime's endpoint closes (a socket peer sees the connection drop).
func (p *inprocPeer) untilLocalCloses(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-p.local.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func (p *inprocPeer) JoinGroup(ctx context.Context, req GroupJoin) ([]byte, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	ctx, cancel := p.untilLocalCloses(ctx)
	defer cancel()
	return p.remote.svc.JoinGroup(ctx, p.from(), req)
}

func (p *inprocPeer) Done() <-chan struct{} { return p.remote.closed }

func (p *inprocPeer) OpenWrite(ctx context.Context, req WriteOpen) (Admission, error) {
	if err := p.check(); err != nil {
		return Admission{}, err
	}
	return p.remote.svc.OpenWrite(p.from(), req)
}

func (p *inprocPeer) WriteDone(end WriteEnd) {
	if p.check() != nil {
		return
	}
	if end.Err != nil {
		end.Err = &transport.Error{Status: transport.StatusOf(end.Err), Msg: "the writer reported: " + end.Err.Error()}
	}
	p.remote.svc.WriteDone(p.local.id, end)
}

func (p *inprocPeer) WriteRun(ctx context.Context, obj transport.ObjectID, transferID, tag uint64) error {
	if err := p.check(); err != nil {
		return err
	}
	p.remote.svc.WriteRun(p.local.id, obj, transferID, tag)
	return nil
}

func (p *inprocPeer) WithdrawWrite(obj transport.ObjectID, transferID uint64, err error) {
	if p.check() != nil {
		return
	}
	if err != nil {
		err = &transport.Error{Status: transport.StatusOf(err), Msg: "the owner withdrew the admission: " + err.Error()}
	}
	p.remote.svc.WriteWithdrawn(p.local.id, obj, transferID, err)
}
