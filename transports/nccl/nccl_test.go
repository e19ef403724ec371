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

func TestLoadMissingLibrary(t *testing.T) {
	t.Setenv("RDT_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
	err := load(Library())
	require.Error(t, err)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "NCCL library /nonexistent/libnccl.so.2 could not be loaded")
	assert.Contains(t, err.Error(), "RDT_NCCL_LIBRARY")
}

func TestLoadWrongLibraryNamesTheSymbol(t *testing.T) {
	t.Setenv("RDT_NCCL_LIBRARY", libc(t))
	err := load(Library())
	require.Error(t, err)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
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

// The descriptor: two-sided (the engine runs the source's Send), the last
// automatic choice for CUDA data, and the backend of groups that name none.
func TestDescribe(t *testing.T) {
	tr := &Transport{}
	d := tr.Describe()
	assert.Equal(t, Name, d.Name)
	assert.Equal(t, []transport.DeviceType{transport.DeviceCUDA}, d.Devices)
	assert.False(t, d.OneSided || d.SameHostOnly || d.Eager())
	assert.True(t, d.CanAbort && d.GroupBackend)
	assert.Equal(t, transport.AutoRank{CUDA: 30}, d.Auto)
	var _ transport.Sender = tr
	var _ transport.GroupBackend = tr
}
