// Package transporttest is the conformance suite every transport runs, and
// the test doubles transport tests share: a Host standing for the runtime a
// transport belongs to, host and device memory, and a source process the
// test can stop and kill. It imports only core/transport and the standard
// library, so transports may use it without depending on the engine.
package transporttest

import (
	"context"
	"crypto/rand"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// TestHostID is the host identity every Host reports: the tests' runtimes
// all live on this machine.
const TestHostID = "transporttest-host"

// Host is the little of a runtime a transport asks for. Its fields are the
// knobs tests turn; set them before the transport is made.
type Host struct {
	// ID is the runtime id (random unless set).
	ID transport.RuntimeID
	// Token is the shared TCP secret ("" for none).
	Token string
	// Dir is the socket directory (see SocketDir).
	Dir string
	// Timeout is PeerTimeout (transport.DefaultPeerTimeout unless set).
	Timeout time.Duration
	// LogLevel is the level of the host's logger (off unless set).
	LogLevel transport.LogLevel
	// Config are the runtime's settings (none set unless set: every
	// setting reads as its default).
	Config transport.Settings
	// Ctx is Context (context.Background unless set).
	Ctx context.Context

	// Writes, when set, are the write ids WriteInto admits and the pieces
	// each covers (nil: whole); unset, it admits any write into a held
	// object (the engine admits writes; the transport only lands them).
	Writes map[uint64][]transport.Piece

	mu   sync.Mutex
	objs map[transport.ObjectID][]transport.Tensor
	pins int
}

// NewHost returns a host with a fresh runtime id and a private socket
// directory that is removed when the test ends.
func NewHost(t testing.TB) *Host {
	t.Helper()
	return NewHostIn(SocketDir(t))
}

// NewHostIn returns a host with a fresh runtime id whose socket directory
// is dir ("" for the system's temporary directory).
func NewHostIn(dir string) *Host {
	h := &Host{Dir: dir, Timeout: transport.DefaultPeerTimeout, LogLevel: transport.LogOff,
		Ctx: context.Background(), objs: map[transport.ObjectID][]transport.Tensor{}}
	_, _ = rand.Read(h.ID[:])
	return h
}

// SocketDir makes a private directory for Unix sockets, removed when the
// test ends (t.TempDir paths can exceed the Unix socket path limit).
func SocketDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rdtt")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Identity reports the runtime as one of this process on the test host.
func (h *Host) Identity() transport.PeerInfo {
	return transport.PeerInfo{RuntimeID: h.ID, Name: "test", HostID: TestHostID, Pid: os.Getpid()}
}

func (h *Host) Log() *transport.Logger { return transport.NewLogger("test", h.LogLevel) }

func (h *Host) Context() context.Context { return h.Ctx }

func (h *Host) AuthToken() string { return h.Token }

func (h *Host) RuntimeSecret() string { return "test-secret" }

func (h *Host) BindHost() string { return "127.0.0.1" }

func (h *Host) AdvertiseHost() string { return "127.0.0.1" }

// SocketDir is Dir, or the system's temporary directory when Dir is empty.
func (h *Host) SocketDir() string {
	if h.Dir == "" {
		return os.TempDir()
	}
	return h.Dir
}

func (h *Host) PeerTimeout() time.Duration { return h.Timeout }

func (h *Host) Settings() transport.Settings { return h.Config }

// Hold makes obj a live object of this runtime: PinObject finds it until
// Drop.
func (h *Host) Hold(obj transport.ObjectID, tensors []transport.Tensor) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.objs[obj] = tensors
}

// Drop frees obj as far as PinObject goes.
func (h *Host) Drop(obj transport.ObjectID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.objs, obj)
}

// PinObject returns a held object and counts the pin until unpin.
func (h *Host) PinObject(obj transport.ObjectID) ([]transport.Tensor, func(), error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	tensors, ok := h.objs[obj]
	if !ok {
		return nil, nil, transport.Errorf(transport.ErrNotFound, "object %s is not held here", obj)
	}
	h.pins++
	var once sync.Once
	return tensors, func() {
		once.Do(func() { h.mu.Lock(); h.pins--; h.mu.Unlock() })
	}, nil
}

// WriteInto admits a write into a held object (see Writes), pinned until
// done.
func (h *Host) WriteInto(obj transport.ObjectID, writeID uint64) ([]transport.Tensor, []transport.Piece, func(), error) {
	var pieces []transport.Piece
	h.mu.Lock()
	if h.Writes != nil { // read under the lock: EndWrite changes it
		p, ok := h.Writes[writeID]
		if !ok {
			h.mu.Unlock()
			return nil, nil, nil, transport.Errorf(transport.ErrNotFound, "write %d is not open", writeID)
		}
		pieces = transport.MergePieces(p) // as the engine hands them out
	}
	h.mu.Unlock()
	tensors, unpin, err := h.PinObject(obj)
	if err != nil {
		return nil, nil, nil, err
	}
	return tensors, pieces, unpin, nil
}

// Admit admits write writeID for pieces (nil: every tensor, whole), as
// the engine does when the owner admits a write; safe while writes land.
// From the first call on, WriteInto refuses the writes not admitted.
func (h *Host) Admit(writeID uint64, pieces []transport.Piece) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.Writes == nil {
		h.Writes = map[uint64][]transport.Piece{}
	}
	h.Writes[writeID] = pieces
}

// EndWrite ends an admitted write, as the engine does when its writer
// reports the outcome: WriteInto refuses it from then on. Writes must be
// set.
func (h *Host) EndWrite(writeID uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.Writes, writeID)
}

// Pinned is the number of pins not released yet.
func (h *Host) Pinned() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pins
}
