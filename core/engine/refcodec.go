package engine

import (
	"encoding/binary"
	"hash/crc32"
	"sort"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// The serialized form of a reference:
//
//	magic "RDTR" | version u16 | flags u16 | body length u32 | body | crc32c u32
//
// The checksum (Castagnoli) covers everything before it. The body holds the
// object id, the owner's runtime id, the lease token, the write key (only
// with flagWritable), the owner's address and host identity, the transport
// name ("" = chosen per fetch), the tensor descriptions and each
// transport's metadata. Every length and count is bounded.

const (
	refMagic   = "RDTR"
	refVersion = 1
	refHeader  = 12
	refTrailer = 4

	// flagWritable marks a writable ref: its body carries the write key,
	// the capability its holders present to write (see Runtime.Expose).
	// Readers older than writable refs refuse the flag as unknown.
	flagWritable = 1

	// MaxRefSize bounds a serialized reference.
	MaxRefSize       = 64 << 20
	maxAddressLen    = control.MaxAddressLen
	maxHostIDLen     = control.MaxHostIDLen
	maxMetaEntries   = 32
	maxMetadataBytes = control.MaxMetadataBytes
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// OwnerInfo locates the runtime that owns an object.
type OwnerInfo struct {
	RuntimeID transport.RuntimeID
	Address   string
	HostID    string
}

// ObjectDesc is everything a reference says about its object. It is
// immutable once made and shared by the references that carry it.
type ObjectDesc struct {
	ID        transport.ObjectID
	Owner     OwnerInfo
	Transport string
	Tensors   []transport.TensorDesc
	Nbytes    uint64
	// Meta holds transport metadata carried by the ref, by transport name.
	Meta map[string][]byte
	// Writable objects were exposed for writing: their refs carry WriteKey,
	// which the owner checks on every write, and they are never fetched.
	Writable bool
	WriteKey WriteKey
}

// WriteKey is the capability of a writable ref: a random secret the owner
// made at Expose and compares on every write.
type WriteKey [16]byte

func newObjectDesc(id transport.ObjectID, owner OwnerInfo, transportName string, tensors []transport.TensorDesc, meta map[string][]byte) *ObjectDesc {
	d := &ObjectDesc{ID: id, Owner: owner, Transport: transportName, Tensors: tensors, Meta: meta}
	for _, t := range tensors {
		d.Nbytes += t.Nbytes
	}
	return d
}

// EncodeRef serializes a description and a lease token.
func EncodeRef(d *ObjectDesc, meta map[string][]byte, token uint64) []byte {
	w := transport.NewWireWriter(make([]byte, refHeader, 256))
	w.Raw(d.ID[:])
	w.Raw(d.Owner.RuntimeID[:])
	w.U64(token)
	flags := uint16(0)
	if d.Writable {
		flags |= flagWritable
		w.Raw(d.WriteKey[:])
	}
	w.Str16(d.Owner.Address)
	w.Str16(d.Owner.HostID)
	w.Str8(d.Transport)
	w.U32(uint32(len(d.Tensors)))
	for _, t := range d.Tensors {
		w.TensorDesc(t)
	}
	names := make([]string, 0, len(meta))
	for n := range meta {
		names = append(names, n)
	}
	sort.Strings(names)
	w.U32(uint32(len(names)))
	for _, n := range names {
		w.Str8(n)
		w.Bytes32(meta[n])
	}
	b := w.Bytes()
	copy(b[0:4], refMagic)
	binary.LittleEndian.PutUint16(b[4:6], refVersion)
	binary.LittleEndian.PutUint16(b[6:8], flags)
	binary.LittleEndian.PutUint32(b[8:12], uint32(len(b)-refHeader))
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// DecodeRef parses serialized bytes. Anything malformed is ErrCorrupt.
func DecodeRef(b []byte) (*ObjectDesc, uint64, error) {
	corrupt := func(format string, args ...any) (*ObjectDesc, uint64, error) {
		return nil, 0, transport.Errorf(transport.ErrCorrupt, "serialized ref: "+format, args...)
	}
	if len(b) < refHeader+refTrailer {
		return corrupt("%d bytes is too short to be a ref", len(b))
	}
	if len(b) > MaxRefSize {
		return corrupt("%d bytes is over the limit of %d", len(b), MaxRefSize)
	}
	if string(b[0:4]) != refMagic {
		return corrupt("bad magic %q (not rdt ref bytes)", b[0:4])
	}
	if v := binary.LittleEndian.Uint16(b[4:6]); v != refVersion {
		return corrupt("format version %d is not supported (this library reads version %d)", v, refVersion)
	}
	flags := binary.LittleEndian.Uint16(b[6:8])
	if flags&^flagWritable != 0 {
		return corrupt("unknown flags %#x", flags)
	}
	body := int(binary.LittleEndian.Uint32(b[8:12]))
	if body != len(b)-refHeader-refTrailer {
		return corrupt("length field says %d body bytes, have %d", body, len(b)-refHeader-refTrailer)
	}
	sum := binary.LittleEndian.Uint32(b[len(b)-refTrailer:])
	if got := crc32.Checksum(b[:len(b)-refTrailer], castagnoli); got != sum {
		return corrupt("checksum mismatch (bytes damaged in transit)")
	}

	r := transport.NewWireReader("serialized ref", b[refHeader:len(b)-refTrailer])
	id := r.ID()
	var owner OwnerInfo
	owner.RuntimeID = r.ID()
	token := r.U64()
	var key WriteKey
	if flags&flagWritable != 0 {
		copy(key[:], r.Take(len(key)))
	}
	owner.Address = r.Str16("owner address", maxAddressLen)
	owner.HostID = r.Str16("host id", maxHostIDLen)
	transportName := r.Str8("transport", 63)
	n := r.Count("tensor", transport.MaxTensors, transport.MinTensorDescSize)
	tensors := make([]transport.TensorDesc, 0, n)
	for i := 0; i < n && r.Err() == nil; i++ {
		tensors = append(tensors, r.TensorDesc())
	}
	nmeta := r.Count("metadata", maxMetaEntries, 5)
	meta := make(map[string][]byte, nmeta)
	for i := 0; i < nmeta && r.Err() == nil; i++ {
		name := r.Str8("metadata name", 63)
		data := r.Bytes32("metadata", maxMetadataBytes)
		if r.Err() != nil {
			break
		}
		if canon, err := transport.CanonicalName(name); err != nil || canon != name {
			r.Fail("metadata name %q is not a canonical transport name", name)
			break
		}
		if _, dup := meta[name]; dup {
			r.Fail("metadata for %q appears twice", name)
			break
		}
		meta[name] = data
	}
	if err := r.Done(); err != nil {
		return nil, 0, err
	}
	if id.IsZero() || owner.RuntimeID.IsZero() {
		return corrupt("zero object or owner id")
	}
	if owner.Address == "" {
		return corrupt("empty owner address")
	}
	if transportName != "" {
		canon, err := transport.CanonicalName(transportName)
		if err != nil || canon != transportName {
			return corrupt("transport %q is not a canonical name", transportName)
		}
	}
	d := newObjectDesc(id, owner, transportName, tensors, meta)
	if flags&flagWritable != 0 {
		if key == (WriteKey{}) {
			return corrupt("writable ref with a zero write key")
		}
		d.Writable, d.WriteKey = true, key
	}
	return d, token, nil
}
