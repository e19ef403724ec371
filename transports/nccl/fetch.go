package nccl

import (
	"fmt"

	"github.com/rdt-project/rdt/core/transport"
)

// CommunicatorMetadata runs on the destination: which group, which ranks,
// and the transfer's place in the order from that source.
func (t *Transport) CommunicatorMetadata(x *transport.Transfer) ([]byte, error) {
	g, src, err := t.groupWith(x.Source.RuntimeID)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	seq := g.recvAssign[src]
	g.recvAssign[src] = seq + 1
	g.mu.Unlock()
	m := cmeta{Group: g.name, Instance: g.roster.Instance, Src: src, Dst: g.rank, Seq: seq}
	return m.encode(), nil
}

// request is a destination's receive in progress.
type request struct {
	*transport.Completion
	o *op
}

// Fetch runs on the destination: ncclRecv into every target from the
// source rank, on its own goroutine. In a partial fetch target i receives
// piece i, which the source sends in the same place of its order (the
// metadata carries no sizes: the engine checked the pieces against the
// ref, and each target must be as long as its piece).
func (t *Transport) Fetch(x *transport.Transfer, targets []transport.Tensor, _, cm []byte) (transport.Request, error) {
	m, err := decodeCMeta(cm)
	if err != nil {
		return nil, err
	}
	g, err := t.lookup(m)
	if err != nil {
		return nil, err
	}
	what := fmt.Sprintf("the receive of object %s from rank %d", x.Object, m.Src)
	bufs, err := g.buffers(targets, "target")
	if err == nil {
		err = matchPieces(x, targets)
	}
	if err != nil {
		g.destroy(transport.Wrap(err, "%s", what), true)
		return nil, g.deadErr()
	}
	r := &request{Completion: transport.NewCompletion(), o: t.register(x.TransferID)}
	go func() {
		defer t.unregister(x.TransferID)
		r.Finish(g.run(r.o, false, m.Src, m.Seq, bufs, what))
	}()
	return r, nil
}

// matchPieces checks that target i is as long as piece i of a partial
// fetch: a receive of another length would not match the source's send.
func matchPieces(x *transport.Transfer, targets []transport.Tensor) error {
	if x.Pieces == nil {
		return nil
	}
	if len(x.Pieces) != len(targets) {
		return transport.Errorf(transport.ErrInvalidArgument, "%d pieces for %d targets", len(x.Pieces), len(targets))
	}
	for i, p := range x.Pieces {
		if p.Length != targets[i].Nbytes {
			return transport.Errorf(transport.ErrInvalidArgument, "target %d holds %d bytes for a piece of %d", i, targets[i].Nbytes, p.Length)
		}
	}
	return nil
}

// Abort stops a transfer; one that had started destroys its group.
func (t *Transport) Abort(x *transport.Transfer, req transport.Request) {
	if r, ok := req.(*request); ok {
		r.o.stop()
		return
	}
	t.mu.Lock()
	o := t.ops[x.TransferID]
	if o == nil && len(t.aborted) < 4096 {
		t.aborted[x.TransferID] = struct{}{}
	}
	t.mu.Unlock()
	if o != nil {
		o.stop()
	}
}
