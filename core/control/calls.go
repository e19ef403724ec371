package control

import (
	"context"
	"errors"
	"sync"

	"github.com/rdt-project/rdt/core/transport"
)

// Our requests to the peer (see conn.go for the rest of a connection):
// each takes one of MaxUnanswered slots and a fresh id, and its answer
// goes to the call or callback registered under that id. pending and
// replies are guarded by sc.mu and nil once the connection closed.

// call sends a request and waits for its response. A call given up
// (ctx ended) keeps its slot until the answer arrives: the slots bound
// the answers in flight, which the peer counts on.
func (sc *sconn) call(ctx context.Context, m *Message) (*Message, error) {
	ch := make(chan *Message, 1)
	if err := sc.start(ctx, m, ch, nil); err != nil {
		return nil, err
	}
	select {
	case resp, ok := <-ch:
		return sc.answer(resp, ok)
	case <-ctx.Done():
		// The answer still comes (its channel has room for it) and
		// frees the slot.
		return nil, sc.givenUp(ctx, m)
	}
}

// callOr is call for a request whose answer matters even once its caller
// stopped waiting (an admission, which must then be ended): late gets the
// answer when it arrives, or nil when the connection ends first.
func (sc *sconn) callOr(ctx context.Context, m *Message, late func(*Message)) (*Message, error) {
	ch := make(chan *Message, 1)
	var mu sync.Mutex
	gaveUp := false
	err := sc.start(ctx, m, nil, func(resp *Message) {
		mu.Lock()
		defer mu.Unlock()
		if gaveUp {
			late(resp)
		} else {
			ch <- resp
		}
	})
	if err != nil {
		return nil, err
	}
	select {
	case resp := <-ch:
		return sc.answer(resp, resp != nil)
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case resp := <-ch: // answered as the wait ended: taken after all
		return sc.answer(resp, resp != nil)
	default:
		gaveUp = true
		return nil, sc.givenUp(ctx, m)
	}
}

// start takes a slot for request m, registers where its answer goes (ch
// for a call, reply for an asynchronous request) and queues it. An error
// means nothing was registered and nothing will answer; after nil exactly
// one answer comes: the peer's, or nil (ch closed) when the connection
// ends first.
func (sc *sconn) start(ctx context.Context, m *Message, ch chan *Message, reply func(*Message)) error {
	if err := sc.snd.acquireSlot(ctx, m.Kind); err != nil {
		return err
	}
	m.ID = sc.nextID.Add(1)
	sc.mu.Lock()
	if sc.pending == nil { // closed
		sc.mu.Unlock()
		sc.snd.releaseSlot()
		return sc.gone()
	}
	if ch != nil {
		sc.pending[m.ID] = ch
	} else {
		sc.replies[m.ID] = reply
	}
	sc.mu.Unlock()
	if err := sc.snd.post(ctx, m); err != nil && sc.forget(m.ID) {
		return err
	}
	// Queued, or the connection closed meanwhile and answered it.
	return nil
}

// forget drops a request that was never sent, and its slot. False: the
// connection closed first and answered it.
func (sc *sconn) forget(id uint64) bool {
	sc.mu.Lock()
	_, isCall := sc.pending[id]
	_, isAsync := sc.replies[id]
	delete(sc.pending, id)
	delete(sc.replies, id)
	sc.mu.Unlock()
	if isCall || isAsync {
		sc.snd.releaseSlot()
		return true
	}
	return false
}

// deliverResponse hands a response to the call or callback waiting for it.
func (sc *sconn) deliverResponse(m *Message) {
	sc.mu.Lock()
	ch, isCall := sc.pending[m.ID]
	delete(sc.pending, m.ID)
	reply, isAsync := sc.replies[m.ID]
	delete(sc.replies, m.ID)
	sc.mu.Unlock()
	if isCall || isAsync {
		sc.snd.releaseSlot()
	}
	if ch != nil {
		ch <- m
	} else if reply != nil {
		reply(m)
	}
}

// answer is a call's outcome: the response, the peer's error, or the
// connection's end (ok false).
func (sc *sconn) answer(resp *Message, ok bool) (*Message, error) {
	if !ok {
		return nil, sc.gone()
	}
	if resp.Status != transport.OK {
		return nil, &transport.Error{Status: resp.Status, Msg: resp.Text}
	}
	return resp, nil
}

// givenUp is the error of a call its caller gave up on when ctx ended; a
// long request is told to stop.
func (sc *sconn) givenUp(ctx context.Context, m *Message) error {
	if m.Kind == KindSend || m.Kind == KindGroupJoin {
		sc.snd.postNow(&Message{Kind: KindCancel, Target: m.ID})
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return transport.Errorf(transport.ErrTimeout, "%s request to %s timed out", m.Kind, sc.Info())
	}
	return transport.Errorf(transport.ErrAborted, "%s request to %s was cancelled", m.Kind, sc.Info())
}
