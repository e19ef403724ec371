package core

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"sync/atomic"
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

func randomID() ID {
	var id ID
	if _, err := rand.Read(id[:]); err != nil {
		panic("rdt: no randomness: " + err.Error())
	}
	return id
}

func randomUint64() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("rdt: no randomness: " + err.Error())
	}
	return binary.LittleEndian.Uint64(b[:])
}

// idSource mints object ids: a random per-runtime prefix and a counter, so
// ids are unique across runtimes without a syscall per object.
type idSource struct {
	prefix [8]byte
	next   atomic.Uint64
}

func newIDSource() *idSource {
	s := &idSource{}
	r := randomID()
	copy(s.prefix[:], r[:8])
	s.next.Store(binary.LittleEndian.Uint64(r[8:]))
	return s
}

func (s *idSource) newID() ID {
	var id ID
	copy(id[:8], s.prefix[:])
	binary.BigEndian.PutUint64(id[8:], s.next.Add(1))
	return id
}
