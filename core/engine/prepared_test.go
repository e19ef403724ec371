package engine

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

// prepareShared shares n buffers of the owner with the borrower and
// prepares their fetch into new targets; the test closes it.
func prepareShared(t *testing.T, p *pair, n int) (pf *Prepared, refs []*Ref, src, dst []*hostBuf) {
	t.Helper()
	refs, targets, src, dst := p.shareToFetch(t, n, 4096)
	pf, err := p.borrower.PrepareFetch(refs, targets, FetchOptions{})
	require.NoError(t, err)
	return pf, refs, src, dst
}

// A prepared fetch runs like Get each time, and after the first run it
// starts the kept transfers without a start phase: the owner is not asked
// again, and the bytes of each run are the source's at that run.
func TestPreparedFetchRunsAgainWithoutAStartPhase(t *testing.T) {
	p := newPair(t, nil)
	pf, _, src, dst := prepareShared(t, p, 3)
	defer pf.Close()
	assert.False(t, pf.Kept(), "nothing is kept before the first run")
	for run := 0; run < 5; run++ {
		for i := range src {
			src[i].fill(byte(10*run + i))
		}
		require.NoError(t, pf.Run(0, 5*time.Second))
		for i := range src {
			assert.True(t, bytes.Equal(src[i].b, dst[i].b), "run %d, tensor %d", run, i)
		}
		assert.True(t, pf.Kept())
	}
	assert.Equal(t, int64(15), p.dst.fetched.Load(), "one fetch per ref per run")
	assert.Equal(t, int64(15), p.dst.released.Load(), "every request released")
	s := p.borrower.Stats()
	assert.Equal(t, uint64(15), s.TransfersCompleted)
	assert.Equal(t, uint64(15*4096), s.BytesReceived)
}

// The prepared holds its own handles: the caller may release its refs, and
// the objects stay borrowed (the owner keeps them) until Close.
func TestPreparedFetchHoldsItsRefsUntilClose(t *testing.T) {
	p := newPair(t, nil)
	pf, refs, src, dst := prepareShared(t, p, 1)
	require.NoError(t, refs[0].Release())
	require.NoError(t, pf.Run(0, 5*time.Second))
	require.NoError(t, pf.Run(0, 5*time.Second))
	assert.True(t, bytes.Equal(src[0].b, dst[0].b))
	assert.Zero(t, p.owner.Stats().ObjectsFreed, "still borrowed")
	pf.Close()
	require.Eventually(t, func() bool { return p.owner.Stats().ObjectsFreed == 1 }, 10*time.Second, time.Millisecond,
		"the owner frees the object once the prepared fetch let go")
	err := pf.Run(0, time.Second)
	assert.Equal(t, transport.ErrClosed, transport.StatusOf(err), "%v", err)
	pf.Close() // twice is harmless
}

// A kept transfer that fails fails the run, and the next run starts it
// again (the failure is not sticky); a deadline aborts a run that waits.
func TestPreparedFetchFailuresAndDeadline(t *testing.T) {
	gate := make(chan struct{})
	p := newPair(t, nil)
	pf, _, _, _ := prepareShared(t, p, 1)
	defer pf.Close()
	require.NoError(t, pf.Run(0, 5*time.Second))

	p.dst.failFetchIdx = int(p.dst.fetched.Load()) + 1
	err := pf.Run(0, 5*time.Second)
	assert.Equal(t, transport.ErrTransport, transport.StatusOf(err), "%v", err)
	require.NoError(t, pf.Run(0, 5*time.Second), "the next run starts afresh")

	p.dst.gate = gate
	released := p.dst.released.Load()
	start := time.Now()
	err = pf.Run(0, 50*time.Millisecond)
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Equal(t, released+1, p.dst.released.Load(), "the aborted request was released before Run returned")
	assert.Equal(t, int64(1), p.dst.aborts.Load())
	p.dst.gate = nil
	require.NoError(t, pf.Run(0, 5*time.Second))
	assert.Equal(t, uint64(2), p.borrower.Stats().TransfersFailed, "the failure and the timeout are counted")
}

// A kept transfer whose owner is gone fails at once with PEER_UNAVAILABLE.
func TestPreparedFetchOwnerGone(t *testing.T) {
	p := newPair(t, nil)
	pf, _, _, _ := prepareShared(t, p, 1)
	defer pf.Close()
	require.NoError(t, pf.Run(0, 5*time.Second))
	fetched := p.dst.fetched.Load()
	p.owner.Destroy()
	require.Eventually(t, func() bool {
		return transport.StatusOf(pf.Run(0, time.Second)) == transport.ErrPeerUnavailable
	}, 10*time.Second, 5*time.Millisecond)
	assert.LessOrEqual(t, p.dst.fetched.Load()-fetched, int64(1), "nothing starts once the owner is known gone")
}

// The runtime's own object is copied the ordinary way each run.
func TestPreparedFetchOfOwnObjectIsNotKept(t *testing.T) {
	p := newPair(t, nil)
	buf := newHostBuf(t, 4096)
	buf.fill(7)
	ref, err := p.owner.Put([]transport.Tensor{tensorOf(t, buf)}, "mem", nil)
	require.NoError(t, err)
	defer ref.Release()
	out := newHostBuf(t, 4096)
	pf, err := p.owner.PrepareFetch([]*Ref{ref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{})
	require.NoError(t, err)
	defer pf.Close()
	for run := 0; run < 3; run++ {
		buf.fill(byte(run))
		require.NoError(t, pf.Run(0, 5*time.Second))
		assert.True(t, bytes.Equal(buf.b, out.b))
	}
	assert.False(t, pf.Kept())
}

// Bad arguments are refused at Prepare, as Get refuses them.
func TestPrepareRefusesWhatGetRefuses(t *testing.T) {
	p := newPair(t, nil)
	refs, src := p.share(t, 1, 4096, "mem")
	small := newHostBuf(t, 100)
	_, err := p.borrower.PrepareFetch(refs, []transport.Tensor{tensorOf(t, small)}, FetchOptions{})
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
	targets, _ := targetsFor(t, src)
	_, err = p.borrower.PrepareWrite(refs, targets, WriteOptions{})
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "a put object is not written: %v", err)
	_, err = p.owner.PrepareFetch(refs, targets, FetchOptions{})
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "another runtime's ref: %v", err)
}

// A prepared write is admitted each run with that run's tag: each run
// lands and makes its own notice, and a revoked object refuses the next.
func TestPreparedWriteNoticesEachRun(t *testing.T) {
	p := writablePair(t)
	owned, w, bufs := p.expose(t)
	src, sources := matrixAndBytes(t)
	pw, err := p.borrower.PrepareWrite([]*Ref{w}, sources, WriteOptions{})
	require.NoError(t, err)
	defer pw.Close()
	for tag := uint64(1); tag <= 4; tag++ {
		src[0].fill(byte(tag))
		src[1].fill(byte(tag + 100))
		require.NoError(t, pw.Run(tag, 5*time.Second))
		n := notice(t, owned, 5*time.Second)
		assert.NoError(t, n.Err)
		assert.Equal(t, tag, n.Tag)
		assert.True(t, bytes.Equal(src[0].b, bufs[0].b) && bytes.Equal(src[1].b, bufs[1].b), "run %d landed", tag)
		assert.True(t, pw.Kept(), "the first run that succeeds is kept")
	}
	assert.Equal(t, uint64(4), p.borrower.Stats().WritesCompleted)
	require.NoError(t, owned.RevokeWrites(5*time.Second))
	err = pw.Run(5, 5*time.Second)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	assert.Equal(t, uint64(1), p.borrower.Stats().WritesFailed)
	_, err = owned.WaitWriteNotice(0)
	assert.Error(t, err, "a refused write makes no notice")
	assert.Zero(t, p.owner.store.pinned(), "no write is left open")
}

// preparedWriter exposes the pair's buffers and prepares a write of new
// sources into them; the test closes it.
func preparedWriter(t *testing.T, p *pair) (owned *Ref, pw *Prepared, src []*hostBuf) {
	t.Helper()
	owned, w, _ := p.expose(t)
	src, sources := matrixAndBytes(t)
	pw, err := p.borrower.PrepareWrite([]*Ref{w}, sources, WriteOptions{})
	require.NoError(t, err)
	return owned, pw, src
}

// standingWriter is preparedWriter after two runs, its notices taken:
// the second run's standing admission is open, and no run is.
func standingWriter(t *testing.T, p *pair) (owned *Ref, pw *Prepared) {
	t.Helper()
	owned, pw, _ = preparedWriter(t, p)
	for tag := uint64(1); tag <= 2; tag++ {
		require.NoError(t, pw.Run(tag, 5*time.Second))
		notice(t, owned, 5*time.Second)
	}
	require.Len(t, standingKeys(t, owned), 1)
	return owned, pw
}

// standingKeys are the writes open into owned's object.
func standingKeys(t *testing.T, owned *Ref) []openKey {
	t.Helper()
	o, err := owned.exposureOf()
	require.NoError(t, err)
	o.write.mu.Lock()
	defer o.write.mu.Unlock()
	var keys []openKey
	for k, w := range o.write.open {
		assert.True(t, w.standing, "a kept run's write is a standing admission")
		keys = append(keys, k)
	}
	return keys
}

// Kept runs of a prepared write share one standing admission, the one its
// first (ordinary) run was granted: the owner admits once, each run still
// gets its own notice with its tag, and closing the Prepared closes the
// admission without a notice.
func TestPreparedWriteRunsUnderOneStandingAdmission(t *testing.T) {
	p := writablePair(t)
	owned, pw, src := preparedWriter(t, p)
	require.NoError(t, pw.Run(1, 5*time.Second)) // an ordinary write, kept
	n := notice(t, owned, 5*time.Second)
	require.Equal(t, uint64(1), n.Tag)
	first := standingKeys(t, owned)
	require.Len(t, first, 1, "the first run's admission stays open")

	for tag := uint64(2); tag <= 6; tag++ {
		src[1].fill(byte(tag))
		require.NoError(t, pw.Run(tag, 5*time.Second))
		keys := standingKeys(t, owned)
		require.Len(t, keys, 1, "one admission stays open between runs")
		assert.Equal(t, first, keys, "run %d asked for no new admission", tag)
		n := notice(t, owned, 5*time.Second)
		assert.NoError(t, n.Err)
		assert.Equal(t, tag, n.Tag)
		assert.Equal(t, uint64(64*16*4+100), n.Bytes)
	}
	assert.Equal(t, uint64(1), p.owner.Stats().WritesOpen)
	assert.Equal(t, 1, p.owner.store.pinned(), "the standing admission pins the object")

	pw.Close()
	assert.Empty(t, standingKeys(t, owned), "closing the Prepared closes its admission")
	assertNoNotice(t, owned, "a close between runs makes no notice")
	assert.Zero(t, p.owner.store.pinned())
}

// Revoking withdraws an idle standing admission: the writer closes it, the
// revocation returns, no notice is made, and the next run is refused.
func TestRevokeWithdrawsAStandingAdmission(t *testing.T) {
	p := writablePair(t)
	owned, pw := standingWriter(t, p)
	defer pw.Close()
	require.NoError(t, owned.RevokeWrites(5*time.Second), "the writer closes its admission when told")
	assert.Empty(t, standingKeys(t, owned))
	assertNoNotice(t, owned, "an admission closed between runs makes no notice")
	err := pw.Run(3, 5*time.Second)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	// The object is unpinned before the write leaves the open set, which
	// RevokeWrites waits on.
	assert.Zero(t, p.owner.store.pinned(), "the withdrawn admission unpins the object")
}

// A standing admission covers the runs whose notices the owner reserved:
// an owner that takes no notices refuses the run after the queue is full,
// every run that succeeded has its notice, in order, and taking a notice
// lets the next run in.
func TestStandingAdmissionsKeepNoticesBounded(t *testing.T) {
	p := writablePair(t)
	owned, pw, _ := preparedWriter(t, p)
	defer pw.Close()
	var err error
	runs := 0
	for ; runs <= maxPendingNotices; runs++ {
		if err = pw.Run(uint64(runs+1), 5*time.Second); err != nil {
			break
		}
	}
	assert.Equal(t, maxPendingNotices, runs, "every slot of the queue takes a run")
	assert.Equal(t, transport.ErrNoMemory, transport.StatusOf(err), "the run after is refused: %v", err)
	for i := 0; i < runs; i++ {
		n, err := owned.WaitWriteNotice(0)
		require.NoError(t, err, "notice %d", i)
		require.NoError(t, n.Err, "notice %d", i)
		require.Equal(t, uint64(i+1), n.Tag, "notices come in the order of the runs")
	}
	assertNoNotice(t, owned, "no other notice")
	for tag := uint64(10001); tag <= 10003; tag++ {
		require.NoError(t, pw.Run(tag, 5*time.Second), "room again: the next run is admitted")
		n := notice(t, owned, 5*time.Second)
		assert.Equal(t, tag, n.Tag)
	}
}

// A writer runtime destroyed between runs closes its standing admissions:
// the owner makes no torn notice for them.
func TestDestroyedWriterClosesItsStandingAdmissions(t *testing.T) {
	p := writablePair(t)
	owned, pw := standingWriter(t, p)
	p.borrower.Destroy()
	assert.Empty(t, standingKeys(t, owned))
	assertNoNotice(t, owned, "no torn notice for an idle admission")
	pw.Close()
}

// A writer gone between runs of a standing admission wrote nothing that
// has no notice: the admission closes without one, and the object is
// unpinned.
func TestWriterGoneBetweenRunsMakesNoNotice(t *testing.T) {
	p := writablePair(t)
	owned, pw := standingWriter(t, p)
	defer pw.Close()
	p.owner.svc.PeerGone(p.borrower.Identity())
	assert.Empty(t, standingKeys(t, owned))
	assertNoNotice(t, owned, "no run was under way")
	assert.Zero(t, p.owner.store.pinned())
}

// A writer gone in the middle of a run tears the standing admission: a
// failure notice with the tag the run was announced with.
func TestWriterGoneMidRunTearsItWithTheRunsTag(t *testing.T) {
	p := writablePair(t)
	owned, pw := standingWriter(t, p)
	defer pw.Close()
	keys := standingKeys(t, owned)
	require.Len(t, keys, 1)
	p.owner.svc.WriteRun(keys[0].writer, owned.Desc().ID, keys[0].id, 77)
	p.owner.svc.PeerGone(p.borrower.Identity())
	n := notice(t, owned, 5*time.Second)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(n.Err), "%v", n.Err)
	assert.Equal(t, uint64(77), n.Tag, "the torn notice names the run under way")
	assert.Empty(t, standingKeys(t, owned))
	assertNoNotice(t, owned, "one notice for the torn run")
	assert.Zero(t, p.owner.store.pinned())
}
