package main

/*
#include "rdt.h"

// How many codes RDT_STATUS_LIST holds, for the Go side to match.
#define RDTC_COUNT_STATUS_(name, value) +1
enum { rdtc_status_count = 0 RDT_STATUS_LIST(RDTC_COUNT_STATUS_) };
#undef RDTC_COUNT_STATUS_
*/
import "C"

import (
	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

// The core's status constants are written in Go, rdt.h's in C; these checks
// make the library fail to build when the two drift apart. Indexing a
// one-element array with a constant is a compile error unless the constant
// is 0, so each entry compiles only if the Go value equals the C one, and
// the last line only if every code of RDT_STATUS_LIST has an entry here.
var sameValue [1]struct{}

var goStatusesMatchRDTH = [...]struct{}{
	sameValue[transport.OK-C.RDT_OK],
	sameValue[transport.ErrInvalidArgument-C.RDT_ERR_INVALID_ARGUMENT],
	sameValue[transport.ErrNotFound-C.RDT_ERR_NOT_FOUND],
	sameValue[transport.ErrAlreadyExists-C.RDT_ERR_ALREADY_EXISTS],
	sameValue[transport.ErrTimeout-C.RDT_ERR_TIMEOUT],
	sameValue[transport.ErrAborted-C.RDT_ERR_ABORTED],
	sameValue[transport.ErrPeerUnavailable-C.RDT_ERR_PEER_UNAVAILABLE],
	sameValue[transport.ErrCorrupt-C.RDT_ERR_CORRUPT],
	sameValue[transport.ErrUnsupported-C.RDT_ERR_UNSUPPORTED],
	sameValue[transport.ErrPermissionDenied-C.RDT_ERR_PERMISSION_DENIED],
	sameValue[transport.ErrTransport-C.RDT_ERR_TRANSPORT],
	sameValue[transport.ErrNoMemory-C.RDT_ERR_NO_MEMORY],
	sameValue[transport.ErrABIMismatch-C.RDT_ERR_ABI_MISMATCH],
	sameValue[transport.ErrForked-C.RDT_ERR_FORKED],
	sameValue[transport.ErrClosed-C.RDT_ERR_CLOSED],
	sameValue[transport.ErrInternal-C.RDT_ERR_INTERNAL],
	sameValue[transport.ErrUser-C.RDT_ERR_USER],
}

var _ = sameValue[C.rdtc_status_count-len(goStatusesMatchRDTH)]

// The fetch histograms' shape and the log queue's bound are fixed in rdt.h
// and in the core alike.
var _ = [...]struct{}{
	sameValue[engine.FetchSizeClasses-C.RDT_FETCH_SIZE_CLASSES],
	sameValue[engine.FetchLatencyBuckets-C.RDT_FETCH_LATENCY_BUCKETS],
	sameValue[transport.MaxCapturedLogs-C.RDT_LOG_QUEUE_MAX],
}
