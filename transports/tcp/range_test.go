package tcp

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// RequestRange pulls one byte range of one tensor of an object from the
// data endpoint named in tmeta (the object's tcp metadata), authenticating
// with the key in tmeta, or with token when it carries none, and returns
// the bytes or the source's refusal. It is the tests' client, independent of
// any runtime, for asking what a fetch never would: fetches go through
// Fetch.
func RequestRange(ctx context.Context, token string, tmeta []byte, tensor uint32, offset, length uint64) ([]byte, error) {
	m, err := decodeMetadata(tmeta)
	if err != nil {
		return nil, err
	}
	if length > maxChunk {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "at most %d bytes per request", maxChunk)
	}
	cl := &client{h: probeHost{token: token, ctx: ctx}, streams: 1, pool: newPool()}
	k := poolKey{endpoint: m.Endpoint, key: cl.clientKey(m)}
	c, err := cl.conn(ctx, k)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	}
	r := &fetchRequest{cl: cl, meta: m, pool: k, conns: map[net.Conn]struct{}{}}
	buf := make([]byte, length)
	s := &stream{r: r, c: c, pieces: []piece{{tensor: tensor, offset: offset, dst: buf}}}
	if err := s.advance(readv(c)); err != nil {
		return nil, err
	}
	return buf, nil
}

// probeHost is the Host of a RequestRange client: it has a token and a
// context and nothing to serve.
type probeHost struct {
	token string
	ctx   context.Context
}

func (p probeHost) Identity() transport.PeerInfo { return transport.PeerInfo{Name: "tcp-probe"} }
func (p probeHost) Log() *transport.Logger       { return transport.NewLogger("tcp-probe", transport.LogOff) }
func (p probeHost) Context() context.Context     { return p.ctx }
func (p probeHost) AuthToken() string            { return p.token }
func (p probeHost) RuntimeSecret() string        { return "" }
func (p probeHost) BindHost() string             { return "127.0.0.1" }
func (p probeHost) AdvertiseHost() string        { return "127.0.0.1" }
func (p probeHost) SocketDir() string            { return "" }

func (p probeHost) PeerTimeout() time.Duration   { return transport.DefaultPeerTimeout }
func (p probeHost) Settings() transport.Settings { return transport.Settings{} }
func (p probeHost) PinObject(transport.ObjectID) ([]transport.Tensor, func(), error) {
	return nil, nil, transport.Errorf(transport.ErrNotFound, "a probe holds no objects")
}
func (p probeHost) WriteInto(transport.ObjectID, uint64) ([]transport.Tensor, []transport.Piece, func(), error) {
	return nil, nil, nil, transport.Errorf(transport.ErrNotFound, "a probe holds no objects")
}

// A source in another process refuses ranges outside its object, and a
// request without its key, and stays up: it still serves what it holds.
func TestRangeOutsideAnObjectIsRefusedAndTheSourceStaysUp(t *testing.T) {
	src := transporttest.StartSource(t, 4096)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, r := range []struct {
		tensor      uint32
		off, length uint64
	}{{0, 4000, 200}, {0, 4097, 0}, {1, 0, 1}, {0, 1 << 62, 1 << 20}} {
		_, err := RequestRange(ctx, "", src.Meta, r.tensor, r.off, r.length)
		assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%+v: %v", r, err)
	}
	m, err := decodeMetadata(src.Meta)
	require.NoError(t, err)
	m.Key = strings.Repeat("0", len(m.Key))
	_, err = RequestRange(ctx, "", m.encode(), 0, 0, 16)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	got, err := RequestRange(ctx, "", src.Meta, 0, 100, 16)
	require.NoError(t, err, "the source still serves")
	assert.Equal(t, src.Want[0][100:116], got)
	assert.Nil(t, src.Cmd.ProcessState, "the source process is still running")
}
