package shm

import (
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"golang.org/x/sys/unix"
)

// Copies out of a received segment into the targets: preadv over runs of
// regions, or a mapping where the targets are misaligned with the segment.

const (
	// maxGap: regions at most this far apart are read by one call, the
	// bytes between them (alignment padding) into a scratch buffer.
	maxGap = 4096
	// maxIovecs per preadv call (the kernel's IOV_MAX is 1024).
	maxIovecs = 1024
)

// mappedCopyMin: a run at least this large whose targets are misaligned
// with its bytes in the segment is copied from a mapping (see misaligned).
const mappedCopyMin = 256 << 10

// run is one preadv: iovecs that are contiguous in the segment from off.
type run struct {
	off   uint64
	iovs  [][]byte
	bytes uint64
}

// extend adds b to the run's iovecs, as part of the last one when it
// follows it in memory (targets that are views of one buffer, say: the
// kernel's cost is per iovec more than per byte) and nothing lies between
// them in the segment (joinable).
func (r *run) extend(b []byte, joinable bool) {
	if n := len(r.iovs); n > 0 && joinable {
		if joined, ok := transport.Join(r.iovs[n-1], b); ok {
			r.iovs[n-1] = joined
			return
		}
	}
	r.iovs = append(r.iovs, b)
}

// planRuns groups the regions into runs of at most chunk bytes and
// maxIovecs iovecs, so an object of many tensors costs one call per run,
// not one per tensor. Regions the metadata lists out of order or far apart
// start a new run.
func planRuns(regions []region, targets []transport.Tensor, scratch []byte) []run {
	var runs []run
	var cur *run
	for i, reg := range regions {
		dst := transport.Bytes(targets[i].Data, reg.Size)
		for done := uint64(0); done < reg.Size; {
			at := reg.Offset + done
			var gap uint64
			if cur != nil && at >= cur.off+cur.bytes {
				gap = at - (cur.off + cur.bytes)
			}
			if cur == nil || at < cur.off+cur.bytes || gap > maxGap || len(cur.iovs)+2 > maxIovecs || cur.bytes+gap >= chunk {
				runs = append(runs, run{off: at})
				cur = &runs[len(runs)-1]
				gap = 0
			}
			if gap > 0 {
				cur.iovs = append(cur.iovs, scratch[:gap])
				cur.bytes += gap
			}
			n := min(reg.Size-done, chunk-cur.bytes)
			cur.extend(dst[done:done+n], gap == 0)
			cur.bytes += n
			done += n
		}
	}
	return runs
}

// readRegions copies the regions of the segment into the targets with
// preadv: one copy by the kernel, no mapping to set up and tear down (for a
// fresh mapping of a large segment that costs more than the copy itself,
// measured), and one call per run of up to chunk bytes, checking for an
// abort between them; runs whose targets are misaligned with the segment
// are copied from a mapping instead (see run.misaligned). Large objects are
// split between two workers.
func readRegions(fd int, regions []region, targets []transport.Tensor, abort *atomic.Bool) error {
	scratch := make([]byte, maxGap)
	runs := planRuns(regions, targets, scratch)
	var total uint64
	for _, r := range runs {
		total += r.bytes
	}
	if total < parallelMin {
		return readRuns(fd, runs, abort)
	}
	half, sum := 0, uint64(0)
	for half < len(runs) && sum < total/2 {
		sum += runs[half].bytes
		half++
	}
	var err1 error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); err1 = readRuns(fd, runs[half:], abort) }()
	err0 := readRuns(fd, runs[:half], abort)
	wg.Wait()
	if err0 != nil {
		return err0
	}
	return err1
}

func readRuns(fd int, runs []run, abort *atomic.Bool) error {
	for _, r := range runs {
		if r.bytes >= mappedCopyMin && r.misaligned() {
			if abort.Load() {
				return transport.Errorf(transport.ErrAborted, "transfer aborted")
			}
			if err := copyMapped(fd, r); err != nil {
				return err
			}
			continue
		}
		if err := preadv(fd, r.iovs, int64(r.off), abort); err != nil {
			return err
		}
	}
	return nil
}

// preadv fills iovs with the bytes of fd from off on, going on after a
// short read; with abort, it stops when abort is set, checked before each
// call.
func preadv(fd int, iovs [][]byte, off int64, abort *atomic.Bool) error {
	for {
		for len(iovs) > 0 && len(iovs[0]) == 0 {
			iovs = iovs[1:]
		}
		if len(iovs) == 0 {
			return nil
		}
		if abort != nil && abort.Load() {
			return transport.Errorf(transport.ErrAborted, "transfer aborted")
		}
		n, err := unix.Preadv(fd, iovs, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return transport.Errorf(transport.ErrTransport, "reading the segment: %v", err)
		}
		if n == 0 {
			return transport.Errorf(transport.ErrCorrupt, "the segment ended early")
		}
		off += int64(n)
		for n > 0 { // a short read: go on after what arrived
			if n >= len(iovs[0]) {
				n -= len(iovs[0])
				iovs = iovs[1:]
			} else {
				iovs[0] = iovs[0][n:]
				n = 0
			}
		}
	}
}

// parallelCopy copies src into dst in chunks, checking abort between them,
// with two workers for large copies. It reports false if it was aborted.
func parallelCopy(dst, src []byte, abort *atomic.Bool) bool {
	one := func(d, s []byte) bool {
		for off := 0; off < len(s); off += chunk {
			if abort != nil && abort.Load() {
				return false
			}
			copy(d[off:], s[off:min(off+chunk, len(s))])
		}
		return true
	}
	if len(src) < parallelMin {
		return one(dst, src)
	}
	half := (len(src) / 2) &^ 4095
	var ok [workers]bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); ok[1] = one(dst[half:], src[half:]) }()
	ok[0] = one(dst[:half], src[:half])
	wg.Wait()
	return ok[0] && ok[1]
}

// misaligned reports whether a target of the run starts at another address
// modulo align than its bytes in the segment. The kernel's copy behind
// preadv runs about 3x slower on such buffers (measured: numpy's arrays are
// 16-byte aligned, tensors sit 64-byte aligned in a segment), a user-space
// copy from a mapping does not.
func (r run) misaligned() bool {
	off := r.off
	for _, iov := range r.iovs {
		if len(iov) > 0 && (uintptr(unsafe.Pointer(&iov[0]))-uintptr(off))%align != 0 {
			return true
		}
		off += uint64(len(iov))
	}
	return false
}

// copyMapped copies the run from a read-only mapping of its pages. The
// segment is sealed against shrinking (checked before), so no page of the
// mapping can vanish under the copy.
func copyMapped(fd int, r run) error {
	page := uint64(os.Getpagesize())
	start := r.off &^ (page - 1)
	mem, err := unix.Mmap(fd, int64(start), int(r.off+r.bytes-start), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return transport.Errorf(transport.ErrTransport, "mapping the segment: %v", err)
	}
	src := mem[r.off-start:]
	for _, iov := range r.iovs {
		src = src[copy(iov, src):]
	}
	if err := unix.Munmap(mem); err != nil {
		return transport.Errorf(transport.ErrTransport, "unmapping the segment: %v", err)
	}
	return nil
}

// checkSealedSize checks that a memfd from a source carries the seals want
// and is size bytes. The seals come first: until they are set the source
// can still resize the file, so a size read before them proves nothing (a
// file shrunk after its size was read, then sealed, passes both checks and
// faults the receiver with SIGBUS on its first read of the mapping).
func checkSealedSize(fd int, size uint64, want int, what, refusal string) error {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&want != want {
		return transport.Errorf(transport.ErrPermissionDenied, "the source's %s is not %s", what, refusal)
	}
	if betweenSealsAndSize != nil {
		betweenSealsAndSize(fd)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || uint64(st.Size) != size {
		return transport.Errorf(transport.ErrCorrupt, "the source's %s is %d bytes, it said %d", what, st.Size, size)
	}
	return nil
}

// betweenSealsAndSize, set by tests only, runs between the two checks of
// checkSealedSize: where a hostile source would act.
var betweenSealsAndSize func(fd int)
