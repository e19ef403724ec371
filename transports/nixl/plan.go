package nixl

import (
	"cmp"
	"slices"

	"github.com/rdt-project/rdt/core/transport"
)

// A transfer's plan: what the local tensors receive (or, in a write, send)
// cut into chunks of one NIXL request each, runs that touch on both sides
// merged into one descriptor.

// span is a byte range read with one descriptor: local and remote
// addresses, on their devices.
type span struct {
	laddr, raddr, n uint64
	ldev, rdev      uint32
}

// continuedBy is whether q starts where s ends, on both sides.
func (s span) continuedBy(q span) bool {
	return s.laddr+s.n == q.laddr && s.raddr+s.n == q.raddr && s.ldev == q.ldev && s.rdev == q.rdev
}

// chunk is what one NIXL READ request moves: spans of one pair of memory
// types, chunkSize bytes at most (or one span).
type chunk struct {
	local, remote uint8
	spans         []span
}

// plan cuts what the targets receive (x's pieces, or the tensors whole)
// into chunks, merging runs that touch on both sides into one descriptor.
// The pieces were checked against m (CheckPieces).
func plan(x *transport.Transfer, m *metadata, targets []transport.Tensor) ([]chunk, []regKey, uint64, error) {
	var chunks []chunk
	var local []regKey
	var total uint64
	var cur *chunk
	var curBytes uint64
	lastTensor := -1 // the source tensor the last span read
	for i, tg := range targets {
		mem, dev, err := memOf(tg.Device)
		if err != nil {
			return nil, nil, 0, err
		}
		p := x.PieceOf(i, tg)
		if p.Length == 0 {
			continue
		}
		g := m.Regions[p.Tensor]
		laddr, raddr := uint64(tg.Data), g.Addr+p.Offset
		local = append(local, regKey{mem: mem, addr: laddr, size: p.Length, dev: dev})
		total += p.Length
		// One descriptor must stay inside one registration on each side:
		// touching targets are registered as one here (coalesce), and a
		// version-2 source registered its touching tensors as one, so a
		// descriptor may run from one tensor into the next only there.
		joinable := m.Version >= 2 || int(p.Tensor) == lastTensor
		for off := uint64(0); off < p.Length; {
			n := min(p.Length-off, chunkSize)
			if cur == nil || cur.local != mem || cur.remote != g.Mem || curBytes+n > chunkSize {
				chunks = append(chunks, chunk{local: mem, remote: g.Mem})
				cur, curBytes = &chunks[len(chunks)-1], 0
			}
			s := span{laddr: laddr + off, raddr: raddr + off, n: n, ldev: dev, rdev: g.Dev}
			if last := len(cur.spans) - 1; joinable && last >= 0 && cur.spans[last].continuedBy(s) {
				cur.spans[last].n += n
			} else {
				cur.spans = append(cur.spans, s)
			}
			curBytes += n
			off += n
		}
		lastTensor = int(p.Tensor)
	}
	return chunks, coalesce(local), total, nil
}

// coalesce merges regions of one memory and device that touch or overlap,
// so that an object of many tensors fetched into one buffer is registered
// as one region rather than one per tensor (registering is most of the
// cost of a fetch of many small tensors). The merged regions cover exactly
// the bytes of the given ones, and never overlap each other.
func coalesce(keys []regKey) []regKey {
	if len(keys) < 2 {
		return keys
	}
	sorted := slices.Clone(keys)
	slices.SortFunc(sorted, func(a, b regKey) int {
		if a.mem != b.mem {
			return cmp.Compare(a.mem, b.mem)
		}
		if a.dev != b.dev {
			return cmp.Compare(a.dev, b.dev)
		}
		return cmp.Compare(a.addr, b.addr)
	})
	out := sorted[:1]
	for _, k := range sorted[1:] {
		last := &out[len(out)-1]
		if k.mem == last.mem && k.dev == last.dev && k.addr <= last.addr+last.size {
			last.size = max(last.size, k.addr+k.size-last.addr)
			continue
		}
		out = append(out, k)
	}
	return out
}

// bytes is what the chunk moves.
func (c *chunk) bytes() uint64 {
	var n uint64
	for _, s := range c.spans {
		n += s.n
	}
	return n
}
