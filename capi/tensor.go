package main

/*
#include "capi.h"
*/
import "C"

import (
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
)

// tensorsFromC reads and validates an rdt_tensor array. Shapes are copied;
// the data pointers are kept as addresses.
func tensorsFromC(p *C.rdt_tensor, n C.size_t, what string) ([]transport.Tensor, error) {
	if n == 0 {
		return nil, nil
	}
	if p == nil {
		return nil, invalid("%s is NULL but the count is %d", what, n)
	}
	if n > transport.MaxTensors {
		return nil, invalid("%d %s is over the limit of %d", n, what, transport.MaxTensors)
	}
	arr := unsafe.Slice(p, int(n))
	out := make([]transport.Tensor, len(arr))
	// Every shape is copied into one block, sized from the counts first.
	dims := 0
	for i := range arr {
		if nd := int(arr[i].ndim); nd > 0 && nd <= transport.MaxNDim {
			dims += nd
		}
	}
	shapes := make([]int64, dims)
	for i := range arr {
		t, err := tensorFromC(&arr[i], &shapes)
		if err != nil {
			return nil, transport.Wrap(err, "%s[%d]", what, i)
		}
		out[i] = t
	}
	return out, nil
}

// tensorFromC reads one rdt_tensor, copying its shape to the front of
// *shapes (then past it).
func tensorFromC(ct *C.rdt_tensor, shapes *[]int64) (transport.Tensor, error) {
	ndim := int(ct.ndim)
	if ndim < 0 || ndim > transport.MaxNDim {
		return transport.Tensor{}, invalid("ndim %d is outside 0..%d", ndim, transport.MaxNDim)
	}
	var shape []int64
	if ndim > 0 {
		if ct.shape == nil {
			return transport.Tensor{}, invalid("shape is NULL for %d dimensions", ndim)
		}
		shape = unsafe.Slice((*int64)(unsafe.Pointer(ct.shape)), ndim)
	}
	if ct.strides != nil && ndim > 0 {
		strides := unsafe.Slice((*int64)(unsafe.Pointer(ct.strides)), ndim)
		if err := transport.CheckContiguous(shape, strides); err != nil {
			return transport.Tensor{}, err
		}
	}
	dev := transport.Device{Type: transport.DeviceType(ct.device.device_type), ID: int32(ct.device.device_id)}
	if dev.Type <= 0 {
		return transport.Tensor{}, invalid("device type %d is not a DLPack device type", dev.Type)
	}
	dt := transport.DType{Code: uint8(ct.dtype.code), Bits: uint8(ct.dtype.bits), Lanes: uint16(ct.dtype.lanes)}
	if len(*shapes) < ndim {
		return transport.Tensor{}, invalid("the tensor array changed during the call")
	}
	own := (*shapes)[:ndim:ndim]
	copy(own, shape)
	*shapes = (*shapes)[ndim:]
	desc, err := transport.DescribeTensor(dev, dt, own)
	if err != nil {
		return transport.Tensor{}, err
	}
	orig := dataAddr(ct)
	if orig == 0 && desc.Nbytes > 0 {
		return transport.Tensor{}, invalid("data is NULL for a tensor of %d bytes", desc.Nbytes)
	}
	return transport.Tensor{TensorDesc: desc, Data: orig + uintptr(ct.byte_offset), Orig: orig}, nil
}

// dataAddr and setDataAddr access a tensor's data address as the integer
// it is to Go: the field is a void *, but its value may be a device address
// or any other bits that Go must never hold as a pointer (see capi.h).
func dataAddr(ct *C.rdt_tensor) uintptr { return *(*uintptr)(unsafe.Pointer(&ct.data)) }

func setDataAddr(ct *C.rdt_tensor, addr uintptr) { *(*uintptr)(unsafe.Pointer(&ct.data)) = addr }

// cTensors is a C-allocated rdt_tensor array (with its shapes) for passing
// tensors to callbacks. Free it with free().
type cTensors struct {
	arr *C.rdt_tensor
	n   C.size_t
}

func newCTensors(ts []transport.Tensor) *cTensors {
	if len(ts) == 0 {
		return &cTensors{}
	}
	dims := 0
	for _, t := range ts {
		dims += len(t.Shape)
	}
	size := C.size_t(len(ts))*C.size_t(unsafe.Sizeof(C.rdt_tensor{})) + C.size_t(dims)*8
	block := C.calloc(1, size)
	if block == nil {
		panic("rdt: out of memory")
	}
	arr := unsafe.Slice((*C.rdt_tensor)(block), len(ts))
	shapes := unsafe.Slice((*C.int64_t)(unsafe.Add(block, len(ts)*int(unsafe.Sizeof(C.rdt_tensor{})))), dims)
	off := 0
	for i, t := range ts {
		ct := &arr[i]
		setDataAddr(ct, t.Data)
		ct.device.device_type = C.int32_t(t.Device.Type)
		ct.device.device_id = C.int32_t(t.Device.ID)
		ct.ndim = C.int32_t(len(t.Shape))
		ct.dtype.code = C.uint8_t(t.DType.Code)
		ct.dtype.bits = C.uint8_t(t.DType.Bits)
		ct.dtype.lanes = C.uint16_t(t.DType.Lanes)
		if len(t.Shape) > 0 {
			ct.shape = &shapes[off]
			for _, d := range t.Shape {
				shapes[off] = C.int64_t(d)
				off++
			}
		}
	}
	return &cTensors{arr: &arr[0], n: C.size_t(len(ts))}
}

func (c *cTensors) free() {
	if c.arr != nil {
		C.free(unsafe.Pointer(c.arr))
		c.arr = nil
	}
}
