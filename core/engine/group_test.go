package engine

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// rosterBackend is a transport that forms groups without a communicator:
// rank 0's bootstrap bytes are random and InitGroup records the roster each
// rank got. It tests the rendezvous over the control plane; the NCCL
// transport's own step (ncclCommInitRank) needs GPUs and is tested there.
type rosterBackend struct {
	name string
	mu   sync.Mutex
	got  map[string]*transport.GroupRoster
	dead []string
	fail error
	// isDefault describes it as the backend of groups that name none.
	isDefault bool
}

func newRosterBackend() *rosterBackend {
	return &rosterBackend{name: "grp", got: map[string]*transport.GroupRoster{}}
}

func (b *rosterBackend) Describe() transport.Descriptor {
	return transport.Descriptor{Name: b.name, Devices: []transport.DeviceType{transport.DeviceCUDA}, GroupBackend: b.isDefault}
}
func (b *rosterBackend) ExtractMetadata(transport.ObjectID, []transport.Tensor) ([]byte, error) {
	return nil, nil
}
func (b *rosterBackend) CommunicatorMetadata(*transport.Transfer) ([]byte, error) { return nil, nil }
func (b *rosterBackend) Send(*transport.Transfer, []transport.Tensor, []byte, []byte) error {
	return nil
}
func (b *rosterBackend) Fetch(*transport.Transfer, []transport.Tensor, []byte, []byte) (transport.Request, error) {
	return nil, transport.Errorf(transport.ErrUnsupported, "no")
}
func (b *rosterBackend) GarbageCollect(transport.ObjectID, []transport.Tensor, []byte) {}
func (b *rosterBackend) Abort(*transport.Transfer, transport.Request)                  {}
func (b *rosterBackend) Close() error                                                  { return nil }

func (b *rosterBackend) NewGroupBootstrap(spec transport.GroupSpec) ([]byte, error) {
	return []byte(fmt.Sprintf("boot-%s-%d", spec.Name, transport.RandomUint64())), nil
}

func (b *rosterBackend) InitGroup(ctx context.Context, r *transport.GroupRoster, spec transport.GroupSpec) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fail != nil {
		return b.fail
	}
	b.got[r.Name] = r
	return nil
}

func (b *rosterBackend) DestroyGroup(name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.got, name)
	b.dead = append(b.dead, name)
	return nil
}

func (b *rosterBackend) roster(name string) *transport.GroupRoster {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.got[name]
}

func groupRuntimes(t *testing.T, n int, sockets bool) ([]*Runtime, []*rosterBackend) {
	rts := make([]*Runtime, n)
	bs := make([]*rosterBackend, n)
	dir := t.TempDir()
	for i := range rts {
		bs[i] = newRosterBackend()
		b := bs[i]
		rts[i] = newRuntime(t, fmt.Sprintf("r%d", i), func(o *Options) {
			if sockets {
				o.Network, o.SocketDir = control.Sockets{}, dir
			}
			o.Builtins = []transport.TransportFactory{{Name: "grp", New: func(transport.Host) (transport.Transport, error) { return b, nil }}}
		})
	}
	return rts, bs
}

func spec(name string, world, rank int, rank0 *Runtime) transport.GroupSpec {
	s := transport.GroupSpec{Name: name, WorldSize: world, Rank: rank, Backend: "grp"}
	if rank0 != nil {
		s.Rank0 = rank0.Address()
	}
	return s
}

func formGroup(t *testing.T, rts []*Runtime, name string, timeout time.Duration) []error {
	errs := make([]error, len(rts))
	var wg sync.WaitGroup
	// The other ranks start first: they wait for rank 0 to create it.
	for i := len(rts) - 1; i >= 0; i-- {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = rts[i].CreateGroup(spec(name, len(rts), i, rts[0]), timeout)
		}()
		if i == 1 {
			time.Sleep(30 * time.Millisecond)
		}
	}
	wg.Wait()
	return errs
}

func testGroupForms(t *testing.T, sockets bool) {
	rts, bs := groupRuntimes(t, 3, sockets)
	for i, err := range formGroup(t, rts, "g1", 10*time.Second) {
		require.NoError(t, err, "rank %d", i)
	}
	r0 := bs[0].roster("g1")
	require.NotNil(t, r0)
	require.Equal(t, 3, r0.WorldSize())
	for i, b := range bs {
		r := b.roster("g1")
		require.NotNil(t, r, "rank %d", i)
		assert.Equal(t, r0.Instance, r.Instance)
		assert.Equal(t, r0.Bootstrap, r.Bootstrap, "every rank gets rank 0's bootstrap bytes")
		assert.Equal(t, i, r.RankOf(rts[i].ID()))
		for j, m := range r.Members {
			assert.Equal(t, rts[j].ID(), m.Runtime)
			assert.Equal(t, rts[j].Address(), m.Address)
		}
	}
	assert.Equal(t, []string{"g1"}, rts[2].GroupNames())

	// A second create of the same name is refused; destroy frees the name.
	err := rts[1].CreateGroup(spec("g1", 3, 1, rts[0]), time.Second)
	assert.Equal(t, transport.ErrAlreadyExists, transport.StatusOf(err), "%v", err)
	for i, rt := range rts {
		require.NoError(t, rt.DestroyGroup("g1"), "rank %d", i)
		assert.Equal(t, []string{"g1"}, bs[i].dead)
	}
	err = rts[0].DestroyGroup("g1")
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err))
	assert.Contains(t, err.Error(), `no group "g1"`)
	for i, err := range formGroup(t, rts, "g1", 10*time.Second) {
		require.NoError(t, err, "re-created, rank %d", i)
	}
	assert.NotEqual(t, r0.Instance, bs[1].roster("g1").Instance, "a re-created group is a new instance")
}

func TestGroupFormsInProcess(t *testing.T)   { testGroupForms(t, false) }
func TestGroupFormsOverSockets(t *testing.T) { testGroupForms(t, true) }

func TestGroupOfOne(t *testing.T) {
	rts, bs := groupRuntimes(t, 1, false)
	require.NoError(t, rts[0].CreateGroup(spec("solo", 1, 0, nil), time.Second))
	require.Equal(t, 1, bs[0].roster("solo").WorldSize())
}

func TestGroupArgumentErrors(t *testing.T) {
	rts, _ := groupRuntimes(t, 1, false)
	rt := rts[0]
	for _, c := range []struct {
		spec    transport.GroupSpec
		timeout time.Duration
		st      transport.Status
		text    string
	}{
		{spec("g", 0, 0, nil), time.Second, transport.ErrInvalidArgument, "world size 0"},
		{spec("g", -3, 0, nil), time.Second, transport.ErrInvalidArgument, "world size -3"},
		{spec("g", transport.MaxGroupSize+1, 0, nil), time.Second, transport.ErrInvalidArgument, "world size"},
		{spec("g", 2, 2, nil), time.Second, transport.ErrInvalidArgument, "rank 2 is outside 0..1"},
		{spec("g", 2, -1, nil), time.Second, transport.ErrInvalidArgument, "rank -1"},
		{spec("g", 2, 1, nil), time.Second, transport.ErrInvalidArgument, "address of rank 0"},
		{spec("", 1, 0, nil), time.Second, transport.ErrInvalidArgument, "group name"},
		{spec("bad name", 1, 0, nil), time.Second, transport.ErrInvalidArgument, "group name"},
		{spec("g", 1, 0, nil), 0, transport.ErrInvalidArgument, "timeout of 0"},
		{transport.GroupSpec{Name: "g", WorldSize: 1, Device: -1, Backend: "grp"}, time.Second, transport.ErrInvalidArgument, "device -1"},
		{transport.GroupSpec{Name: "g", WorldSize: 1, Backend: "nccl"}, time.Second, transport.ErrUnsupported, "transport nccl is not available"},
		{transport.GroupSpec{Name: "g", WorldSize: 1}, time.Second, transport.ErrUnsupported, "no transport in this runtime forms groups"},
		{transport.GroupSpec{Name: "g", WorldSize: 1, Backend: "bad name"}, time.Second, transport.ErrInvalidArgument, "transport name"},
	} {
		err := rt.CreateGroup(c.spec, c.timeout)
		require.Error(t, err, "%+v", c.spec)
		assert.Equal(t, c.st, transport.StatusOf(err), "%+v: %v", c.spec, err)
		assert.Contains(t, err.Error(), c.text)
	}
	assert.Empty(t, rt.GroupNames())
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(rt.DestroyGroup("")))
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(rt.DestroyGroup("nope")))
}

func TestGroupWithoutBackendSupport(t *testing.T) {
	rt := newRuntime(t, "r", func(o *Options) {
		o.Builtins = []transport.TransportFactory{{Name: "mem", New: func(transport.Host) (transport.Transport, error) { return newMemTransport("mem"), nil }}}
	})
	err := rt.CreateGroup(transport.GroupSpec{Name: "g", WorldSize: 1, Backend: "mem"}, time.Second)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "does not form groups")
}

func TestGroupMismatchAndTakenRank(t *testing.T) {
	rts, _ := groupRuntimes(t, 3, true)
	done := make(chan error, 1)
	go func() { done <- rts[0].CreateGroup(spec("g", 3, 0, nil), 5*time.Second) }()

	err := rts[1].CreateGroup(spec("g", 4, 1, rts[0]), 5*time.Second)
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "world size 3 on rank 0, not 4")

	joined := make(chan error, 1)
	go func() { joined <- rts[1].CreateGroup(spec("g", 3, 1, rts[0]), 5*time.Second) }()
	require.Eventually(t, func() bool {
		rts[0].grp.mu.Lock()
		defer rts[0].grp.mu.Unlock()
		return rts[0].grp.m["g"].joined == 2
	}, 5*time.Second, time.Millisecond)
	err = rts[2].CreateGroup(spec("g", 3, 1, rts[0]), 5*time.Second)
	assert.Equal(t, transport.ErrAlreadyExists, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "rank 1 was already taken by r1")

	require.NoError(t, rts[2].CreateGroup(spec("g", 3, 2, rts[0]), 5*time.Second))
	require.NoError(t, <-joined)
	require.NoError(t, <-done)
}

func TestGroupTimeouts(t *testing.T) {
	rts, _ := groupRuntimes(t, 2, true)
	start := time.Now()
	err := rts[0].CreateGroup(spec("g", 3, 0, nil), 200*time.Millisecond)
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "ranks [1 2] of 3 did not join")
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Empty(t, rts[0].GroupNames())

	// No rank 0 at all: the joiner retries until its deadline.
	err = rts[1].CreateGroup(spec("h", 2, 1, rts[0]), 200*time.Millisecond)
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "did not accept rank 1")

	// A joiner that gave up frees its rank: a later one takes it.
	go func() {
		time.Sleep(300 * time.Millisecond)
		rts[0].CreateGroup(spec("k", 2, 0, nil), 5*time.Second)
	}()
	require.NoError(t, rts[1].CreateGroup(spec("k", 2, 1, rts[0]), 5*time.Second))
}

func TestGroupBackendFailure(t *testing.T) {
	rts, bs := groupRuntimes(t, 2, false)
	bs[1].fail = transport.Errorf(transport.ErrTransport, "init exploded")
	errs := formGroup(t, rts, "g", 5*time.Second)
	require.NoError(t, errs[0])
	require.Error(t, errs[1])
	assert.Contains(t, errs[1].Error(), "init exploded")
	assert.Contains(t, errs[1].Error(), "rank 1 of 2")
	assert.Empty(t, rts[1].GroupNames(), "a failed rank keeps no group")
}

func TestRosterCodec(t *testing.T) {
	r := &transport.GroupRoster{Name: "g:1", Backend: "nccl", Instance: 42, Bootstrap: bytes.Repeat([]byte{7}, 128),
		Members: []transport.GroupMember{{Runtime: transport.ID{1}, Name: "a", Address: "unix:///a"}, {Runtime: transport.ID{2}, Name: "b", Address: "tcp://h:1"}}}
	got, err := decodeRoster(encodeRoster(r))
	require.NoError(t, err)
	assert.Equal(t, r, got)
	b := encodeRoster(r)
	for i := 0; i < len(b); i++ {
		_, err := decodeRoster(b[:i])
		assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "truncated at %d", i)
	}
	dup := *r
	dup.Members = []transport.GroupMember{r.Members[0], r.Members[0]}
	_, err = decodeRoster(encodeRoster(&dup))
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err))
}

func FuzzDecodeRoster(f *testing.F) {
	f.Add(encodeRoster(&transport.GroupRoster{Name: "g", Backend: "nccl", Instance: 1, Bootstrap: make([]byte, 128),
		Members: []transport.GroupMember{{Runtime: transport.ID{1}, Name: "a", Address: "unix:///a"}}}))
	f.Add([]byte{1, 'g', 4, 'n', 'c', 'c', 'l'})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRoster(b)
		if err != nil {
			if transport.StatusOf(err) != transport.ErrCorrupt {
				t.Fatalf("status %v: %v", transport.StatusOf(err), err)
			}
			return
		}
		again, err := decodeRoster(encodeRoster(r))
		if err != nil || again.Instance != r.Instance || len(again.Members) != len(r.Members) {
			t.Fatalf("re-encoding a decoded roster: %v", err)
		}
	})
}
