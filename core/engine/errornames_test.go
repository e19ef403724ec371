package engine

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A transport's own error type that knows its status, as a driver binding
// has: the engine must honour it without the transport converting it.
type linkError struct{ code int }

func (e *linkError) Error() string               { return fmt.Sprintf("link error %d", e.code) }
func (e *linkError) RDTStatus() transport.Status { return transport.ErrPeerUnavailable }

// quillName is unusual enough that counting it in a message counts the
// places that named the transport.
const quillName = "quill"

// failingExtract refuses to make metadata, wrapping its own error type.
type failingExtract struct{ *memTransport }

func (f failingExtract) ExtractMetadata(transport.ObjectID, []transport.Tensor) ([]byte, error) {
	return nil, fmt.Errorf("registering the buffer: %w", &linkError{code: 7})
}

func TestTransportErrorsReachTheCallerNamedOnceWithTheirStatus(t *testing.T) {
	p := newPair(t, nil)
	p.src.name, p.dst.name = quillName, quillName
	p.dst.waitErr = func(*transport.Transfer) error {
		return fmt.Errorf("reading tensor 0: %w", &linkError{code: 3})
	}
	// newPair registered "mem"; register the renamed pair as well.
	require.NoError(t, p.owner.RegisterTransport(p.src))
	require.NoError(t, p.borrower.RegisterTransport(p.dst))

	refs, src := p.share(t, 1, 64, quillName)
	targets, _ := targetsFor(t, src)
	f, err := p.borrower.StartFetch(refs, targets, FetchOptions{Transport: quillName})
	require.NoError(t, err)
	err = f.Wait(5 * time.Second)
	f.Free()
	require.Error(t, err)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "the transport's own error type keeps its status: %v", err)
	assert.Contains(t, err.Error(), "transport quill: reading tensor 0: link error 3")
	assert.Equal(t, 1, strings.Count(err.Error(), quillName), "named exactly once: %v", err)

	// A failure to start names it once too.
	p.dst.failFetchIdx = int(p.dst.fetched.Load()) + 1
	f, err = p.borrower.StartFetch(refs, targets, FetchOptions{Transport: quillName})
	require.NoError(t, err)
	err = f.Wait(5 * time.Second)
	f.Free()
	assert.Equal(t, transport.ErrTransport, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "transport quill: fetch")
	assert.Equal(t, 1, strings.Count(err.Error(), quillName), "named exactly once: %v", err)
}

func TestPutNamesTheTransportThatFailedOnce(t *testing.T) {
	rt := newRuntime(t, "owner")
	m := newMemTransport(quillName)
	require.NoError(t, rt.RegisterTransport(failingExtract{m}))
	buf := newHostBuf(t, 64)
	_, err := rt.Put([]transport.Tensor{tensorOf(t, buf)}, quillName, nil)
	require.Error(t, err)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "transport quill: could not extract metadata: registering the buffer: link error 7")
	assert.Equal(t, 1, strings.Count(err.Error(), quillName), "named exactly once: %v", err)
}

// A built-in transport logs through its Host without naming itself; the
// line names it once, and the runtime's own lines are not prefixed.
func TestTransportLogLinesNameTheTransportOnce(t *testing.T) {
	var logged transporttest.LogBuffer
	factory := transport.TransportFactory{Name: quillName, New: func(h transport.Host) (transport.Transport, error) {
		h.Log().Warnf("the listener stopped accepting: too many files")
		return newMemTransport(quillName), nil
	}}
	rt := newRuntime(t, "logger", func(o *Options) {
		o.LogLevel, o.LogOutput = transport.LogWarn, &logged
		o.Builtins = []transport.TransportFactory{factory}
	})
	out := logged.String()
	assert.Contains(t, out, "rdt[logger] warn: transport quill: the listener stopped accepting: too many files")
	assert.Equal(t, 1, strings.Count(out, quillName), "named exactly once: %q", out)

	rt.Log().Warnf("a line of the runtime's own")
	assert.Contains(t, logged.String(), "warn: a line of the runtime's own\n", "the runtime's logger is not the transport's")
}

// A built-in transport that fails to start is named once in the error.
func TestBuiltinFailureNamesTheTransportOnce(t *testing.T) {
	factory := transport.TransportFactory{Name: quillName, New: func(h transport.Host) (transport.Transport, error) {
		return nil, transport.Errorf(transport.ErrPermissionDenied, "the device node is not readable")
	}}
	_, err := NewRuntime(Options{Name: "x", LogLevel: transport.LogOff, Builtins: []transport.TransportFactory{factory}})
	require.Error(t, err)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err))
	assert.Equal(t, "transport quill: the device node is not readable", err.Error())
}
