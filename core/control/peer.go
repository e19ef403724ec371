package control

import (
	"context"

	"github.com/rdt-project/rdt/core/transport"
)

// Peer implementation.

func (sc *sconn) Info() transport.PeerInfo {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.remote
}

func (sc *sconn) Refresh(ctx context.Context) (transport.PeerInfo, error) {
	resp, err := sc.call(ctx, &Message{Kind: KindIdentity})
	if err != nil {
		return transport.PeerInfo{}, err
	}
	// The id and the pid were proven at the handshake; they cannot change.
	if old := sc.Info(); resp.Peer.RuntimeID != old.RuntimeID || resp.Peer.Pid != old.Pid {
		return transport.PeerInfo{}, transport.Errorf(transport.ErrCorrupt, "peer %s changed its identity", old)
	}
	sc.mu.Lock()
	sc.remote = resp.Peer
	sc.mu.Unlock()
	return resp.Peer, nil
}

func (sc *sconn) Borrow(ctx context.Context, obj transport.ObjectID, token uint64) error {
	_, err := sc.call(ctx, &Message{Kind: KindBorrow, Object: obj, Token: token})
	return err
}

func (sc *sconn) BorrowAsync(ctx context.Context, obj transport.ObjectID, token uint64, done func(error)) {
	m := &Message{Kind: KindBorrow, Object: obj, Token: token}
	err := sc.start(ctx, m, nil, func(resp *Message) {
		switch {
		case resp == nil:
			done(sc.gone())
		case resp.Status != transport.OK:
			done(&transport.Error{Status: resp.Status, Msg: resp.Text})
		default:
			done(nil)
		}
	})
	if err != nil {
		done(err)
	}
}

// Unborrow waits for room in the outbox while the connection lives: a
// peer that stops reading is closed by the heartbeat, which ends the wait.
func (sc *sconn) Unborrow(obj transport.ObjectID, n uint64) {
	sc.snd.post(context.Background(), &Message{Kind: KindUnborrow, Object: obj, Count: n})
}

func (sc *sconn) Lease(ctx context.Context, obj transport.ObjectID) (uint64, error) {
	resp, err := sc.call(ctx, &Message{Kind: KindLease, Object: obj})
	if err != nil {
		return 0, err
	}
	return resp.Token, nil
}

func (sc *sconn) Metadata(ctx context.Context, obj transport.ObjectID, transportName string) ([]byte, error) {
	resp, err := sc.call(ctx, &Message{Kind: KindMetadata, Object: obj, Transport: transportName})
	if err != nil {
		return nil, err
	}
	return resp.Data, nil
}

func (sc *sconn) Send(ctx context.Context, req SendRequest) error {
	_, err := sc.call(ctx, &Message{Kind: KindSend, Object: req.Object, TransferID: req.TransferID, Transport: req.Transport, Data: req.CMeta, Pieces: req.Pieces})
	return err
}

func (sc *sconn) JoinGroup(ctx context.Context, req GroupJoin) ([]byte, error) {
	resp, err := sc.call(ctx, &Message{Kind: KindGroupJoin, Group: req})
	if err != nil {
		return nil, err
	}
	return resp.Data, nil
}

func (sc *sconn) Done() <-chan struct{} { return sc.done }

func (sc *sconn) OpenWrite(ctx context.Context, req WriteOpen) (Admission, error) {
	m := &Message{Kind: KindWriteOpen, Object: req.Object, TransferID: req.TransferID, Transport: req.Transport,
		WriteKey: req.Key, Token: req.Tag, Pieces: req.Pieces}
	if req.Standing {
		m.Flags = WriteStanding
	}
	// A writer that stops waiting (its deadline, an abort) may have been
	// admitted all the same: the answer still comes, and an admission
	// nobody waits for any more is ended at once (a standing one closed),
	// or the owner would hold it open, its object pinned, until this
	// connection closes.
	resp, err := sc.callOr(ctx, m, func(resp *Message) {
		if resp == nil || resp.Status != transport.OK {
			return
		}
		end := WriteEnd{Object: req.Object, TransferID: req.TransferID, Tag: req.Tag, Close: req.Standing}
		if !req.Standing {
			end.Err = transport.Errorf(transport.ErrAborted, "the writer stopped waiting for the admission; it wrote nothing")
		}
		sc.WriteDone(end)
	})
	if err != nil {
		return Admission{}, err
	}
	return Admission{Meta: resp.Data, Runs: resp.Token}, nil
}

// WriteDone is written at once when the connection is idle, else it waits
// for room in the outbox while the connection lives, like Unborrow.
func (sc *sconn) WriteDone(end WriteEnd) {
	m := &Message{Kind: KindWriteDone, Object: end.Object, TransferID: end.TransferID, Token: end.Tag}
	m.Status, m.Text = statusText(end.Err)
	switch {
	case end.Close:
		m.Flags = WriteClose
	case end.Keep:
		m.Flags = WriteKeep
	}
	sc.snd.postDirect(m)
}

// WriteRun writes the announcement now, with what is queued before it,
// when no write is under way; else it waits under ctx until the writer
// goroutine wrote it (see flush).
func (sc *sconn) WriteRun(ctx context.Context, obj transport.ObjectID, transferID, tag uint64) error {
	return sc.snd.flush(ctx, &Message{Kind: KindWriteRun, Object: obj, TransferID: transferID, Token: tag})
}

// WithdrawWrite waits for room in the outbox while the connection lives,
// like Unborrow.
func (sc *sconn) WithdrawWrite(obj transport.ObjectID, transferID uint64, err error) {
	m := &Message{Kind: KindWriteWithdrawn, Object: obj, TransferID: transferID}
	m.Status, m.Text = statusText(err)
	sc.snd.post(context.Background(), m)
}

// statusText is how an error travels in a one-way message: its status and
// a bounded text (OK and "" for nil).
func statusText(err error) (transport.Status, string) {
	if err == nil {
		return transport.OK, ""
	}
	text := err.Error()
	if len(text) > maxRefusalText {
		text = text[:maxRefusalText]
	}
	return transport.StatusOf(err), text
}
