package engine

import (
	"encoding/binary"
	"testing"

	"github.com/rdt-project/rdt/core/transport"
)

// FuzzViewOfRef builds views from any ref a peer could hand over and any
// sizes a mapping could report: a view is made only when the ref agrees
// with the mapping, and then no tensor of it reaches past its mapped
// region.
func FuzzViewOfRef(f *testing.F) {
	d := sampleDesc(f)
	sizes := func(ns ...uint64) []byte {
		var b []byte
		for _, n := range ns {
			b = binary.LittleEndian.AppendUint64(b, n)
		}
		return b
	}
	var whole []uint64
	for _, t := range d.Tensors {
		whole = append(whole, t.Nbytes)
	}
	f.Add(EncodeRef(d, nil, 1), sizes(whole...))
	f.Add(EncodeRef(d, nil, 1), sizes(append(whole, 8)...))
	f.Add(EncodeRef(d, nil, 1), sizes(whole[0]+1))
	f.Add([]byte("RDTR"), []byte{})
	f.Fuzz(func(t *testing.T, ref, mappedSizes []byte) {
		desc, _, err := DecodeRef(ref)
		if err != nil {
			return
		}
		held := make([]uint64, len(mappedSizes)/8)
		data := make([]uintptr, len(held))
		var off uint64
		for i := range held {
			held[i] = binary.LittleEndian.Uint64(mappedSizes[8*i:])
			data[i] = uintptr(off) // the regions one after another
			off += held[i] % (1 << 40)
		}
		err = checkMapped(desc, data, held)
		if err != nil {
			if transport.StatusOf(err) != transport.ErrCorrupt {
				t.Fatalf("refused with %v: %v", transport.StatusOf(err), err)
			}
			return
		}
		if len(held) != len(desc.Tensors) {
			t.Fatalf("a view of %d tensors over a mapping of %d", len(desc.Tensors), len(held))
		}
		for i, tn := range desc.Tensors {
			if tn.Nbytes > held[i] {
				t.Fatalf("tensor %d of the view is %d bytes; its mapped region %d", i, tn.Nbytes, held[i])
			}
		}
	})
}
