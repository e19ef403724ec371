package nccl

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// libc is a library that exists everywhere and is not NCCL.
func libc(t *testing.T) string {
	for _, p := range []string{"libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6"} {
		if strings.Contains(p, "/") {
			if _, err := os.Stat(p); err != nil {
				continue
			}
		}
		return p
	}
	t.Skip("no libc.so.6 found")
	return ""
}

func TestLibraryOverride(t *testing.T) {
	t.Setenv("RDT_NCCL_LIBRARY", "")
	assert.Equal(t, DefaultLibrary, Library())
	t.Setenv("RDT_NCCL_LIBRARY", "/opt/x/libnccl.so.2")
	assert.Equal(t, "/opt/x/libnccl.so.2", Library())
}

// loadError is the error of loading the library that RDT_NCCL_LIBRARY
// names when set to lib; it requires one, with ErrUnsupported.
func loadError(t *testing.T, lib string) error {
	t.Helper()
	t.Setenv("RDT_NCCL_LIBRARY", lib)
	err := load(Library())
	require.Error(t, err)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	return err
}

func TestLoadMissingLibrary(t *testing.T) {
	err := loadError(t, "/nonexistent/libnccl.so.2")
	assert.Contains(t, err.Error(), "NCCL library /nonexistent/libnccl.so.2 could not be loaded")
	assert.Contains(t, err.Error(), "RDT_NCCL_LIBRARY")
}

func TestLoadWrongLibraryNamesTheSymbol(t *testing.T) {
	err := loadError(t, libc(t))
	assert.Contains(t, err.Error(), "has no symbol ncclGetVersion")
	assert.Contains(t, err.Error(), "not the NCCL library")
}

// Without NCCL (or CUDA) the transport does not exist: the factory says
// why, with ErrUnsupported, so runtimes skip it.
func TestUnavailableHere(t *testing.T) {
	if ncclMissing() == "" {
		t.Skip("this machine has NCCL and a CUDA device")
	}
	_, err := New(nil)
	require.Error(t, err)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "nccl")

	rt, err := engine.NewRuntime(engine.Options{LogLevel: transport.LogOff, Builtins: []transport.TransportFactory{Factory()}})
	require.NoError(t, err, "a missing library must not stop a runtime")
	defer rt.Destroy()
	assert.NotContains(t, rt.Registry().Names(), Name)
}

func TestErrorText(t *testing.T) {
	e := &Error{Op: "ncclCommInitRank", Code: RemoteError}
	assert.Contains(t, e.Error(), "ncclCommInitRank: ncclRemoteError")
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(fmt.Errorf("forming: %w", e)))
	assert.Equal(t, transport.ErrInvalidArgument, (&Error{Code: InvalidUsage}).RDTStatus())
	assert.Equal(t, "ncclResult_t(99)", Result(99).String())
	assert.Equal(t, "ncclTimeout", Timeout.String())
	assert.Equal(t, transport.ErrTimeout, (&Error{Code: Timeout}).RDTStatus())
}

// The descriptor: two-sided (the engine runs the source's Send), partial
// fetches, the last automatic choice for CUDA data, and the backend of
// groups that name none.
func TestDescribe(t *testing.T) {
	tr := &Transport{}
	d := tr.Describe()
	assert.Equal(t, Name, d.Name)
	assert.Equal(t, []transport.DeviceType{transport.DeviceCUDA}, d.Devices)
	assert.False(t, d.OneSided || d.SameHostOnly || d.Eager())
	assert.True(t, d.CanAbort && d.GroupBackend && d.Ranges)
	assert.Equal(t, transport.AutoRank{CUDA: 30}, d.Auto)
	var _ transport.Sender = tr
	var _ transport.GroupBackend = tr
}

// cudaTensor is a tensor of n bytes at addr on cuda:dev (never touched).
func cudaTensor(t *testing.T, dev int32, addr uintptr, n int) transport.Tensor {
	desc, err := transport.NewTensorDesc(transport.Device{Type: transport.DeviceCUDA, ID: dev}, transport.DType{Code: 1, Bits: 8, Lanes: 1}, []int64{int64(n)})
	require.NoError(t, err)
	return transport.Tensor{TensorDesc: desc, Data: addr, Orig: addr}
}

// The source sends the destination's pieces in its order, from the tensor
// each names, and refuses pieces outside the tensors; only the tensors
// sent from need be on the group's device.
func TestSendBuffersFollowThePieces(t *testing.T) {
	g := &group{name: "g", dev: 1}
	tensors := []transport.Tensor{cudaTensor(t, 1, 0x1000, 256), cudaTensor(t, 1, 0x9000, 64), cudaTensor(t, 0, 0x20000, 16)}
	bufs, err := g.sendBuffers(&transport.Transfer{}, tensors[:2])
	require.NoError(t, err)
	assert.Equal(t, []Buffer{{Ptr: 0x1000, Nbytes: 256}, {Ptr: 0x9000, Nbytes: 64}}, bufs, "a whole fetch sends every tensor")

	x := &transport.Transfer{Pieces: []transport.Piece{{Tensor: 1, Offset: 8, Length: 56}, {Tensor: 0, Offset: 100, Length: 0}, {Tensor: 0, Length: 256}}}
	bufs, err = g.sendBuffers(x, tensors)
	require.NoError(t, err)
	assert.Equal(t, []Buffer{{Ptr: 0x9008, Nbytes: 56}, {Ptr: 0x1064, Nbytes: 0}, {Ptr: 0x1000, Nbytes: 256}}, bufs)

	for _, p := range []transport.Piece{{Tensor: 3, Length: 1}, {Tensor: 1, Offset: 60, Length: 8}, {Tensor: 0, Offset: 8, Length: ^uint64(0) - 4}} {
		_, err := g.sendBuffers(&transport.Transfer{Pieces: []transport.Piece{p}}, tensors)
		assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "piece %+v", p)
	}
	_, err = g.sendBuffers(&transport.Transfer{Pieces: []transport.Piece{{Tensor: 2, Length: 16}}}, tensors)
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "a piece of a tensor on another device")
}

// The destination receives piece i into target i: a target of another
// length, or another count, would not match the source's sends.
func TestReceivesMatchThePieces(t *testing.T) {
	targets := []transport.Tensor{cudaTensor(t, 0, 0x1000, 56), cudaTensor(t, 0, 0x2000, 0)}
	pieces := []transport.Piece{{Tensor: 1, Offset: 8, Length: 56}, {Tensor: 0, Offset: 3, Length: 0}}
	assert.NoError(t, matchPieces(&transport.Transfer{}, targets))
	assert.NoError(t, matchPieces(&transport.Transfer{Pieces: pieces}, targets))
	err := matchPieces(&transport.Transfer{Pieces: pieces[:1]}, targets)
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err))
	err = matchPieces(&transport.Transfer{Pieces: []transport.Piece{pieces[1], pieces[0]}}, targets)
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err))
}
