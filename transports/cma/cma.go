// Package cma moves host memory between processes on one host with
// cross-memory attach: the receiver reads the source's pages with
// process_vm_readv straight into its targets. One copy, no staging, and the
// source does nothing per transfer.
package cma

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/rdt-project/rdt/core/transport"
	"golang.org/x/sys/unix"
)

// Name is the canonical transport name.
const Name = "cma"

const (
	// chunkSize bounds the bytes of one process_vm_readv call, so that an
	// abort is seen promptly and a large tensor can be split between workers.
	chunkSize = 8 << 20
	// maxIovecs is the most iovecs one process_vm_readv call takes (the
	// kernel's IOV_MAX): small tensors are read up to this many at once.
	maxIovecs = 1024
	// syncLimit: transfers up to this size run inside Fetch, on the
	// caller's thread. At 1 MiB (about 80 µs at this machine's limit) the
	// goroutine hand-off and wake-up cost a third of the copy. A copy
	// inside Fetch is not aborted: at 2 MiB it lasts well under a
	// millisecond.
	syncLimit = 2 << 20
	// parallelMin: tensors at least this large are read by several workers.
	parallelMin = 32 << 20
	maxWorkers  = 4
)

// Factory makes the transport for a new runtime.
func Factory() transport.TransportFactory {
	return transport.TransportFactory{Name: Name, New: New, Settings: Settings()}
}

// Transport is the cma transport of one runtime.
type Transport struct {
	h         transport.Host
	pid       int
	startTime uint64
	workers   int

	mu    sync.Mutex
	procs map[procKey]*proc // sources read from, by pid and start time

	guards guardTable
}

// PeerGone drops the pidfd of a runtime that is gone: a receiver fed by
// many short-lived sources keeps no descriptor per source. Another runtime
// of the same process, if any, opens it again on its next fetch.
func (t *Transport) PeerGone(peer transport.PeerInfo) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.procs {
		if k.pid == peer.Pid {
			t.forgetLocked(k)
		}
	}
}

// New makes the transport. On kernels where Yama restricts ptrace to
// descendants (ptrace_scope 1), it allows same-user processes to read this
// one, which is what classic ptrace permissions allow anyway; set
// RDT_CMA_SET_PTRACER=0 to keep the restriction (cma then fails with a
// message that names shm).
func New(h transport.Host) (transport.Transport, error) {
	st, err := processStartTime(os.Getpid())
	if err != nil {
		return nil, transport.Errorf(transport.ErrUnsupported, "cannot read this process's start time from /proc: %v", err)
	}
	workers := workersSetting.In(h.Settings()) // checked by the runtime
	if workers < 1 || workers > maxWorkers {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "%d workers: want 1 to %d", workers, maxWorkers)
	}
	t := &Transport{h: h, pid: os.Getpid(), startTime: st, workers: workers}
	if yamaScope() == 1 && setPtracerSetting.In(h.Settings()) {
		if err := unix.Prctl(unix.PR_SET_PTRACER, unix.PR_SET_PTRACER_ANY, 0, 0, 0); err != nil {
			h.Log().Warnf("Yama ptrace_scope is 1 and PR_SET_PTRACER failed (%v): peers will fall back to shm", err)
		} else {
			h.Log().Infof("Yama ptrace_scope is 1: allowed same-user processes to read this one")
		}
	}
	return t, nil
}

// Describe: cma reads (and, for writes, writes) another process's memory,
// so only on the same host
// (the host identity covers the pid namespace); the guard word the source
// clears at free is read after every copy; addresses are free to describe,
// so every put carries them; for host data it is the first choice.
func (t *Transport) Describe() transport.Descriptor {
	return transport.Descriptor{
		Name:                Name,
		Devices:             []transport.DeviceType{transport.DeviceCPU, transport.DeviceCUDAHost},
		OneSided:            true,
		CanAbort:            true,
		SameHostOnly:        true,
		DetectsFreedObjects: true,
		Ranges:              true,
		EagerMetadata:       true,
		Writes:              true,
		Auto:                transport.AutoRank{Host: 10},
	}
}

// Close drops every pidfd (those of requests still running once they end).
func (t *Transport) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.procs {
		t.forgetLocked(k)
	}
	return nil
}

// processStartTime reads field 22 of /proc/<pid>/stat: the start time in
// clock ticks since boot, which with the pid names a process uniquely.
func processStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses; the
	// fields after it start behind the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	fields := strings.Fields(string(b[i+1:]))
	// fields[0] is field 3 (state), so field 22 is fields[19].
	if len(fields) < 20 {
		return 0, errors.New("short stat")
	}
	if fields[0] == "Z" || fields[0] == "X" {
		return 0, errors.New("process exited")
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

func yamaScope() int {
	b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
	if err != nil {
		return -1
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return v
}

func yamaDescription() string {
	if s := yamaScope(); s >= 0 {
		return strconv.Itoa(s)
	}
	return "absent"
}
