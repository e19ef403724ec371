package main

/*
#include "capi.h"
*/
import "C"

import (
	"slices"
	"unsafe"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

//export rdtgo_runtime_create
func rdtgo_runtime_create(opts *C.rdt_runtime_options, out *C.uintptr_t) C.int {
	return guard("rdt_runtime_create", func() error {
		if out == nil {
			return invalid("out is NULL")
		}
		o := engine.Options{
			Name:          goString(opts.name),
			LogLevel:      transport.LogLevel(opts.log_level),
			Lease:         duration(opts.lease_ms),
			PeerTimeout:   duration(opts.peer_timeout_ms),
			ListenTCP:     goString(opts.listen_tcp),
			AuthToken:     goString(opts.auth_token),
			AdvertiseHost: goString(opts.advertise_host),
			SocketDir:     goString(opts.socket_dir),
			HostID:        goString(opts.host_id),
			Builtins:      builtinTransports,
			// Every built-in's variables are checked, made or not.
			Settings: engine.SettingsOf(builtinTransports),
			// RDT_LISTEN and RDT_AUTH_TOKEN stand in for NULL strings.
			EnvironmentDefaults: true,
		}
		if o.LogLevel < transport.LogDefault || o.LogLevel > transport.LogDebug {
			return invalid("log_level %d is not an RDT_LOG_* value", o.LogLevel)
		}
		if opts.lease_ms < 0 || opts.peer_timeout_ms < 0 {
			return invalid("lease_ms and peer_timeout_ms must not be negative")
		}
		flags := uint32(opts.flags)
		if flags&^uint32(C.RDT_RUNTIME_IN_PROCESS|C.RDT_RUNTIME_NO_BUILTIN_TRANSPORTS|C.RDT_RUNTIME_QUEUE_RELEASES) != 0 {
			return invalid("unknown flags %#x", flags)
		}
		if flags&C.RDT_RUNTIME_NO_BUILTIN_TRANSPORTS != 0 {
			o.Builtins = nil
		}
		o.Network = networkFor(flags)
		o.QueueReleases = flags&C.RDT_RUNTIME_QUEUE_RELEASES != 0
		rt, err := engine.NewRuntime(o)
		if err != nil {
			return err
		}
		*out = newHandle(&runtimeHandle{rt: rt, address: C.CString(rt.Address())})
		return nil
	})
}

//export rdtgo_runtime_destroy
func rdtgo_runtime_destroy(h C.uintptr_t) C.int {
	return guardFree("rdt_runtime_destroy", h, "rt", func(rh *runtimeHandle) error {
		rh.rt.Destroy()
		C.free(unsafe.Pointer(rh.address))
		return nil
	})
}

//export rdtgo_runtime_address
func rdtgo_runtime_address(h C.uintptr_t, out **C.char) C.int {
	return guardOn("rdt_runtime_address", h, "rt", func(rh *runtimeHandle) error {
		if out == nil {
			return invalid("out is NULL")
		}
		*out = rh.address
		return nil
	})
}

//export rdtgo_runtime_fetch_histograms
func rdtgo_runtime_fetch_histograms(h C.uintptr_t, out *C.rdt_fetch_histogram, capacity C.size_t, count *C.size_t, getsOnly C.int) C.int {
	return guardList("rdt_runtime_fetch_histograms", h, out, capacity, count,
		func(rt *engine.Runtime) []engine.FetchHistogram {
			hs := rt.Registry().FetchHistograms()
			if getsOnly != 0 {
				hs = slices.DeleteFunc(hs, func(hg engine.FetchHistogram) bool { return hg.Direction != transport.Read })
			}
			return hs
		},
		func(hg engine.FetchHistogram, o *C.rdt_fetch_histogram) {
			o.size_class = C.uint32_t(hg.SizeClass)
			o.direction = C.uint32_t(hg.Direction)
			copyName(o.transport[:], hg.Transport)
			o.count = C.uint64_t(hg.Count)
			o.sum_ns = C.uint64_t(hg.SumNanos)
			o.bytes = C.uint64_t(hg.Bytes)
			o.failures = C.uint64_t(hg.Failures)
			for b, n := range hg.Buckets {
				o.buckets[b] = C.uint64_t(n)
			}
		})
}

//export rdtgo_runtime_stats
func rdtgo_runtime_stats(h C.uintptr_t, out *C.rdt_stats) C.int {
	return guardRuntime("rdt_runtime_stats", h, func(rt *engine.Runtime) error {
		s := rt.Stats()
		out.objects = C.uint64_t(s.Objects)
		out.objects_freed = C.uint64_t(s.ObjectsFreed)
		out.refs = C.uint64_t(s.Refs)
		out.borrows = C.uint64_t(s.Borrows)
		out.borrowed_objects = C.uint64_t(s.BorrowedObjects)
		out.refs_in_transit = C.uint64_t(s.RefsInTransit)
		out.leases_expired = C.uint64_t(s.LeasesExpired)
		out.fetches_active = C.uint64_t(s.FetchesActive)
		out.transfers_completed = C.uint64_t(s.TransfersCompleted)
		out.transfers_failed = C.uint64_t(s.TransfersFailed)
		out.bytes_received = C.uint64_t(s.BytesReceived)
		out.sends_completed = C.uint64_t(s.SendsCompleted)
		out.bytes_sent = C.uint64_t(s.BytesSent)
		out.local_copies = C.uint64_t(s.LocalCopies)
		out.peers = C.uint64_t(s.Peers)
		out.peers_lost = C.uint64_t(s.PeersLost)
		out.writes_completed = C.uint64_t(s.WritesCompleted)
		out.writes_failed = C.uint64_t(s.WritesFailed)
		out.bytes_written = C.uint64_t(s.BytesWritten)
		out.writes_open = C.uint64_t(s.WritesOpen)
		out.views_open = C.uint64_t(s.ViewsOpen)
		out.bytes_viewed = C.uint64_t(s.BytesViewed)
		return nil
	})
}
