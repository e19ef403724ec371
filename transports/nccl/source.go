package nccl

import (
	"fmt"

	"github.com/rdt-project/rdt/core/transport"
)

// ExtractMetadata checks that the tensors are device memory; NCCL needs
// nothing from the source beforehand.
func (t *Transport) ExtractMetadata(obj transport.ObjectID, tensors []transport.Tensor) ([]byte, error) {
	for i, x := range tensors {
		if x.Device.Type != transport.DeviceCUDA {
			return nil, transport.Errorf(transport.ErrUnsupported, "it moves CUDA device memory; tensor %d is on %s", i, x.Device)
		}
	}
	return nil, nil
}

func (t *Transport) GarbageCollect(transport.ObjectID, []transport.Tensor, []byte) {}

// Send runs on the source: ncclSend of every tensor, or in a partial fetch
// of every piece, to the destination rank.
func (t *Transport) Send(x *transport.Transfer, tensors []transport.Tensor, _, cm []byte) error {
	o := t.register(x.TransferID)
	defer t.unregister(x.TransferID)
	m, err := decodeCMeta(cm)
	if err != nil {
		return err
	}
	g, err := t.lookup(m)
	if err != nil {
		return err
	}
	what := fmt.Sprintf("the send of object %s to rank %d", x.Object, m.Dst)
	if m.Src != g.rank || g.roster.Members[m.Dst].Runtime != x.Destination.RuntimeID {
		err := transport.Errorf(transport.ErrInvalidArgument, "the transfer names ranks %d→%d of group %q, but this runtime is rank %d and the destination is rank %d",
			m.Src, m.Dst, m.Group, g.rank, g.roster.RankOf(x.Destination.RuntimeID))
		g.destroy(transport.Wrap(err, "%s", what), true)
		return g.deadErr()
	}
	bufs, err := g.sendBuffers(x, tensors)
	if err != nil {
		g.destroy(transport.Wrap(err, "%s", what), true)
		return g.deadErr()
	}
	return g.run(o, true, m.Dst, m.Seq, bufs, what)
}

// sendBuffers is what Send sends: the tensors whole, or the destination's
// pieces in its order, so that its receives (one per target, in order)
// match them one for one. Empty ones are skipped on both sides alike (see
// Comm.P2P). Only the tensors sent from need be on the group's device.
func (g *group) sendBuffers(x *transport.Transfer, tensors []transport.Tensor) ([]Buffer, error) {
	if x.Pieces == nil {
		return g.buffers(tensors, "tensor")
	}
	bufs := make([]Buffer, len(x.Pieces))
	for i, p := range x.Pieces {
		// The engine checked the pieces against the put tensors; a caller
		// that did not must not make NCCL read outside them.
		if int64(p.Tensor) >= int64(len(tensors)) || !p.Within(tensors[p.Tensor].Nbytes) {
			return nil, transport.Errorf(transport.ErrInvalidArgument, "piece %d asks for bytes [%d, +%d) of tensor %d, which the object of %d tensors does not have",
				i, p.Offset, p.Length, p.Tensor, len(tensors))
		}
		src := tensors[p.Tensor]
		if err := g.onDevice(src, "tensor", int(p.Tensor)); err != nil {
			return nil, err
		}
		bufs[i] = Buffer{Ptr: src.Data + uintptr(p.Offset), Nbytes: p.Length}
	}
	return bufs, nil
}
