package main

/*
#include "rdt.h"

// How many codes RDT_STATUS_LIST holds, for the Go side to match.
#define RDTC_COUNT_STATUS_(name, value) +1
enum { rdtc_status_count = 0 RDT_STATUS_LIST(RDTC_COUNT_STATUS_) };
#undef RDTC_COUNT_STATUS_
*/
import "C"

import "github.com/rdt-project/rdt/core"

// The core's status constants are written in Go, rdt.h's in C; these checks
// make the library fail to build when the two drift apart. Indexing a
// one-element array with a constant is a compile error unless the constant
// is 0, so each entry compiles only if the Go value equals the C one, and
// the last line only if every code of RDT_STATUS_LIST has an entry here.
var sameValue [1]struct{}

var goStatusesMatchRDTH = [...]struct{}{
	sameValue[core.OK-C.RDT_OK],
	sameValue[core.ErrInvalidArgument-C.RDT_ERR_INVALID_ARGUMENT],
	sameValue[core.ErrNotFound-C.RDT_ERR_NOT_FOUND],
	sameValue[core.ErrAlreadyExists-C.RDT_ERR_ALREADY_EXISTS],
	sameValue[core.ErrTimeout-C.RDT_ERR_TIMEOUT],
	sameValue[core.ErrAborted-C.RDT_ERR_ABORTED],
	sameValue[core.ErrPeerUnavailable-C.RDT_ERR_PEER_UNAVAILABLE],
	sameValue[core.ErrCorrupt-C.RDT_ERR_CORRUPT],
	sameValue[core.ErrUnsupported-C.RDT_ERR_UNSUPPORTED],
	sameValue[core.ErrPermissionDenied-C.RDT_ERR_PERMISSION_DENIED],
	sameValue[core.ErrTransport-C.RDT_ERR_TRANSPORT],
	sameValue[core.ErrNoMemory-C.RDT_ERR_NO_MEMORY],
	sameValue[core.ErrABIMismatch-C.RDT_ERR_ABI_MISMATCH],
	sameValue[core.ErrForked-C.RDT_ERR_FORKED],
	sameValue[core.ErrClosed-C.RDT_ERR_CLOSED],
	sameValue[core.ErrInternal-C.RDT_ERR_INTERNAL],
	sameValue[core.ErrUser-C.RDT_ERR_USER],
}

var _ = sameValue[C.rdtc_status_count-len(goStatusesMatchRDTH)]
