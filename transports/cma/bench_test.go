package cma

import (
	"os"
	"testing"

	"github.com/rdt-project/rdt/core/transport"
	"golang.org/x/sys/unix"
)

// ---- benchmarks ------------------------------------------------------------
//
// go test -run '^$' -bench . ./transports/cma
// The transport reads an object of this process (process_vm_readv works
// on oneself); Raw is one process_vm_readv per chunk of the same bytes.

func benchMany(b *testing.B, count, n int) {
	tr := newTransport(b)
	var srcs, dsts []transport.Tensor
	for i := 0; i < count; i++ {
		sb, s := buffer(b, n)
		fill(sb, byte(i))
		_, d := buffer(b, n)
		srcs, dsts = append(srcs, s), append(dsts, d)
	}
	fetchRepeatedly(b, tr, transport.ObjectID{7}, srcs, dsts)
}

func benchRaw(b *testing.B, n int) {
	sb, _ := buffer(b, n)
	db, _ := buffer(b, n)
	fill(sb, 1)
	b.SetBytes(int64(n))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for off := 0; off < n; off += chunkSize {
			e := min(off+chunkSize, n)
			local := []unix.Iovec{{Base: &db[off]}}
			local[0].SetLen(e - off)
			remote := []unix.RemoteIovec{{Base: uintptr(unsafePointer(sb[off:])), Len: e - off}}
			if _, err := unix.ProcessVMReadv(os.Getpid(), local, remote, 0); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func BenchmarkFetch1MiB(b *testing.B)       { benchMany(b, 1, 1<<20) }
func BenchmarkRaw1MiB(b *testing.B)         { benchRaw(b, 1<<20) }
func BenchmarkFetch4MiB(b *testing.B)       { benchMany(b, 1, 4<<20) }
func BenchmarkFetch1024x4KiB(b *testing.B)  { benchMany(b, 1024, 4<<10) }
func BenchmarkFetch256MiB(b *testing.B)     { benchMany(b, 1, 256<<20) }
func BenchmarkFetch4096x64KiB(b *testing.B) { benchMany(b, 4096, 64<<10) }
func BenchmarkRaw256MiB(b *testing.B)       { benchRaw(b, 256<<20) }

// benchRawMany reads count buffers of n bytes with one process_vm_readv
// per IOV_MAX of them: the kernel's own cost of a scattered read.
func benchRawMany(b *testing.B, count, n int) {
	var local []unix.Iovec
	var remote []unix.RemoteIovec
	for i := 0; i < count; i++ {
		sb, _ := buffer(b, n)
		db, _ := buffer(b, n)
		fill(sb, byte(i))
		l := unix.Iovec{Base: &db[0]}
		l.SetLen(n)
		local = append(local, l)
		remote = append(remote, unix.RemoteIovec{Base: uintptr(unsafePointer(sb)), Len: n})
	}
	b.SetBytes(int64(count * n))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := 0; j < count; j += maxIovecs {
			e := min(j+maxIovecs, count)
			if _, err := unix.ProcessVMReadv(os.Getpid(), local[j:e], remote[j:e], 0); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func BenchmarkRaw1024x4KiB(b *testing.B) { benchRawMany(b, 1024, 4<<10) }
func BenchmarkRaw4MiB(b *testing.B)      { benchRaw(b, 4<<20) }

// benchViews fetches count tensors of n bytes that are views of one
// buffer on both sides, as blocks of a KV cache are.
func benchViews(b *testing.B, count, n int) {
	tr := newTransport(b)
	sb, _ := buffer(b, count*n)
	db, _ := buffer(b, count*n)
	fill(sb, 1)
	var srcs, dsts []transport.Tensor
	for i := 0; i < count; i++ {
		_, s := buffer(b, 0)
		s.Data, s.Orig = uintptr(unsafePointer(sb[i*n:])), uintptr(unsafePointer(sb[i*n:]))
		s.TensorDesc, _ = transport.NewTensorDesc(s.Device, s.DType, []int64{int64(n)})
		d := s
		d.Data, d.Orig = uintptr(unsafePointer(db[i*n:])), uintptr(unsafePointer(db[i*n:]))
		srcs, dsts = append(srcs, s), append(dsts, d)
	}
	fetchRepeatedly(b, tr, transport.ObjectID{8}, srcs, dsts)
}

func BenchmarkFetch1024x4KiBViews(b *testing.B) { benchViews(b, 1024, 4<<10) }

// fetchRepeatedly puts srcs as object obj and times fetches of it into dsts.
func fetchRepeatedly(b *testing.B, tr *Transport, obj transport.ObjectID, srcs, dsts []transport.Tensor) {
	meta, err := tr.ExtractMetadata(obj, srcs)
	if err != nil {
		b.Fatal(err)
	}
	x := from(obj, os.Getpid())
	var total int64
	for _, d := range dsts {
		total += int64(d.Nbytes)
	}
	b.SetBytes(total)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req, err := tr.Fetch(x, dsts, meta, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := req.Wait(); err != nil {
			b.Fatal(err)
		}
		req.Release()
	}
}

func BenchmarkFetch4KiB(b *testing.B) { benchMany(b, 1, 4<<10) }
func BenchmarkRaw4KiB(b *testing.B)   { benchRaw(b, 4<<10) }
