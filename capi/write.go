package main

/*
#include "capi.h"
*/
import "C"

import (
	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

// writeArgs resolves the arguments shared by rdt_write_start and rdt_write.
func writeArgs(h C.uintptr_t, refs *C.uintptr_t, nrefs C.size_t, sources *C.rdt_tensor,
	nsources C.size_t, copts *C.rdt_write_options) (*engine.Runtime, []*engine.Ref, []transport.Tensor, engine.WriteOptions, error) {
	var opts engine.WriteOptions
	rt, rs, ts, _, err := getArgs(h, refs, nrefs, sources, nsources, nil, "sources")
	if err != nil {
		return nil, nil, nil, opts, err
	}
	if copts != nil {
		opts.Transport = goString(copts.transport)
		opts.Tag = uint64(copts.tag)
		if opts.Destinations, err = rangesFromC(copts.destinations, copts.num_destinations, "destinations"); err != nil {
			return nil, nil, nil, opts, err
		}
	}
	return rt, rs, ts, opts, nil
}

//export rdtgo_write_start
func rdtgo_write_start(h C.uintptr_t, refs *C.uintptr_t, nrefs C.size_t, sources *C.rdt_tensor,
	nsources C.size_t, copts *C.rdt_write_options, out *C.uintptr_t) C.int {
	return openCall("rdt_write_start", h, refs, nrefs, sources, nsources, copts, out, writeArgs,
		(*engine.Runtime).StartWrite, newPending)
}

//export rdtgo_write
func rdtgo_write(h C.uintptr_t, refs *C.uintptr_t, nrefs C.size_t, sources *C.rdt_tensor,
	nsources C.size_t, copts *C.rdt_write_options, ms C.int64_t) C.int {
	return runCall("rdt_write", h, refs, nrefs, sources, nsources, copts, ms, writeArgs, (*engine.Runtime).Write)
}

//export rdtgo_write_notice_wait
func rdtgo_write_notice_wait(h C.uintptr_t, ms C.int64_t, out *C.rdt_write_notice) C.int {
	return guardRef("rdt_write_notice_wait", h, "exposed", func(ref *engine.Ref) error {
		n, err := ref.WaitWriteNotice(duration(ms))
		if err != nil {
			return err
		}
		out.tag = C.uint64_t(n.Tag)
		out.nbytes = C.uint64_t(n.Bytes)
		copyName(out.writer[:], n.Writer.String())
		if n.Err != nil {
			out.status = C.rdt_status(transport.StatusOf(n.Err))
			copyName(out.message[:], n.Err.Error())
		}
		return nil
	})
}

//export rdtgo_write_notice_event_fd
func rdtgo_write_notice_event_fd(h C.uintptr_t, out *C.int) C.int {
	return guard("rdt_write_notice_event_fd", func() error {
		if out == nil {
			return invalid("fd_out is NULL")
		}
		ref, err := refOf(h, "exposed")
		if err != nil {
			return err
		}
		fd, err := ref.WriteNoticeFD()
		if err != nil {
			return err
		}
		*out = C.int(fd)
		return nil
	})
}

//export rdtgo_ref_revoke_writes
func rdtgo_ref_revoke_writes(h C.uintptr_t, ms C.int64_t) C.int {
	return guardRef("rdt_ref_revoke_writes", h, "exposed", func(ref *engine.Ref) error {
		return ref.RevokeWrites(duration(ms))
	})
}
