package engine

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// Groups: a named set of runtimes, each with a rank, formed over the
// control plane for transports that move bytes within a communicator
// (transport.GroupBackend). Rank 0 hosts the rendezvous: the other ranks connect to it and
// join; once every rank has joined, rank 0 answers each of them with the
// roster (who has which rank, and the backend's bootstrap bytes that rank 0
// made), and every rank then initializes the
// backend's communicator.

const maxBootstrap = 4096

type groupState struct {
	spec transport.GroupSpec
	// Rank 0's rendezvous; nil on other ranks.
	roster  *transport.GroupRoster
	joined  int
	formed  chan struct{} // closed when every rank joined
	failed  chan struct{} // closed when rank 0 gave up
	failErr error
	ready   bool // the communicator is formed
}

// groups is a runtime's table of groups, by name, and their formation:
// rank 0's rendezvous (join) and the other ranks' joining it.
type groups struct {
	me  *identity
	ctx context.Context // the runtime's: its end ends forming and joining

	mu sync.Mutex
	m  map[string]*groupState
}

// CreateGroup forms this runtime's rank of a group; see rdt_group_create.
// It returns once every rank has joined and the backend's communicator is
// formed, or fails (a negative timeout waits forever).
func (rt *Runtime) CreateGroup(spec transport.GroupSpec, timeout time.Duration) error {
	if err := rt.store.checkOpen(); err != nil {
		return err
	}
	if err := checkGroupSpec(spec, timeout); err != nil {
		return err
	}
	spec, backend, err := rt.reg.groupBackendFor(spec)
	if err != nil {
		return err
	}
	ctx, cancel := rt.ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(rt.ctx, timeout)
	}
	defer cancel()

	g, err := newGroupState(spec, backend, rt.Identity())
	if err != nil {
		return err
	}
	if err := rt.grp.claim(g); err != nil {
		return err
	}
	if err := rt.grp.form(ctx, g, backend, rt.ep); err != nil {
		return err
	}
	rt.log.Infof("group %q formed: rank %d of %d on device %d over %s", spec.Name, spec.Rank, spec.WorldSize, spec.Device, spec.Backend)
	return nil
}

// checkGroupSpec refuses a spec no backend could form.
func checkGroupSpec(spec transport.GroupSpec, timeout time.Duration) error {
	if err := transport.CheckGroupName(spec.Name); err != nil {
		return err
	}
	if spec.WorldSize < 1 || spec.WorldSize > transport.MaxGroupSize {
		return transport.Errorf(transport.ErrInvalidArgument, "group %q: world size %d is outside 1..%d", spec.Name, spec.WorldSize, transport.MaxGroupSize)
	}
	if spec.Rank < 0 || spec.Rank >= spec.WorldSize {
		return transport.Errorf(transport.ErrInvalidArgument, "group %q: rank %d is outside 0..%d (world size %d)", spec.Name, spec.Rank, spec.WorldSize-1, spec.WorldSize)
	}
	if spec.Rank != 0 && spec.Rank0 == "" {
		return transport.Errorf(transport.ErrInvalidArgument, "group %q: rank %d needs the address of rank 0's runtime (rdt_runtime_address there)", spec.Name, spec.Rank)
	}
	if spec.Device < 0 {
		return transport.Errorf(transport.ErrInvalidArgument, "group %q: device %d is not a device ordinal", spec.Name, spec.Device)
	}
	if timeout == 0 {
		return transport.Errorf(transport.ErrInvalidArgument, "group %q: a timeout of 0 cannot work: forming a group waits for the other ranks (negative: wait forever)", spec.Name)
	}
	return nil
}

// newGroupState is this rank's record of a forming group; rank 0's holds
// the roster, with the backend's bootstrap bytes and itself (me) as rank 0.
func newGroupState(spec transport.GroupSpec, backend transport.GroupBackend, me transport.PeerInfo) (*groupState, error) {
	g := &groupState{spec: spec}
	if spec.Rank != 0 {
		return g, nil
	}
	boot, err := backend.NewGroupBootstrap(spec)
	if err != nil {
		return nil, transport.Wrap(transportError(spec.Backend, err), "group %q", spec.Name)
	}
	if len(boot) > maxBootstrap {
		return nil, transport.Errorf(transport.ErrInternal, "group %q: transport %s made %d bootstrap bytes, over %d", spec.Name, spec.Backend, len(boot), maxBootstrap)
	}
	g.roster = &transport.GroupRoster{Name: spec.Name, Backend: spec.Backend, Instance: transport.RandomUint64() | 1, Bootstrap: boot,
		Members: make([]transport.GroupMember, spec.WorldSize)}
	g.roster.Members[0] = transport.GroupMember{Runtime: me.RuntimeID, Name: me.Name, Address: me.Address}
	g.joined = 1
	g.formed, g.failed = make(chan struct{}), make(chan struct{})
	if spec.WorldSize == 1 {
		close(g.formed)
	}
	return g, nil
}

// claim records g under its name, refusing a name in use.
func (gs *groups) claim(g *groupState) error {
	spec := g.spec
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if gs.m == nil {
		gs.m = map[string]*groupState{}
	}
	if old := gs.m[spec.Name]; old != nil {
		what := "is being formed"
		if old.ready {
			what = "exists"
		}
		return transport.Errorf(transport.ErrAlreadyExists, "group %q already %s in this runtime (rank %d of %d); destroy it first", spec.Name, what, old.spec.Rank, old.spec.WorldSize)
	}
	gs.m[spec.Name] = g
	return nil
}

// form waits for every rank (reaching rank 0 over ep), then has the
// backend form its communicator; the group is ready after, or its name is
// released.
func (gs *groups) form(ctx context.Context, g *groupState, backend transport.GroupBackend, ep control.Endpoint) error {
	spec := g.spec
	roster, err := gs.rendezvous(ctx, g, ep)
	if err == nil {
		err = backend.InitGroup(ctx, roster, spec)
		if err != nil {
			err = transportError(spec.Backend, transport.Wrap(err, "communicator (rank %d of %d, device %d)", spec.Rank, spec.WorldSize, spec.Device))
			err = transport.Wrap(err, "group %q", spec.Name)
		}
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if err != nil {
		delete(gs.m, spec.Name)
		return err
	}
	g.ready = true
	return nil
}

// rendezvous waits until every rank joined and returns the roster; a rank
// other than 0 joins rank 0 over ep.
func (gs *groups) rendezvous(ctx context.Context, g *groupState, ep control.Endpoint) (*transport.GroupRoster, error) {
	spec := g.spec
	if spec.Rank == 0 {
		select {
		case <-g.formed:
			return g.roster, nil
		case <-ctx.Done():
		}
		gs.mu.Lock()
		select {
		case <-g.formed: // formed just as the deadline passed
			gs.mu.Unlock()
			return g.roster, nil
		default:
		}
		var missing []string
		for i, m := range g.roster.Members {
			if m.Runtime.IsZero() {
				missing = append(missing, fmt.Sprint(i))
			}
		}
		g.failErr = transport.Errorf(transport.ErrTimeout, "rank 0 gave up before ranks [%s] joined", strings.Join(missing, " "))
		close(g.failed)
		gs.mu.Unlock()
		if gs.ctx.Err() != nil {
			return nil, transport.Errorf(transport.ErrClosed, "runtime %s was destroyed while group %q was forming", gs.me.name, spec.Name)
		}
		return nil, transport.Errorf(transport.ErrTimeout, "group %q: ranks [%s] of %d did not join rank 0 in time", spec.Name, strings.Join(missing, " "), spec.WorldSize)
	}
	req := control.GroupJoin{Name: spec.Name, Backend: spec.Backend, WorldSize: spec.WorldSize, Rank: spec.Rank}
	var last error
	for delay := 10 * time.Millisecond; ; delay = min(delay*2, 250*time.Millisecond) {
		peer, err := ep.Connect(ctx, spec.Rank0)
		var b []byte
		if err == nil {
			b, err = peer.JoinGroup(ctx, req)
		}
		if err == nil {
			roster, err := decodeRoster(b)
			if err != nil {
				return nil, transport.Wrap(err, "group %q: rank 0's answer", spec.Name)
			}
			if err := checkRoster(roster, req, gs.me.id, peer.Info().RuntimeID); err != nil {
				return nil, err
			}
			return roster, nil
		}
		st := transport.StatusOf(err)
		// Rank 0 may not have created the group, or even its runtime, yet.
		if st != transport.ErrNotFound && st != transport.ErrPeerUnavailable {
			return nil, transport.Wrap(err, "group %q: joining rank 0 at %s", spec.Name, spec.Rank0)
		}
		last = err
		select {
		case <-time.After(delay):
			continue
		case <-ctx.Done():
		}
		if gs.ctx.Err() != nil {
			return nil, transport.Errorf(transport.ErrClosed, "runtime %s was destroyed while group %q was forming", gs.me.name, spec.Name)
		}
		return nil, transport.Errorf(transport.ErrTimeout, "group %q: rank 0 at %s did not accept rank %d in time (last: %v)", spec.Name, spec.Rank0, spec.Rank, last)
	}
}

func checkRoster(g *transport.GroupRoster, req control.GroupJoin, self, rank0 transport.RuntimeID) error {
	switch {
	case g.Name != req.Name || g.Backend != req.Backend:
		return transport.Errorf(transport.ErrCorrupt, "group %q: rank 0 answered for group %q over %s", req.Name, g.Name, g.Backend)
	case g.WorldSize() != req.WorldSize:
		return transport.Errorf(transport.ErrCorrupt, "group %q: rank 0 answered with %d ranks, not %d", req.Name, g.WorldSize(), req.WorldSize)
	case g.Members[req.Rank].Runtime != self:
		return transport.Errorf(transport.ErrCorrupt, "group %q: rank 0's roster gives rank %d to another runtime", req.Name, req.Rank)
	case g.Members[0].Runtime != rank0:
		return transport.Errorf(transport.ErrCorrupt, "group %q: the roster's rank 0 is not the runtime that answered", req.Name)
	}
	return nil
}

// join registers `from` as a rank of a group this runtime is rank 0 of and
// answers with the roster once every rank has joined.
func (gs *groups) join(ctx context.Context, from transport.PeerInfo, req control.GroupJoin) ([]byte, error) {
	gs.mu.Lock()
	g := gs.m[req.Name]
	if g == nil || g.roster == nil {
		gs.mu.Unlock()
		if g != nil {
			return nil, transport.Errorf(transport.ErrInvalidArgument, "group %q: runtime %s is rank %d of it, not rank 0", req.Name, gs.me.name, g.spec.Rank)
		}
		return nil, transport.Errorf(transport.ErrNotFound, "group %q has not been created on rank 0 (%s) yet", req.Name, gs.me.name)
	}
	r := g.roster
	var err error
	switch {
	case req.Backend != r.Backend:
		err = transport.Errorf(transport.ErrInvalidArgument, "group %q is formed over %s on rank 0, not %s", req.Name, r.Backend, req.Backend)
	case req.WorldSize != r.WorldSize():
		err = transport.Errorf(transport.ErrInvalidArgument, "group %q has world size %d on rank 0, not %d", req.Name, r.WorldSize(), req.WorldSize)
	case req.Rank <= 0 || req.Rank >= r.WorldSize():
		err = transport.Errorf(transport.ErrInvalidArgument, "group %q: rank %d is outside 1..%d", req.Name, req.Rank, r.WorldSize()-1)
	case !r.Members[req.Rank].Runtime.IsZero() && r.Members[req.Rank].Runtime != from.RuntimeID:
		err = transport.Errorf(transport.ErrAlreadyExists, "group %q: rank %d was already taken by %s", req.Name, req.Rank, r.Members[req.Rank].Name)
	case r.RankOf(from.RuntimeID) >= 0 && r.RankOf(from.RuntimeID) != req.Rank:
		err = transport.Errorf(transport.ErrAlreadyExists, "group %q: runtime %s already joined as rank %d", req.Name, from.Name, r.RankOf(from.RuntimeID))
	}
	if err != nil {
		gs.mu.Unlock()
		return nil, err
	}
	if r.Members[req.Rank].Runtime.IsZero() {
		select {
		case <-g.failed:
			gs.mu.Unlock()
			return nil, transport.Errorf(transport.ErrTimeout, "group %q: %v", req.Name, g.failErr)
		default:
		}
		r.Members[req.Rank] = transport.GroupMember{Runtime: from.RuntimeID, Name: from.Name, Address: from.Address}
		g.joined++
		if g.joined == r.WorldSize() {
			close(g.formed)
		}
	}
	gs.mu.Unlock()

	select {
	case <-g.formed:
		return encodeRoster(r), nil
	case <-g.failed:
		return nil, transport.Errorf(transport.ErrTimeout, "group %q: %v", req.Name, g.failErr)
	case <-ctx.Done():
	case <-gs.ctx.Done():
	}
	// The joiner gave up (or we are shutting down): free its rank unless
	// the group formed meanwhile.
	gs.mu.Lock()
	select {
	case <-g.formed:
	default:
		if r.Members[req.Rank].Runtime == from.RuntimeID {
			r.Members[req.Rank] = transport.GroupMember{}
			g.joined--
		}
	}
	gs.mu.Unlock()
	return nil, transport.Errorf(transport.ErrAborted, "group %q: the join was cancelled", req.Name)
}

// DestroyGroup frees this runtime's rank of a group; see rdt_group_destroy.
func (rt *Runtime) DestroyGroup(name string) error {
	if err := transport.CheckGroupName(name); err != nil {
		return err
	}
	g, err := rt.grp.take(name)
	if err != nil {
		return err
	}
	t, err := rt.reg.Get(g.spec.Backend)
	if err != nil {
		return err
	}
	if err := t.(transport.GroupBackend).DestroyGroup(name); err != nil {
		return transport.Wrap(transportError(g.spec.Backend, err), "group %q", name)
	}
	rt.log.Infof("group %q destroyed", name)
	return nil
}

// GroupNames lists the groups formed in this runtime, sorted.
func (rt *Runtime) GroupNames() []string { return rt.grp.names() }

// take removes the formed group name from the table, for its destroy.
func (gs *groups) take(name string) (*groupState, error) {
	gs.mu.Lock()
	g := gs.m[name]
	if g == nil || !g.ready {
		gs.mu.Unlock()
		if g != nil {
			return nil, transport.Errorf(transport.ErrInvalidArgument, "group %q is still being formed in this runtime", name)
		}
		return nil, transport.Errorf(transport.ErrNotFound, "no group %q in runtime %s (have: %s)", name, gs.me.name, strings.Join(gs.names(), ", "))
	}
	delete(gs.m, name)
	gs.mu.Unlock()
	return g, nil
}

// names lists the groups formed, sorted.
func (gs *groups) names() []string {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	var names []string
	for n, g := range gs.m {
		if g.ready {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// Roster encoding: the payload of rank 0's answer to a join.

func encodeRoster(g *transport.GroupRoster) []byte {
	w := transport.NewWireWriter(nil)
	w.Str8(g.Name)
	w.Str8(g.Backend)
	w.U64(g.Instance)
	w.Bytes32(g.Bootstrap)
	w.U32(uint32(len(g.Members)))
	for _, m := range g.Members {
		w.Raw(m.Runtime[:])
		w.Str16(m.Name)
		w.Str16(m.Address)
	}
	return w.Bytes()
}

func decodeRoster(b []byte) (*transport.GroupRoster, error) {
	r := transport.NewWireReader("group roster", b)
	g := &transport.GroupRoster{}
	g.Name = r.Str8("group name", 127)
	g.Backend = r.Str8("backend", 63)
	g.Instance = r.U64()
	g.Bootstrap = r.Bytes32("bootstrap", maxBootstrap)
	n := r.Count("member", transport.MaxGroupSize, len(transport.RuntimeID{})+4)
	for i := 0; i < n && r.Err() == nil; i++ {
		var m transport.GroupMember
		m.Runtime = r.ID()
		m.Name = r.Str16("member name", control.MaxNameLen)
		m.Address = r.Str16("member address", maxAddressLen)
		g.Members = append(g.Members, m)
	}
	if err := r.Done(); err != nil {
		return nil, err
	}
	if err := transport.CheckGroupName(g.Name); err != nil {
		return nil, transport.Errorf(transport.ErrCorrupt, "group roster: %v", err)
	}
	if canon, err := transport.CanonicalName(g.Backend); err != nil || canon != g.Backend {
		return nil, transport.Errorf(transport.ErrCorrupt, "group roster: backend %q is not a canonical transport name", g.Backend)
	}
	if n == 0 {
		return nil, transport.Errorf(transport.ErrCorrupt, "group roster: no members")
	}
	seen := map[transport.RuntimeID]bool{}
	for i, m := range g.Members {
		if m.Runtime.IsZero() || seen[m.Runtime] {
			return nil, transport.Errorf(transport.ErrCorrupt, "group roster: rank %d has a zero or repeated runtime id", i)
		}
		seen[m.Runtime] = true
	}
	return g, nil
}
