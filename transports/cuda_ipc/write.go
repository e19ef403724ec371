package cudaipc

import "github.com/rdt-project/rdt/core/transport"

// Write copies the sources into the exposed object's allocations, opened
// in this process as a fetch opens them to read: the same checks, the same
// cache, the copies the other way (start). Device sources only: a host
// source has no stream to order it (fetch into host memory is the
// supported cross). The owner does nothing per write: there is no land.go.
func (t *Transport) Write(x *transport.Transfer, sources []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	return t.start(x, sources, tmeta)
}

// checkSource checks that a write's source is on a CUDA device this
// transport may use.
func (t *Transport) checkSource(i int, s transport.Tensor) error {
	if s.Device.Type != transport.DeviceCUDA {
		return transport.Errorf(transport.ErrUnsupported, "it writes from CUDA device memory; source %d is on %s", i, s.Device)
	}
	return t.checkDevice("source", i, s.Device)
}
