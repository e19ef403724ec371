package main

/*
#include "capi.h"
*/
import "C"

import (
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
)

//export rdtgo_log_capture
func rdtgo_log_capture(enable C.int) C.int {
	return guard("rdt_log_capture", func() error {
		transport.SetLogCapture(enable != 0)
		return nil
	})
}

//export rdtgo_log_set_level
func rdtgo_log_set_level(level C.int32_t) C.int {
	return guard("rdt_log_set_level", func() error {
		return transport.SetLogLevelOverride(transport.LogLevel(level))
	})
}

//export rdtgo_log_take
func rdtgo_log_take(records *C.rdt_log_record, capacity C.size_t, count *C.size_t, timeoutMS C.int64_t) C.int {
	return guard("rdt_log_take", func() error {
		timeout := duration(timeoutMS)
		buf := make([]transport.LogRecord, min(capacity, transport.MaxCapturedLogs))
		got, err := transport.TakeLogs(buf, timeout)
		if err != nil {
			return err
		}
		out := unsafe.Slice(records, got)
		for i, r := range buf[:got] {
			o := &out[i]
			o.level = C.int32_t(r.Level)
			o.unix_ns = C.int64_t(r.Time.UnixNano())
			copyName(o.runtime[:], r.Name)
			copyCut(o.message[:], r.Message)
		}
		*count = C.size_t(got)
		return nil
	})
}

// copyCut copies s into dst NUL-terminated, ending in "..." where it is cut.
func copyCut(dst []C.char, s string) {
	if len(s) > len(dst)-1 {
		s = s[:len(dst)-4] + "..."
	}
	copyName(dst, s)
}
