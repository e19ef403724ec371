// Package dynlib opens shared libraries at run time (dlopen) and resolves
// tables of their symbols, so that rdt builds and runs on machines without
// them. A library's own C shim keeps the function pointers (Go cannot call
// them) and is handed what Resolve found; this package holds what the
// loaders share: choosing the path, reporting dlerror, naming a missing
// symbol, and loading once.
//
// It reads no environment: a loader passes the value of its override
// variable to Path.
package dynlib

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

// rdtdl_open opens path, and on failure writes dlerror's text into err
// (dlerror is per thread, so the two calls are made in one C call).
static void *rdtdl_open(const char *path, char *err, size_t errlen) {
	dlerror();
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
	}
	return h;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
)

// Path is what a loader opens: the override (its environment variable's
// value) when set, else the default name.
func Path(override, fallback string) string {
	if override != "" {
		return override
	}
	return fallback
}

// Library is an open shared library.
type Library struct {
	Path string // the path it was opened by
	h    unsafe.Pointer
}

// OpenError is a library that dlopen refused.
type OpenError struct {
	Path   string
	Reason string // dlerror's text (it usually names the path)
}

func (e *OpenError) Error() string { return e.Reason }

// MissingSymbolError is a library that lacks a symbol the loader needs.
type MissingSymbolError struct {
	Path   string
	Symbol string
}

func (e *MissingSymbolError) Error() string {
	return fmt.Sprintf("%s has no symbol %s", e.Path, e.Symbol)
}

// Open opens the first of paths that dlopen accepts (RTLD_NOW |
// RTLD_LOCAL). When none does, the *OpenError names the first path and
// gives every path's reason.
func Open(paths ...string) (*Library, error) {
	var reasons []string
	for _, path := range paths {
		cpath := C.CString(path)
		var buf [512]C.char
		h := C.rdtdl_open(cpath, &buf[0], C.size_t(len(buf)))
		C.free(unsafe.Pointer(cpath))
		if h != nil {
			return &Library{Path: path, h: h}, nil
		}
		reasons = append(reasons, C.GoString(&buf[0]))
	}
	if len(paths) == 0 {
		return nil, &OpenError{Reason: "no library named"}
	}
	return nil, &OpenError{Path: paths[0], Reason: strings.Join(reasons, "; ")}
}

// Symbol is one entry of a table to resolve.
type Symbol struct {
	Name     string
	Older    string // tried when Name is missing ("" for none)
	Optional bool   // missing is not an error: its address is nil
}

// Lookup is the address of name in the library, or nil.
func (l *Library) Lookup(name string) unsafe.Pointer {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return C.dlsym(l.h, cname)
}

// Resolve finds the address of every symbol, in order. A missing symbol
// that is not optional is a *MissingSymbolError naming it.
func (l *Library) Resolve(syms []Symbol) ([]unsafe.Pointer, error) {
	fns := make([]unsafe.Pointer, len(syms))
	for i, s := range syms {
		f := l.Lookup(s.Name)
		if f == nil && s.Older != "" {
			f = l.Lookup(s.Older)
		}
		if f == nil && !s.Optional {
			return nil, &MissingSymbolError{Path: l.Path, Symbol: s.Name}
		}
		fns[i] = f
	}
	return fns, nil
}

// Close closes the library (dlclose). A library whose functions are in use
// is never closed.
func (l *Library) Close() {
	C.dlclose(l.h)
}

// OpenTable opens the first of paths that loads and resolves syms in it;
// on failure nothing stays open.
func OpenTable(syms []Symbol, paths ...string) (*Library, []unsafe.Pointer, error) {
	l, err := Open(paths...)
	if err != nil {
		return nil, nil, err
	}
	fns, err := l.Resolve(syms)
	if err != nil {
		l.Close()
		return nil, nil, err
	}
	return l, fns, nil
}

// OpenLibrary is OpenTable for the one library of a transport, whose
// failure is a transport.ErrUnsupported error that names what the library
// is and its path, goes on with hint (how to point at another), and says
// of a missing symbol notIt (what a library without it is).
func OpenLibrary(syms []Symbol, path, what, hint, notIt string) ([]unsafe.Pointer, error) {
	_, fns, err := OpenTable(syms, path)
	if err != nil {
		var missing *MissingSymbolError
		if errors.As(err, &missing) {
			err = fmt.Errorf("%v: %s", missing, notIt)
		}
		return nil, transport.Errorf(transport.ErrUnsupported, "%s %s could not be loaded%s: %v", what, path, hint, err)
	}
	return fns, nil
}

// Once runs a load once per process and keeps its result: later calls
// return the first one, whether it failed or not.
type Once struct {
	done atomic.Bool
	mu   sync.Mutex
	err  error
}

// Do runs load the first time and returns its result every time.
func (o *Once) Do(load func() error) error {
	if o.done.Load() {
		return o.err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.done.Load() {
		o.err = load()
		o.done.Store(true)
	}
	return o.err
}

// ByPath loads one library per process, chosen by path when the load is
// asked for: the first path that loads stays, any other is then refused,
// and a path that failed fails again with the same error without being
// tried (the path may change between calls, so each is remembered).
type ByPath struct {
	mu     sync.Mutex
	loaded string
	errs   map[string]error
}

// Load runs load for path unless path already loaded (nil) or failed (its
// error); it refuses another path once one loaded.
func (b *ByPath) Load(path string, load func() error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.loaded != "" {
		if b.loaded != path {
			return transport.Errorf(transport.ErrUnsupported, "%s is already loaded in this process; cannot also load %s", b.loaded, path)
		}
		return nil
	}
	if err, ok := b.errs[path]; ok {
		return err
	}
	err := load()
	if err == nil {
		b.loaded = path
		return nil
	}
	if b.errs == nil {
		b.errs = map[string]error{}
	}
	b.errs[path] = err
	return err
}
