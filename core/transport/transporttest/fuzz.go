package transporttest

import (
	"errors"
	"fmt"
	mrand "math/rand"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/rdt-project/rdt/core/transport"
)

// The metadata_fuzz case: the package's corpus, valid metadata, its
// mutations and garbage fed to the transport's decoder and to Fetch.

// The metadata fuzz feeds the package's decoder its seed corpus, valid
// metadata, every truncation of it, mutations and garbage: it must never
// panic or allocate without bound, and truncated metadata is an error,
// from the decoder and from Fetch.
func (s *suite) metadataFuzz(t *testing.T) {
	seeds := readCorpus(t, s.conf.corpus())
	var valid [][]byte
	var dst *end
	if s.conf.Unavailable == nil || s.conf.Unavailable() == "" {
		_, d, meta, _, _ := s.pair(t, transport.ObjectID{8}, []transport.DType{Uint8}, []int{4096, 100})
		dst = d
		if len(meta) > 0 { // empty metadata has nothing to cut
			valid = [][]byte{meta}
		}
	}
	if s.conf.Decode == nil && dst == nil {
		t.Skip("no decoder given and the transport is unavailable here")
	}
	decode := func(b []byte) error {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := callDecode(s.conf.Decode, b)
		runtime.ReadMemStats(&after)
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
			t.Fatalf("decoding %d bytes allocated %d bytes", len(b), grew)
		}
		return err
	}
	rng := mrand.New(mrand.NewSource(14))
	inputs := append(append([][]byte{}, seeds...), valid...)
	for _, seed := range inputs {
		if s.conf.Decode != nil {
			_ = decode(seed)
			for i := 0; i < 64; i++ {
				_ = decode(mutate(rng, seed))
			}
		}
	}
	for i := 0; i < 64; i++ {
		g := make([]byte, rng.Intn(512))
		_, _ = rng.Read(g)
		if s.conf.Decode != nil {
			_ = decode(g)
		}
	}
	for _, meta := range valid {
		if s.conf.Decode != nil {
			if err := decode(meta); err != nil {
				t.Fatalf("the decoder refuses valid metadata: %v", err)
			}
		}
		step := max(1, len(meta)/128)
		for n := 0; n < len(meta); n += step {
			cut := meta[:n]
			if s.conf.Decode != nil {
				if err := decode(cut); err == nil {
					t.Fatalf("metadata cut to %d of %d bytes decoded", n, len(meta))
				}
			}
			targets := []transport.Tensor{s.tensor(t, dst, Uint8, 4096, 0), s.tensor(t, dst, Uint8, 100, 0)}
			x := transfer(transport.ObjectID{8}, dst.desc.Name, dst.host.Identity(), dst.host.Identity())
			if err := fetch(t, dst, x, targets, cut); err == nil {
				t.Fatalf("a fetch with metadata cut to %d of %d bytes succeeded", n, len(meta))
			}
		}
	}
}

func (c Config) corpus() string {
	if c.Corpus != "" {
		return c.Corpus
	}
	return filepath.Join("testdata", "fuzz", "FuzzDecodeMetadata")
}

// callDecode turns a decoder's panic into a test failure naming the input.
func callDecode(decode func([]byte) error, b []byte) (err error) {
	defer func() {
		if r := recover(); r != nil {
			panic(fmt.Sprintf("the decoder panicked on %x: %v", b, r))
		}
	}()
	return decode(b)
}

func mutate(rng *mrand.Rand, b []byte) []byte {
	out := append([]byte(nil), b...)
	for n := 1 + rng.Intn(4); n > 0; n-- {
		switch op := rng.Intn(4); {
		case op == 0 && len(out) > 0:
			out[rng.Intn(len(out))] ^= byte(1 << rng.Intn(8))
		case op == 1 && len(out) > 0:
			out[rng.Intn(len(out))] = 0xff
		case op == 2:
			i := rng.Intn(len(out) + 1)
			out = append(out[:i], append([]byte{byte(rng.Intn(256))}, out[i:]...)...)
		case len(out) > 0:
			out = out[:rng.Intn(len(out))]
		}
	}
	return out
}

// readCorpus reads the []byte values of Go fuzz corpus files
// ("go test fuzz v1" then one []byte("...") line).
func readCorpus(t *testing.T, dir string) [][]byte {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			lit, ok := strings.CutPrefix(strings.TrimSpace(line), "[]byte(")
			if !ok {
				continue
			}
			v, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
			if err != nil {
				t.Fatalf("corpus file %s: %v", e.Name(), err)
			}
			out = append(out, []byte(v))
		}
	}
	return out
}
