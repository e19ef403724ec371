package multiprocess

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/rdt-project/rdt/core/transport"
)

// streamTransport is a two-sided transport for the tests: the destination
// listens on a Unix socket named in the communicator metadata, and the
// source runtime's Send connects and writes the tensors. It proves the
// two-sided orchestration over the control plane between processes.
type streamTransport struct {
	dir string
	mu  sync.Mutex
	lns map[uint64]net.Listener
}

func twoSidedFactory() transport.TransportFactory {
	return transport.TransportFactory{Name: "stream2", New: func(h transport.Host) (transport.Transport, error) {
		return &streamTransport{dir: h.SocketDir(), lns: map[uint64]net.Listener{}}, nil
	}}
}

func (s *streamTransport) Describe() transport.Descriptor {
	return transport.Descriptor{Name: "stream2", Devices: []transport.DeviceType{transport.DeviceCPU}, CanAbort: true}
}
func (s *streamTransport) Close() error { return nil }
func (s *streamTransport) ExtractMetadata(transport.ObjectID, []transport.Tensor) ([]byte, error) {
	return nil, nil
}
func (s *streamTransport) GarbageCollect(transport.ObjectID, []transport.Tensor, []byte) {}

// CommunicatorMetadata runs on the destination: open the socket the source
// will write to.
func (s *streamTransport) CommunicatorMetadata(x *transport.Transfer) ([]byte, error) {
	path := filepath.Join(s.dir, "s2-"+x.Object.String()[:8]+"-"+itoa(x.TransferID)+".sock")
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, transport.Errorf(transport.ErrTransport, "stream2: %v", err)
	}
	s.mu.Lock()
	s.lns[x.TransferID] = ln
	s.mu.Unlock()
	return []byte(path), nil
}

func itoa(v uint64) string {
	const digits = "0123456789abcdef"
	var b [16]byte
	for i := 15; i >= 0; i-- {
		b[i] = digits[v&15]
		v >>= 4
	}
	return string(b[:])
}

func (s *streamTransport) Send(x *transport.Transfer, tensors []transport.Tensor, _, cmeta []byte) error {
	c, err := net.Dial("unix", string(cmeta))
	if err != nil {
		return transport.Errorf(transport.ErrTransport, "stream2: %v", err)
	}
	defer c.Close()
	for _, t := range tensors {
		if _, err := c.Write(transport.Bytes(t.Data, t.Nbytes)); err != nil {
			return transport.Errorf(transport.ErrTransport, "stream2: %v", err)
		}
	}
	return nil
}

type streamRequest struct {
	done chan error
}

func (r *streamRequest) Wait() error { return <-r.done }
func (r *streamRequest) Release()    {}

func (s *streamTransport) Fetch(x *transport.Transfer, targets []transport.Tensor, _, _ []byte) (transport.Request, error) {
	s.mu.Lock()
	ln := s.lns[x.TransferID]
	s.mu.Unlock()
	if ln == nil {
		return nil, transport.Errorf(transport.ErrInternal, "stream2: no listener for transfer %d", x.TransferID)
	}
	r := &streamRequest{done: make(chan error, 1)}
	go func() {
		defer s.forget(x.TransferID)
		c, err := ln.Accept()
		if err != nil {
			r.done <- transport.Errorf(transport.ErrAborted, "stream2: %v", err)
			return
		}
		defer c.Close()
		for _, t := range targets {
			if _, err := io.ReadFull(c, transport.Bytes(t.Data, t.Nbytes)); err != nil {
				r.done <- transport.Errorf(transport.ErrTransport, "stream2: %v", err)
				return
			}
		}
		r.done <- nil
	}()
	return r, nil
}

func (s *streamTransport) forget(id uint64) {
	s.mu.Lock()
	ln := s.lns[id]
	delete(s.lns, id)
	s.mu.Unlock()
	if ln != nil {
		ln.Close()
		os.Remove(ln.Addr().String())
	}
}

func (s *streamTransport) Abort(x *transport.Transfer, _ transport.Request) {
	if x.Role == transport.RoleDestination {
		s.forget(x.TransferID)
	}
}
