package engine

import (
	"context"
	"strings"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// routes are how a runtime reaches other runtimes' objects: its endpoint
// to connect to their owners, its transports, its store (the borrows it
// holds, with the metadata owners gave) and who it is.
type routes struct {
	ep    control.Endpoint
	reg   *Registry
	store *store
	me    *identity
}

// A route is one ref's way to its object's bytes in one direction,
// resolved once: the owner's connection, the transport, the transfer
// template and the metadata to start it with (a read's from the ref, a
// cache or the owner; a write's from the owner's admission). A fetch, a
// write and a view each resolve theirs the same way (resolve); a fetch or
// a write then starts it (start) and ends it (account); a Prepared keeps
// its first run's routes and starts them again.
type route struct {
	peer  control.Peer
	entry *registered
	x     transport.Transfer // the template: each start takes its own TransferID
	tmeta []byte
	cmeta []byte
	// admitted: the owner admitted a write over this route and is owed its
	// outcome (set even when resolve fails after the admission).
	admitted bool
	// runs: those a standing admission covers (0: an admission of its own).
	runs uint64
}

// routeQuery is what resolve asks the owner for: a direction, an object,
// and whatever waits on the owner are bounded by.
type routeQuery struct {
	dir    transport.Direction
	maps   bool // a view: the transport must map, and nothing is started
	desc   *ObjectDesc
	peer   control.Peer
	pieces []transport.Piece
	// wait bounds each question to the owner.
	wait func() context.Context
	// checks runs once the transport is known, before the owner is asked
	// anything (a fetch's borrow and landing plan); nil: none.
	checks func(e *registered) error
	// tag is a write's, handed to the owner with the admission.
	tag uint64
	// standing asks for a standing admission (a plain write keeps it for
	// the writes after it).
	standing bool
}

// resolve finds the route over transport name: the transport serves the
// direction (and the ranges, and maps for a view), the owner offers it and
// is on this host where it must be, and the metadata is at hand (asked of
// the owner for a read, given with its admission for a write).
func (rs *routes) resolve(q *routeQuery, name string) (*route, error) {
	e, err := rs.reg.lookup(name)
	if err != nil {
		return nil, err
	}
	if err := e.serves(q); err != nil {
		return nil, err
	}
	if q.checks != nil {
		if err := q.checks(e); err != nil {
			return nil, err
		}
	}
	peerInfo, err := peerOffering(q.wait, q.peer, name)
	if err != nil {
		return nil, err
	}
	self := rs.me.info()
	if e.desc.SameHostOnly && !self.SameHost(peerInfo) {
		return nil, transport.Errorf(transport.ErrUnsupported, "transport %s works only between processes on the same host; %q is on another host", name, peerInfo.Name)
	}
	r := &route{peer: q.peer, entry: e, x: template(q, name, self, peerInfo)}
	if q.dir == transport.Read {
		if r.tmeta, err = rs.remoteMeta(q.wait, q.peer, q.desc, name); err != nil {
			return nil, transportError(name, transport.Wrap(err, "asking the owner for metadata"))
		}
		if q.maps {
			return r, nil
		}
	}
	if r.cmeta, err = e.t.CommunicatorMetadata(&r.x); err != nil {
		return nil, transportError(name, transport.Wrap(err, "communicator metadata"))
	}
	if q.dir == transport.Write {
		return r, r.admit(q)
	}
	return r, nil
}

// template is the Transfer of a route: this runtime receives a read and
// sends a write; the owner is the other side.
func template(q *routeQuery, name string, self, owner transport.PeerInfo) transport.Transfer {
	x := transport.Transfer{Object: q.desc.ID, TransferID: transport.RandomUint64(), Transport: name,
		Direction: q.dir, Pieces: q.pieces}
	if q.dir == transport.Write {
		x.Role, x.Source, x.Destination = transport.RoleSource, self, owner
	} else {
		x.Role, x.Source, x.Destination = transport.RoleDestination, owner, self
	}
	return x
}

// admit has the owner admit a write over the route. The owner answers
// with the object's metadata: where an exposed object lies goes only to
// holders of its key.
func (r *route) admit(q *routeQuery) error {
	ctx := q.wait()
	if ctx.Err() != nil {
		return transport.ContextError(ctx, "asking the owner to admit the write")
	}
	open := control.WriteOpen{Object: q.desc.ID, TransferID: r.x.TransferID, Transport: r.x.Transport,
		Key: q.desc.WriteKey, Tag: q.tag, Pieces: q.pieces, Standing: q.standing}
	adm, err := q.peer.OpenWrite(ctx, open)
	if err != nil {
		return transport.Wrap(err, "owner %s refused the write", q.desc.Owner.Address)
	}
	r.admitted, r.tmeta = true, adm.Meta
	if q.standing {
		r.runs = max(adm.Runs, 1)
	}
	return nil
}

// serves refuses a transport that cannot take the route q asks for.
func (e *registered) serves(q *routeQuery) error {
	name := e.desc.Name
	switch {
	case q.maps:
		if _, ok := e.t.(transport.Viewer); !ok {
			return transport.Errorf(transport.ErrUnsupported, "transport %s cannot map an object (views need one that can, such as shm)", name)
		}
	case q.dir == transport.Write && e.writer == nil:
		return transport.Errorf(transport.ErrUnsupported, "transport %s cannot write into another runtime's memory", name)
	}
	if q.pieces != nil && !e.desc.Ranges {
		if q.dir == transport.Write {
			return transport.Errorf(transport.ErrUnsupported, "transport %s cannot write byte ranges or a subset of an object's tensors", name)
		}
		return transport.Errorf(transport.ErrUnsupported, "transport %s cannot serve a partial fetch (a byte range or a subset of an object's tensors)", name)
	}
	return nil
}

// start starts the transport's half of one transfer over the route: x is
// the template with its own TransferID, local what this runtime receives
// into (a read) or sends from (a write).
func (r *route) start(x *transport.Transfer, local []transport.Tensor) (transport.Request, error) {
	if x.Direction == transport.Write {
		return r.entry.writer.Write(x, local, r.tmeta, r.cmeta)
	}
	return r.entry.t.Fetch(x, local, r.tmeta, r.cmeta)
}

// connectOwner connects to the owner of the object desc describes and
// checks that the runtime there still is that owner.
func (rs *routes) connectOwner(ctx context.Context, desc *ObjectDesc) (control.Peer, error) {
	peer, err := rs.ep.Connect(ctx, desc.Owner.Address)
	if err != nil {
		return nil, transport.Wrap(err, "the owner%s", ownerUnlessNamed(" ", desc, err))
	}
	if peer.Info().RuntimeID != desc.Owner.RuntimeID {
		return nil, transport.Errorf(transport.ErrPeerUnavailable, "the runtime at %s is no longer the owner of object %s", desc.Owner.Address, desc.ID)
	}
	return peer, nil
}

// peerOffering is the owner's identity, asked again under ctx() when it
// does not advertise transport name (it may have registered it since we
// connected); an owner without it is ErrUnsupported.
func peerOffering(ctx func() context.Context, peer control.Peer, name string) (transport.PeerInfo, error) {
	peerInfo := peer.Info()
	if _, ok := peerInfo.Advert(name); ok {
		return peerInfo, nil
	}
	wctx := ctx()
	if wctx.Err() != nil {
		return peerInfo, transport.ContextError(wctx, "asking %s for its transports", peerInfo)
	}
	peerInfo, err := peer.Refresh(wctx)
	if err != nil {
		return peerInfo, err
	}
	if _, ok := peerInfo.Advert(name); !ok {
		have := make([]string, len(peerInfo.Transports))
		for i, a := range peerInfo.Transports {
			have[i] = a.Name
		}
		return peerInfo, transport.Errorf(transport.ErrUnsupported, "transport %s: the source runtime %s has no transport of that name (it has: %s)", name, peerInfo, strings.Join(have, ", "))
	}
	return peerInfo, nil
}

// remoteMeta is the transport metadata of a borrowed object: from the ref,
// from our cache, or asked of the owner (which extracts it on demand) under
// ctx().
func (rs *routes) remoteMeta(ctx func() context.Context, peer control.Peer, desc *ObjectDesc, name string) ([]byte, error) {
	if m, ok := desc.Meta[name]; ok {
		return m, nil
	}
	if m, ok := rs.store.cachedMeta(desc.ID, name); ok {
		return m, nil
	}
	wctx := ctx()
	if wctx.Err() != nil {
		return nil, transport.ContextError(wctx, "asking the owner")
	}
	m, err := peer.Metadata(wctx, desc.ID, name)
	if err != nil {
		return nil, err
	}
	rs.store.cacheMeta(desc.ID, name, m)
	return m, nil
}

// autoCandidates orders the registered transports for an object put
// without one, from their descriptors (see transport.AutoRank): host data
// when every tensor is host-accessible, else CUDA data when a tensor is in
// CUDA memory; same-host-only transports only for a peer on this host. A
// write's are those of them that write.
func (rs *routes) autoCandidates(dir transport.Direction, desc *ObjectDesc, peer transport.PeerInfo) []string {
	host, cuda := true, false
	for _, t := range desc.Tensors {
		host = host && t.Device.Type.HostAccessible()
		cuda = cuda || t.Device.Type == transport.DeviceCUDA
	}
	if !host && !cuda {
		return nil
	}
	names := rs.reg.autoOrder(!host, rs.me.info().SameHost(peer))
	if dir == transport.Read {
		return names
	}
	var out []string
	for _, name := range names {
		if e, err := rs.reg.lookup(name); err == nil && e.writer != nil {
			out = append(out, name)
		}
	}
	return out
}
