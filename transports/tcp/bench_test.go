package tcp

import (
	"io"
	"net"
	"sort"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/stretchr/testify/require"
)

// go test -run '^$' -bench . ./transports/tcp
// The Raw benchmarks are the machine's own limit: one plain Go TCP stream
// on loopback, with no protocol, between the same kind of buffers.

// benchFetch fetches an object of one tensor of n bytes.
func benchFetch(b *testing.B, n int) { benchMany(b, 1, n) }

func reportLatency(b *testing.B, lat []time.Duration) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
}

func BenchmarkFetch4KiB(b *testing.B) { benchFetch(b, 4<<10) }

func BenchmarkFetch1MiB(b *testing.B) { benchFetch(b, 1<<20) }

func BenchmarkFetch64MiB(b *testing.B) { benchFetch(b, 64<<20) }

// benchRaw: the client asks for n bytes with 8 bytes, the server writes
// them from an mmap'd buffer, the client reads them into another.
func benchRaw(b *testing.B, n int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	defer ln.Close()
	src, _ := transporttest.Buffer(b, n)
	dst, _ := transporttest.Buffer(b, n)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.(*net.TCPConn).SetNoDelay(true)
		q := make([]byte, 8)
		for {
			if _, err := io.ReadFull(c, q); err != nil {
				return
			}
			if _, err := c.Write(src); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(b, err)
	defer c.Close()
	c.(*net.TCPConn).SetNoDelay(true)
	q := make([]byte, 8)
	lat := make([]time.Duration, 0, b.N)
	b.SetBytes(int64(n))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := c.Write(q); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, dst); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	reportLatency(b, lat)
}

func BenchmarkRaw4KiB(b *testing.B) { benchRaw(b, 4<<10) }

func BenchmarkRaw1MiB(b *testing.B) { benchRaw(b, 1<<20) }

func BenchmarkRaw64MiB(b *testing.B) { benchRaw(b, 64<<20) }

// benchMany fetches one object of count tensors of n bytes each.
// benchMany fetches an object of count tensors of n bytes each.
func benchMany(b *testing.B, count, n int) {
	p := &pair{host: newHost("")}
	s, _ := New(p.host)
	d, _ := New(newHost(""))
	p.src, p.dst = s.(*Transport), d.(*Transport)
	defer s.Close()
	defer d.Close()
	sizes := make([]int, count)
	for i := range sizes {
		sizes[i] = n
	}
	meta, _ := p.put(b, 1, sizes...)
	var targets []transport.Tensor
	for range sizes {
		_, x := transporttest.Buffer(b, n)
		targets = append(targets, x)
	}
	lat := make([]time.Duration, 0, b.N)
	b.SetBytes(int64(count * n))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		req, err := d.Fetch(&transport.Transfer{}, targets, meta, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := wait(req); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	reportLatency(b, lat)
}

func BenchmarkFetch4MiB(b *testing.B) { benchFetch(b, 4<<20) }

func BenchmarkFetch1024x4KiB(b *testing.B) { benchMany(b, 1024, 4<<10) }

func BenchmarkFetch256MiB(b *testing.B) { benchFetch(b, 256<<20) }

func BenchmarkFetch4096x64KiB(b *testing.B) { benchMany(b, 4096, 64<<10) }
