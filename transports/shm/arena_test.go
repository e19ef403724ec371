package shm

import (
	"bufio"
	"context"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// stopServing closes the segment server (listener and served connections)
// but keeps the arena, so that a fetch that still works asked nothing.
func (t *Transport) stopServing() {
	t.srv.mu.Lock()
	ln := t.srv.ln
	t.srv.ln = nil
	for c := range t.srv.conns {
		transport.CloseWaking(c)
	}
	t.srv.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	t.srv.serving.Wait()
}

func arenaOf(t *testing.T, meta []byte) *metadata {
	m, err := decodeMetadata(meta)
	require.NoError(t, err)
	return m
}

// Small and mid-size objects are staged in the arena; once a receiver has
// mapped it, it reads them, and objects staged later, without the
// segment server.
func TestArenaObjectsAreReadWithoutAsking(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	shapes := [][]int{{4096}, {1 << 20}, {1, 100, 0, 3000, 7}}
	var metas [][]byte
	var wants [][][]byte
	for i, sizes := range shapes {
		meta, want := stageObject(t, src, byte(i+1), sizes...)
		require.True(t, arenaOf(t, meta).inArena(), "shape %v", sizes)
		for j := range want {
			if want[j] == nil {
				want[j] = []byte{} // as a fetch makes an empty target
			}
		}
		metas, wants = append(metas, meta), append(wants, want)
	}
	fetched(t, dst, metas[0], wants[0]) // maps the arena
	later, laterWant := stageObject(t, src, 9, 5000)
	src.stopServing()
	for i, sizes := range shapes {
		got, err := fetch(t, dst, metas[i], sizes...)
		require.NoError(t, err, "shape %v", sizes)
		assert.Equal(t, wants[i], got, "shape %v", sizes)
	}
	fetched(t, dst, later, laterWant)
}

// A freed object is NOT_FOUND though the receiver maps the arena, also
// once another object took its range; that one arrives intact.
func TestArenaFreedObjectIsNotFound(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	meta, want := stageObject(t, src, 1, 4096)
	fetched(t, dst, meta, want)
	src.GarbageCollect(transport.ObjectID{1}, nil, meta)
	_, err := fetch(t, dst, meta, 4096)
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "%v", err)
	again, againWant := stageObject(t, src, 2, 4096)
	assert.Equal(t, arenaOf(t, meta).Base, arenaOf(t, again).Base, "the range is reused")
	_, err = fetch(t, dst, meta, 4096)
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "%v", err)
	fetched(t, dst, again, againWant)
}

// An owner whose transport closed retired every slot: PEER_UNAVAILABLE.
func TestArenaOwnerClosedIsPeerUnavailable(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	meta, _ := stageObject(t, src, 1, 4096)
	_, err := fetch(t, dst, meta, 4096)
	require.NoError(t, err)
	require.NoError(t, src.Close())
	_, err = fetch(t, dst, meta, 4096)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
}

// Metadata that misplaces an object of the arena is refused, never read
// out of bounds.
func TestArenaMisplacedObjectIsCorrupt(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	meta, _ := stageObject(t, src, 1, 4096)
	_, err := fetch(t, dst, meta, 4096)
	require.NoError(t, err)
	for name, mut := range map[string]func(m *metadata){
		"another tag":      func(m *metadata) { m.Tag++ },
		"another slot":     func(m *metadata) { m.Slot++ },
		"beyond the arena": func(m *metadata) { m.Base = src.srv.arenaBytes - 64 },
	} {
		m := arenaOf(t, meta)
		mut(m)
		_, err := fetch(t, dst, m.encode(), 4096)
		assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%s: %v", name, err)
	}
	m := arenaOf(t, meta)
	m.Arena = transport.ObjectID{0xba, 0xd}
	_, err = fetch(t, dst, m.encode(), 4096)
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "an arena the owner does not have: %v", err)
}

// smallArena is a host whose arena is 1 MiB.
type smallArena struct{ transport.Host }

func (h smallArena) Settings() transport.Settings {
	return transport.NewSettings(map[string]string{arenaSetting.Name: "1"})
}

// Objects that do not fit get segments of their own; freed room is used
// again.
func TestArenaFullFallsBackToSegments(t *testing.T) {
	tr, err := New(smallArena{transporttest.NewHostIn(socketDir(t))})
	require.NoError(t, err)
	t.Cleanup(func() { tr.Close() })
	src, dst := tr.(*Transport), newTransport(t)
	const size = 300 << 10
	var metas [][]byte
	var inArena []bool
	for i := 0; i < 4; i++ {
		meta, want := stageObject(t, src, byte(i+1), size)
		metas = append(metas, meta)
		inArena = append(inArena, arenaOf(t, meta).inArena())
		fetched(t, dst, meta, want)
	}
	assert.Equal(t, []bool{true, true, true, false}, inArena)
	src.GarbageCollect(transport.ObjectID{2}, nil, metas[1])
	meta, want := stageObject(t, src, 9, size)
	assert.True(t, arenaOf(t, meta).inArena())
	fetched(t, dst, meta, want)
}

func TestArenaAllocator(t *testing.T) {
	a, err := newArena(arenaTable + 4096)
	require.NoError(t, err)
	defer a.close()
	s1, t1, o1, ok := a.alloc(1000)
	require.True(t, ok)
	s2, t2, o2, ok := a.alloc(1000)
	require.True(t, ok)
	_, _, o3, ok := a.alloc(2000)
	require.True(t, ok)
	assert.Equal(t, []uint64{arenaTable, arenaTable + 1024, arenaTable + 2048}, []uint64{o1, o2, o3})
	assert.NotEqual(t, t1, t2)
	assert.NotEqual(t, s1, s2)
	_, _, _, ok = a.alloc(100)
	assert.False(t, ok, "full")
	a.release(s1, o1, 1000)
	a.release(s2, o2, 1000)
	assert.Equal(t, []span{{arenaTable, 2048}}, a.free, "neighbours join")
	_, t4, o4, ok := a.alloc(2048)
	require.True(t, ok)
	assert.Equal(t, o1, o4)
	assert.Greater(t, t4, t2, "tags are never given twice")
}

// PeerGone unmaps the source's arena with its connections.
func TestPeerGoneUnmapsTheArena(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	meta, _ := stageObject(t, src, 1, 4096)
	_, err := fetch(t, dst, meta, 4096)
	require.NoError(t, err)
	kept, err := dst.peers.record(transport.PeerInfo{RuntimeID: sourceRuntime})
	require.NoError(t, err)
	v := dst.peers.mappedArena(kept, arenaOf(t, meta).Arena)
	require.NotNil(t, v)
	dst.PeerGone(transport.PeerInfo{RuntimeID: sourceRuntime})
	assert.Nil(t, v.mem)
	got, err := fetch(t, dst, meta, 4096) // mapped again
	require.NoError(t, err)
	assert.Len(t, got, 1)
}

const arenaTestRole = "RDT_SHM_ARENA_TEST_ROLE"

// A receiver that mapped the arena of a process that then died reads
// nothing more from it: PEER_UNAVAILABLE, though the mapping still holds
// the bytes and the tags.
func TestArenaOfAKilledSourceIsPeerUnavailable(t *testing.T) {
	if os.Getenv(arenaTestRole) == "source" {
		src := newTransport(t)
		meta, _ := stageObject(t, src, 7, 4096)
		os.Stdout.WriteString("META " + hex.EncodeToString(meta) + "\n")
		io.Copy(io.Discard, os.Stdin)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), arenaTestRole+"=source")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var meta []byte
	for lines := bufio.NewScanner(stdout); lines.Scan(); {
		if h, ok := strings.CutPrefix(lines.Text(), "META "); ok {
			meta, err = hex.DecodeString(h)
			require.NoError(t, err)
			break
		}
	}
	require.NotNil(t, meta, "the source printed no metadata")
	dst := newTransport(t)
	want := make([]byte, 4096)
	transporttest.Fill(want, 7)
	got, err := fetchFrom(t, dst, meta, cmd.Process.Pid, 4096)
	require.NoError(t, err)
	assert.Equal(t, [][]byte{want}, got)
	require.NoError(t, cmd.Process.Kill())
	cmd.Wait()
	_, err = fetchFrom(t, dst, meta, cmd.Process.Pid, 4096)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
}

// A fetch whose source record was dropped while it ran (pruned as empty by
// another source's first fetch, or the source reported gone) still gets
// the object, and keeps no mapping in a record nobody will close.
func TestArenaMappedForADroppedRecordIsNotKept(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	meta, want := stageObject(t, src, 1, 4096)
	dropped := &keptConns{peer: sourceRuntime, arenas: map[transport.ObjectID]*arenaView{}}
	got, target := transporttest.Buffer(t, 4096)
	r := &request{Completion: transport.NewCompletion()}
	require.NoError(t, dst.rcv.fetchFromArena(r, dropped, os.Getpid(), arenaOf(t, meta), []transport.Tensor{target}))
	assert.Equal(t, want[0], got)
	assert.Empty(t, dropped.arenas)
}

// The arena's descriptor a receiver gets is read-only and sealed against
// resizing: it can neither write the owner's objects nor make a mapping
// fault.
func TestArenaDescriptorIsReadOnlyAndSealed(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	meta, _ := stageObject(t, src, 1, 4096)
	m := arenaOf(t, meta)
	kept, err := dst.peers.record(transport.PeerInfo{RuntimeID: sourceRuntime})
	require.NoError(t, err)
	a, err := dst.rcv.getSegment(nil, kept, os.Getpid(), &metadata{Path: m.Path, Object: m.Arena, askArena: true}, nil, false)
	require.NoError(t, err)
	require.GreaterOrEqual(t, a.fd, 0)
	defer unix.Close(a.fd)
	assert.Equal(t, src.srv.arenaBytes, a.size)
	_, err = unix.Mmap(a.fd, 0, int(a.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	assert.Error(t, err, "a writable shared mapping is refused")
	assert.Error(t, unix.Ftruncate(a.fd, 1), "shrinking is refused")
	_, err = unix.Pwrite(a.fd, []byte{1}, arenaTable)
	assert.Error(t, err, "writing is refused")
}
