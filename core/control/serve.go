package control

import (
	"context"

	"github.com/rdt-project/rdt/core/transport"
)

// The peer's requests to us (see conn.go for the rest of a connection):
// the reader dispatches each, answering the short ones itself and serving
// the long ones on goroutines of their own, bounded per connection.

const (
	// MaxHandlers bounds the requests of one connection served on their
	// own goroutines (metadata, sends, group joins). Past it requests wait
	// in a queue of at most maxQueued requests (maxQueuedBytes of payload)
	// and are refused with NO_MEMORY beyond that: the connection's reader
	// never waits for a handler, so heartbeats, cancels and answers to our
	// own requests keep flowing while a peer keeps us busy.
	MaxHandlers    = 256
	maxQueued      = 4096
	maxQueuedBytes = 16 << 20
)

// dispatchProtected is dispatch; a panic in the handler of a request is
// answered as an internal error and the connection lives on (a peer must
// not be able to end this process, nor a bug leave a caller waiting).
func (sc *sconn) dispatchProtected(m *Message) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			err := transport.Panicked(sc.ep.cfg.Log, "handling a "+m.Kind.String()+" message of "+sc.remote.String(), r)
			if m.ID != 0 && m.Kind != KindResponse {
				sc.snd.answerInline(response(m.ID, nil, err))
			}
			ok = true
		}
	}()
	return sc.dispatch(m)
}

// dispatch handles one message: answers a request (the long ones on their
// own goroutines) or delivers a response. An unexpected kind closes the
// connection and reports false.
func (sc *sconn) dispatch(m *Message) bool {
	svc := sc.ep.cfg.Service
	from := sc.Info()
	switch m.Kind {
	case KindResponse:
		sc.deliverResponse(m)
	case KindPing:
		sc.peerReports(m.Count)
		sc.snd.postUrgent(&sc.ponging, KindPong)
	case KindPong:
		sc.peerReports(m.Count)
	case KindIdentity:
		sc.snd.answerInline(response(m.ID, &Message{Peer: sc.ep.identity(sc.isTCP)}, nil))
	case KindBorrow:
		sc.snd.answerInline(response(m.ID, nil, svc.Borrow(from, m.Object, m.Token)))
	case KindUnborrow:
		svc.Unborrow(from.RuntimeID, m.Object, m.Count)
	case KindLease:
		token, err := svc.Lease(from.RuntimeID, m.Object)
		sc.snd.answerInline(response(m.ID, &Message{Token: token}, err))
	case KindMetadata:
		sc.serve(m, func() {
			data, err := svc.Metadata(from.RuntimeID, m.Object, m.Transport)
			sc.answerLater(m.ID, &Message{Data: data}, err)
		})
	case KindSend:
		sc.serveCancellable(m, func(ctx context.Context) (*Message, error) {
			return nil, svc.Send(ctx, from, SendRequest{Object: m.Object, TransferID: m.TransferID, Transport: m.Transport, CMeta: m.Data, Pieces: m.Pieces})
		})
	case KindGroupJoin:
		// Rank 0 answers once every rank joined: a long wait.
		sc.serveCancellable(m, func(ctx context.Context) (*Message, error) {
			data, err := svc.JoinGroup(ctx, from, m.Group)
			return &Message{Data: data}, err
		})
	case KindWriteOpen:
		adm, err := svc.OpenWrite(from, WriteOpen{Object: m.Object, TransferID: m.TransferID,
			Transport: m.Transport, Key: m.WriteKey, Tag: m.Token, Pieces: m.Pieces, Standing: m.Flags&WriteStanding != 0})
		sc.snd.answerInline(response(m.ID, &Message{Data: adm.Meta, Token: adm.Runs}, err))
	case KindWriteDone:
		svc.WriteDone(from.RuntimeID, WriteEnd{Object: m.Object, TransferID: m.TransferID, Err: peerError(m, "the writer reported: "),
			Tag: m.Token, Keep: m.Flags&WriteKeep != 0, Close: m.Flags&WriteClose != 0})
	case KindWriteRun:
		svc.WriteRun(from.RuntimeID, m.Object, m.TransferID, m.Token)
	case KindWriteWithdrawn:
		svc.WriteWithdrawn(from.RuntimeID, m.Object, m.TransferID, peerError(m, "the owner withdrew the admission: "))
	case KindClosing:
		sc.closeClean(transport.Errorf(transport.ErrPeerUnavailable, "runtime %s shut down", sc.remote))
		return false
	case KindCancel:
		sc.mu.Lock()
		cancel := sc.handlers[m.Target]
		sc.mu.Unlock()
		if cancel != nil {
			cancel()
		}
	default:
		sc.ep.cfg.Log.Warnf("control plane: peer %s sent an unexpected %s Message, closing the connection", sc.remote, m.Kind)
		sc.close(transport.Errorf(transport.ErrCorrupt, "unexpected %s message", m.Kind))
		return false
	}
	return true
}

// serve runs a request's handler on its own goroutine, or queues it while
// MaxHandlers run (see there). It never blocks the reader.
func (sc *sconn) serve(m *Message, run func()) {
	run = sc.protect(m, run)
	size := len(m.Data) + 64
	sc.mu.Lock()
	switch {
	case sc.running < MaxHandlers:
		sc.running++
		sc.mu.Unlock()
		go sc.handle(run)
	case len(sc.queued) < maxQueued && sc.queuedBytes+size <= maxQueuedBytes:
		sc.queued = append(sc.queued, queuedRequest{run, size})
		sc.queuedBytes += size
		sc.mu.Unlock()
	default:
		waiting := len(sc.queued)
		sc.mu.Unlock()
		sc.snd.answerInline(response(m.ID, nil, transport.Errorf(transport.ErrNoMemory, "%d requests are in progress and %d wait on this connection; %s refused", MaxHandlers, waiting, m.Kind)))
	}
}

// serveCancellable answers a long request on its own goroutine under a
// context the peer's KindCancel (or the connection's end) cancels.
func (sc *sconn) serveCancellable(m *Message, run func(ctx context.Context) (*Message, error)) {
	ctx, cancel := context.WithCancel(sc.ctx)
	sc.mu.Lock()
	sc.handlers[m.ID] = cancel
	sc.mu.Unlock()
	sc.serve(m, func() {
		var resp *Message
		var err error
		func() {
			defer func() { // also when run panics
				sc.mu.Lock()
				delete(sc.handlers, m.ID)
				sc.mu.Unlock()
				cancel()
			}()
			resp, err = run(ctx)
		}()
		sc.answerLater(m.ID, resp, err)
	})
}

// queuedRequest is a request waiting for a handler goroutine.
type queuedRequest struct {
	run  func()
	size int
}

// handle runs handlers, the given one and then queued ones, until none
// waits.
func (sc *sconn) handle(run func()) {
	for run != nil {
		run()
		run = nil
		sc.mu.Lock()
		if len(sc.queued) > 0 && !sc.isClosed() {
			next := sc.queued[0]
			sc.queued[0] = queuedRequest{}
			sc.queued = sc.queued[1:]
			sc.queuedBytes -= next.size
			run = next.run
		} else {
			sc.running--
			sc.queued, sc.queuedBytes = nil, 0
		}
		sc.mu.Unlock()
	}
}

// protect wraps the handler of request m run on a goroutine of its own: a
// panic in it is answered as an internal error.
func (sc *sconn) protect(m *Message, run func()) func() {
	return func() {
		defer func() {
			if r := recover(); r != nil {
				sc.answerLater(m.ID, nil, transport.Panicked(sc.ep.cfg.Log, "answering a "+m.Kind.String()+" request of "+sc.remote.String(), r))
			}
		}()
		run()
	}
}

// response is the answer to request id: resp (nil: an empty one) or err.
func response(id uint64, resp *Message, err error) *Message {
	if resp == nil {
		resp = &Message{}
	}
	resp.Kind, resp.ID = KindResponse, id
	if err != nil {
		resp.Status = transport.StatusOf(err)
		if resp.Status == transport.OK {
			resp.Status = transport.ErrInternal
		}
		resp.Text = err.Error()
		if len(resp.Text) > maxMessageText {
			resp.Text = resp.Text[:maxMessageText]
		}
	}
	return resp
}

// answerLater queues a handler goroutine's answer, waiting for room while
// the connection lives.
func (sc *sconn) answerLater(id uint64, resp *Message, err error) {
	sc.snd.post(sc.ctx, response(id, resp, err))
}

// peerError is the error a one-way message reports (nil for OK): a peer's
// status other than an error's is never taken for success.
func peerError(m *Message, prefix string) error {
	if m.Status == transport.OK {
		return nil
	}
	status := m.Status
	if status > 0 {
		status = transport.ErrTransport
	}
	return &transport.Error{Status: status, Msg: prefix + m.Text}
}
