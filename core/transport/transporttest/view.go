package transporttest

import (
	"bytes"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// ViewCases are the cases of transports that implement transport.Viewer;
// Run runs them last, and skips them for every other transport.
var ViewCases = []string{"view"}

// view: a mapping of a source process's object holds the put's bytes at
// the addresses it gives, keeps them after the source is killed, and ends
// with Close; a view once the source is gone fails as a fetch does; a
// deadline already passed ends a view at once.
func (s *suite) view(t *testing.T) {
	dst := s.newEnd(t, 0)
	vw := implemented[transport.Viewer](t, dst)
	sizes := []int{4096, 0, 5<<20 + 3}
	src := s.source(t, dst, sizes...)
	x := transfer(SourceObject, dst.desc.Name, src.Peer, dst.host.Identity())
	m, err := vw.View(x, src.Meta, false, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatalf("view: %v", err)
	}
	data, mapped := m.Data(), m.Sizes()
	if len(data) != len(sizes) || len(mapped) != len(sizes) {
		t.Fatalf("the view has %d tensors (%d sizes), the object %d", len(data), len(mapped), len(sizes))
	}
	for i, n := range sizes {
		if mapped[i] != uint64(n) {
			t.Fatalf("the view says tensor %d holds %d bytes; it was put with %d", i, mapped[i], n)
		}
	}
	check := func(when string) {
		for i, n := range sizes {
			if n > 0 && !bytes.Equal(transport.Bytes(data[i], uint64(n)), Pattern(n, seedOf(i))) {
				t.Fatalf("%s: tensor %d of the view is not the put's", when, i)
			}
		}
	}
	check("mapped")
	src.Kill()
	check("after the source was killed")
	_, err = vw.View(x, src.Meta, false, time.Now().Add(time.Minute))
	wantStatus(t, err, "a view of a killed source's object", s.conf.sourceGone())
	if err := m.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}

	src = s.source(t, dst, 4096)
	x = transfer(SourceObject, dst.desc.Name, src.Peer, dst.host.Identity())
	start := time.Now()
	m, err = vw.View(x, src.Meta, false, time.Now().Add(-time.Second))
	if err == nil { // answered before the deadline's timer could fire
		m.Close()
	} else {
		wantStatus(t, err, "a view past its deadline", transport.ErrTimeout)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("a view past its deadline took %v", took)
	}
}
