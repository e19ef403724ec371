package nixl

import "github.com/rdt-project/rdt/core/transport"

// Write registers the sources and posts WRITEs of each (its piece, or its
// tensor whole) into the exposed object's registered memory, as Fetch
// reads (start). The owner handed its metadata to this write alone (it
// admitted it) and does nothing per write: there is no land.go.
func (t *Transport) Write(x *transport.Transfer, sources []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	return t.start(x, sources, tmeta)
}
