package main

/*
#include "capi.h"
*/
import "C"

import (
	"runtime"
	"runtime/debug"
	"strings"
)

//export rdtgo_build_info
func rdtgo_build_info() *C.char {
	// Made once (abi.c caches it) and never freed: rdt_build_info hands out
	// static storage.
	return C.CString(buildInfo())
}

// buildInfo describes how this library was built, as "key=value" lines
// (the keys rdt.h lists; cc from the C compiler's own macros), from what the Go toolchain recorded in it.
func buildInfo() string {
	var lines []string
	add := func(key, value string) {
		if value != "" {
			lines = append(lines, key+"="+strings.ReplaceAll(value, "\n", " "))
		}
	}
	add("go", runtime.Version())
	add("os", runtime.GOOS)
	add("arch", runtime.GOARCH)
	add("compiler", runtime.Compiler)
	add("cc", C.GoString(C.rdtc_cc_version()))
	if bi, ok := debug.ReadBuildInfo(); ok {
		settings := map[string]string{}
		for _, s := range bi.Settings {
			settings[s.Key] = s.Value
		}
		add("buildmode", settings["-buildmode"])
		add("tags", settings["-tags"])
		add("cgo", settings["CGO_ENABLED"])
		add("goamd64", settings["GOAMD64"])
		add("goarm64", settings["GOARM64"])
		add("vcs.revision", settings["vcs.revision"])
		add("vcs.time", settings["vcs.time"])
		add("vcs.modified", settings["vcs.modified"])
	}
	return strings.Join(lines, "\n")
}
