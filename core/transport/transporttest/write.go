package transporttest

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// WriteCases are the cases of transports that write into exposed objects
// (their descriptor sets Writes); Run runs them after Cases, and skips them
// for every other transport.
var WriteCases = []string{"write", "write_refused", "write_admitted", "write_owner_killed"}

func (s *suite) writeCases() map[string]func(*testing.T) {
	return map[string]func(*testing.T){"write": s.write, "write_refused": s.writeRefused, "write_admitted": s.writeAdmitted,
		"write_owner_killed": s.writeOwnerKilled}
}

// writer is the end that writes; the object lives on owner.
func (s *suite) writesOnly(t *testing.T, e *end) transport.Writer {
	t.Helper()
	w, ok := e.tr.(transport.Writer)
	if !e.desc.Writes || !ok {
		t.Skip("the descriptor says the transport does not write")
	}
	return w
}

// writeTransfer is a write by the end with identity from into the object
// of owner.
func writeTransfer(obj transport.ObjectID, name string, from, owner transport.PeerInfo) *transport.Transfer {
	x := transfer(obj, name, from, owner)
	x.Role = transport.RoleSource
	x.Direction = transport.Write
	return x
}

// write starts a write the way the engine does (communicator metadata,
// then Write) and waits for it, within a minute.
func write(t *testing.T, e *end, x *transport.Transfer, sources []transport.Tensor, meta []byte) error {
	t.Helper()
	w := e.tr.(transport.Writer)
	cmeta, err := e.tr.CommunicatorMetadata(x)
	if err != nil {
		return err
	}
	req, err := w.Write(x, sources, meta, cmeta)
	if err != nil {
		return err
	}
	return finish(t, req, time.Minute)
}

// write: whole tensors and pieces land where they are addressed and
// nowhere else, in this process and in a source process (read back with a
// fetch).
func (s *suite) write(t *testing.T) {
	t.Run("in_process", func(t *testing.T) {
		dts := []transport.DType{Float32, Int64, Uint8, Uint8}
		owner, writer, meta, tensors, _ := s.exposedPair(t, transport.ObjectID{20}, dts, partialSizes)
		s.writesOnly(t, writer)
		before := make([][]byte, len(tensors))
		for i, x := range tensors {
			before[i] = s.read(t, owner, x)
		}
		x := writeTransfer(transport.ObjectID{20}, writer.desc.Name, writer.host.Identity(), owner.host.Identity())
		pieces := partialPieces()
		x.Pieces = pieces
		var sources []transport.Tensor
		for i, p := range pieces {
			sources = append(sources, s.tensor(t, writer, Uint8, int(p.Length), 0x30+byte(i)))
		}
		if err := write(t, writer, x, sources, meta); err != nil {
			t.Fatal(err)
		}
		want := before
		for i, p := range pieces {
			copy(want[p.Tensor][p.Offset:p.End()], s.read(t, writer, sources[i]))
		}
		for i, x := range tensors {
			if !bytes.Equal(s.read(t, owner, x), want[i]) {
				t.Fatalf("tensor %d: the pieces did not land exactly where addressed", i)
			}
		}

		// A whole write replaces every tensor.
		x = writeTransfer(transport.ObjectID{20}, writer.desc.Name, writer.host.Identity(), owner.host.Identity())
		whole := s.targets(t, writer, tensors)
		if err := write(t, writer, x, whole, meta); err != nil {
			t.Fatal(err)
		}
		for i := range tensors {
			if !bytes.Equal(s.read(t, owner, tensors[i]), s.read(t, writer, whole[i])) {
				t.Fatalf("whole write: tensor %d differs", i)
			}
		}
	})
	t.Run("source_process", func(t *testing.T) {
		writer := s.newEnd(t, 0)
		s.writesOnly(t, writer)
		owner := s.exposedSource(t, writer, 4096, 3<<20)
		x := writeTransfer(SourceObject, writer.desc.Name, writer.host.Identity(), owner.Peer)
		x.Pieces = []transport.Piece{{Tensor: 1, Offset: 1 << 20, Length: 1 << 20}, {Tensor: 0, Offset: 8, Length: 16}}
		sources := []transport.Tensor{s.tensor(t, writer, Uint8, 1<<20, 0x61), s.tensor(t, writer, Uint8, 16, 0x62)}
		if err := write(t, writer, x, sources, owner.Meta); err != nil {
			t.Fatal(err)
		}
		want := [][]byte{append([]byte(nil), owner.Want[0]...), append([]byte(nil), owner.Want[1]...)}
		copy(want[1][1<<20:], s.read(t, writer, sources[0]))
		copy(want[0][8:], s.read(t, writer, sources[1]))
		for i, got := range owner.Contents(t) {
			if !bytes.Equal(got, want[i]) {
				t.Fatalf("tensor %d of the owner process does not hold exactly what was written", i)
			}
		}
	})
}

// writeRefused: pieces outside what the owner's metadata describes, and
// sources of another size, fail with ErrInvalidArgument and write nothing.
func (s *suite) writeRefused(t *testing.T) {
	owner, writer, meta, tensors, _ := s.exposedPair(t, transport.ObjectID{21}, []transport.DType{Uint8}, []int{4096, 100})
	s.writesOnly(t, writer)
	skipDescribesNothing(t, meta)
	before := [][]byte{s.read(t, owner, tensors[0]), s.read(t, owner, tensors[1])}
	for _, c := range []struct {
		what  string
		piece *transport.Piece
		n     int
	}{
		{"a tensor the owner lacks", &transport.Piece{Tensor: 2, Length: 16}, 16},
		{"bytes past the end", &transport.Piece{Tensor: 1, Offset: 90, Length: 16}, 16},
		{"an offset past the end", &transport.Piece{Tensor: 0, Offset: 1 << 40, Length: 1}, 1},
		{"a length that wraps", &transport.Piece{Tensor: 0, Offset: 8, Length: ^uint64(0) - 4}, 16},
		{"a source of another length", &transport.Piece{Tensor: 0, Offset: 0, Length: 32}, 16},
		{"a whole write of another size", nil, 4097},
	} {
		if c.piece == nil && s.conf.SizelessMetadata {
			// Each tensor's range is checked where it lands: the other
			// tensor would be written (the engine compares the sources
			// with the ref's shapes before any write starts).
			continue
		}
		x := writeTransfer(transport.ObjectID{21}, writer.desc.Name, writer.host.Identity(), owner.host.Identity())
		sources := []transport.Tensor{s.tensor(t, writer, Uint8, c.n, 0x77)}
		if c.piece != nil {
			x.Pieces = []transport.Piece{*c.piece}
		} else {
			sources = append(sources, s.tensor(t, writer, Uint8, 100, 0x78))
		}
		wantStatus(t, write(t, writer, x, sources, meta), c.what, transport.ErrInvalidArgument)
		for i := range tensors {
			if !bytes.Equal(s.read(t, owner, tensors[i]), before[i]) {
				t.Fatalf("%s: tensor %d changed", c.what, i)
			}
		}
	}
}

// writeAdmitted: the owner lands a write's bytes only inside the ranges it
// admitted the write for (Host.WriteInto), wherever the writer addresses
// them. Pieces past the end of the one admitted range, small and large
// (inline and staged where the transport tells the two apart), are
// refused, so the write fails and no byte of the object changes; inside
// the range the bytes land. Ranges admitted overlapping admit every byte
// either names: a piece that starts in the second and ends past it, inside
// the first, lands.
func (s *suite) writeAdmitted(t *testing.T) {
	if s.conf.WriterLandsBytes != "" {
		t.Skip(s.conf.WriterLandsBytes)
	}
	const n = 12 << 20
	writer := s.newEnd(t, 0)
	s.writesOnly(t, writer)
	owner := s.newEnd(t, 1)
	obj := transport.ObjectID{22}
	meta, tensors := s.putOrExpose(t, owner, obj, []transport.DType{Uint8}, []int{n}, true)
	want := s.read(t, owner, tensors[0])
	// try writes the bytes of seed into piece p, as a write admitted for
	// the pieces admitted, and returns them with the write's outcome.
	try := func(admitted []transport.Piece, p transport.Piece, seed byte) ([]byte, error) {
		x := writeTransfer(obj, writer.desc.Name, writer.host.Identity(), owner.host.Identity())
		x.Pieces = []transport.Piece{p}
		owner.host.Admit(x.TransferID, admitted)
		src := s.tensor(t, writer, Uint8, int(p.Length), seed)
		return s.read(t, writer, src), write(t, writer, x, []transport.Tensor{src}, meta)
	}
	first := []transport.Piece{{Length: 16}}
	for _, p := range []transport.Piece{{Offset: 4096, Length: 16}, {Offset: 8192, Length: 16}, {Offset: 65536, Length: 65536}} {
		_, err := try(first, p, 0x90)
		what := fmt.Sprintf("bytes [%d, +%d) of a write admitted for [0, 16)", p.Offset, p.Length)
		wantStatus(t, err, what, transport.ErrInvalidArgument)
		if !bytes.Equal(s.read(t, owner, tensors[0]), want) {
			t.Fatalf("%s: the object changed", what)
		}
	}
	for _, c := range []struct {
		admitted []transport.Piece
		p        transport.Piece
	}{
		{first, first[0]},
		{[]transport.Piece{{Length: n}, {Offset: 4 << 20, Length: 5 << 20}}, transport.Piece{Offset: 8 << 20, Length: 4 << 20}},
	} {
		landed, err := try(c.admitted, c.p, 0x91)
		if err != nil {
			t.Fatalf("bytes [%d, +%d) of a write admitted for %v: %v", c.p.Offset, c.p.Length, c.admitted, err)
		}
		copy(want[c.p.Offset:], landed)
		if !bytes.Equal(s.read(t, owner, tensors[0]), want) {
			t.Fatalf("bytes [%d, +%d) of a write admitted for %v did not land exactly there", c.p.Offset, c.p.Length, c.admitted)
		}
	}
}

// writeOwnerKilled: an owner process killed while a large write lands in
// it fails the write (or it finished first); the writer neither hangs nor
// crashes.
func (s *suite) writeOwnerKilled(t *testing.T) {
	writer := s.newEnd(t, 0, func(h *Host) { h.Timeout = time.Second })
	s.writesOnly(t, writer)
	owner := s.exposedSource(t, writer, s.large())
	x := writeTransfer(SourceObject, writer.desc.Name, writer.host.Identity(), owner.Peer)
	w := writer.tr.(transport.Writer)
	cmeta, err := writer.tr.CommunicatorMetadata(x)
	if err != nil {
		t.Fatal(err)
	}
	req, err := w.Write(x, []transport.Tensor{s.largeTensor(t, writer)}, owner.Meta, cmeta)
	s.killDuring(t, owner, req, err, fmt.Sprintf("an owner killed mid-write (%s)", writer.desc.Name))
}
