package transport

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
)

// ID is a 16-byte identifier of a runtime or an object.
type ID [16]byte

// ObjectID identifies an object across all runtimes.
type ObjectID = ID

// RuntimeID identifies a runtime across all hosts.
type RuntimeID = ID

// String is the lower-case hexadecimal form (32 characters).
func (id ID) String() string { return hex.EncodeToString(id[:]) }

// IsZero reports whether id is all zeros (never a valid id).
func (id ID) IsZero() bool { return id == ID{} }

// ParseID parses the 32-character hexadecimal form.
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != 32 {
		return id, Errorf(ErrInvalidArgument, "id %q: want 32 hexadecimal characters", s)
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, Errorf(ErrInvalidArgument, "id %q: %v", s, err)
	}
	return id, nil
}

// RandomID is 128 bits from crypto/rand: runtime and object ids. An object
// id is what a peer names to read an object over the tcp data port, so no
// id may be derivable from another (a prefix and a counter would let anyone
// who saw one ref guess its neighbours). Reading the kernel's randomness
// costs a put tens of nanoseconds (see BenchmarkPut).
func RandomID() ID {
	var id ID
	if _, err := rand.Read(id[:]); err != nil {
		panic("rdt: no randomness: " + err.Error())
	}
	return id
}

// RandomUint64 is 64 bits from crypto/rand: tokens and transfer ids.
func RandomUint64() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("rdt: no randomness: " + err.Error())
	}
	return binary.LittleEndian.Uint64(b[:])
}
