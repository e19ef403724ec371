package core

import (
	"encoding/binary"
	"hash/crc32"
	"sort"
)

// The serialized form of a reference:
//
//	magic "RDTR" | version u16 | flags u16 | body length u32 | body | crc32c u32
//
// The checksum (Castagnoli) covers everything before it. The body holds the
// object id, the owner's runtime id, address and host identity, the lease
// token, the transport name ("" = chosen per fetch), the tensor descriptions
// and each transport's metadata. Every length and count is bounded.

const (
	refMagic   = "RDTR"
	refVersion = 1
	refHeader  = 12
	refTrailer = 4

	// MaxRefSize bounds a serialized reference.
	MaxRefSize       = 64 << 20
	maxAddressLen    = 1024
	maxHostIDLen     = 1024
	maxMetaEntries   = 32
	maxMetadataBytes = 16 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// OwnerInfo locates the runtime that owns an object.
type OwnerInfo struct {
	RuntimeID RuntimeID
	Address   string
	HostID    string
}

// ObjectDesc is everything a reference says about its object. It is
// immutable once made and shared by the references that carry it.
type ObjectDesc struct {
	ID        ObjectID
	Owner     OwnerInfo
	Transport string
	Tensors   []TensorDesc
	Nbytes    uint64
	// Meta holds transport metadata carried by the ref, by transport name.
	Meta map[string][]byte
}

func newObjectDesc(id ObjectID, owner OwnerInfo, transport string, tensors []TensorDesc, meta map[string][]byte) *ObjectDesc {
	d := &ObjectDesc{ID: id, Owner: owner, Transport: transport, Tensors: tensors, Meta: meta}
	for _, t := range tensors {
		d.Nbytes += t.Nbytes
	}
	return d
}

// EncodeRef serializes a description and a lease token.
func EncodeRef(d *ObjectDesc, meta map[string][]byte, token uint64) []byte {
	w := &writer{b: make([]byte, refHeader, 256)}
	w.raw(d.ID[:])
	w.raw(d.Owner.RuntimeID[:])
	w.u64(token)
	w.str16(d.Owner.Address)
	w.str16(d.Owner.HostID)
	w.str8(d.Transport)
	w.u32(uint32(len(d.Tensors)))
	for _, t := range d.Tensors {
		w.tensorDesc(t)
	}
	names := make([]string, 0, len(meta))
	for n := range meta {
		names = append(names, n)
	}
	sort.Strings(names)
	w.u32(uint32(len(names)))
	for _, n := range names {
		w.str8(n)
		w.bytes32(meta[n])
	}
	b := w.b
	copy(b[0:4], refMagic)
	binary.LittleEndian.PutUint16(b[4:6], refVersion)
	binary.LittleEndian.PutUint16(b[6:8], 0)
	binary.LittleEndian.PutUint32(b[8:12], uint32(len(b)-refHeader))
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// DecodeRef parses serialized bytes. Anything malformed is ErrCorrupt.
func DecodeRef(b []byte) (*ObjectDesc, uint64, error) {
	corrupt := func(format string, args ...any) (*ObjectDesc, uint64, error) {
		return nil, 0, Errorf(ErrCorrupt, "serialized ref: "+format, args...)
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
	if f := binary.LittleEndian.Uint16(b[6:8]); f != 0 {
		return corrupt("unknown flags %#x", f)
	}
	body := int(binary.LittleEndian.Uint32(b[8:12]))
	if body != len(b)-refHeader-refTrailer {
		return corrupt("length field says %d body bytes, have %d", body, len(b)-refHeader-refTrailer)
	}
	sum := binary.LittleEndian.Uint32(b[len(b)-refTrailer:])
	if got := crc32.Checksum(b[:len(b)-refTrailer], castagnoli); got != sum {
		return corrupt("checksum mismatch (bytes damaged in transit)")
	}

	r := &reader{b: b[refHeader : len(b)-refTrailer], what: "serialized ref"}
	id := r.id()
	var owner OwnerInfo
	owner.RuntimeID = r.id()
	token := r.u64()
	owner.Address = r.str16("owner address", maxAddressLen)
	owner.HostID = r.str16("host id", maxHostIDLen)
	transport := r.str8("transport", 63)
	n := r.count("tensor", MaxTensors, minTensorDescSize)
	tensors := make([]TensorDesc, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		tensors = append(tensors, r.tensorDesc())
	}
	nmeta := r.count("metadata", maxMetaEntries, 5)
	meta := make(map[string][]byte, nmeta)
	for i := 0; i < nmeta && r.err == nil; i++ {
		name := r.str8("metadata name", 63)
		data := r.bytes32("metadata", maxMetadataBytes)
		if r.err != nil {
			break
		}
		if _, err := CanonicalName(name); err != nil || name != lower(name) {
			r.fail("metadata name %q is not a canonical transport name", name)
			break
		}
		if _, dup := meta[name]; dup {
			r.fail("metadata for %q appears twice", name)
			break
		}
		meta[name] = data
	}
	if err := r.done(); err != nil {
		return nil, 0, err
	}
	if id.IsZero() || owner.RuntimeID.IsZero() {
		return corrupt("zero object or owner id")
	}
	if owner.Address == "" {
		return corrupt("empty owner address")
	}
	if transport != "" {
		canon, err := CanonicalName(transport)
		if err != nil || canon != transport {
			return corrupt("transport %q is not a canonical name", transport)
		}
	}
	return newObjectDesc(id, owner, transport, tensors, meta), token, nil
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
