package multiprocess

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

// stallWriteFactory makes "stallwrite": a transport whose writes never end
// until aborted, so that a test can kill a writer with its write surely
// open.
func stallWriteFactory() transport.TransportFactory {
	return transport.TransportFactory{Name: "stallwrite", New: func(h transport.Host) (transport.Transport, error) {
		return stallWrite{}, nil
	}}
}

type stallWrite struct{}

func (stallWrite) Describe() transport.Descriptor {
	return transport.Descriptor{Name: "stallwrite", Devices: []transport.DeviceType{transport.DeviceCPU}, OneSided: true, CanAbort: true, Writes: true}
}
func (stallWrite) Close() error { return nil }
func (stallWrite) ExtractMetadata(transport.ObjectID, []transport.Tensor) ([]byte, error) {
	return []byte("stall"), nil
}
func (stallWrite) CommunicatorMetadata(*transport.Transfer) ([]byte, error)      { return nil, nil }
func (stallWrite) GarbageCollect(transport.ObjectID, []transport.Tensor, []byte) {}
func (stallWrite) Fetch(*transport.Transfer, []transport.Tensor, []byte, []byte) (transport.Request, error) {
	return nil, transport.Errorf(transport.ErrUnsupported, "stallwrite only writes")
}
func (stallWrite) Write(*transport.Transfer, []transport.Tensor, []byte, []byte) (transport.Request, error) {
	return transport.NewCompletion(), nil // finished by Abort only
}
func (stallWrite) Abort(x *transport.Transfer, req transport.Request) {
	if c, ok := req.(*transport.Completion); ok && !c.Completed() {
		c.Finish(transport.Errorf(transport.ErrAborted, "stallwrite aborted"))
	}
}

// exposeIn exposes one zeroed buffer of n bytes in rt over transportName.
func exposeIn(t *testing.T, rt *engine.Runtime, n int, transportName string) (*engine.Ref, []byte) {
	t.Helper()
	buf := hostMem(n)
	t.Cleanup(func() { freeMem(buf) })
	ref, err := rt.Expose([]transport.Tensor{tensorOver(buf)}, transportName, nil)
	require.NoError(t, err)
	t.Cleanup(func() { ref.Release() })
	return ref, buf
}

// startWriteLoop starts a writer process that writes into exposed as req
// says (a "write_loop" of exposed's ref).
func startWriteLoop(t *testing.T, exposed *engine.Ref, req request) *child {
	t.Helper()
	b, err := exposed.Serialize()
	require.NoError(t, err)
	w := startChild(t, runtimeConfig{Name: "writer"})
	req.Op, req.Refs = "write_loop", []string{enc(b)}
	require.Empty(t, w.call(req).Error)
	return w
}

// laterNotices takes the notices of writes into exposed that come, each
// within wait of the one before, until none does.
func laterNotices(t *testing.T, exposed *engine.Ref, wait time.Duration) []engine.WriteNotice {
	t.Helper()
	var notices []engine.WriteNotice
	for {
		n, err := exposed.WaitWriteNotice(wait)
		if transport.StatusOf(err) == transport.ErrTimeout {
			return notices
		}
		require.NoError(t, err)
		notices = append(notices, n)
	}
}

func waitOpenWrites(t *testing.T, rt *engine.Runtime, want uint64) {
	t.Helper()
	require.Eventually(t, func() bool { return rt.Stats().WritesOpen == want }, 60*time.Second, time.Millisecond,
		"the owner has %d writes open", want)
}

// A writer killed with its write open leaves the owner a failure notice
// for that write (its tag, PEER_UNAVAILABLE), never a success, and the
// object unpinned.
func TestWriterKilledWithItsWriteOpenTearsIt(t *testing.T) {
	owner := parentRuntime(t, runtimeConfig{Name: "owner"})
	exposed, _ := exposeIn(t, owner, 4096, "stallwrite")
	w := startWriteLoop(t, exposed, request{Sizes: []int{4096}, Seed: 1, Count: 1})
	waitOpenWrites(t, owner, 1)
	_, err := exposed.WaitWriteNotice(0)
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "no notice while the write is open")

	w.kill()
	n, err := exposed.WaitWriteNotice(60 * time.Second)
	require.NoError(t, err)
	require.Error(t, n.Err, "a writer killed mid-write is never a success")
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(n.Err), "%v", n.Err)
	assert.Contains(t, n.Err.Error(), "torn")
	assert.Equal(t, uint64(1), n.Tag)
	assert.Zero(t, owner.Stats().WritesOpen)
}

// Real writes (cma, shm, tcp), one after another, until the writer is killed: every
// notice before the last is a success; a failure can only be the last,
// for the write after the last success; and nothing stays open.
// writingTransports are the transports these tests write over: nixl's
// subtests skip, saying why, where NIXL does not load.
var writingTransports = []string{"cma", "shm", "tcp", "nixl"}

// forEachWriter runs test as a subtest over each of writingTransports.
func forEachWriter(t *testing.T, test func(t *testing.T, transportName string)) {
	for _, name := range writingTransports {
		t.Run(name, func(t *testing.T) {
			if name == "nixl" {
				requireNIXL(t)
			}
			test(t, name)
		})
	}
}

func TestWriterKilledAmidWrites(t *testing.T) {
	forEachWriter(t, writerKilledAmidWrites)
}

func writerKilledAmidWrites(t *testing.T, transportName string) {
	owner := parentRuntime(t, runtimeConfig{Name: "owner"})
	const size = 32 << 20
	exposed, buf := exposeIn(t, owner, size, transportName)
	w := startWriteLoop(t, exposed, request{Sizes: []int{size}, Seed: 5})

	first, err := exposed.WaitWriteNotice(60 * time.Second)
	require.NoError(t, err)
	require.NoError(t, first.Err)
	assert.Equal(t, uint64(1), first.Tag)
	waitOpenWrites(t, owner, 1) // a write is under way, or its admission stands for the next
	w.kill()
	waitOpenWrites(t, owner, 0) // the killed writer's write is closed

	last := first
	for _, n := range laterNotices(t, exposed, 0) {
		require.NoError(t, last.Err, "a failure notice is the last one")
		assert.Equal(t, last.Tag+1, n.Tag, "notices come in the order of the writes")
		if n.Err != nil {
			assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(n.Err), "%v", n.Err)
		}
		last = n
	}
	if last.Err == nil {
		// Killed between two writes: the last notice's version is whole.
		want := make([]byte, size)
		for j := range want {
			want[j] = patternByte(5, 0, j) + byte(last.Tag)
		}
		assert.True(t, bytes.Equal(want, buf), "the buffer holds version %d exactly", last.Tag)
	}
}

// An owner killed while a large write lands in it fails the write
// (PEER_UNAVAILABLE), promptly, and later writes fail the same way.
func TestOwnerKilledWhileBeingWritten(t *testing.T) {
	forEachWriter(t, ownerKilledWhileBeingWritten)
}

func ownerKilledWhileBeingWritten(t *testing.T, transportName string) {
	writer := parentRuntime(t, runtimeConfig{Name: "writer"})
	o := startChild(t, runtimeConfig{Name: "owner"})
	const size = 256 << 20
	r := o.call(request{Op: "expose", Sizes: []int{size}, Transport: transportName})
	require.Empty(t, r.Error)
	ref, err := writer.Deserialize(dec(r.Refs[0]))
	require.NoError(t, err)
	defer ref.Release()
	src := hostMem(size)
	defer freeMem(src)
	for i := range src {
		src[i] = byte(i)
	}
	require.NoError(t, writer.Write([]*engine.Ref{ref}, []transport.Tensor{tensorOver(src)}, engine.WriteOptions{Tag: 1}, time.Minute))

	f, err := writer.StartWrite([]*engine.Ref{ref}, []transport.Tensor{tensorOver(src)}, engine.WriteOptions{Tag: 2})
	require.NoError(t, err)
	defer f.Free()
	o.kill()
	if err := f.Wait(time.Minute); err != nil { // it may have finished before the kill
		assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
	}
	err = writer.Write([]*engine.Ref{ref}, []transport.Tensor{tensorOver(src)}, engine.WriteOptions{Tag: 3}, time.Minute)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
}

// Writes under deadlines from far too short to ample, over each built-in
// transport that writes: whatever each ended in, the writer's result and
// the owner's notice say the same (a write never admitted has no notice,
// and one that succeeded always has one).
func TestWriteOutcomeAgreesAtEveryDeadline(t *testing.T) {
	forEachWriter(t, writeOutcomeAgrees)
}

func writeOutcomeAgrees(t *testing.T, transportName string) {
	owner := parentRuntime(t, runtimeConfig{Name: "owner"})
	writer := parentRuntime(t, runtimeConfig{Name: "writer"})
	const size = 64 << 20
	dst, src := hostMem(size), hostMem(size)
	defer freeMem(dst)
	defer freeMem(src)
	exposed, err := owner.Expose([]transport.Tensor{tensorOver(dst)}, transportName, nil)
	require.NoError(t, err)
	defer exposed.Release()
	b, err := exposed.Serialize()
	require.NoError(t, err)
	ref, err := writer.Deserialize(b)
	require.NoError(t, err)
	defer ref.Release()

	deadlines := []time.Duration{200 * time.Microsecond, 500 * time.Microsecond, time.Millisecond, 2 * time.Millisecond,
		3 * time.Millisecond, 5 * time.Millisecond, 8 * time.Millisecond, 13 * time.Millisecond, 21 * time.Millisecond, time.Minute}
	results := map[uint64]error{}
	for i, d := range deadlines {
		tag := uint64(i + 1)
		results[tag] = writer.Write([]*engine.Ref{ref}, []transport.Tensor{tensorOver(src)}, engine.WriteOptions{Tag: tag}, d)
	}
	require.NoError(t, results[uint64(len(deadlines))], "the write with time enough succeeds")
	if !assert.Eventually(t, func() bool { return owner.Stats().WritesOpen == 0 }, 30*time.Second, time.Millisecond) {
		for tag, e := range results {
			t.Logf("tag %d: %v", tag, e)
		}
		t.Logf("writer %+v owner %+v", writer.Stats(), owner.Stats())
	}
	noticed := map[uint64]bool{}
	for _, n := range laterNotices(t, exposed, time.Second) {
		require.False(t, noticed[n.Tag], "one notice per write (tag %d)", n.Tag)
		noticed[n.Tag] = true
		werr, ok := results[n.Tag]
		require.True(t, ok, "a notice for tag %d, which no write had", n.Tag)
		assert.Equal(t, werr == nil, n.Err == nil, "tag %d: the writer got %v, the owner's notice %v", n.Tag, werr, n.Err)
	}
	for tag, werr := range results {
		if werr == nil {
			assert.True(t, noticed[tag], "tag %d succeeded without a notice", tag)
		}
	}
}
