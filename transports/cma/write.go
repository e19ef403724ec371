package cma

import "github.com/rdt-project/rdt/core/transport"

// Write checks the metadata against the sources and the owner's guard
// slot, and starts writing into the owner's exposed memory with
// process_vm_writev: the same checks and spans as a fetch (start), the
// other way. The owner does nothing per write: there is no land.go.
func (t *Transport) Write(x *transport.Transfer, sources []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	return t.start(x, sources, tmeta)
}
