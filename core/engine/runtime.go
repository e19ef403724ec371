package engine

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// DefaultLease is how long a serialized ref keeps its object alive.
const DefaultLease = 2 * time.Minute

// rpcTimeout bounds one control-plane call.
const rpcTimeout = 30 * time.Second

// Options configure a runtime.
type Options struct {
	Name     string
	LogLevel transport.LogLevel
	Lease    time.Duration   // 0: DefaultLease
	Network  control.Network // nil: control.InProcess
	Builtins []transport.TransportFactory
	// Settings are the transports' environment variables the runtime
	// reads and checks at creation, whether or not it makes those
	// transports (nil: the settings of Builtins).
	Settings []transport.Setting
	HostID   string // "": detected from the kernel
	// AuthToken is the shared secret of TCP endpoints ("": none, loopback
	// only).
	AuthToken string
	// BindHost is the host TCP listeners bind ("": the host of ListenTCP,
	// else 127.0.0.1).
	BindHost string
	// AdvertiseHost is what peers dial ("": BindHost, or this host's name
	// when BindHost is a wildcard).
	AdvertiseHost string
	// SocketDir holds Unix sockets ("": a private directory under
	// $XDG_RUNTIME_DIR or the temporary directory).
	SocketDir string
	// ListenTCP also makes the control plane reachable over TCP at
	// host:port ("": Unix socket only).
	ListenTCP string
	// PeerTimeout is how long a silent peer counts as alive (0:
	// DefaultPeerTimeout).
	PeerTimeout time.Duration
	// LogOutput receives the runtime's log lines (nil: stderr).
	LogOutput io.Writer
	// EnvironmentDefaults makes an empty ListenTCP and AuthToken fall back
	// to RDT_LISTEN and RDT_AUTH_TOKEN, as the C API promises.
	EnvironmentDefaults bool
	// QueueReleases queues the user data of freed objects for TakeReleased
	// (see ReleaseToQueue) instead of calling release functions on the
	// runtime's threads.
	QueueReleases bool
}

// Runtime is what an application holds: it owns an object store, a
// transport registry and a control-plane endpoint, and its methods are the
// calls applications make. Peers are answered by its peerService
// (service.go), its transports served by their transportHost (host.go).
// All methods are safe for concurrent use.
type Runtime struct {
	opts   Options
	me     *identity // who it is, to its peers and transports (identity.go)
	log    *transport.Logger
	reg    *Registry
	ep     control.Endpoint
	routes *routes // to other runtimes' objects, over ep (route.go)
	ctx    context.Context
	cancel context.CancelFunc

	store *store // objects, leases, borrows and fetches (store.go)
	// host is what its built-in transports get, each with a logger of its
	// own (host.go).
	host transportHost
	gate *writeGate   // admits and ends writes into its exposed objects (gate.go)
	svc  *peerService // what the endpoint calls on behalf of peers (service.go)

	grp *groups // collective groups (group.go)
	// adm holds the standing admissions of this runtime's prepared writes
	// (standing.go).
	adm admissions

	releases *releaseQueue // with Options.QueueReleases, else nil (release.go)

	bg sync.WaitGroup // what destroy waits for: finalizers, sends, withdrawals
	c  counters

	panicAt stageHook // tests' only (transfer.go)
}

// NewRuntime creates a runtime and its built-in transports.
func NewRuntime(opts Options) (*Runtime, error) {
	settings := opts.Settings
	if settings == nil {
		settings = SettingsOf(opts.Builtins)
	}
	env, err := readProcessEnvironment(settings)
	if err != nil {
		return nil, err
	}
	listenFromEnv := applyEnvironment(&opts, env)
	if err := resolveHosts(&opts, env); err != nil {
		if listenFromEnv {
			return nil, transport.Wrap(err, "environment variable RDT_LISTEN=%q", opts.ListenTCP)
		}
		return nil, err
	}
	key, id := control.NewIdentityKey()
	rt := newRuntimeState(opts, env, id)
	if err := rt.listen(key); err != nil {
		rt.cancel()
		if listenFromEnv {
			return nil, transport.Wrap(err, "control plane (environment variable RDT_LISTEN=%q)", rt.opts.ListenTCP)
		}
		return nil, transport.Wrap(err, "control plane")
	}
	if err := rt.reg.startBuiltins(rt.opts.Builtins, rt.host); err != nil {
		rt.Destroy()
		return nil, err
	}
	rt.log.Debugf("runtime %s listening at %s with transports [%s]", rt.me.id, rt.Address(), strings.Join(rt.reg.Names(), ", "))
	return rt, nil
}

// applyEnvironment fills the options the environment may supply and
// reports whether the control plane's TCP address came from RDT_LISTEN.
func applyEnvironment(opts *Options, env Environment) (listenFromEnv bool) {
	if opts.EnvironmentDefaults {
		if opts.ListenTCP == "" && env.Listen != "" {
			opts.ListenTCP, listenFromEnv = env.Listen, true
		}
		if opts.AuthToken == "" {
			opts.AuthToken = env.AuthToken
		}
	}
	if opts.LogLevel == transport.LogDefault {
		opts.LogLevel = env.LogLevel
	}
	return listenFromEnv
}

// newRuntimeState makes the runtime's identity (id, derived from its
// identity key), empty tables, logger and the host its transports get;
// nothing is listening yet.
func newRuntimeState(opts Options, env Environment, id transport.RuntimeID) *Runtime {
	reg := newRegistry()
	me := &identity{id: id, name: opts.Name, hostID: opts.HostID, pid: os.Getpid(), reg: reg}
	if me.name == "" {
		me.name = fmt.Sprintf("rdt-%d", me.pid)
	}
	if me.hostID == "" {
		me.hostID = hostIdentity()
	}
	lease := opts.Lease
	if lease <= 0 {
		lease = DefaultLease
	}
	if opts.PeerTimeout <= 0 {
		opts.PeerTimeout = transport.DefaultPeerTimeout
	}
	rt := &Runtime{opts: opts, me: me, reg: reg, log: transport.NewLoggerTo(me.name, opts.LogLevel, opts.LogOutput)}
	rt.ctx, rt.cancel = context.WithCancel(context.Background())
	if opts.QueueReleases {
		rt.releases = newReleaseQueue()
	}
	rt.store = newStore(me.name, rt.log, lease, &rt.c, reg, &rt.bg)
	rt.grp = &groups{me: me, ctx: rt.ctx}
	rt.gate = &writeGate{store: rt.store, reg: reg, log: rt.log, ctx: rt.ctx, bg: &rt.bg}
	rt.svc = &peerService{me: me, log: rt.log, ctx: rt.ctx, bg: &rt.bg, c: &rt.c,
		store: rt.store, reg: reg, grp: rt.grp, gate: rt.gate, adm: &rt.adm}
	rt.host = transportHost{
		me: me, log: rt.log, ctx: rt.ctx, settings: env.Settings, store: rt.store,
		authToken: opts.AuthToken, secret: transport.RandomID().String() + transport.RandomID().String(),
		bindHost: opts.BindHost, advertiseHost: opts.AdvertiseHost, socketDir: opts.SocketDir, peerTimeout: opts.PeerTimeout,
	}
	return rt
}

// listen opens the control-plane endpoint peers reach the runtime at; key
// proves its identity to them.
func (rt *Runtime) listen(key ed25519.PrivateKey) error {
	network := rt.opts.Network
	if network == nil {
		network = control.InProcess{}
	}
	ep, err := network.Listen(control.ListenConfig{
		Service: rt.svc, Log: rt.log, SocketDir: rt.opts.SocketDir, ListenTCP: rt.opts.ListenTCP,
		AuthToken: rt.opts.AuthToken, Secret: rt.host.secret, Key: key, AdvertiseHost: rt.opts.AdvertiseHost, PeerTimeout: rt.opts.PeerTimeout,
	})
	if err != nil {
		return err
	}
	rt.ep = ep
	rt.routes = &routes{ep: ep, reg: rt.reg, store: rt.store, me: rt.me}
	address := ep.Address()
	rt.me.address.Store(&address)
	return nil
}

// transportError names the transport an error left: the engine does it,
// once, wherever a transport's error reaches it; transports never name
// themselves. The error's status is kept.
func transportError(name string, err error) error {
	return transport.Wrap(err, "transport %s", name)
}

// ID is the runtime's identity.
func (rt *Runtime) ID() transport.RuntimeID { return rt.me.id }

// Name is the runtime's name for logs.
func (rt *Runtime) Name() string { return rt.me.name }

// Address is the control-plane address peers reach it at.
func (rt *Runtime) Address() string { return rt.me.addr() }

// Log is the runtime's logger.
func (rt *Runtime) Log() *transport.Logger { return rt.log }

// Context is cancelled when the runtime is destroyed.
func (rt *Runtime) Context() context.Context { return rt.ctx }

// Registry holds the runtime's transports.
func (rt *Runtime) Registry() *Registry { return rt.reg }

// RegisterTransport adds a (foreign) transport.
func (rt *Runtime) RegisterTransport(t transport.Transport) error {
	if err := rt.store.checkOpen(); err != nil {
		return err
	}
	return rt.reg.Register(t, false)
}

// Identity describes the runtime to peers.
func (rt *Runtime) Identity() transport.PeerInfo { return rt.me.info() }

// stderrFlushWait bounds how long Destroy waits for the log lines queued
// for stderr to be written.
const stderrFlushWait = 500 * time.Millisecond

// Destroy shuts the runtime down; see rdt_runtime_destroy. It is idempotent.
func (rt *Runtime) Destroy() {
	fetches, borrowed, first := rt.store.close()
	if !first {
		return
	}

	if rt.releases != nil {
		// Wakes takers with ErrClosed; the objects destroy frees below are
		// not queued.
		rt.releases.close()
	}
	// Stop our fetches and sends, and whatever transports serve.
	rt.cancel()
	for _, f := range fetches {
		f.Abort()
		<-f.done
	}
	// Close the standing admissions no run uses: their owners need not
	// tear them (a run in progress was aborted above and ended its own).
	rt.adm.closeIdle()
	// Return the borrows we hold on other runtimes' objects.
	for id, e := range borrowed {
		if e.registered > 0 {
			e.peer.Unborrow(id, e.registered)
		}
	}
	if rt.ep != nil {
		rt.ep.Close()
	}
	// Writes into our exposed objects cannot end any more (their writers'
	// outcomes would come over the connections just closed): they are torn.
	rt.gate.tearWrites(transport.RuntimeID{}, transport.Errorf(transport.ErrClosed, "the owner %s was destroyed with the write open", rt.me.name), "destroying")
	// Free every object we own, once nothing reads its memory any more.
	rt.store.waitUnpinned()
	for _, o := range rt.store.drain() {
		rt.store.finalize(o)
	}
	rt.bg.Wait()
	rt.reg.closeAll(rt.log)
	rt.log.Debugf("runtime destroyed")
	// Lines for stderr are written by a goroutine; a program that exits
	// right after destroy still gets them, unless stderr is stuck.
	transport.FlushStderrLogs(stderrFlushWait)
}

// Put stores tensors as a new object owned by this runtime and returns its
// first reference. See rdt_put.
func (rt *Runtime) Put(tensors []transport.Tensor, transportName string, release func()) (*Ref, error) {
	return rt.put(tensors, transportName, release, false)
}

// put stores a new object: one to fetch, or one exposed for writing.
func (rt *Runtime) put(tensors []transport.Tensor, transportName string, release func(), writable bool) (*Ref, error) {
	if len(tensors) > transport.MaxTensors {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "%d tensors is over the limit of %d per object", len(tensors), transport.MaxTensors)
	}
	if err := rt.store.checkOpen(); err != nil {
		return nil, err
	}
	id := transport.RandomID()
	meta := map[string][]byte{}
	canon := ""
	if transportName != "" {
		e, err := rt.reg.lookup(transportName)
		if err != nil {
			return nil, err
		}
		canon = e.desc.Name
		if writable && !e.desc.Writes {
			return nil, transport.Errorf(transport.ErrUnsupported, "transport %s cannot write into another runtime's memory", canon)
		}
		for i, t := range tensors {
			if !e.desc.Moves(t.Device.Type) {
				return nil, transport.Errorf(transport.ErrUnsupported, "tensor %d is in %s memory, which transport %s does not move (it moves %v)", i, t.Device.Type, canon, e.desc.Devices)
			}
		}
		m, err := extractMetadata(e, id, tensors, writable)
		if err != nil {
			return nil, transportError(canon, transport.Wrap(err, "could not extract metadata"))
		}
		meta[canon] = m
	} else {
		for _, e := range rt.reg.eagerTransports(tensors) {
			if writable && !e.desc.Writes {
				continue
			}
			m, err := extractMetadata(e, id, tensors, writable)
			if err != nil {
				rt.log.Debugf("transport %s skipped for object %s: %v", e.desc.Name, id, err)
				continue
			}
			meta[e.desc.Name] = m
		}
	}
	descs := make([]transport.TensorDesc, len(tensors))
	for i, t := range tensors {
		descs[i] = t.TensorDesc
	}
	o := &object{
		desc:      newObjectDesc(id, OwnerInfo{RuntimeID: rt.me.id, Address: rt.Address(), HostID: rt.me.hostID}, canon, descs, nil),
		tensors:   append([]transport.Tensor(nil), tensors...),
		release:   release,
		local:     1,
		transit:   map[uint64]lease{},
		borrows:   map[transport.RuntimeID]uint64{},
		freed:     make(chan struct{}),
		collected: make(chan struct{}),
		meta:      meta,
	}
	if writable {
		o.desc.Writable = true
		if _, err := rand.Read(o.desc.WriteKey[:]); err != nil {
			o.collectMeta(rt.reg)
			return nil, transport.Errorf(transport.ErrInternal, "making a write key: %v", err)
		}
		o.write = newExposure(rt.store.unpin)
	}
	if err := rt.store.add(o); err != nil {
		o.collectMeta(rt.reg) // the caller keeps the tensors: no release callback
		return nil, err
	}
	rt.c.refs.Add(1)
	rt.log.Debugf("put object %s: %d tensors, %d bytes, transport %q, writable %v", id, len(tensors), o.desc.Nbytes, canon, writable)
	return &Ref{rt: rt, desc: o.desc, owned: true}, nil
}

// WaitTensorFreed waits until no object holds a tensor whose data pointer is
// data. A negative timeout waits forever.
func (rt *Runtime) WaitTensorFreed(data uintptr, timeout time.Duration) error {
	var deadline <-chan time.Time
	if timeout >= 0 {
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		deadline = timer.C
	}
	for {
		holders := rt.store.holders(data)
		if len(holders) == 0 {
			return nil
		}
		for _, o := range holders {
			select {
			case <-o.freed:
			case <-deadline:
				return rt.store.stillHeld(data, holders)
			}
		}
	}
}

// Stats is a snapshot of a runtime's counters.
type Stats struct {
	Objects, ObjectsFreed, Refs, Borrows, BorrowedObjects, RefsInTransit uint64
	LeasesExpired, FetchesActive, TransfersCompleted, TransfersFailed    uint64
	BytesReceived, SendsCompleted, BytesSent, LocalCopies, Peers         uint64
	PeersLost                                                            uint64
	WritesCompleted, WritesFailed, BytesWritten                          uint64
	WritesOpen                                                           uint64 // into our exposed objects
	ViewsOpen, BytesViewed                                               uint64 // views mapping others' objects, held
}

// Stats snapshots the runtime's counters.
func (rt *Runtime) Stats() Stats {
	s := Stats{
		ObjectsFreed:       rt.c.objectsFreed.Load(),
		Refs:               uint64(rt.c.refs.Load()),
		LeasesExpired:      rt.c.leasesExpired.Load(),
		FetchesActive:      uint64(rt.c.fetchesActive.Load()),
		TransfersCompleted: rt.c.moved[transport.Read].completed.Load(),
		TransfersFailed:    rt.c.moved[transport.Read].failed.Load(),
		BytesReceived:      rt.c.moved[transport.Read].bytes.Load(),
		SendsCompleted:     rt.c.sendsCompleted.Load(),
		BytesSent:          rt.c.bytesSent.Load(),
		LocalCopies:        rt.c.localCopies.Load(),
		WritesCompleted:    rt.c.moved[transport.Write].completed.Load(),
		WritesFailed:       rt.c.moved[transport.Write].failed.Load(),
		BytesWritten:       rt.c.moved[transport.Write].bytes.Load(),
		ViewsOpen:          uint64(rt.c.viewsOpen.Load()),
		BytesViewed:        uint64(rt.c.bytesViewed.Load()),
	}
	rt.store.counts(&s)
	for _, o := range rt.store.exposedObjects() {
		s.WritesOpen += uint64(o.write.numOpen())
	}
	if rt.ep != nil {
		s.Peers = uint64(rt.ep.NumPeers())
		s.PeersLost = rt.ep.PeersLost()
	}
	return s
}
