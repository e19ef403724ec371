package engine

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

func TestRegistryCaseInsensitiveAndDuplicates(t *testing.T) {
	rt := newRuntime(t, "a")
	require.NoError(t, rt.RegisterTransport(newMemTransport("my_t")))
	got, err := rt.Registry().Get("MY_T")
	require.NoError(t, err)
	assert.Equal(t, "my_t", got.Describe().Name)

	err = rt.RegisterTransport(newMemTransport("my_t"))
	assert.Equal(t, transport.ErrAlreadyExists, transport.StatusOf(err))

	_, err = rt.Registry().Get("nope")
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "my_t", "the error lists what is registered")

	for _, bad := range []string{"", "has space", "slash/", string(make([]byte, 64))} {
		_, err := transport.CanonicalName(bad)
		assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%q", bad)
	}
	n, err := transport.CanonicalName("NiXl.v2-x_y")
	require.NoError(t, err)
	assert.Equal(t, "nixl.v2-x_y", n)
}

func TestRegistryListAndAdverts(t *testing.T) {
	rt := newRuntime(t, "a")
	one := newMemTransport("b_one")
	two := newMemTransport("a_two")
	two.oneSided, two.canAbort = false, false
	require.NoError(t, rt.RegisterTransport(one))
	require.NoError(t, rt.RegisterTransport(two))
	list := rt.Registry().List()
	require.Len(t, list, 2)
	assert.Equal(t, "a_two", list[0].Name)
	assert.False(t, list[0].OneSided)
	assert.False(t, list[0].CanAbort)
	assert.True(t, list[1].OneSided)
	assert.Equal(t, []transport.DeviceType{transport.DeviceCPU}, list[1].Devices)
	ad, ok := rt.Identity().Advert("b_one")
	require.True(t, ok)
	assert.True(t, ad.OneSided)
}

func TestRegistryRefusesNonCanonicalTransport(t *testing.T) {
	rt := newRuntime(t, "a")
	err := rt.RegisterTransport(newMemTransport("Upper"))
	assert.Equal(t, transport.ErrInternal, transport.StatusOf(err))
}

func TestPutValidatesTransport(t *testing.T) {
	rt := newRuntime(t, "a")
	buf := newHostBuf(t, 64)
	_, err := rt.Put([]transport.Tensor{tensorOf(t, buf)}, "missing", nil)
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err))
	gpuOnly := &deviceTransport{memTransport: newMemTransport("gpu_only")}
	require.NoError(t, rt.RegisterTransport(gpuOnly))
	_, err = rt.Put([]transport.Tensor{tensorOf(t, buf)}, "gpu_only", nil)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	assert.Equal(t, uint64(0), rt.Stats().Objects)
}

type deviceTransport struct{ *memTransport }

func (d deviceTransport) Describe() transport.Descriptor {
	desc := d.memTransport.Describe()
	desc.Devices = []transport.DeviceType{transport.DeviceCUDA}
	return desc
}

// A built-in transport that cannot be made here is listed with its reason
// and status, until a transport of that name is registered.
func TestUnavailableListsWhyBuiltinsAreMissing(t *testing.T) {
	unsupported := func(why string) func(transport.Host) (transport.Transport, error) {
		return func(transport.Host) (transport.Transport, error) {
			return nil, transport.Errorf(transport.ErrUnsupported, "%s", why)
		}
	}
	rt := newRuntime(t, "a", func(o *Options) {
		o.Builtins = []transport.TransportFactory{
			{Name: "zeta", New: unsupported("needs libzeta.so")},
			{Name: "mem", New: func(transport.Host) (transport.Transport, error) { return newMemTransport("mem"), nil }},
			{Name: "alpha", New: unsupported("no device")},
		}
	})
	got := rt.Registry().Unavailable()
	require.Len(t, got, 2)
	assert.Equal(t, "alpha", got[0].Name)
	assert.Equal(t, "zeta", got[1].Name)
	assert.Contains(t, got[1].Reason.Error(), "needs libzeta.so")
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(got[1].Reason))
	_, err := rt.Registry().Get("ZETA")
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "needs libzeta.so", "naming a missing built-in says why it is missing")

	require.NoError(t, rt.RegisterTransport(newMemTransport("alpha")))
	got = rt.Registry().Unavailable()
	require.Len(t, got, 1)
	assert.Equal(t, "zeta", got[0].Name)
}
