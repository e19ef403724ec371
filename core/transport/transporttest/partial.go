package transporttest

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// The partial-fetch cases run on transports whose descriptor sets Ranges:
// pieces of an object's tensors, in any order, land in their targets and
// nothing else is written; pieces outside what the source describes are
// refused before anything is.

// guard is the slack around each partial target: bytes a transport writes
// past its target land there and are noticed.
const guard = 64

// Guarded is a host target with guard bytes of Fill's pattern on each
// side, for a package's own tests of partial fetches: a transport that
// writes past its target is noticed (Check, CheckGuards).
type Guarded struct {
	Target transport.Tensor
	all    []byte // the guards and the target between them
}

// GuardedTarget maps a Guarded target of n bytes, holding Fill's pattern.
func GuardedTarget(t testing.TB, n int) Guarded {
	all, x := Buffer(t, n+2*guard)
	Fill(all, 0xd7)
	x.Data += guard
	x.Orig = x.Data
	x.Nbytes = uint64(n)
	x.Shape = []int64{int64(n)}
	return Guarded{Target: x, all: all}
}

// Check fails t unless the target holds want (nil: what it held before)
// and the bytes around it are untouched.
func (g Guarded) Check(t testing.TB, want []byte, what string) {
	t.Helper()
	n := len(g.all) - 2*guard
	if want == nil {
		want = Pattern(len(g.all), 0xd7)[guard : guard+n]
	}
	g.CheckGuards(t, what)
	if !bytes.Equal(want, g.all[guard:guard+n]) {
		t.Errorf("%s: the target holds the wrong bytes", what)
	}
}

// CheckGuards fails t unless the bytes around the target are untouched.
func (g Guarded) CheckGuards(t testing.TB, what string) {
	t.Helper()
	orig, n := Pattern(len(g.all), 0xd7), len(g.all)-2*guard
	if !bytes.Equal(orig[:guard], g.all[:guard]) || !bytes.Equal(orig[guard+n:], g.all[guard+n:]) {
		t.Errorf("%s: bytes around the target were written", what)
	}
}

// partialTarget is a target of n bytes of dt with guard bytes on each side,
// all filled with a pattern; check compares it after the fetch.
type partialTarget struct {
	t    transport.Tensor
	base uintptr
	n    int
}

func (s *suite) partialTarget(t *testing.T, e *end, dt transport.DType, n int) partialTarget {
	t.Helper()
	addr, free, err := e.mem.Alloc(n + 2*guard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(free)
	if err := e.mem.Write(addr, Pattern(n+2*guard, 0xd7)); err != nil {
		t.Fatal(err)
	}
	return partialTarget{t: Describe(e.mem.Device, dt, addr+guard, n), base: addr, n: n}
}

// partialTargets makes a guarded target for each piece.
func (s *suite) partialTargets(t *testing.T, e *end, pieces []transport.Piece) ([]partialTarget, []transport.Tensor) {
	var pts []partialTarget
	var targets []transport.Tensor
	for _, p := range pieces {
		pt := s.partialTarget(t, e, Uint8, int(p.Length))
		pts, targets = append(pts, pt), append(targets, pt.t)
	}
	return pts, targets
}

// check reads the target and its guards: the target holds want (nil: left
// as it was) and the guards are untouched.
func (s *suite) check(t *testing.T, e *end, pt partialTarget, want []byte, what string) {
	t.Helper()
	got := make([]byte, pt.n+2*guard)
	if err := e.mem.Read(pt.base, got); err != nil {
		t.Fatal(err)
	}
	orig := Pattern(pt.n+2*guard, 0xd7)
	if !bytes.Equal(got[:guard], orig[:guard]) || !bytes.Equal(got[guard+pt.n:], orig[guard+pt.n:]) {
		t.Fatalf("%s: bytes around the target were written", what)
	}
	if want == nil {
		want = orig[guard : guard+pt.n]
	}
	if !bytes.Equal(got[guard:guard+pt.n], want) {
		t.Fatalf("%s: the target holds the wrong bytes", what)
	}
}

func (s *suite) rangesOnly(t *testing.T, e *end) {
	t.Helper()
	if !e.desc.Ranges {
		t.Skip("the descriptor says the transport cannot serve ranges (the engine refuses partial fetches over it)")
	}
}

// partialCases are the pieces every ranged transport serves, against an
// object of tensors of sizes partialSizes: the first, middle and last rows
// of a float32 matrix, one byte, whole tensors, an empty range, in an order
// that is not the object's.
var partialSizes = []int{64 << 10, 3<<20 + 24, 4096, 0}

func partialPieces() []transport.Piece {
	row := uint64(256) // a float32 matrix of 256 rows of 64 elements
	return []transport.Piece{
		{Tensor: 0, Offset: 0, Length: 16 * row},         // first rows
		{Tensor: 1, Offset: 1<<20 + 8, Length: 1 << 20},  // middle
		{Tensor: 0, Offset: 240 * row, Length: 16 * row}, // last rows
		{Tensor: 2, Offset: 4095, Length: 1},             // one byte
		{Tensor: 2, Offset: 0, Length: 4096},             // a whole tensor
		{Tensor: 0, Offset: 128 * row, Length: 0},        // empty
		{Tensor: 3, Offset: 0, Length: 0},                // a whole empty tensor
		{Tensor: 1, Offset: 3<<20 + 16, Length: 8},       // the last element
	}
}

func (s *suite) partial(t *testing.T) {
	t.Run("in_process", func(t *testing.T) {
		dts := []transport.DType{Float32, Int64, Uint8, Uint8}
		src, dst, meta, tensors, x := s.pair(t, transport.ObjectID{9}, dts, partialSizes)
		s.rangesOnly(t, dst)
		pieces := partialPieces()
		x.Pieces = pieces
		pts, targets := s.partialTargets(t, dst, pieces)
		if err := fetch(t, dst, x, targets, meta); err != nil {
			t.Fatal(err)
		}
		for i, p := range pieces {
			whole := s.read(t, src, tensors[p.Tensor])
			s.check(t, dst, pts[i], whole[p.Offset:p.End()], fmt.Sprintf("piece %d (tensor %d [%d, +%d))", i, p.Tensor, p.Offset, p.Length))
		}
	})
	t.Run("source_process", func(t *testing.T) {
		dst := s.newEnd(t, 0)
		s.rangesOnly(t, dst)
		src := s.source(t, dst, partialSizes...)
		pieces := partialPieces()
		x := transfer(SourceObject, dst.desc.Name, src.Peer, dst.host.Identity())
		x.Pieces = pieces
		pts, targets := s.partialTargets(t, dst, pieces)
		if err := fetch(t, dst, x, targets, src.Meta); err != nil {
			t.Fatal(err)
		}
		for i, p := range pieces {
			s.check(t, dst, pts[i], src.Want[p.Tensor][p.Offset:p.End()], fmt.Sprintf("piece %d", i))
		}
	})
}

// partialRefused: pieces outside what the source's metadata describes (a
// tensor it does not have, bytes past a tensor's end, a target of another
// length) fail with ErrInvalidArgument and write nothing. The engine checks
// pieces against the ref first; these are what a transport sees when the
// ref and the owner's metadata disagree (hostile or stale bytes).
func (s *suite) partialRefused(t *testing.T) {
	_, dst, meta, _, x := s.pair(t, transport.ObjectID{10}, []transport.DType{Uint8}, []int{4096, 100})
	s.rangesOnly(t, dst)
	skipDescribesNothing(t, meta)
	if s.conf.SizelessMetadata {
		t.Skip("the metadata carries no tensor sizes: the engine checks ranges against the ref before it fetches")
	}
	for _, c := range []struct {
		what  string
		piece transport.Piece
		n     int
	}{
		{"a tensor the source lacks", transport.Piece{Tensor: 2, Length: 16}, 16},
		{"bytes past the end", transport.Piece{Tensor: 1, Offset: 90, Length: 16}, 16},
		{"an offset past the end", transport.Piece{Tensor: 0, Offset: 1 << 40, Length: 1}, 1},
		{"a length that wraps", transport.Piece{Tensor: 0, Offset: 8, Length: ^uint64(0) - 4}, 16},
		{"a target of another length", transport.Piece{Tensor: 0, Offset: 0, Length: 32}, 16},
	} {
		pt := s.partialTarget(t, dst, Uint8, c.n)
		x.Pieces = []transport.Piece{c.piece}
		wantStatus(t, fetch(t, dst, x, []transport.Tensor{pt.t}, meta), c.what, transport.ErrInvalidArgument)
		s.check(t, dst, pt, nil, c.what)
	}
}

// partialSourceKilled: a source killed during a partial fetch of a large
// tensor fails the fetch as a killed source does a whole one.
func (s *suite) partialSourceKilled(t *testing.T) {
	dst := s.newEnd(t, 0, func(h *Host) { h.Timeout = time.Second })
	s.rangesOnly(t, dst)
	src := s.source(t, dst, 4096, s.large())
	x := transfer(SourceObject, dst.desc.Name, src.Peer, dst.host.Identity())
	n := uint64(s.large() / 2)
	x.Pieces = []transport.Piece{{Tensor: 1, Offset: n / 2, Length: n}}
	target := s.largeTensor(t, dst)
	target.Nbytes = n
	target.Shape = []int64{int64(n)}
	req, err := start(dst, x, []transport.Tensor{target}, src.Meta)
	s.killDuring(t, src, req, err, "a source killed mid-transfer")
}

// formatPieces writes a transfer's pieces into a SEND line to a grouped
// source process, whose Send must send those ranges: "-" for a whole
// fetch, else "P" and ":tensor/offset/length" per piece.
func formatPieces(pieces []transport.Piece) string {
	if pieces == nil {
		return "-"
	}
	var b strings.Builder
	b.WriteString("P")
	for _, p := range pieces {
		fmt.Fprintf(&b, ":%d/%d/%d", p.Tensor, p.Offset, p.Length)
	}
	return b.String()
}

// parsePieces reads what formatPieces wrote.
func parsePieces(s string) ([]transport.Piece, error) {
	if s == "-" {
		return nil, nil
	}
	rest, ok := strings.CutPrefix(s, "P")
	if !ok {
		return nil, fmt.Errorf("bad pieces %q", s)
	}
	pieces := []transport.Piece{}
	for _, f := range strings.Split(rest, ":")[1:] {
		var p transport.Piece
		if _, err := fmt.Sscanf(f, "%d/%d/%d", &p.Tensor, &p.Offset, &p.Length); err != nil {
			return nil, fmt.Errorf("bad piece %q: %v", f, err)
		}
		pieces = append(pieces, p)
	}
	return pieces, nil
}
