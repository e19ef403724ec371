package core

import (
	"encoding/binary"
	"math"
)

// writer and reader are the little-endian encoding helpers shared by the
// ref format and the control-plane messages. The reader never trusts a
// length: every read is checked against what remains, so a corrupt input can
// neither read out of bounds nor make it allocate more than its own size.

type writer struct{ b []byte }

func (w *writer) u8(v uint8)   { w.b = append(w.b, v) }
func (w *writer) u16(v uint16) { w.b = binary.LittleEndian.AppendUint16(w.b, v) }
func (w *writer) u32(v uint32) { w.b = binary.LittleEndian.AppendUint32(w.b, v) }
func (w *writer) u64(v uint64) { w.b = binary.LittleEndian.AppendUint64(w.b, v) }
func (w *writer) i32(v int32)  { w.u32(uint32(v)) }
func (w *writer) i64(v int64)  { w.u64(uint64(v)) }
func (w *writer) raw(p []byte) { w.b = append(w.b, p...) }
func (w *writer) str8(s string) {
	w.u8(uint8(len(s)))
	w.b = append(w.b, s...)
}
func (w *writer) str16(s string) {
	w.u16(uint16(len(s)))
	w.b = append(w.b, s...)
}
func (w *writer) bytes32(p []byte) {
	w.u32(uint32(len(p)))
	w.b = append(w.b, p...)
}

type reader struct {
	b   []byte
	err error
	// what names the format in error messages.
	what string
}

// WireReader reads the bounded little-endian encoding of refs and control
// messages, for transports' own metadata codecs. A read past the end leaves
// a CORRUPT error naming the format (Err), and every later read returns a
// zero value, so a decoder checks once after a group of reads.
type WireReader struct{ r reader }

// NewWireReader reads b; what names the format in errors.
func NewWireReader(what string, b []byte) *WireReader {
	return &WireReader{reader{b: b, what: what}}
}

func (w *WireReader) U8() uint8   { return w.r.u8() }
func (w *WireReader) U32() uint32 { return w.r.u32() }
func (w *WireReader) U64() uint64 { return w.r.u64() }

// Take returns the next n bytes (sharing b's memory) or nil.
func (w *WireReader) Take(n int) []byte { return w.r.take(n) }

// Len is how many bytes are left.
func (w *WireReader) Len() int { return len(w.r.b) }

// Err is the first error, or nil.
func (w *WireReader) Err() error { return w.r.err }

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = Errorf(ErrCorrupt, r.what+": "+format, args...)
	}
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.fail("truncated: need %d more bytes, have %d", n, len(r.b))
		return nil
	}
	p := r.b[:n:n] // appending to it never writes over what follows
	r.b = r.b[n:]
	return p
}

func (r *reader) u8() uint8 {
	if p := r.take(1); p != nil {
		return p[0]
	}
	return 0
}
func (r *reader) u16() uint16 {
	if p := r.take(2); p != nil {
		return binary.LittleEndian.Uint16(p)
	}
	return 0
}
func (r *reader) u32() uint32 {
	if p := r.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}
func (r *reader) u64() uint64 {
	if p := r.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}
func (r *reader) i32() int32 { return int32(r.u32()) }
func (r *reader) i64() int64 { return int64(r.u64()) }

func (r *reader) id() (id ID) {
	copy(id[:], r.take(len(id)))
	return id
}

func (r *reader) str8(field string, max int) string {
	n := int(r.u8())
	if n > max {
		r.fail("%s is %d bytes, over the limit of %d", field, n, max)
		return ""
	}
	return string(r.take(n))
}

func (r *reader) str16(field string, max int) string {
	n := int(r.u16())
	if n > max {
		r.fail("%s is %d bytes, over the limit of %d", field, n, max)
		return ""
	}
	return string(r.take(n))
}

func (r *reader) bytes32(field string, max int) []byte {
	n := r.u32()
	if uint64(n) > uint64(max) || n > math.MaxInt32 {
		r.fail("%s is %d bytes, over the limit of %d", field, n, max)
		return nil
	}
	p := r.take(int(n))
	if p == nil {
		return nil
	}
	return append([]byte(nil), p...)
}

// count reads a u32 count, bounded by max and by what the remaining bytes
// could possibly hold (minSize bytes per item).
func (r *reader) count(field string, max, minSize int) int {
	n := r.u32()
	if uint64(n) > uint64(max) {
		r.fail("%s count %d is over the limit of %d", field, n, max)
		return 0
	}
	if minSize > 0 && uint64(n)*uint64(minSize) > uint64(len(r.b)) {
		r.fail("%s count %d cannot fit in the %d bytes left", field, n, len(r.b))
		return 0
	}
	return int(n)
}

func (r *reader) done() error {
	if r.err == nil && len(r.b) != 0 {
		r.fail("%d unexpected trailing bytes", len(r.b))
	}
	return r.err
}

// tensor descriptions share one encoding in refs and messages.
func (w *writer) tensorDesc(t TensorDesc) {
	w.i32(int32(t.Device.Type))
	w.i32(t.Device.ID)
	w.u8(t.DType.Code)
	w.u8(t.DType.Bits)
	w.u16(t.DType.Lanes)
	w.u8(uint8(len(t.Shape)))
	for _, d := range t.Shape {
		w.i64(d)
	}
}

const minTensorDescSize = 4 + 4 + 4 + 1

func (r *reader) tensorDesc() TensorDesc {
	dev := Device{Type: DeviceType(r.i32()), ID: r.i32()}
	dt := DType{Code: r.u8(), Bits: r.u8(), Lanes: r.u16()}
	ndim := int(r.u8())
	if ndim > MaxNDim {
		r.fail("tensor has %d dimensions, over the limit of %d", ndim, MaxNDim)
		return TensorDesc{}
	}
	shape := make([]int64, 0, ndim)
	for i := 0; i < ndim && r.err == nil; i++ {
		shape = append(shape, r.i64())
	}
	if r.err != nil {
		return TensorDesc{}
	}
	td, err := NewTensorDesc(dev, dt, shape)
	if err != nil {
		r.fail("tensor: %v", err)
	}
	return td
}
