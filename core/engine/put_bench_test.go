package engine

import (
	"testing"

	"github.com/rdt-project/rdt/core/transport"
)

// BenchmarkPutManyViews puts 100,000 views of one buffer as one object.
func BenchmarkPutManyViews(b *testing.B) {
	rt := newRuntime(b, "owner")
	const n = 100000
	buf := newHostBuf(b, n*64)
	tensors := make([]transport.Tensor, n)
	for i := range tensors {
		d, _ := transport.NewTensorDesc(transport.Device{Type: transport.DeviceCPU}, f32, []int64{16})
		tensors[i] = transport.Tensor{TensorDesc: d, Data: buf.addr() + uintptr(64*i), Orig: buf.addr() + uintptr(64*i)}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ref, err := rt.Put(tensors, "", nil)
		if err != nil {
			b.Fatal(err)
		}
		ref.Release()
	}
}
