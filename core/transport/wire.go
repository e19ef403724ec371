package transport

import (
	"encoding/binary"
	"math"
)

// WireWriter and WireReader are the little-endian encoding shared by the
// ref format, the control-plane messages and transports' metadata codecs.
// The reader never trusts a length: every read is checked against what
// remains, so a corrupt input can neither read out of bounds nor make it
// allocate more than its own size.

// WireWriter appends the encoding to a byte slice.
type WireWriter struct{ b []byte }

// NewWireWriter appends to b (which may hold a header already).
func NewWireWriter(b []byte) *WireWriter { return &WireWriter{b: b} }

// Bytes is everything written, b included.
func (w *WireWriter) Bytes() []byte { return w.b }

// U8, U16, U32, U64, I32 and I64 append one little-endian integer; Raw
// appends bytes as they are.
func (w *WireWriter) U8(v uint8)   { w.b = append(w.b, v) }
func (w *WireWriter) U16(v uint16) { w.b = binary.LittleEndian.AppendUint16(w.b, v) }
func (w *WireWriter) U32(v uint32) { w.b = binary.LittleEndian.AppendUint32(w.b, v) }
func (w *WireWriter) U64(v uint64) { w.b = binary.LittleEndian.AppendUint64(w.b, v) }
func (w *WireWriter) I32(v int32)  { w.U32(uint32(v)) }
func (w *WireWriter) I64(v int64)  { w.U64(uint64(v)) }
func (w *WireWriter) Raw(p []byte) { w.b = append(w.b, p...) }

// Str8 writes a string of at most 255 bytes after its u8 length.
func (w *WireWriter) Str8(s string) {
	w.U8(uint8(len(s)))
	w.b = append(w.b, s...)
}

// Str16 writes a string of at most 65535 bytes after its u16 length.
func (w *WireWriter) Str16(s string) {
	w.U16(uint16(len(s)))
	w.b = append(w.b, s...)
}

// Bytes32 writes p after its u32 length.
func (w *WireWriter) Bytes32(p []byte) {
	w.U32(uint32(len(p)))
	w.b = append(w.b, p...)
}

// WireReader reads the bounded encoding. A read past the end leaves a
// CORRUPT error naming the format (Err), and every later read returns a
// zero value, so a decoder checks once after a group of reads.
type WireReader struct {
	b   []byte
	err error
	// what names the format in error messages.
	what string
}

// NewWireReader reads b; what names the format in errors.
func NewWireReader(what string, b []byte) *WireReader {
	return &WireReader{b: b, what: what}
}

// Len is how many bytes are left.
func (r *WireReader) Len() int { return len(r.b) }

// Err is the first error, or nil.
func (r *WireReader) Err() error { return r.err }

// Fail records a CORRUPT error naming the format, unless one is recorded.
func (r *WireReader) Fail(format string, args ...any) {
	if r.err == nil {
		r.err = Errorf(ErrCorrupt, r.what+": "+format, args...)
	}
}

// Take returns the next n bytes (sharing the input's memory) or nil.
func (r *WireReader) Take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.Fail("truncated: need %d more bytes, have %d", n, len(r.b))
		return nil
	}
	p := r.b[:n:n] // appending to it never writes over what follows
	r.b = r.b[n:]
	return p
}

// U8, U16, U32, U64, I32 and I64 read one little-endian integer.
func (r *WireReader) U8() uint8 {
	if p := r.Take(1); p != nil {
		return p[0]
	}
	return 0
}
func (r *WireReader) U16() uint16 {
	if p := r.Take(2); p != nil {
		return binary.LittleEndian.Uint16(p)
	}
	return 0
}
func (r *WireReader) U32() uint32 {
	if p := r.Take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}
func (r *WireReader) U64() uint64 {
	if p := r.Take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}
func (r *WireReader) I32() int32 { return int32(r.U32()) }
func (r *WireReader) I64() int64 { return int64(r.U64()) }

// ID reads a 16-byte id.
func (r *WireReader) ID() (id ID) {
	copy(id[:], r.Take(len(id)))
	return id
}

// Str8 reads a string written by WireWriter.Str8, refusing one over max
// bytes; field names it in the error.
func (r *WireReader) Str8(field string, max int) string { return r.str(int(r.U8()), field, max) }

// Str16 reads a string written by WireWriter.Str16, bounded like Str8.
func (r *WireReader) Str16(field string, max int) string { return r.str(int(r.U16()), field, max) }

// str reads the n bytes of a string whose length prefix was just read,
// bounded like Str8.
func (r *WireReader) str(n int, field string, max int) string {
	if n > max {
		r.Fail("%s is %d bytes, over the limit of %d", field, n, max)
		return ""
	}
	return string(r.Take(n))
}

// Bytes32 reads a copy of what WireWriter.Bytes32 wrote, bounded like Str8.
func (r *WireReader) Bytes32(field string, max int) []byte {
	n := r.U32()
	if uint64(n) > uint64(max) || n > math.MaxInt32 {
		r.Fail("%s is %d bytes, over the limit of %d", field, n, max)
		return nil
	}
	p := r.Take(int(n))
	if p == nil {
		return nil
	}
	return append([]byte(nil), p...)
}

// Count reads a u32 count, bounded by max and by what the remaining bytes
// could possibly hold (minSize bytes per item).
func (r *WireReader) Count(field string, max, minSize int) int {
	n := r.U32()
	if uint64(n) > uint64(max) {
		r.Fail("%s count %d is over the limit of %d", field, n, max)
		return 0
	}
	if minSize > 0 && uint64(n)*uint64(minSize) > uint64(len(r.b)) {
		r.Fail("%s count %d cannot fit in the %d bytes left", field, n, len(r.b))
		return 0
	}
	return int(n)
}

// Done returns Err, or a CORRUPT error when bytes are left over.
func (r *WireReader) Done() error {
	if r.err == nil && len(r.b) != 0 {
		r.Fail("%d unexpected trailing bytes", len(r.b))
	}
	return r.err
}

// TensorDesc writes a tensor description: refs and messages share the
// encoding.
func (w *WireWriter) TensorDesc(t TensorDesc) {
	w.I32(int32(t.Device.Type))
	w.I32(t.Device.ID)
	w.U8(t.DType.Code)
	w.U8(t.DType.Bits)
	w.U16(t.DType.Lanes)
	w.U8(uint8(len(t.Shape)))
	for _, d := range t.Shape {
		w.I64(d)
	}
}

// MinTensorDescSize is the fewest bytes an encoded TensorDesc takes.
const MinTensorDescSize = 4 + 4 + 4 + 1

// TensorDesc reads what WireWriter.TensorDesc wrote, checking it.
func (r *WireReader) TensorDesc() TensorDesc {
	dev := Device{Type: DeviceType(r.I32()), ID: r.I32()}
	dt := DType{Code: r.U8(), Bits: r.U8(), Lanes: r.U16()}
	ndim := int(r.U8())
	if ndim > MaxNDim {
		r.Fail("tensor has %d dimensions, over the limit of %d", ndim, MaxNDim)
		return TensorDesc{}
	}
	shape := make([]int64, 0, ndim)
	for i := 0; i < ndim && r.err == nil; i++ {
		shape = append(shape, r.I64())
	}
	if r.err != nil {
		return TensorDesc{}
	}
	td, err := NewTensorDesc(dev, dt, shape)
	if err != nil {
		r.Fail("tensor: %v", err)
	}
	return td
}

// A transport's metadata starts with its 4-byte magic and a version byte,
// so that a build reads only the layouts it knows.

// NewMetadataWriter starts a transport's metadata with its header;
// capacity is a hint for the whole encoding.
func NewMetadataWriter(magic string, version uint8, capacity int) *WireWriter {
	w := NewWireWriter(make([]byte, 0, max(capacity, len(magic)+1)))
	w.Raw([]byte(magic))
	w.U8(version)
	return w
}

// OpenMetadata checks the header NewMetadataWriter wrote and returns a
// reader of what follows: CORRUPT when b is too short or another format,
// UNSUPPORTED when it is another version of this one.
func OpenMetadata(b []byte, magic string, version uint8) (*WireReader, error) {
	r, _, err := OpenMetadataVersions(b, magic, version, version)
	return r, err
}

// OpenMetadataVersions is OpenMetadata for a format that still reads
// versions oldest to newest; it also returns the version found.
func OpenMetadataVersions(b []byte, magic string, oldest, newest uint8) (*WireReader, uint8, error) {
	r := NewWireReader("transport metadata", b)
	got, v := r.Take(len(magic)), r.U8()
	if r.Err() != nil {
		return nil, 0, CorruptMetadata("too short")
	}
	if string(got) != magic {
		return nil, 0, CorruptMetadata("bad magic")
	}
	if v < oldest || v > newest {
		if oldest == newest {
			return nil, 0, Errorf(ErrUnsupported, "metadata version %d, this build reads version %d", v, newest)
		}
		return nil, 0, Errorf(ErrUnsupported, "metadata version %d, this build reads versions %d to %d", v, oldest, newest)
	}
	return r, v, nil
}

// CorruptMetadata is the error for metadata that breaks its format's rules.
func CorruptMetadata(why string) error {
	return Errorf(ErrCorrupt, "corrupt transport metadata (%s)", why)
}

// RecordCount reads the u32 count of the fixed-size records (one per
// tensor, size bytes each) that end a transport's metadata, and checks it:
// CORRUPT when the metadata ended before the count (short says why), when
// the count is over max, or when what remains is not count records.
func (r *WireReader) RecordCount(short string, max uint32, size uint64) (uint32, error) {
	n := r.U32()
	if r.Err() != nil {
		return 0, CorruptMetadata(short)
	}
	if n > max {
		return 0, CorruptMetadata("too many tensors")
	}
	if uint64(r.Len()) != uint64(n)*size {
		return 0, CorruptMetadata("length does not match the tensor count")
	}
	return n, nil
}
