package engine

import (
	"slices"

	"github.com/rdt-project/rdt/core/transport"
)

// Range is a byte range of one tensor of one of a get's or a write's refs
// (rdt_range): what one target of a partial get receives, or where one
// source of a partial write lands.
type Range struct {
	Ref int
	transport.Piece
}

// RestOfTensor as a Range's Length takes the tensor from Offset to its end.
const RestOfTensor = ^uint64(0)

// refTargets is what a fetch moves for one ref: its targets and, in a
// partial fetch, the piece each receives (nil: every tensor, whole).
type refTargets struct {
	targets []transport.Tensor
	pieces  []transport.Piece
}

// planTargets checks the targets against the refs' tensors and splits them
// by ref: without sources one target per source tensor, ref after ref; with
// them, targets[i] receives sources[i]. Refs that no source names are left
// out (nil). With disjoint, targets must not overlap (a write's sources,
// which are only read, may). Nothing is written by a fetch these checks
// refuse.
func planTargets(refs []*Ref, targets []transport.Tensor, sources []Range, disjoint bool) ([]*refTargets, error) {
	overlap := checkOverlap
	if !disjoint {
		overlap = func([]transport.Tensor) error { return nil }
	}
	plans := make([]*refTargets, len(refs))
	if sources == nil {
		total := 0
		for _, r := range refs {
			total += len(r.desc.Tensors)
		}
		if total != len(targets) {
			return nil, transport.Errorf(transport.ErrInvalidArgument, "%d targets given for %d source tensors", len(targets), total)
		}
		off := 0
		for i, r := range refs {
			for j, td := range r.desc.Tensors {
				if err := td.Matches(targets[off].TensorDesc); err != nil {
					return nil, transport.Wrap(err, "target for ref %d tensor %d", i, j)
				}
				off++
			}
			n := len(r.desc.Tensors)
			plans[i] = &refTargets{targets: targets[off-n : off]}
		}
		return plans, overlap(targets)
	}
	if len(sources) != len(targets) {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "%d sources given for %d targets", len(sources), len(targets))
	}
	for i, s := range sources {
		if s.Ref < 0 || s.Ref >= len(refs) {
			return nil, transport.Errorf(transport.ErrInvalidArgument, "source %d names ref %d of %d", i, s.Ref, len(refs))
		}
		p, err := checkSource(refs[s.Ref].desc, s, targets[i])
		if err != nil {
			return nil, transport.Wrap(err, "source %d (ref %d tensor %d)", i, s.Ref, s.Tensor)
		}
		rt := plans[s.Ref]
		if rt == nil {
			rt = &refTargets{}
			plans[s.Ref] = rt
		}
		rt.targets = append(rt.targets, targets[i])
		rt.pieces = append(rt.pieces, p)
	}
	for i, rt := range plans {
		if rt != nil && wholeInOrder(refs[i].desc, rt.pieces) {
			rt.pieces = nil // any transport moves a whole object
		}
	}
	return plans, overlap(targets)
}

// checkSource checks one source against the owner's description of the
// tensor it names and the target that receives it, and returns its piece
// with RestOfTensor resolved.
func checkSource(desc *ObjectDesc, s Range, target transport.Tensor) (transport.Piece, error) {
	p := s.Piece
	if int64(p.Tensor) >= int64(len(desc.Tensors)) {
		return p, transport.Errorf(transport.ErrInvalidArgument, "the object has %d tensors", len(desc.Tensors))
	}
	td := desc.Tensors[p.Tensor]
	if p.Offset > td.Nbytes {
		return p, transport.Errorf(transport.ErrInvalidArgument, "offset %d is past the tensor's %d bytes", p.Offset, td.Nbytes)
	}
	if p.Length == RestOfTensor {
		p.Length = td.Nbytes - p.Offset
	}
	if p.Length > td.Nbytes-p.Offset {
		return p, transport.Errorf(transport.ErrInvalidArgument, "bytes [%d, %d+%d) are outside the tensor's %d bytes", p.Offset, p.Offset, p.Length, td.Nbytes)
	}
	if td.DType != target.DType {
		return p, transport.Errorf(transport.ErrInvalidArgument, "the target's dtype %s is not the source's %s", target.DType, td.DType)
	}
	if bits := uint64(td.DType.Bits) * uint64(td.DType.Lanes); bits%8 != 0 {
		if p.Offset != 0 || p.Length != td.Nbytes {
			return p, transport.Errorf(transport.ErrInvalidArgument, "a tensor of %s (elements smaller than a byte) is only fetched whole", td.DType)
		}
	} else if elem := bits / 8; p.Offset%elem != 0 || p.Length%elem != 0 {
		return p, transport.Errorf(transport.ErrInvalidArgument, "bytes [%d, %d+%d) do not fall on the %d-byte elements of %s", p.Offset, p.Offset, p.Length, elem, td.DType)
	}
	if target.Nbytes != p.Length {
		return p, transport.Errorf(transport.ErrInvalidArgument, "the target holds %d bytes for a range of %d", target.Nbytes, p.Length)
	}
	return p, transport.CanLand(td.Device.Type, target.Device)
}

// wholeInOrder reports whether pieces take every tensor of the object whole,
// in order: a partial fetch in name only.
func wholeInOrder(desc *ObjectDesc, pieces []transport.Piece) bool {
	if len(pieces) != len(desc.Tensors) {
		return false
	}
	for i, p := range pieces {
		if p.Tensor != uint32(i) || p.Offset != 0 || p.Length != desc.Tensors[i].Nbytes {
			return false
		}
	}
	return true
}

// span is the memory a target covers, for the overlap check.
type span struct {
	dev        transport.Device
	start, end uintptr
}

// checkOverlap refuses targets whose memory overlaps: two transfers would
// write the same bytes at once. Targets listed in address order (views of
// one buffer, the common case) are checked in one pass; others are sorted
// first.
func checkOverlap(targets []transport.Tensor) error {
	if len(targets) < 2 {
		return nil // the common small get: nothing to compare, nothing to allocate
	}
	spans := make([]span, 0, len(targets))
	sorted := true
	for _, t := range targets {
		if t.Nbytes == 0 {
			continue
		}
		dev := t.Device
		if dev.Type.HostAccessible() {
			dev = transport.Device{Type: transport.DeviceCPU} // one address space
		}
		s := span{dev, t.Data, t.Data + uintptr(t.Nbytes)}
		if n := len(spans); n > 0 && less(s, spans[n-1]) {
			sorted = false
		}
		spans = append(spans, s)
	}
	if !sorted {
		slices.SortFunc(spans, func(a, b span) int {
			switch {
			case less(a, b):
				return -1
			case less(b, a):
				return 1
			}
			return 0
		})
	}
	for i := 1; i < len(spans); i++ {
		a, b := spans[i-1], spans[i]
		if a.dev == b.dev && b.start < a.end {
			return transport.Errorf(transport.ErrInvalidArgument, "targets overlap: [%#x, %#x) and [%#x, %#x) on %s", a.start, a.end, b.start, b.end, a.dev)
		}
	}
	return nil
}

func less(a, b span) bool {
	if a.dev != b.dev {
		if a.dev.Type != b.dev.Type {
			return a.dev.Type < b.dev.Type
		}
		return a.dev.ID < b.dev.ID
	}
	return a.start < b.start
}

// pieceTensor is the object's tensor that target (or write source) i of a
// transfer pairs with: its piece's tensor in a partial transfer, else
// tensor i. Several targets may pair with one tensor (rows of it).
func pieceTensor(pieces []transport.Piece, i int) uint32 {
	if pieces != nil {
		return pieces[i].Tensor
	}
	return uint32(i)
}
