package engine

import (
	"sync/atomic"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// counters are a runtime's, for Stats.
type counters struct {
	refs, fetchesActive                    atomic.Int64
	objectsFreed, leasesExpired            atomic.Uint64
	moved                                  [2]outcomes // by direction (see account)
	sendsCompleted, bytesSent, localCopies atomic.Uint64
	viewsOpen, bytesViewed                 atomic.Int64 // mapped views held
}

// outcomes count the transfers of one direction: those completed, those
// failed, and the bytes the completed ones moved.
type outcomes struct {
	completed, failed, bytes atomic.Uint64
}

func (o *outcomes) add(nbytes uint64, err error) {
	if err != nil {
		o.failed.Add(1)
		return
	}
	o.completed.Add(1)
	o.bytes.Add(nbytes)
}

// account counts one transfer's outcome, reads and writes alike, each in
// its direction's counters: the runtime's, and, when a transport moved it
// (e not nil), the transport's and its histograms. took counts from the
// caller's start of the fetch, write or prepared run.
func (c *counters) account(dir transport.Direction, e *registered, nbytes uint64, took time.Duration, err error) {
	c.moved[dir].add(nbytes, err)
	if e == nil {
		return
	}
	e.moved[dir].add(nbytes, err)
	if err != nil {
		e.hist[dir].recordFailure(nbytes)
		return
	}
	e.hist[dir].recordFetch(nbytes, took)
}
