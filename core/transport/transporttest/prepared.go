package transporttest

import (
	"bytes"
	"reflect"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// PreparedCases are the cases of transports that implement
// transport.Preparer; Run runs them after WriteCases, and skips them for
// every other transport.
var PreparedCases = []string{"prepared"}

// implemented is e's transport as the optional interface I, or skips the
// case when the transport does not implement it.
func implemented[I any](t *testing.T, e *end) I {
	t.Helper()
	v, ok := e.tr.(I)
	if !ok {
		t.Skipf("the transport does not implement %v", reflect.TypeFor[I]())
	}
	return v
}

// prepared: a transfer prepared once and started again and again moves
// the bytes the source holds at each start (the owner's, for a write),
// with a new TransferID each time, until Close.
func (s *suite) prepared(t *testing.T) {
	dts := []transport.DType{Uint8, Float32}
	sizes := []int{4 << 10, 300<<10 + 8}
	rounds := func(t *testing.T, p transport.Prepared, x *transport.Transfer, fill func(round int), check func(round int)) {
		t.Helper()
		defer p.Close()
		for round := 0; round < 3; round++ {
			fill(round)
			run := *x
			run.TransferID = x.TransferID + uint64(round) + 1
			req, err := p.Start(&run)
			if err != nil {
				t.Fatalf("start %d: %v", round, err)
			}
			if err := finish(t, req, time.Minute); err != nil {
				t.Fatalf("run %d: %v", round, err)
			}
			check(round)
		}
	}
	refill := func(t *testing.T, e *end, tensors []transport.Tensor, round int) {
		for i, x := range tensors {
			if err := e.mem.Write(x.Data, Pattern(int(x.Nbytes), byte(0x40+8*round+i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	same := func(t *testing.T, a *end, as []transport.Tensor, b *end, bs []transport.Tensor, round int) {
		for i := range as {
			if !bytes.Equal(s.read(t, a, as[i]), s.read(t, b, bs[i])) {
				t.Fatalf("run %d: tensor %d differs", round, i)
			}
		}
	}
	// prepare prepares x on e the way the engine does: communicator
	// metadata first.
	prepare := func(t *testing.T, e *end, pr transport.Preparer, x *transport.Transfer, tensors []transport.Tensor, meta []byte) transport.Prepared {
		t.Helper()
		cmeta, err := e.tr.CommunicatorMetadata(x)
		if err != nil {
			t.Fatal(err)
		}
		p, err := pr.Prepare(x, tensors, meta, cmeta)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Run("fetch", func(t *testing.T) {
		src, dst, meta, tensors, x := s.pair(t, transport.ObjectID{30}, dts, sizes)
		pr := implemented[transport.Preparer](t, dst)
		if s.grouped() || !dst.desc.OneSided {
			t.Skip("prepared transfers are one-sided")
		}
		targets := s.targets(t, dst, tensors)
		rounds(t, prepare(t, dst, pr, x, targets, meta), x,
			func(round int) { refill(t, src, tensors, round) },
			func(round int) { same(t, src, tensors, dst, targets, round) })
	})
	t.Run("write", func(t *testing.T) {
		owner, writer, meta, tensors, _ := s.exposedPair(t, transport.ObjectID{31}, dts, sizes)
		s.writesOnly(t, writer)
		pr := implemented[transport.Preparer](t, writer)
		x := writeTransfer(transport.ObjectID{31}, writer.desc.Name, writer.host.Identity(), owner.host.Identity())
		sources := s.targets(t, writer, tensors)
		rounds(t, prepare(t, writer, pr, x, sources, meta), x,
			func(round int) { refill(t, writer, sources, round) },
			func(round int) { same(t, writer, sources, owner, tensors, round) })
	})
}
