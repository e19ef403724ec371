package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

var (
	hostDevices = []transport.DeviceType{transport.DeviceCPU, transport.DeviceCUDAHost}
	cudaDevices = []transport.DeviceType{transport.DeviceCUDA}
)

// builtinDescriptors are the parts of the built-in transports' descriptors
// that decide the automatic order (each transport's own TestDescribe checks
// its descriptor says the same).
var builtinDescriptors = []transport.Descriptor{
	{Name: "cma", Devices: hostDevices, OneSided: true, SameHostOnly: true, Auto: transport.AutoRank{Host: 10}},
	{Name: "shm", Devices: hostDevices, OneSided: true, SameHostOnly: true, Auto: transport.AutoRank{Host: 20}},
	{Name: "tcp", Devices: hostDevices, OneSided: true, Auto: transport.AutoRank{Host: 30}},
	{Name: "cuda_ipc", Devices: cudaDevices, OneSided: true, SameHostOnly: true, Auto: transport.AutoRank{CUDA: 10}},
	{Name: "nixl", Devices: append(hostDevices, transport.DeviceCUDA), OneSided: true, Auto: transport.AutoRank{CUDA: 20}},
	{Name: "nccl", Devices: cudaDevices, Auto: transport.AutoRank{CUDA: 30}},
}

// described is a memTransport that answers with a given descriptor.
func described(d transport.Descriptor) *memTransport {
	m := newMemTransport(d.Name)
	m.describe = func(out *transport.Descriptor) { *out = d }
	return m
}

// factories register transports the way the C ABI registers the built-ins:
// as a runtime's factories, in the order given.
func factories(descs ...transport.Descriptor) []transport.TransportFactory {
	var out []transport.TransportFactory
	for _, d := range descs {
		out = append(out, transport.TransportFactory{Name: d.Name, New: func(transport.Host) (transport.Transport, error) { return described(d), nil }})
	}
	return out
}

func objectOn(devices ...transport.DeviceType) *ObjectDesc {
	d := &ObjectDesc{}
	for _, dev := range devices {
		d.Tensors = append(d.Tensors, transport.TensorDesc{Device: transport.Device{Type: dev}})
	}
	return d
}

// The automatic order comes from the descriptors alone and is the order the
// built-ins always had: host data on this host cma, shm, tcp, across hosts
// tcp; CUDA data on this host cuda_ipc, nixl, nccl, across hosts nixl, nccl.
// A transport that sets no rank (a foreign one) is never chosen.
func TestAutoOrderOfTheBuiltinDescriptors(t *testing.T) {
	foreign := transport.Descriptor{Name: "mine", Devices: hostDevices, OneSided: true}
	rt := newRuntime(t, "a", func(o *Options) {
		o.Builtins = factories(append([]transport.Descriptor{foreign}, builtinDescriptors...)...)
	})
	here := rt.Identity()
	there := here
	there.HostID = "another-host"
	for _, c := range []struct {
		what string
		obj  *ObjectDesc
		peer transport.PeerInfo
		want []string
	}{
		{"host data, same host", objectOn(transport.DeviceCPU, transport.DeviceCUDAHost), here, []string{"cma", "shm", "tcp"}},
		{"host data, other host", objectOn(transport.DeviceCPU), there, []string{"tcp"}},
		{"CUDA data, same host", objectOn(transport.DeviceCUDA), here, []string{"cuda_ipc", "nixl", "nccl"}},
		{"CUDA and host data, same host", objectOn(transport.DeviceCPU, transport.DeviceCUDA), here, []string{"cuda_ipc", "nixl", "nccl"}},
		{"CUDA data, other host", objectOn(transport.DeviceCUDA), there, []string{"nixl", "nccl"}},
		{"neither", objectOn(transport.DeviceType(10)), here, nil},
	} {
		assert.Equal(t, c.want, rt.routes.autoCandidates(transport.Read, c.obj, c.peer), c.what)
	}
}

// A transport registered later with a better rank comes first; equal ranks
// go by name; unregistered built-ins are simply absent.
func TestAutoOrderTakesLaterBetterRanksFirst(t *testing.T) {
	rt := newRuntime(t, "a", func(o *Options) { o.Builtins = factories(builtinDescriptors[1:3]...) }) // shm, tcp
	host := objectOn(transport.DeviceCPU)
	assert.Equal(t, []string{"shm", "tcp"}, rt.routes.autoCandidates(transport.Read, host, rt.Identity()))
	require.NoError(t, rt.RegisterTransport(described(transport.Descriptor{Name: "fast", Devices: hostDevices, OneSided: true, Auto: transport.AutoRank{Host: 5}})))
	require.NoError(t, rt.RegisterTransport(described(transport.Descriptor{Name: "also_tcp", Devices: hostDevices, OneSided: true, Auto: transport.AutoRank{Host: 30}})))
	assert.Equal(t, []string{"fast", "shm", "also_tcp", "tcp"}, rt.routes.autoCandidates(transport.Read, host, rt.Identity()))
}

// An object put without a transport is fetched with the best-ranked
// transport the owner's descriptors offer; a same-host-only transport is
// refused for a peer on another host, and the next one is used.
func TestAutoFetchSkipsSameHostOnlyAcrossHosts(t *testing.T) {
	near := transport.Descriptor{Name: "near", Devices: hostDevices, OneSided: true, CanAbort: true, SameHostOnly: true, Auto: transport.AutoRank{Host: 1}}
	far := transport.Descriptor{Name: "far", Devices: hostDevices, OneSided: true, CanAbort: true, Auto: transport.AutoRank{Host: 2}}
	owner := newRuntime(t, "owner", func(o *Options) { o.HostID = "host-a" })
	for _, host := range []string{"host-a", "host-b"} {
		borrower := newRuntime(t, "borrower", func(o *Options) { o.HostID = host })
		nearSrc, farSrc, nearDst, farDst := described(near), described(far), described(near), described(far)
		nearDst.mailbox, farDst.mailbox = nearSrc.mailbox, farSrc.mailbox
		if host == "host-a" {
			require.NoError(t, owner.RegisterTransport(nearSrc))
			require.NoError(t, owner.RegisterTransport(farSrc))
		}
		require.NoError(t, borrower.RegisterTransport(nearDst))
		require.NoError(t, borrower.RegisterTransport(farDst))

		buf := newHostBuf(t, 64)
		for i := range buf.b {
			buf.b[i] = byte(i)
		}
		ref, err := owner.Put([]transport.Tensor{tensorOf(t, buf)}, "", nil)
		require.NoError(t, err)
		b := serialized(t, ref)
		out := requireGets(t, borrower, deserialized(t, borrower, b), buf)
		if host == "host-a" {
			assert.Equal(t, int64(1), nearDst.fetched.Load(), "same host: the better rank")
		} else {
			assert.Equal(t, int64(0), nearDst.fetched.Load(), "other host: never the same-host-only one")
			assert.Equal(t, int64(1), farDst.fetched.Load())
			bref2 := deserialized(t, borrower, b)
			err = borrower.Get([]*Ref{bref2}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{Transport: "near"}, 5*time.Second)
			assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err), "%v", err)
			assert.Contains(t, err.Error(), "near works only between processes on the same host")
		}
		require.NoError(t, ref.Release())
	}
}

// Metadata is extracted at put for descriptors that say so, and only while
// EagerWhile agrees.
func TestEagerMetadataFollowsTheDescriptor(t *testing.T) {
	serving := false
	rt := newRuntime(t, "a")
	require.NoError(t, rt.RegisterTransport(described(transport.Descriptor{Name: "eager", Devices: hostDevices, OneSided: true, EagerMetadata: true})))
	require.NoError(t, rt.RegisterTransport(described(transport.Descriptor{Name: "lazy", Devices: hostDevices, OneSided: true})))
	require.NoError(t, rt.RegisterTransport(described(transport.Descriptor{Name: "serving", Devices: hostDevices, OneSided: true, EagerMetadata: true,
		EagerWhile: func() bool { return serving }})))
	metaOf := func() []string {
		buf := newHostBuf(t, 8)
		ref, err := rt.Put([]transport.Tensor{tensorOf(t, buf)}, "", nil)
		require.NoError(t, err)
		defer ref.Release()
		o := rt.store.object(ref.desc.ID)
		o.metaMu.Lock()
		defer o.metaMu.Unlock()
		var names []string
		for _, n := range []string{"eager", "lazy", "serving"} {
			if _, ok := o.meta[n]; ok {
				names = append(names, n)
			}
		}
		return names
	}
	assert.Equal(t, []string{"eager"}, metaOf())
	serving = true
	assert.Equal(t, []string{"eager", "serving"}, metaOf())
}

// The default group backend is the registered transport whose descriptor
// says so; without one, the error says why the built-ins that are missing
// are missing.
func TestGroupDefaultBackendFromDescriptor(t *testing.T) {
	b := newRosterBackend()
	b.isDefault = true
	rt := newRuntime(t, "r", func(o *Options) {
		o.Builtins = []transport.TransportFactory{{Name: "grp", New: func(transport.Host) (transport.Transport, error) { return b, nil }}}
	})
	require.NoError(t, rt.CreateGroup(transport.GroupSpec{Name: "g", WorldSize: 1}, time.Second))
	require.NotNil(t, b.roster("g"))
	assert.Equal(t, "grp", b.roster("g").Backend)

	bare := newRuntime(t, "bare", func(o *Options) {
		o.Builtins = []transport.TransportFactory{{Name: "collective", New: func(transport.Host) (transport.Transport, error) {
			return nil, transport.Errorf(transport.ErrUnsupported, "it needs libcollective.so")
		}}}
	})
	err := bare.CreateGroup(transport.GroupSpec{Name: "g", WorldSize: 1}, time.Second)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "no transport in this runtime forms groups")
	assert.Contains(t, err.Error(), "collective is not available here: it needs libcollective.so")
	err = bare.CreateGroup(transport.GroupSpec{Name: "g", WorldSize: 1, Backend: "collective"}, time.Second)
	assert.Contains(t, err.Error(), "transport collective is not available in this runtime")
	assert.Contains(t, err.Error(), "it needs libcollective.so")
}

// Registration checks the descriptor against what the transport implements.
func TestRegisterChecksTheDescriptor(t *testing.T) {
	rt := newRuntime(t, "a")
	twoSidedWithoutSend := &struct{ transport.Transport }{described(transport.Descriptor{Name: "nosend", Devices: hostDevices})}
	err := rt.RegisterTransport(twoSidedWithoutSend)
	assert.Equal(t, transport.ErrInternal, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "two-sided but has no Send")
	err = rt.RegisterTransport(described(transport.Descriptor{Name: "nogroups", Devices: hostDevices, OneSided: true, GroupBackend: true}))
	assert.Equal(t, transport.ErrInternal, transport.StatusOf(err))
	err = rt.RegisterTransport(described(transport.Descriptor{Name: "Upper", Devices: hostDevices, OneSided: true}))
	assert.Equal(t, transport.ErrInternal, transport.StatusOf(err))
	err = rt.RegisterTransport(described(transport.Descriptor{Name: "nodev", OneSided: true}))
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err))
	assert.Equal(t, []string{}, append([]string{}, rt.Registry().Names()...))
}
