package core

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
)

// Groups: a named set of runtimes, each with a rank, formed over the
// control plane for transports that move bytes within a communicator
// (nccl). Rank 0 hosts the rendezvous: the other ranks connect to it and
// join; once every rank has joined, rank 0 answers each of them with the
// roster (who has which rank, and the backend's bootstrap bytes that rank 0
// made, such as an ncclUniqueId), and every rank then initializes the
// backend's communicator.

// MaxGroupSize bounds the world size of a group.
const MaxGroupSize = 1 << 16

const maxBootstrap = 4096

// GroupMember is one rank of a group.
type GroupMember struct {
	Runtime RuntimeID
	Name    string
	Address string
}

// GroupRoster is what every rank of a formed group knows.
type GroupRoster struct {
	Name      string
	Backend   string // the transport whose communicator the group is
	Instance  uint64 // random, made by rank 0: tells re-created groups apart
	Bootstrap []byte // the backend's bytes made on rank 0 (an ncclUniqueId)
	Members   []GroupMember
}

// WorldSize is the number of ranks.
func (g *GroupRoster) WorldSize() int { return len(g.Members) }

// RankOf finds the rank of a runtime (-1 if it is not a member).
func (g *GroupRoster) RankOf(id RuntimeID) int {
	for i, m := range g.Members {
		if m.Runtime == id {
			return i
		}
	}
	return -1
}

// GroupSpec is one rank's part in forming a group.
type GroupSpec struct {
	Name      string
	WorldSize int
	Rank      int
	// Rank0 is the control-plane address of rank 0's runtime (ignored on
	// rank 0 itself).
	Rank0 string
	// Device is the ordinal of the device the rank's communicator uses.
	Device int
	// Backend names the transport ("" is "nccl").
	Backend string
}

// GroupBackend is implemented by transports that move bytes inside groups.
type GroupBackend interface {
	// NewGroupBootstrap runs on rank 0 before anyone joins: the bytes every
	// rank needs to initialize the communicator (ncclGetUniqueId).
	NewGroupBootstrap(spec GroupSpec) ([]byte, error)
	// InitGroup runs on every rank once all ranks joined, and returns when
	// the communicator is formed (ncclCommInitRank), failed, or ctx is done.
	InitGroup(ctx context.Context, roster *GroupRoster, spec GroupSpec) error
	// DestroyGroup frees this rank's communicator of the group.
	DestroyGroup(name string) error
}

// GroupJoin is what a rank sends rank 0 to join a group.
type GroupJoin struct {
	Name      string
	Backend   string
	WorldSize int
	Rank      int
}

var groupNameRE = regexp.MustCompile(`^[A-Za-z0-9_.:\-]{1,127}$`)

// CheckGroupName validates a group name.
func CheckGroupName(name string) error {
	if !groupNameRE.MatchString(name) {
		return Errorf(ErrInvalidArgument, "group name %q: want 1 to 127 letters, digits, '_', '-', '.' or ':'", name)
	}
	return nil
}

type groupState struct {
	spec GroupSpec
	// Rank 0's rendezvous; nil on other ranks.
	roster  *GroupRoster
	joined  int
	formed  chan struct{} // closed when every rank joined
	failed  chan struct{} // closed when rank 0 gave up
	failErr error
	ready   bool // the communicator is formed
}

// groups is a runtime's table of groups, by name.
type groups struct {
	mu sync.Mutex
	m  map[string]*groupState
}

// CreateGroup forms this runtime's rank of a group; see rdt_group_create.
// It returns once every rank has joined and the backend's communicator is
// formed, or fails (a negative timeout waits forever).
func (rt *Runtime) CreateGroup(spec GroupSpec, timeout time.Duration) error {
	if err := rt.checkOpen(); err != nil {
		return err
	}
	if err := CheckGroupName(spec.Name); err != nil {
		return err
	}
	if spec.WorldSize < 1 || spec.WorldSize > MaxGroupSize {
		return Errorf(ErrInvalidArgument, "group %q: world size %d is outside 1..%d", spec.Name, spec.WorldSize, MaxGroupSize)
	}
	if spec.Rank < 0 || spec.Rank >= spec.WorldSize {
		return Errorf(ErrInvalidArgument, "group %q: rank %d is outside 0..%d (world size %d)", spec.Name, spec.Rank, spec.WorldSize-1, spec.WorldSize)
	}
	if spec.Rank != 0 && spec.Rank0 == "" {
		return Errorf(ErrInvalidArgument, "group %q: rank %d needs the address of rank 0's runtime (rdt_runtime_address there)", spec.Name, spec.Rank)
	}
	if spec.Device < 0 {
		return Errorf(ErrInvalidArgument, "group %q: device %d is not a device ordinal", spec.Name, spec.Device)
	}
	if timeout == 0 {
		return Errorf(ErrInvalidArgument, "group %q: a timeout of 0 cannot work: forming a group waits for the other ranks (negative: wait forever)", spec.Name)
	}
	if spec.Backend == "" {
		spec.Backend = "nccl"
	}
	canon, err := CanonicalName(spec.Backend)
	if err != nil {
		return err
	}
	spec.Backend = canon
	t, err := rt.reg.Get(canon)
	if err != nil {
		if StatusOf(err) == ErrNotFound {
			return Errorf(ErrUnsupported, "group %q: transport %s is not available in this runtime (have: %s)%s",
				spec.Name, canon, strings.Join(rt.reg.Names(), ", "), unavailableHint(canon))
		}
		return err
	}
	backend, ok := t.(GroupBackend)
	if !ok {
		return Errorf(ErrUnsupported, "group %q: transport %s does not form groups", spec.Name, canon)
	}

	ctx, cancel := rt.ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(rt.ctx, timeout)
	}
	defer cancel()

	g := &groupState{spec: spec}
	if spec.Rank == 0 {
		boot, err := backend.NewGroupBootstrap(spec)
		if err != nil {
			return Wrap(err, "group %q", spec.Name)
		}
		if len(boot) > maxBootstrap {
			return Errorf(ErrInternal, "group %q: %s made %d bootstrap bytes, over %d", spec.Name, canon, len(boot), maxBootstrap)
		}
		id := rt.Identity()
		g.roster = &GroupRoster{Name: spec.Name, Backend: canon, Instance: randomUint64() | 1, Bootstrap: boot,
			Members: make([]GroupMember, spec.WorldSize)}
		g.roster.Members[0] = GroupMember{Runtime: id.RuntimeID, Name: id.Name, Address: id.Address}
		g.joined = 1
		g.formed, g.failed = make(chan struct{}), make(chan struct{})
		if spec.WorldSize == 1 {
			close(g.formed)
		}
	}
	rt.grp.mu.Lock()
	if rt.grp.m == nil {
		rt.grp.m = map[string]*groupState{}
	}
	if old := rt.grp.m[spec.Name]; old != nil {
		rt.grp.mu.Unlock()
		what := "is being formed"
		if old.ready {
			what = "exists"
		}
		return Errorf(ErrAlreadyExists, "group %q already %s in this runtime (rank %d of %d); destroy it first", spec.Name, what, old.spec.Rank, old.spec.WorldSize)
	}
	rt.grp.m[spec.Name] = g
	rt.grp.mu.Unlock()

	roster, err := rt.rendezvous(ctx, g)
	if err == nil {
		err = backend.InitGroup(ctx, roster, spec)
		if err != nil {
			err = Wrap(err, "group %q: %s communicator (rank %d of %d, device %d)", spec.Name, canon, spec.Rank, spec.WorldSize, spec.Device)
		}
	}
	rt.grp.mu.Lock()
	if err != nil {
		delete(rt.grp.m, spec.Name)
	} else {
		g.ready = true
	}
	rt.grp.mu.Unlock()
	if err != nil {
		return err
	}
	rt.log.Infof("group %q formed: rank %d of %d on device %d over %s", spec.Name, spec.Rank, spec.WorldSize, spec.Device, canon)
	return nil
}

func unavailableHint(name string) string {
	if name == "nccl" {
		return "; it needs the NCCL library (libnccl.so.2, or RDT_NCCL_LIBRARY) and a CUDA driver with a device"
	}
	return ""
}

// rendezvous waits until every rank joined and returns the roster.
func (rt *Runtime) rendezvous(ctx context.Context, g *groupState) (*GroupRoster, error) {
	spec := g.spec
	if spec.Rank == 0 {
		select {
		case <-g.formed:
			return g.roster, nil
		case <-ctx.Done():
		}
		rt.grp.mu.Lock()
		select {
		case <-g.formed: // formed just as the deadline passed
			rt.grp.mu.Unlock()
			return g.roster, nil
		default:
		}
		var missing []string
		for i, m := range g.roster.Members {
			if m.Runtime.IsZero() {
				missing = append(missing, fmt.Sprint(i))
			}
		}
		g.failErr = Errorf(ErrTimeout, "rank 0 gave up before ranks [%s] joined", strings.Join(missing, " "))
		close(g.failed)
		rt.grp.mu.Unlock()
		if rt.ctx.Err() != nil {
			return nil, Errorf(ErrClosed, "runtime %s was destroyed while group %q was forming", rt.name, spec.Name)
		}
		return nil, Errorf(ErrTimeout, "group %q: ranks [%s] of %d did not join rank 0 in time", spec.Name, strings.Join(missing, " "), spec.WorldSize)
	}
	req := GroupJoin{Name: spec.Name, Backend: spec.Backend, WorldSize: spec.WorldSize, Rank: spec.Rank}
	var last error
	for delay := 10 * time.Millisecond; ; delay = min(delay*2, 250*time.Millisecond) {
		peer, err := rt.ep.Connect(ctx, spec.Rank0)
		var b []byte
		if err == nil {
			b, err = peer.JoinGroup(ctx, req)
		}
		if err == nil {
			roster, err := decodeRoster(b)
			if err != nil {
				return nil, Wrap(err, "group %q: rank 0's answer", spec.Name)
			}
			if err := checkRoster(roster, req, rt.id, peer.Info().RuntimeID); err != nil {
				return nil, err
			}
			return roster, nil
		}
		st := StatusOf(err)
		// Rank 0 may not have created the group, or even its runtime, yet.
		if st != ErrNotFound && st != ErrPeerUnavailable {
			return nil, Wrap(err, "group %q: joining rank 0 at %s", spec.Name, spec.Rank0)
		}
		last = err
		select {
		case <-time.After(delay):
			continue
		case <-ctx.Done():
		}
		if rt.ctx.Err() != nil {
			return nil, Errorf(ErrClosed, "runtime %s was destroyed while group %q was forming", rt.name, spec.Name)
		}
		return nil, Errorf(ErrTimeout, "group %q: rank 0 at %s did not accept rank %d in time (last: %v)", spec.Name, spec.Rank0, spec.Rank, last)
	}
}

func checkRoster(g *GroupRoster, req GroupJoin, self, rank0 RuntimeID) error {
	switch {
	case g.Name != req.Name || g.Backend != req.Backend:
		return Errorf(ErrCorrupt, "group %q: rank 0 answered for group %q over %s", req.Name, g.Name, g.Backend)
	case g.WorldSize() != req.WorldSize:
		return Errorf(ErrCorrupt, "group %q: rank 0 answered with %d ranks, not %d", req.Name, g.WorldSize(), req.WorldSize)
	case g.Members[req.Rank].Runtime != self:
		return Errorf(ErrCorrupt, "group %q: rank 0's roster gives rank %d to another runtime", req.Name, req.Rank)
	case g.Members[0].Runtime != rank0:
		return Errorf(ErrCorrupt, "group %q: the roster's rank 0 is not the runtime that answered", req.Name)
	}
	return nil
}

// JoinGroup implements PeerService on rank 0: register `from` as a rank
// and answer with the roster once every rank has joined.
func (rt *Runtime) JoinGroup(ctx context.Context, from PeerInfo, req GroupJoin) ([]byte, error) {
	rt.grp.mu.Lock()
	g := rt.grp.m[req.Name]
	if g == nil || g.roster == nil {
		rt.grp.mu.Unlock()
		if g != nil {
			return nil, Errorf(ErrInvalidArgument, "group %q: runtime %s is rank %d of it, not rank 0", req.Name, rt.name, g.spec.Rank)
		}
		return nil, Errorf(ErrNotFound, "group %q has not been created on rank 0 (%s) yet", req.Name, rt.name)
	}
	r := g.roster
	var err error
	switch {
	case req.Backend != r.Backend:
		err = Errorf(ErrInvalidArgument, "group %q is formed over %s on rank 0, not %s", req.Name, r.Backend, req.Backend)
	case req.WorldSize != r.WorldSize():
		err = Errorf(ErrInvalidArgument, "group %q has world size %d on rank 0, not %d", req.Name, r.WorldSize(), req.WorldSize)
	case req.Rank <= 0 || req.Rank >= r.WorldSize():
		err = Errorf(ErrInvalidArgument, "group %q: rank %d is outside 1..%d", req.Name, req.Rank, r.WorldSize()-1)
	case !r.Members[req.Rank].Runtime.IsZero() && r.Members[req.Rank].Runtime != from.RuntimeID:
		err = Errorf(ErrAlreadyExists, "group %q: rank %d was already taken by %s", req.Name, req.Rank, r.Members[req.Rank].Name)
	case r.RankOf(from.RuntimeID) >= 0 && r.RankOf(from.RuntimeID) != req.Rank:
		err = Errorf(ErrAlreadyExists, "group %q: runtime %s already joined as rank %d", req.Name, from.Name, r.RankOf(from.RuntimeID))
	}
	if err != nil {
		rt.grp.mu.Unlock()
		return nil, err
	}
	if r.Members[req.Rank].Runtime.IsZero() {
		select {
		case <-g.failed:
			rt.grp.mu.Unlock()
			return nil, Errorf(ErrTimeout, "group %q: %v", req.Name, g.failErr)
		default:
		}
		r.Members[req.Rank] = GroupMember{Runtime: from.RuntimeID, Name: from.Name, Address: from.Address}
		g.joined++
		if g.joined == r.WorldSize() {
			close(g.formed)
		}
	}
	rt.grp.mu.Unlock()

	select {
	case <-g.formed:
		return encodeRoster(r), nil
	case <-g.failed:
		return nil, Errorf(ErrTimeout, "group %q: %v", req.Name, g.failErr)
	case <-ctx.Done():
	case <-rt.ctx.Done():
	}
	// The joiner gave up (or we are shutting down): free its rank unless
	// the group formed meanwhile.
	rt.grp.mu.Lock()
	select {
	case <-g.formed:
	default:
		if r.Members[req.Rank].Runtime == from.RuntimeID {
			r.Members[req.Rank] = GroupMember{}
			g.joined--
		}
	}
	rt.grp.mu.Unlock()
	return nil, Errorf(ErrAborted, "group %q: the join was cancelled", req.Name)
}

// DestroyGroup frees this runtime's rank of a group; see rdt_group_destroy.
func (rt *Runtime) DestroyGroup(name string) error {
	if err := CheckGroupName(name); err != nil {
		return err
	}
	rt.grp.mu.Lock()
	g := rt.grp.m[name]
	if g == nil || !g.ready {
		rt.grp.mu.Unlock()
		if g != nil {
			return Errorf(ErrInvalidArgument, "group %q is still being formed in this runtime", name)
		}
		return Errorf(ErrNotFound, "no group %q in runtime %s (have: %s)", name, rt.name, strings.Join(rt.GroupNames(), ", "))
	}
	delete(rt.grp.m, name)
	rt.grp.mu.Unlock()
	t, err := rt.reg.Get(g.spec.Backend)
	if err != nil {
		return err
	}
	if err := t.(GroupBackend).DestroyGroup(name); err != nil {
		return Wrap(err, "group %q", name)
	}
	rt.log.Infof("group %q destroyed", name)
	return nil
}

// GroupNames lists the groups formed in this runtime, sorted.
func (rt *Runtime) GroupNames() []string {
	rt.grp.mu.Lock()
	defer rt.grp.mu.Unlock()
	var names []string
	for n, g := range rt.grp.m {
		if g.ready {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// Roster encoding: the payload of rank 0's answer to a join.

func encodeRoster(g *GroupRoster) []byte {
	w := &writer{}
	w.str8(g.Name)
	w.str8(g.Backend)
	w.u64(g.Instance)
	w.bytes32(g.Bootstrap)
	w.u32(uint32(len(g.Members)))
	for _, m := range g.Members {
		w.raw(m.Runtime[:])
		w.str16(m.Name)
		w.str16(m.Address)
	}
	return w.b
}

func decodeRoster(b []byte) (*GroupRoster, error) {
	r := &reader{b: b, what: "group roster"}
	g := &GroupRoster{}
	g.Name = r.str8("group name", 127)
	g.Backend = r.str8("backend", 63)
	g.Instance = r.u64()
	g.Bootstrap = r.bytes32("bootstrap", maxBootstrap)
	n := r.count("member", MaxGroupSize, len(RuntimeID{})+4)
	for i := 0; i < n && r.err == nil; i++ {
		var m GroupMember
		m.Runtime = r.id()
		m.Name = r.str16("member name", maxNameLen)
		m.Address = r.str16("member address", maxAddressLen)
		g.Members = append(g.Members, m)
	}
	if err := r.done(); err != nil {
		return nil, err
	}
	if err := CheckGroupName(g.Name); err != nil {
		return nil, Errorf(ErrCorrupt, "group roster: %v", err)
	}
	if canon, err := CanonicalName(g.Backend); err != nil || canon != g.Backend {
		return nil, Errorf(ErrCorrupt, "group roster: backend %q is not a canonical transport name", g.Backend)
	}
	if n == 0 {
		return nil, Errorf(ErrCorrupt, "group roster: no members")
	}
	seen := map[RuntimeID]bool{}
	for i, m := range g.Members {
		if m.Runtime.IsZero() || seen[m.Runtime] {
			return nil, Errorf(ErrCorrupt, "group roster: rank %d has a zero or repeated runtime id", i)
		}
		seen[m.Runtime] = true
	}
	return g, nil
}
