package transport

import (
	"context"
	"regexp"
	"strings"
)

// MaxGroupSize bounds the world size of a group.
const MaxGroupSize = 1 << 16

// GroupMember is one rank of a group.
type GroupMember struct {
	Runtime RuntimeID
	Name    string
	Address string
}

// GroupRoster is what every rank of a formed group knows.
type GroupRoster struct {
	Name      string
	Backend   string // the transport whose communicator the group is
	Instance  uint64 // random, made by rank 0: tells re-created groups apart
	Bootstrap []byte // the backend's bytes made on rank 0 (an ncclUniqueId)
	Members   []GroupMember
}

// WorldSize is the number of ranks.
func (g *GroupRoster) WorldSize() int { return len(g.Members) }

// RankOf finds the rank of a runtime (-1 if it is not a member).
func (g *GroupRoster) RankOf(id RuntimeID) int {
	for i, m := range g.Members {
		if m.Runtime == id {
			return i
		}
	}
	return -1
}

// GroupSpec is one rank's part in forming a group.
type GroupSpec struct {
	Name      string
	WorldSize int
	Rank      int
	// Rank0 is the control-plane address of rank 0's runtime (ignored on
	// rank 0 itself).
	Rank0 string
	// Device is the ordinal of the device the rank's communicator uses.
	Device int
	// Backend names the transport ("": the registered transport whose
	// descriptor sets GroupBackend).
	Backend string
}

// GroupBackend is implemented by transports that move bytes inside groups.
type GroupBackend interface {
	// NewGroupBootstrap runs on rank 0 before anyone joins: the bytes every
	// rank needs to initialize the communicator (ncclGetUniqueId).
	NewGroupBootstrap(spec GroupSpec) ([]byte, error)
	// InitGroup runs on every rank once all ranks joined, and returns when
	// the communicator is formed (ncclCommInitRank), failed, or ctx is done.
	InitGroup(ctx context.Context, roster *GroupRoster, spec GroupSpec) error
	// DestroyGroup frees this rank's communicator of the group.
	DestroyGroup(name string) error
}

var groupNameRE = regexp.MustCompile(`^[A-Za-z0-9_.:\-]{1,127}$`)

// CheckGroupName validates a group name.
func CheckGroupName(name string) error {
	if !groupNameRE.MatchString(name) {
		return Errorf(ErrInvalidArgument, "group name %q: want 1 to 127 letters, digits, '_', '-', '.' or ':'", name)
	}
	return nil
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_.\-]{1,63}$`)

// CanonicalName validates a transport name and lower-cases it.
func CanonicalName(name string) (string, error) {
	if !nameRE.MatchString(name) {
		return "", Errorf(ErrInvalidArgument, "transport name %q: want 1 to 63 letters, digits, '_', '-' or '.'", name)
	}
	return strings.ToLower(name), nil
}
