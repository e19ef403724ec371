package tcp

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// fetchRequest is one Fetch: an inline stream for small tensors when a
// pooled connection was at hand, and goroutines for the rest.
type fetchRequest struct {
	cl   *client
	meta *metadata
	pool poolKey // which pooled connections it may use

	aborted atomic.Bool
	ctx     context.Context // cancels dials; nil when no goroutine runs
	cancel  context.CancelFunc

	dir transport.Direction // a write pushes into the owner (write.go), a read pulls from it

	mu    sync.Mutex
	conns map[net.Conn]struct{} // connections in use, closed by abort
	err   error                 // the first error

	wg      sync.WaitGroup
	pending atomic.Int32 // goroutines still running

	// The inline stream is driven by whoever holds imu: Completed (with a
	// budget) or Wait.
	imu    sync.Mutex
	inline *stream
	idone  bool
}

// Fetch starts pulling into each target its piece of the object: the
// tensor of its index, whole, or in a partial fetch its piece's range.
func (t *Transport) Fetch(x *transport.Transfer, targets []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	return t.cl.fetch(x, targets, tmeta)
}

// fetch is Fetch.
func (cl *client) fetch(x *transport.Transfer, targets []transport.Tensor, tmeta []byte) (transport.Request, error) {
	m, err := cl.checkRequest(x, targets, tmeta)
	if err != nil {
		return nil, err
	}
	small, shares, err := plan(x, targets, cl.streams)
	if err != nil {
		return nil, err
	}
	r := cl.newRequest(x, m)
	if len(small) == 0 && len(shares) == 0 {
		return r, nil // nothing to move
	}
	if err := cl.activate(r); err != nil {
		return nil, err
	}
	if len(small) > 0 {
		// With a pooled connection the requests go out now and the answers
		// are read by Completed or Wait, with no goroutine of ours.
		if c := cl.idleConn(r.pool); c != nil {
			s := &stream{r: r, c: c, pieces: small}
			r.track(c)
			if err := s.sendMore(); err != nil {
				r.untrack(c)
				c.Close()
				cl.pool.Drop(r.pool) // its siblings are most likely dead too
			} else {
				r.inline = s
				small = nil
			}
		}
	}
	if len(small) > 0 || len(shares) > 0 {
		r.ctx, r.cancel = context.WithCancel(cl.h.Context())
	}
	if len(small) > 0 {
		r.spawn(small)
	}
	for _, ps := range shares {
		r.spawn(ps)
	}
	return r, nil
}

// newRequest is the request of a fetch or a write of the object m
// describes. Its pooled connections are recorded with the owner's runtime,
// so that they are closed when it is gone (PeerGone).
func (cl *client) newRequest(x *transport.Transfer, m *metadata) *fetchRequest {
	return &fetchRequest{cl: cl, meta: m, dir: x.Direction, conns: map[net.Conn]struct{}{},
		pool: poolKey{endpoint: m.Endpoint, source: x.Owner().RuntimeID, key: cl.clientKey(m)}}
}

// checkRequest decodes the metadata of the object a request moves and
// checks the local tensors (a fetch's targets, a write's sources) against
// it. The metadata counts the tensors but has no sizes: the source checks
// every range it is asked for against its tensors (checkRun), so here a
// tensor's size is taken as its local tensor's in a whole transfer and as
// unbounded in a partial one (which still catches a wrapping range).
func (cl *client) checkRequest(x *transport.Transfer, local []transport.Tensor, tmeta []byte) (*metadata, error) {
	m, err := decodeMetadata(tmeta)
	if err != nil {
		return nil, err
	}
	size := func(i int) uint64 {
		if x.Pieces == nil {
			return local[i].Nbytes
		}
		return math.MaxUint64
	}
	if err := x.CheckPieces(local, int(m.Tensors), size); err != nil {
		return nil, err
	}
	return m, nil
}

// activate records a request that moves bytes, for Close to abort.
func (cl *client) activate(r *fetchRequest) error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.closed {
		return transport.Errorf(transport.ErrClosed, "the transport is closed")
	}
	cl.active[r] = struct{}{}
	return nil
}

// plan cuts what the targets receive (x.PieceOf: a whole tensor, or a
// range of one) into requests: those under streamMin all go on one
// stream, pipelined, their answers batched at the source; a larger one is
// split into one share per stream (page-aligned), each share into requests
// of at most maxChunk. A request asks for bytes of its target's range
// alone, so nothing else crosses the wire. Small pieces that follow each
// other both at the source and in the targets' memory become one request
// (see the protocol), of up to streamMin bytes and maxRunTensors tensors.
func plan(x *transport.Transfer, targets []transport.Tensor, streams int) (small []piece, shares [][]piece, err error) {
	var runLast uint32 // the tensor the last small piece ends in
	var runEnd uint64  // and the byte it ends before
	joinable := false  // nothing moved between the last small piece and this one
	for i, tg := range targets {
		if !tg.Device.Type.HostAccessible() {
			return nil, nil, transport.Errorf(transport.ErrUnsupported, "target %d is in %s memory; tcp writes host memory", i, tg.Device)
		}
		p := x.PieceOf(i, tg)
		if p.Length == 0 {
			continue // a run goes on through an empty tensor
		}
		dst := transport.Bytes(tg.Data, p.Length)
		if p.Length < streamMin {
			if !joinable || !joinRun(x, targets, &small[len(small)-1], p, dst, runLast, runEnd) {
				small = append(small, piece{tensor: p.Tensor, offset: p.Offset, dst: dst, tensors: 1, sizes: sizeDigest(sizeDigestStart, p.Length)})
			}
			runLast, runEnd, joinable = p.Tensor, p.End(), true
			continue
		}
		joinable = false
		share := (p.Length + uint64(streams) - 1) / uint64(streams)
		share = (share + 4095) &^ 4095
		for off := uint64(0); off < p.Length; off += share {
			end := min(off+share, p.Length)
			var ps []piece
			for o := off; o < end; o += maxChunk {
				e := min(o+maxChunk, end)
				ps = append(ps, piece{tensor: p.Tensor, offset: p.Offset + o, dst: dst[o:e]})
			}
			shares = append(shares, ps)
		}
	}
	small, more := spread(small, streams)
	return small, append(shares, more...), nil
}

// joinRun adds p, landing in dst, to the run last, which ends before
// byte runEnd of tensor runLast, when p follows it both at the source and
// in memory and the run stays within its bounds; it reports whether it
// did. At the source, in a whole fetch pieces are whole tensors in order,
// so each follows the one before (empty ones between take no bytes, and
// the source checks the run's sizes); in a partial fetch only pieces of
// one tensor are known to touch, the metadata having no sizes.
func joinRun(x *transport.Transfer, targets []transport.Tensor, last *piece, p transport.Piece, dst []byte, runLast uint32, runEnd uint64) bool {
	follows := x.Pieces == nil || p.Tensor == runLast && p.Offset == runEnd
	if !follows || len(last.dst)+len(dst) > streamMin || p.Tensor-last.tensor >= maxRunTensors {
		return false
	}
	joined, ok := transport.Join(last.dst, dst)
	if !ok {
		return false
	}
	last.dst = joined
	if x.Pieces == nil { // a run of whole tensors, the empty ones between included
		for j := runLast + 1; j <= p.Tensor; j++ {
			last.sizes = sizeDigest(last.sizes, targets[j].Nbytes)
		}
		last.tensors = p.Tensor - last.tensor + 1
	}
	return true
}

// spreadMin is the average piece from which a run of small pieces is
// spread over the streams: below it a fetch costs per request more than
// per byte, which one pipelined stream batches best (measured: 10,000
// pieces of 105 KiB went from 1.29x to 1.0x one tensor of the same bytes
// when spread, 100,000 of 10 KiB gained nothing).
const spreadMin = 96 << 10

// spread cuts a run of small pieces that together is large and made of
// mid-sized pieces (views of one buffer, the tensors of a state dict) into
// up to `streams` runs of about equal bytes, kept in order, so that it
// moves over as many connections as one large tensor of the same bytes:
// the first run stays the inline one, the others become shares.
func spread(small []piece, streams int) ([]piece, [][]piece) {
	var total uint64
	for _, p := range small {
		total += uint64(len(p.dst))
	}
	k := min(uint64(streams), total/streamMin)
	if k < 2 || total < spreadMin*uint64(len(small)) {
		return small, nil
	}
	per := (total + k - 1) / k
	var runs [][]piece
	start, acc := 0, uint64(0)
	for i, p := range small {
		acc += uint64(len(p.dst))
		if acc >= per && len(runs) < int(k)-1 {
			runs = append(runs, small[start:i+1])
			start, acc = i+1, 0
		}
	}
	if start < len(small) {
		runs = append(runs, small[start:])
	}
	return runs[0], runs[1:]
}

func (r *fetchRequest) spawn(ps []piece) {
	r.run(func() error { return r.pull(ps) })
}

// pull runs pieces on one connection, pooled or new.
func (r *fetchRequest) pull(ps []piece) error {
	c, err := r.takeConn()
	if err != nil {
		return err
	}
	s := &stream{r: r, c: c, pieces: ps}
	err = s.advance(readv(c))
	r.finishConn(c, err)
	return err
}

// takeConn takes a pooled connection or dials one, tracked for abort.
func (r *fetchRequest) takeConn() (net.Conn, error) {
	if r.aborted.Load() {
		return nil, abortedErr()
	}
	c, err := r.cl.conn(r.ctx, r.pool)
	if err != nil {
		if r.aborted.Load() {
			return nil, abortedErr()
		}
		return nil, err
	}
	if !r.track(c) {
		c.Close()
		return nil, abortedErr()
	}
	return c, nil
}

// finishConn pools a connection that ended cleanly and closes one that saw
// any error (its stream position is unknown).
func (r *fetchRequest) finishConn(c net.Conn, err error) {
	r.mu.Lock()
	delete(r.conns, c)
	if err == nil && r.aborted.Load() {
		// abort may have closed it already: never pool a closed conn.
		err = abortedErr()
	}
	r.mu.Unlock()
	if err != nil {
		c.Close()
		if transport.StatusOf(err) == transport.ErrPeerUnavailable {
			r.cl.pool.Drop(r.pool)
		}
		return
	}
	r.cl.pool.Put(r.pool, c)
}

// driveInline advances the inline stream (imu held): within budget when
// budget > 0, else to the end.
func (r *fetchRequest) driveInline(budget time.Duration) {
	s := r.inline
	var err error
	if budget > 0 {
		err = s.advanceInline(budget)
		if err == errBudget {
			return
		}
	} else {
		err = s.advance(readv(s.c))
	}
	r.idone = true
	r.finishConn(s.c, err)
	if err != nil {
		r.fail(err)
	}
}

// Completed reports whether everything arrived. For a small inline pull it
// first waits up to inlineBudget for the answers, on this goroutine: the
// engine then finishes the transfer without a goroutine hand-off.
func (r *fetchRequest) Completed() bool {
	if r.inline != nil {
		if !r.imu.TryLock() {
			return false
		}
		if !r.idone && r.pending.Load() == 0 && r.inline.bytesLeft() <= inlineMax {
			r.driveInline(inlineBudget)
		}
		done := r.idone
		r.imu.Unlock()
		if !done {
			return false
		}
	}
	return r.pending.Load() == 0
}

// Wait finishes the inline stream on this goroutine, waits for the others
// and returns the first error.
func (r *fetchRequest) Wait() error {
	if r.inline != nil {
		r.imu.Lock()
		if !r.idone {
			r.driveInline(0)
		}
		r.imu.Unlock()
	}
	r.wg.Wait()
	r.done()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Release frees the request; after Wait there is nothing left to free, and
// a request released without Wait is aborted and waited for.
func (r *fetchRequest) Release() {
	if !r.Completed() {
		r.abort()
		r.Wait()
	}
	r.done()
}

// done drops what a finished request holds in its transport.
func (r *fetchRequest) done() {
	if r.cancel != nil {
		r.cancel()
	}
	r.cl.mu.Lock()
	delete(r.cl.active, r)
	r.cl.mu.Unlock()
}

// fail records the first error and stops the rest of the request.
func (r *fetchRequest) fail(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
	r.abort()
}

func (r *fetchRequest) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.aborted.Load() {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *fetchRequest) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}

// abort closes the request's connections so that blocked reads return: a
// shutdown first, which also wakes a thread waiting in ppoll (a close alone
// would wait for it).
func (r *fetchRequest) abort() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.aborted.Store(true)
	if r.cancel != nil {
		r.cancel()
	}
	for c := range r.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.CloseRead()
		}
		c.Close()
	}
}

func abortedErr() error { return transport.Errorf(transport.ErrAborted, "transfer aborted") }

// ioError names what a failed read or write on a data connection means.
func (r *fetchRequest) ioError(err error) error {
	if r.aborted.Load() {
		return abortedErr()
	}
	var carrier transport.StatusCarrier
	if errors.As(err, &carrier) {
		return err
	}
	peer := "source"
	if r.dir == transport.Write {
		peer = "owner"
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.EPIPE) {
		return transport.Errorf(transport.ErrPeerUnavailable, "the %s %s went away during the transfer", peer, r.meta.Endpoint)
	}
	return transport.Errorf(transport.ErrPeerUnavailable, "transfer with the %s %s failed: %v", peer, r.meta.Endpoint, err)
}

// Abort stops a transfer in progress; Wait then returns ErrAborted.
func (t *Transport) Abort(x *transport.Transfer, req transport.Request) {
	if r, ok := req.(*fetchRequest); ok {
		r.abort()
	}
}

func (t *Transport) CommunicatorMetadata(x *transport.Transfer) ([]byte, error) { return nil, nil }

// run runs f on a goroutine of the request; its error fails the request.
func (r *fetchRequest) run(f func() error) {
	r.wg.Add(1)
	r.pending.Add(1)
	go func() {
		defer r.wg.Done()
		if err := f(); err != nil {
			r.fail(err)
		}
		r.pending.Add(-1)
	}()
}
