package engine

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

// How transfers end: writes of several ranges of one tensor, a panic at
// any stage of a fetch or a write, and one outcome for a write's caller
// and its owners.

// exposeMatrix exposes a float32 matrix of 64 rows of 16 elements (zeroed
// but for fill) in the owner and returns its ref, the writer's ref and the
// matrix.
func (p *pair) exposeMatrix(t *testing.T, fill byte) (owned, writable *Ref, buf *hostBuf) {
	buf = newHostBuf(t, 64*16*4)
	buf.fill(fill)
	owned, writable = p.exposeTensors(t, shaped(t, buf, f32, 64, 16))
	return owned, writable, buf
}

const matrixRow = 16 * 4

// rowsOf names rows [first, first+n) of tensor 0 of ref 0.
func rowsOf(first, n int) Range {
	return Range{Ref: 0, Piece: transport.Piece{Tensor: 0, Offset: uint64(first * matrixRow), Length: uint64(n * matrixRow)}}
}

func TestWriteOfSeveralRangesOfOneTensor(t *testing.T) {
	for _, local := range []bool{false, true} {
		t.Run(fmt.Sprintf("local=%v", local), func(t *testing.T) {
			p := writablePair(t)
			owned, w, buf := p.exposeMatrix(t, 0x55)
			writer := p.borrower
			if local {
				writer, w = p.owner, owned
			}
			before := append([]byte(nil), buf.b...)
			a, b := newHostBuf(t, 2*matrixRow), newHostBuf(t, 3*matrixRow)
			a.fill(0xA0)
			b.fill(0xB0)
			dests := []Range{rowsOf(10, 2), rowsOf(40, 3)}
			sources := []transport.Tensor{shaped(t, a, f32, 2, 16), shaped(t, b, f32, 3, 16)}
			require.NoError(t, writer.Write([]*Ref{w}, sources, WriteOptions{Tag: 7, Destinations: dests}, 10*time.Second))
			n := notice(t, owned, 10*time.Second)
			require.NoError(t, n.Err)
			assert.Equal(t, uint64(7), n.Tag)
			assert.Equal(t, uint64(5*matrixRow), n.Bytes)
			want := append([]byte(nil), before...)
			copy(want[10*matrixRow:], a.b)
			copy(want[40*matrixRow:], b.b)
			assert.True(t, bytes.Equal(want, buf.b), "rows 10..11 and 40..42 changed, nothing else")
			assert.Equal(t, uint64(0), writer.Stats().FetchesActive)
		})
	}
}

func TestPartialFetchOfSeveralRangesOfOwnTensor(t *testing.T) {
	p := rangedPair(t)
	buf := newHostBuf(t, 64*matrixRow)
	buf.fill(3)
	ref, err := p.owner.Put([]transport.Tensor{shaped(t, buf, f32, 64, 16)}, "mem", nil)
	require.NoError(t, err)
	defer ref.Release()
	a, b := newHostBuf(t, matrixRow), newHostBuf(t, 4*matrixRow)
	targets := []transport.Tensor{shaped(t, a, f32, 1, 16), shaped(t, b, f32, 4, 16)}
	require.NoError(t, p.owner.Get([]*Ref{ref}, targets, FetchOptions{Sources: []Range{rowsOf(63, 1), rowsOf(0, 4)}}, 10*time.Second))
	assert.Equal(t, buf.b[63*matrixRow:], a.b)
	assert.Equal(t, buf.b[:4*matrixRow], b.b)
}

// How a test drives one transfer: a get or a write, through the call that
// waits, a started fetch waited on, or a prepared transfer's kept run.
type endingCase struct {
	write bool
	how   string // "call", "started" or "prepared"
}

func (c endingCase) String() string {
	op := "fetch"
	if c.write {
		op = "write"
	}
	return op + "/" + c.how
}

var endingCases = []endingCase{
	{false, "call"}, {false, "started"}, {false, "prepared"},
	{true, "call"}, {true, "started"}, {true, "prepared"},
}

// endingRig is one transfer of one ref between a pair, ready to run.
type endingRig struct {
	p       *pair
	c       endingCase
	owned   *Ref // the owner's handle (of the exposed object, for a write)
	ref     *Ref // the borrower's
	tensors []transport.Tensor
	prep    *Prepared
}

func newEndingRig(t *testing.T, c endingCase, configure func(*memTransport)) *endingRig {
	p := newPair(t, func(m *memTransport) {
		m.writes = true
		if configure != nil {
			configure(m)
		}
	})
	r := &endingRig{p: p, c: c}
	local := newHostBuf(t, 64*matrixRow)
	local.fill(9)
	r.tensors = []transport.Tensor{shaped(t, local, f32, 64, 16)}
	if c.write {
		r.owned, r.ref, _ = p.exposeMatrix(t, 0)
	} else {
		src := newHostBuf(t, 64*matrixRow)
		src.fill(4)
		owned, err := p.owner.Put([]transport.Tensor{shaped(t, src, f32, 64, 16)}, "mem", nil)
		require.NoError(t, err)
		t.Cleanup(func() { owned.Release() })
		r.owned = owned
		r.ref = borrowIn(t, p.borrower, owned)
	}
	if c.how == "prepared" {
		var err error
		if c.write {
			r.prep, err = p.borrower.PrepareWrite([]*Ref{r.ref}, r.tensors, WriteOptions{})
		} else {
			r.prep, err = p.borrower.PrepareFetch([]*Ref{r.ref}, r.tensors, FetchOptions{})
		}
		require.NoError(t, err)
		t.Cleanup(r.prep.Close)
		// The first run resolves the transfer; the runs a test makes are kept ones.
		require.NoError(t, r.prep.Run(1, 10*time.Second))
		require.True(t, r.prep.Kept())
		if c.write {
			n := notice(t, r.owned, 10*time.Second)
			require.NoError(t, n.Err)
		}
	}
	return r
}

// run runs the transfer once under timeout and returns its outcome.
func (r *endingRig) run(t *testing.T, tag uint64, timeout time.Duration) error {
	rt, refs := r.p.borrower, []*Ref{r.ref}
	switch {
	case r.c.how == "prepared":
		return r.prep.Run(tag, timeout)
	case r.c.how == "call" && r.c.write:
		return rt.Write(refs, r.tensors, WriteOptions{Tag: tag}, timeout)
	case r.c.how == "call":
		return rt.Get(refs, r.tensors, FetchOptions{}, timeout)
	}
	var f *Fetch
	var err error
	if r.c.write {
		f, err = rt.StartWrite(refs, r.tensors, WriteOptions{Tag: tag})
	} else {
		f, err = rt.StartFetch(refs, r.tensors, FetchOptions{})
	}
	if err != nil {
		return err
	}
	defer f.Free()
	return f.Wait(timeout)
}

// admitted counts the writes the owner admitted so far: each started the
// transport's write.
func (r *endingRig) admitted() int {
	n := 0
	for _, ev := range r.p.dst.Events() {
		if ev == "write" {
			n++
		}
	}
	return n
}

// ended checks that nothing of a transfer that ended is left: no fetch
// counted active, no handle of its own on the ref, and (a write the owner
// admitted since admittedBefore) one notice, of a failure when the writer
// failed; none for a write never admitted.
func (r *endingRig) ended(t *testing.T, err error, refsBefore uint64, admittedBefore int) {
	t.Helper()
	assert.Equal(t, uint64(0), r.p.borrower.Stats().FetchesActive, "the fetch is counted out")
	assert.Equal(t, refsBefore, r.p.borrower.Stats().Refs, "the fetch's own handles were released")
	if !r.c.write {
		return
	}
	if r.admitted() == admittedBefore {
		_, nerr := r.owned.WaitWriteNotice(0)
		assert.Equal(t, transport.ErrTimeout, transport.StatusOf(nerr), "a write never admitted has no notice")
		return
	}
	n, nerr := r.owned.WaitWriteNotice(10 * time.Second)
	require.NoError(t, nerr, "every admitted write ends in a notice")
	if err != nil {
		assert.Error(t, n.Err, "a write its writer saw fail is no success to its owner")
	} else {
		assert.NoError(t, n.Err)
	}
}

func TestPanicAtAnyStageFailsTheTransferAndEndsIt(t *testing.T) {
	engineStages := []string{"begin", "run", "finish"}
	transportCalls := []string{"communicator metadata", "fetch", "write", "wait", "release"}
	for _, c := range endingCases {
		for _, stage := range append(engineStages, transportCalls...) {
			if (stage == "fetch" && c.write) || (stage == "write" && !c.write) {
				continue
			}
			if c.how == "prepared" && (stage == "begin" || stage == "run" || stage == "finish" || stage == "communicator metadata") {
				continue // a kept run calls the transport only
			}
			t.Run(c.String()+"/"+stage, func(t *testing.T) {
				r := newEndingRig(t, c, nil)
				refsBefore, admittedBefore := r.p.borrower.Stats().Refs, r.admitted()
				isEngine := stage == "begin" || stage == "run" || stage == "finish"
				if isEngine {
					r.p.borrower.panicAt = func(s string) {
						if s == stage {
							panic("injected at " + s)
						}
					}
				} else {
					r.p.dst.panicIn = stage
				}
				err := r.run(t, 2, 30*time.Second)
				require.Error(t, err)
				assert.Equal(t, transport.ErrInternal, transport.StatusOf(err), "a panic is an internal error, returned before the deadline: %v", err)
				assert.Contains(t, err.Error(), "internal error")
				r.ended(t, err, refsBefore, admittedBefore)

				// The runtime works on: the next transfer succeeds.
				r.p.borrower.panicAt, r.p.dst.panicIn = nil, ""
				admittedBefore = r.admitted()
				err = r.run(t, 3, 30*time.Second)
				require.NoError(t, err)
				r.ended(t, err, refsBefore, admittedBefore)
			})
		}
	}
}

func TestWriteOutcomeIsOneForWriterAndOwner(t *testing.T) {
	// A transport that cannot abort lands a write after its deadline: the
	// writer was told it timed out, and so is the owner.
	for _, c := range endingCases {
		t.Run("deadline/"+c.String(), func(t *testing.T) {
			if !c.write {
				t.Skip("a fetch has no owner's notice")
			}
			gate := make(chan struct{})
			r := newEndingRig(t, c, func(m *memTransport) { m.canAbort = false })
			r.p.dst.gate = gate
			refsBefore, admittedBefore := r.p.borrower.Stats().Refs, r.admitted()
			// The bytes land only once the deadline passed. (A start
			// slower than the deadline times out before the owner
			// admits the write: then there is no notice, which ended
			// checks too.) A started write's Wait leaves it running;
			// Free aborts it, and the bytes land after the abort.
			const timeout = time.Second
			deadline := time.Now().Add(timeout)
			go func() {
				time.Sleep(time.Until(deadline) + 50*time.Millisecond)
				close(gate)
			}()
			err := r.run(t, 5, timeout)
			require.Equal(t, transport.ErrTimeout, transport.StatusOf(err), "%v", err)
			r.ended(t, err, refsBefore, admittedBefore)
		})
	}

	// One part of a write fails: the part that landed is reported failed
	// to its owner too, since the writer's call failed.
	for _, how := range []string{"call", "started", "prepared"} {
		t.Run("one_part_fails/"+how, func(t *testing.T) {
			p := writablePair(t)
			ownedA, wA, _ := p.exposeMatrix(t, 0)
			ownedB, wB, _ := p.exposeMatrix(t, 0)
			failing := false
			p.dst.waitErr = func(x *transport.Transfer) error {
				if failing && x.Object == wB.Desc().ID {
					return transport.Errorf(transport.ErrTransport, "the link to B went down")
				}
				return nil
			}
			src := newHostBuf(t, 64*matrixRow)
			sources := []transport.Tensor{shaped(t, src, f32, 64, 16), shaped(t, src, f32, 64, 16)}
			refs := []*Ref{wA, wB}
			var run func(tag uint64) error
			switch how {
			case "call":
				run = func(tag uint64) error { return p.borrower.Write(refs, sources, WriteOptions{Tag: tag}, 10*time.Second) }
			case "started":
				run = func(tag uint64) error {
					f, err := p.borrower.StartWrite(refs, sources, WriteOptions{Tag: tag})
					require.NoError(t, err)
					defer f.Free()
					return f.Wait(10 * time.Second)
				}
			case "prepared":
				prep, err := p.borrower.PrepareWrite(refs, sources, WriteOptions{})
				require.NoError(t, err)
				defer prep.Close()
				require.NoError(t, prep.Run(1, 10*time.Second))
				require.True(t, prep.Kept())
				for _, o := range []*Ref{ownedA, ownedB} {
					n := notice(t, o, 10*time.Second)
					require.NoError(t, n.Err)
				}
				run = func(tag uint64) error { return prep.Run(tag, 10*time.Second) }
			}
			failing = true
			err := run(8)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "the link to B went down")
			for name, o := range map[string]*Ref{"A": ownedA, "B": ownedB} {
				n, nerr := o.WaitWriteNotice(10 * time.Second)
				require.NoError(t, nerr)
				assert.Equal(t, uint64(8), n.Tag)
				if assert.Error(t, n.Err, "owner %s: the write its writer saw fail is no success", name) {
					assert.Contains(t, n.Err.Error(), "the link to B went down", "owner %s is told why", name)
				}
			}
		})
	}

	// An abort asked of a started write whose transport cannot stop it:
	// the bytes land, but the write was aborted, for both sides.
	t.Run("abort", func(t *testing.T) {
		gate := make(chan struct{})
		r := newEndingRig(t, endingCase{write: true, how: "started"}, func(m *memTransport) { m.canAbort = false })
		r.p.dst.gate = gate
		refsBefore := r.p.borrower.Stats().Refs
		f, err := r.p.borrower.StartWrite([]*Ref{r.ref}, r.tensors, WriteOptions{Tag: 6})
		require.NoError(t, err)
		eventually(t, func() bool { return r.admitted() == 1 }, "the owner admitted the write")
		f.Abort()
		close(gate)
		err = f.Wait(-1)
		assert.Equal(t, transport.ErrAborted, transport.StatusOf(err))
		f.Free()
		r.ended(t, err, refsBefore, 0)
	})
}
