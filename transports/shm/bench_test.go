package shm

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// The fetch benchmarks read from a source in another process, as a
// receiver does: a 4 KiB object (latency), 1 MiB and 64 MiB (bandwidth,
// to compare with BenchmarkMemcpy), and objects of many tensors against
// one tensor of the same bytes.
func BenchmarkRemote(b *testing.B) {
	for _, c := range []struct{ count, size int }{
		{1, 4 << 10}, {1, 16 << 10}, {1, 64 << 10}, {1, 1 << 20}, {1, 64 << 20},
		{1024, 4 << 10}, {1, 4 << 20}, {4096, 64 << 10}, {1, 256 << 20},
	} {
		b.Run(fmt.Sprintf("%dx%d", c.count, c.size), func(b *testing.B) {
			sizes := make([]int, c.count)
			for i := range sizes {
				sizes[i] = c.size
			}
			src := transporttest.StartSource(b, sizes...)
			dst := newTransport(b)
			targets := make([]transport.Tensor, c.count)
			for i := range targets {
				_, targets[i] = transporttest.Buffer(b, c.size)
			}
			x := &transport.Transfer{Object: transporttest.SourceObject, Transport: Name,
				Role: transport.RoleDestination, Source: src.Peer}
			fetchOnce := func() {
				req, err := dst.Fetch(x, targets, src.Meta, nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := req.Wait(); err != nil {
					b.Fatal(err)
				}
				req.Release()
			}
			fetchOnce()
			b.SetBytes(int64(c.count * c.size))
			b.ResetTimer()
			self0, src0 := cpuTime(os.Getpid()), cpuTime(src.Cmd.Process.Pid)
			took := make([]time.Duration, b.N)
			for i := range took {
				t0 := time.Now()
				fetchOnce()
				took[i] = time.Since(t0)
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Nanoseconds())/1e3, "p50-us")
			// CPU time per fetch, of both processes: what a loaded
			// machine's wall-clock times hide.
			b.ReportMetric((cpuTime(os.Getpid())-self0).Seconds()*1e6/float64(b.N), "dst-cpu-us")
			b.ReportMetric((cpuTime(src.Cmd.Process.Pid)-src0).Seconds()*1e6/float64(b.N), "src-cpu-us")
		})
	}
}

// cpuTime is the user and system time process pid has used.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

func BenchmarkMemcpy(b *testing.B) {
	for _, n := range []int{4 << 10, 1 << 20, 64 << 20} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			s, _ := transporttest.Buffer(b, n)
			d, _ := transporttest.Buffer(b, n)
			transporttest.Fill(s, 1)
			copy(d, s)
			b.SetBytes(int64(n))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				copy(d, s)
			}
		})
	}
}
