package multiprocess

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/shm"
	"github.com/rdt-project/rdt/transports/tcp"
)

// misaddressing is a built-in transport that, asked to write, sends bytes
// of its own to pieces of its own: a writer holding the key that lands
// its bytes elsewhere than the ranges the owner admitted.
type misaddressing struct {
	transport.Transport
	pieces []transport.Piece
	mem    [][]byte
}

func misaddressingFactory(f transport.TransportFactory, pieces []transport.Piece, mem [][]byte) transport.TransportFactory {
	return transport.TransportFactory{Name: f.Name, Settings: f.Settings, New: func(h transport.Host) (transport.Transport, error) {
		tr, err := f.New(h)
		return misaddressing{Transport: tr, pieces: pieces, mem: mem}, err
	}}
}

func (m misaddressing) Write(x *transport.Transfer, _ []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	y := *x
	y.Pieces = m.pieces
	var sources []transport.Tensor
	for _, b := range m.mem {
		sources = append(sources, tensorOver(b))
	}
	return m.Transport.(transport.Writer).Write(&y, sources, tmeta, cmeta)
}

// A writer admitted for bytes [0, 16) of an exposed tensor that sends its
// bytes to 4096, 8192 and 65536 instead (over shm inline and staged, and
// over tcp) lands none of them: the owner's transport refuses them, the
// write fails, and the owner's notice of it is a failure, not "16 bytes,
// ok". No byte of the owner's tensor changes.
func TestMisaddressedWriteLandsNothingAndItsNoticeFails(t *testing.T) {
	inline := []transport.Piece{{Offset: 4096, Length: 16}, {Offset: 8192, Length: 16}}
	staged := []transport.Piece{{Offset: 65536, Length: 64 << 10}}
	for _, c := range []struct {
		name    string
		factory transport.TransportFactory
		pieces  []transport.Piece
	}{
		{"shm_inline", shm.Factory(), inline},
		{"shm_staged", shm.Factory(), staged},
		{"tcp", tcp.Factory(), append(inline, staged...)},
	} {
		t.Run(c.name, func(t *testing.T) {
			owner := parentRuntime(t, runtimeConfig{Name: "owner"})
			exposed, buf := exposeIn(t, owner, 128<<10, c.factory.Name)
			before := bytes.Clone(buf)
			var mem [][]byte
			for _, p := range c.pieces {
				b := hostMem(int(p.Length))
				t.Cleanup(func() { freeMem(b) })
				copy(b, bytes.Repeat([]byte{0xee}, len(b)))
				mem = append(mem, b)
			}
			writer, err := engine.NewRuntime(engine.Options{Name: "writer", LogLevel: transport.LogOff, Network: control.Sockets{},
				SocketDir: sharedSocketDir(t), Builtins: []transport.TransportFactory{misaddressingFactory(c.factory, c.pieces, mem)}})
			require.NoError(t, err)
			t.Cleanup(writer.Destroy)
			b, err := exposed.Serialize()
			require.NoError(t, err)
			w, err := writer.Deserialize(b)
			require.NoError(t, err)
			defer w.Release()

			src := hostMem(16)
			defer freeMem(src)
			dest := []engine.Range{{Ref: 0, Piece: transport.Piece{Length: 16}}}
			err = writer.Write([]*engine.Ref{w}, []transport.Tensor{tensorOver(src)}, engine.WriteOptions{Transport: c.factory.Name, Tag: 9, Destinations: dest}, 30*time.Second)
			assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
			n, err := exposed.WaitWriteNotice(30 * time.Second)
			require.NoError(t, err)
			assert.Equal(t, uint64(9), n.Tag)
			assert.Error(t, n.Err, "the notice of a write whose bytes were refused is a failure")
			assert.True(t, bytes.Equal(before, buf), "no byte of the owner's tensor changed")
			assert.Zero(t, owner.Stats().WritesOpen)
		})
	}
}
