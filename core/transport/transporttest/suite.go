package transporttest

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// Config is what the suite needs to know of the transport under test.
type Config struct {
	// New makes the transport on a host.
	New func(h transport.Host) (transport.Transport, error)
	// Unavailable, when it returns a reason, skips every case that needs the
	// transport working here (a library or device that is missing).
	Unavailable func() string
	// Memory is where tensors live (HostMemory when zero).
	Memory Memory
	// Decode is the package's metadata decoder, for the fuzz case.
	Decode func([]byte) error
	// Corpus is the folder of fuzz seeds for Decode (the package's
	// testdata/fuzz/FuzzDecodeMetadata when empty; a missing folder is no
	// seeds).
	Corpus string
	// FreedStatus is the status a fetch of a freed object fails with (when
	// zero: ErrNotFound or ErrPeerUnavailable).
	FreedStatus transport.Status
	// SourceGoneStatus is the status a fetch from a killed source fails
	// with (ErrPeerUnavailable when zero).
	SourceGoneStatus transport.Status
	// TrustsSourceProcess, when set, is why the transport does not check
	// that its metadata comes from the process the transfer names: the
	// other-host case is skipped with it.
	TrustsSourceProcess string
	// SizelessMetadata says the metadata carries no tensor sizes, so that a
	// target smaller than the source's tensor is not noticed by the
	// transport (the engine compares shapes before it fetches); a larger
	// one must still be refused.
	SizelessMetadata bool
	// WriterLandsBytes, when set, is why the owner's side takes no part in
	// landing a write's bytes (the writer copies them into the owner's
	// memory itself), so that nothing on the owner's side can hold a write
	// to the ranges it was admitted for: the write_admitted case is
	// skipped with it.
	WriterLandsBytes string
	// LargeBytes is the size of the object the abort and source-killed
	// cases move: large enough to be in flight when they act (256 MiB when
	// zero).
	LargeBytes int
	// Ranks, for a two-sided transport that moves bytes only between the
	// ranks of a group (its descriptor sets GroupBackend), is where the
	// tensors of each rank of a group of two live, on a device of its own:
	// the suite forms the group through the transport's GroupBackend with
	// the destination as rank 0 and the source (in this process or a source
	// process) as rank 1, and runs the source's Send once the destination's
	// Fetch has started. Memory is unused then.
	Ranks func(rank int) Memory
}

func (c Config) memory() Memory {
	if c.Memory.Alloc == nil {
		return HostMemory()
	}
	return c.Memory
}

// Margin is the slack every bounded wait gets beyond the time it is due
// (CI machines are small and loaded).
const Margin = 1500 * time.Millisecond

// Cases are the names of the suite's cases, in the order Run runs them.
// The C ABI's conformance program uses the same names.
var Cases = []string{"round_trip", "count_mismatch", "size_mismatch", "dtype_mismatch", "device_mismatch",
	"abort", "deadline", "freed_object", "other_host_refusal", "source_killed", "metadata_fuzz",
	"partial", "partial_refused", "partial_source_killed"}

// Run runs the conformance cases as subtests of t.
func Run(t *testing.T, conf Config) {
	s := &suite{conf: conf, mem: conf.memory()}
	cases := map[string]func(*testing.T){
		"round_trip": s.roundTrip, "count_mismatch": s.countMismatch, "size_mismatch": s.sizeMismatch,
		"dtype_mismatch": s.dtypeMismatch, "device_mismatch": s.deviceMismatch, "abort": s.abort,
		"deadline": s.deadline, "freed_object": s.freedObject, "other_host_refusal": s.otherHost,
		"source_killed": s.sourceKilled, "metadata_fuzz": s.metadataFuzz,
		"partial": s.partial, "partial_refused": s.partialRefused, "partial_source_killed": s.partialSourceKilled,
	}
	for _, name := range Cases {
		t.Run(name, cases[name])
	}
	writes := s.writeCases()
	for _, name := range WriteCases {
		t.Run(name, writes[name])
	}
	for _, name := range PreparedCases {
		t.Run(name, map[string]func(*testing.T){"prepared": s.prepared}[name])
	}
	for _, name := range ViewCases {
		t.Run(name, map[string]func(*testing.T){"view": s.view}[name])
	}
}

type suite struct {
	conf Config
	mem  Memory
}

// end is one transport on its own host.
type end struct {
	host *Host
	tr   transport.Transport
	desc transport.Descriptor
	mem  Memory
	// send, for a grouped transport, runs the source's Send of a transfer
	// the end fetches.
	send func(x *transport.Transfer, cmeta []byte)
}

func (s *suite) available(t *testing.T) {
	t.Helper()
	if s.conf.Unavailable != nil {
		if why := s.conf.Unavailable(); why != "" {
			t.Skip(why)
		}
	}
}

// newEnd makes a transport; rank is its rank in a group (0 for a
// destination, 1 for a source), which says where its tensors live.
func (s *suite) newEnd(t *testing.T, rank int, tune ...func(*Host)) *end {
	t.Helper()
	s.available(t)
	h := NewHost(t)
	for _, f := range tune {
		f(h)
	}
	tr, err := s.conf.New(h)
	if err != nil {
		t.Fatalf("making the transport: %v", err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return &end{host: h, tr: tr, desc: tr.Describe(), mem: s.memOf(rank)}
}

// tensor allocates n bytes of dt in e's memory, filled with the pattern of
// seed.
func (s *suite) tensor(t *testing.T, e *end, dt transport.DType, n int, seed byte) transport.Tensor {
	t.Helper()
	addr, free, err := e.mem.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(free)
	if err := e.mem.Write(addr, Pattern(n, seed)); err != nil {
		t.Fatal(err)
	}
	return Describe(e.mem.Device, dt, addr, n)
}

func (s *suite) read(t *testing.T, e *end, x transport.Tensor) []byte {
	t.Helper()
	b := make([]byte, x.Nbytes)
	if err := e.mem.Read(x.Data, b); err != nil {
		t.Fatal(err)
	}
	return b
}

// put makes an object of the given dtypes and sizes on src.
func (s *suite) put(t *testing.T, src *end, obj transport.ObjectID, dts []transport.DType, sizes []int) ([]byte, []transport.Tensor) {
	t.Helper()
	return s.putOrExpose(t, src, obj, dts, sizes, false)
}

// putOrExpose is put, or with exposed an object exposed for writing.
func (s *suite) putOrExpose(t *testing.T, src *end, obj transport.ObjectID, dts []transport.DType, sizes []int, exposed bool) ([]byte, []transport.Tensor) {
	t.Helper()
	var tensors []transport.Tensor
	for i, n := range sizes {
		tensors = append(tensors, s.tensor(t, src, dts[i%len(dts)], n, obj[0]+byte(i)))
	}
	src.host.Hold(obj, tensors)
	meta, err := extractMetadata(src.tr, obj, tensors, exposed)
	if err != nil {
		t.Fatalf("extracting metadata: %v", err)
	}
	return meta, tensors
}

// targets allocates tensors like the given ones on dst.
func (s *suite) targets(t *testing.T, dst *end, like []transport.Tensor) []transport.Tensor {
	var out []transport.Tensor
	for i, x := range like {
		out = append(out, s.tensor(t, dst, x.DType, int(x.Nbytes), 0xa0+byte(i)))
	}
	return out
}

func transfer(obj transport.ObjectID, name string, src, dst transport.PeerInfo) *transport.Transfer {
	var id [8]byte
	_, _ = rand.Read(id[:])
	return &transport.Transfer{Object: obj, TransferID: uint64(id[0]) | uint64(id[1])<<8 | uint64(id[2])<<16 | uint64(id[3])<<24,
		Transport: name, Role: transport.RoleDestination, Source: src, Destination: dst}
}

// start begins a fetch the way the engine does: communicator metadata
// first, then Fetch (and, for a grouped transport, the source's Send).
func start(dst *end, x *transport.Transfer, targets []transport.Tensor, meta []byte) (transport.Request, error) {
	cmeta, err := dst.tr.CommunicatorMetadata(x)
	if err != nil {
		return nil, err
	}
	req, err := dst.tr.Fetch(x, targets, meta, cmeta)
	if err == nil && dst.send != nil {
		dst.send(x, cmeta)
	}
	return req, err
}

// finish waits for req at most within and releases it.
func finish(t *testing.T, req transport.Request, within time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- req.Wait() }()
	select {
	case err := <-done:
		req.Release()
		return err
	case <-time.After(within):
		t.Fatalf("the fetch did not finish within %v", within)
		return nil
	}
}

// release releases req, within 30 seconds.
func release(t *testing.T, req transport.Request) {
	t.Helper()
	done := make(chan struct{})
	go func() { req.Release(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("releasing the request took over 30 s")
	}
}

// fetch fetches and waits, within a minute.
func fetch(t *testing.T, dst *end, x *transport.Transfer, targets []transport.Tensor, meta []byte) error {
	t.Helper()
	req, err := start(dst, x, targets, meta)
	if err != nil {
		return err
	}
	return finish(t, req, time.Minute)
}

func wantStatus(t *testing.T, err error, what string, want ...transport.Status) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: the fetch succeeded, want one of %v", what, want)
	}
	got := transport.StatusOf(err)
	for _, w := range want {
		if got == w {
			return
		}
	}
	t.Fatalf("%s: status %v (%v), want one of %v", what, got, err, want)
}

// pair is a source and a destination in this process, and an object put
// on the source.
func (s *suite) pair(t *testing.T, obj transport.ObjectID, dts []transport.DType, sizes []int) (src, dst *end, meta []byte, tensors []transport.Tensor, x *transport.Transfer) {
	return s.pairOf(t, obj, dts, sizes, false)
}

// exposedPair is pair with the object exposed for writing.
func (s *suite) exposedPair(t *testing.T, obj transport.ObjectID, dts []transport.DType, sizes []int) (src, dst *end, meta []byte, tensors []transport.Tensor, x *transport.Transfer) {
	return s.pairOf(t, obj, dts, sizes, true)
}

func (s *suite) pairOf(t *testing.T, obj transport.ObjectID, dts []transport.DType, sizes []int, exposed bool) (src, dst *end, meta []byte, tensors []transport.Tensor, x *transport.Transfer) {
	src, dst = s.newEnd(t, 1), s.newEnd(t, 0)
	if s.grouped() {
		s.groupPair(t, src, dst)
	}
	meta, tensors = s.putOrExpose(t, src, obj, dts, sizes, exposed)
	return src, dst, meta, tensors, transfer(obj, src.desc.Name, src.host.Identity(), dst.host.Identity())
}

func (s *suite) roundTrip(t *testing.T) {
	t.Run("in_process", func(t *testing.T) {
		dts := []transport.DType{Uint8, Float32, Int64, Float64, Uint8}
		sizes := []int{0, 1 << 10, 4 << 10, 300<<10 + 8, 5<<20 + 1}
		src, dst, meta, tensors, x := s.pair(t, transport.ObjectID{1}, dts, sizes)
		for round := 0; round < 2; round++ { // a second fetch of the same object reads it again
			targets := s.targets(t, dst, tensors)
			if err := fetch(t, dst, x, targets, meta); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			for i := range targets {
				if !bytes.Equal(s.read(t, dst, targets[i]), s.read(t, src, tensors[i])) {
					t.Fatalf("round %d: tensor %d (%s, %d bytes) differs", round, i, tensors[i].DType, tensors[i].Nbytes)
				}
			}
		}
	})
	t.Run("source_process", func(t *testing.T) {
		dst := s.newEnd(t, 0)
		src := s.source(t, dst, 4096, 3<<20, 0)
		var targets []transport.Tensor
		for _, w := range src.Want {
			targets = append(targets, s.tensor(t, dst, Uint8, len(w), 0xee))
		}
		if err := fetch(t, dst, transfer(SourceObject, dst.desc.Name, src.Peer, dst.host.Identity()), targets, src.Meta); err != nil {
			t.Fatal(err)
		}
		for i := range targets {
			if !bytes.Equal(s.read(t, dst, targets[i]), src.Want[i]) {
				t.Fatalf("tensor %d differs", i)
			}
		}
	})
}

func (s *suite) countMismatch(t *testing.T) {
	_, dst, meta, tensors, x := s.pair(t, transport.ObjectID{2}, []transport.DType{Uint8}, []int{100, 200})
	skipDescribesNothing(t, meta)
	targets := s.targets(t, dst, tensors)
	wantStatus(t, fetch(t, dst, x, targets[:1], meta), "fewer targets", transport.ErrInvalidArgument)
	more := append(targets, s.tensor(t, dst, Uint8, 100, 3))
	wantStatus(t, fetch(t, dst, x, more, meta), "more targets", transport.ErrInvalidArgument)
	wantStatus(t, fetch(t, dst, x, nil, meta), "no targets", transport.ErrInvalidArgument)
}

func (s *suite) sizeMismatch(t *testing.T) {
	_, dst, meta, _, x := s.pair(t, transport.ObjectID{3}, []transport.DType{Uint8}, []int{100, 4096})
	skipDescribesNothing(t, meta)
	for _, n := range []int{4095, 4097} {
		if n < 4096 && s.conf.SizelessMetadata {
			continue
		}
		targets := []transport.Tensor{s.tensor(t, dst, Uint8, 100, 1), s.tensor(t, dst, Uint8, n, 2)}
		wantStatus(t, fetch(t, dst, x, targets, meta), fmt.Sprintf("a %d-byte target for 4096 bytes", n), transport.ErrInvalidArgument)
	}
}

// Transports see bytes, not dtypes (the engine compares dtypes against
// the ref): a target of as many elements of a wider dtype is a size the
// source does not have.
func (s *suite) dtypeMismatch(t *testing.T) {
	_, dst, meta, _, x := s.pair(t, transport.ObjectID{4}, []transport.DType{Float32}, []int{1024})
	skipDescribesNothing(t, meta)
	targets := []transport.Tensor{s.tensor(t, dst, Float64, 2048, 1)}
	wantStatus(t, fetch(t, dst, x, targets, meta), "float64[256] for float32[256]", transport.ErrInvalidArgument)
}

// A target on a device type the descriptor does not land the source's
// memory in is refused, not written.
func (s *suite) deviceMismatch(t *testing.T) {
	_, dst, meta, tensors, x := s.pair(t, transport.ObjectID{5}, []transport.DType{Uint8}, []int{4096})
	other := transport.DeviceROCM
	for _, d := range []transport.DeviceType{transport.DeviceCPU, transport.DeviceCUDA} {
		if !dst.desc.Lands(tensors[0].Device.Type, d) {
			other = d
			break
		}
	}
	b, host := Buffer(t, int(tensors[0].Nbytes))
	Fill(b, 0x33)
	target := Describe(transport.Device{Type: other}, Uint8, host.Data, len(b))
	wantStatus(t, fetch(t, dst, x, []transport.Tensor{target}, meta), "a "+other.String()+" target",
		transport.ErrInvalidArgument, transport.ErrUnsupported)
	if !bytes.Equal(b, Pattern(len(b), 0x33)) {
		t.Fatal("the refused target was written")
	}
}

// source starts a source process putting tensors of the given sizes, and
// forms the group of dst and the source for a grouped transport.
func (s *suite) source(t *testing.T, dst *end, sizes ...int) *Source {
	t.Helper()
	return s.sourceOf(t, dst, false, sizes...)
}

// exposedSource is source with the object exposed for writing.
func (s *suite) exposedSource(t *testing.T, dst *end, sizes ...int) *Source {
	t.Helper()
	return s.sourceOf(t, dst, true, sizes...)
}

func (s *suite) sourceOf(t *testing.T, dst *end, exposed bool, sizes ...int) *Source {
	t.Helper()
	src := startSource(t, exposed, sizes...)
	if s.grouped() {
		s.groupSource(t, dst, src)
	}
	return src
}

// skipDescribesNothing skips a mismatch case for a transport whose
// metadata describes no tensors: the engine compares the targets with the
// ref's shapes before it fetches, and nothing is left for the transport to
// check.
func skipDescribesNothing(t *testing.T, meta []byte) {
	t.Helper()
	if len(meta) == 0 {
		t.Skip("the transport's metadata is empty: the engine checks the targets against the ref's shapes before it fetches")
	}
}
