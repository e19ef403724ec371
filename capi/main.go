// Command capi is the C ABI of rdt. Built with -buildmode=c-shared it
// becomes librdt.so, whose only exported symbols are the rdt_* functions of
// include/rdt.h (see exports.map). The public functions live in abi.c and
// errors.c; they call the Go exports (rdtgo_*) of this package, which
// convert types, resolve handles and call the core. No logic lives here.
package main

/*
#cgo CFLAGS: -I${SRCDIR}/../include -g -O2 -Wall -Wextra -Wno-unused-parameter
#cgo LDFLAGS: -lpthread
*/
import "C"

import (
	// Puts C frames into Go tracebacks, so a crash inside a callback shows
	// where it happened.
	_ "github.com/ianlancetaylor/cgosymbolizer"
)

func main() {}
