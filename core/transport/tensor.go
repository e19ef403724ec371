package transport

import (
	"fmt"
	"math/bits"
	"unsafe"
)

// DeviceType is a DLPack device type code (RDT_DEVICE_* in rdt.h).
type DeviceType int32

const (
	DeviceCPU         DeviceType = 1
	DeviceCUDA        DeviceType = 2
	DeviceCUDAHost    DeviceType = 3
	DeviceROCM        DeviceType = 10
	DeviceCUDAManaged DeviceType = 13
)

var deviceNames = map[DeviceType]string{
	DeviceCPU: "cpu", DeviceCUDA: "cuda", DeviceCUDAHost: "cuda_host",
	DeviceROCM: "rocm", DeviceCUDAManaged: "cuda_managed",
}

func (d DeviceType) String() string {
	if n, ok := deviceNames[d]; ok {
		return n
	}
	return fmt.Sprintf("device_type(%d)", int32(d))
}

// HostAccessible reports whether the CPU can read memory of this type
// directly (so a plain memory copy or process_vm_readv works).
func (d DeviceType) HostAccessible() bool {
	return d == DeviceCPU || d == DeviceCUDAHost || d == DeviceCUDAManaged
}

// Device is a DLPack device: a type and an index.
type Device struct {
	Type DeviceType
	ID   int32
}

func (d Device) String() string { return fmt.Sprintf("%s:%d", d.Type, d.ID) }

// DType is a DLPack data type.
type DType struct {
	Code  uint8
	Bits  uint8
	Lanes uint16
}

func (t DType) String() string {
	names := map[uint8]string{0: "int", 1: "uint", 2: "float", 3: "handle", 4: "bfloat", 5: "complex", 6: "bool"}
	n, ok := names[t.Code]
	if !ok {
		n = fmt.Sprintf("code%d_", t.Code)
	}
	s := fmt.Sprintf("%s%d", n, t.Bits)
	if t.Lanes != 1 {
		s += fmt.Sprintf("x%d", t.Lanes)
	}
	return s
}

// Limits on what a tensor description may hold. MaxTensors bounds one
// object: its ref takes some 21 bytes a tensor and a transport's metadata
// some 16, so that an object at the limit still fits MaxRefSize and
// MaxMetadataBytes. Counts read from outside are bounded further by the
// bytes that carry them (WireReader.Count), never trusted to allocate.
const (
	MaxNDim       = 64
	MaxTensors    = 1 << 20
	maxTensorSize = uint64(1) << 56 // 64 PiB: beyond any real tensor, far from overflow
)

// TensorDesc describes a tensor without pointing at its memory: what a ref
// carries and what a target must match.
type TensorDesc struct {
	Device Device
	DType  DType
	Shape  []int64
	Nbytes uint64
}

// Tensor is a contiguous tensor in memory: its description and the address
// of its first byte (Data + byte offset already applied).
type Tensor struct {
	TensorDesc
	Data uintptr
	// Orig is the data pointer exactly as the application gave it, used to
	// match rdt_wait_tensor_freed.
	Orig uintptr
}

// numBytes computes prod(shape) * ceil(bits*lanes/8), refusing overflow.
func numBytes(shape []int64, dt DType) (uint64, error) {
	if dt.Bits == 0 || dt.Lanes == 0 {
		return 0, Errorf(ErrInvalidArgument, "dtype %s: bits and lanes must be positive", dt)
	}
	elem := (uint64(dt.Bits)*uint64(dt.Lanes) + 7) / 8
	n := uint64(1)
	for i, d := range shape {
		if d < 0 {
			return 0, Errorf(ErrInvalidArgument, "shape[%d] = %d is negative", i, d)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > maxTensorSize {
			return 0, Errorf(ErrInvalidArgument, "shape %v is too large", shape)
		}
		n = lo
	}
	hi, lo := bits.Mul64(n, elem)
	if hi != 0 || lo > maxTensorSize {
		return 0, Errorf(ErrInvalidArgument, "shape %v of %s is too large", shape, dt)
	}
	return lo, nil
}

// NewTensorDesc validates a shape and dtype and computes the size. The
// shape is copied.
func NewTensorDesc(dev Device, dt DType, shape []int64) (TensorDesc, error) {
	return DescribeTensor(dev, dt, append([]int64(nil), shape...))
}

// DescribeTensor is NewTensorDesc keeping shape itself, for callers that
// copied many shapes into one block (a million tensors, a million fewer
// allocations).
func DescribeTensor(dev Device, dt DType, shape []int64) (TensorDesc, error) {
	if len(shape) > MaxNDim {
		return TensorDesc{}, Errorf(ErrInvalidArgument, "ndim %d exceeds the limit of %d", len(shape), MaxNDim)
	}
	n, err := numBytes(shape, dt)
	if err != nil {
		return TensorDesc{}, err
	}
	return TensorDesc{Device: dev, DType: dt, Shape: shape, Nbytes: n}, nil
}

// CheckContiguous accepts nil strides or the compact row-major strides of
// shape (in elements). Dimensions of size 1 may carry any stride, as DLPack
// producers such as PyTorch emit them so.
func CheckContiguous(shape, strides []int64) error {
	if strides == nil {
		return nil
	}
	if len(strides) != len(shape) {
		return Errorf(ErrInvalidArgument, "strides has %d entries for %d dimensions", len(strides), len(shape))
	}
	expect := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		if shape[i] == 0 {
			return nil // empty tensors have no layout to get wrong
		}
		if shape[i] != 1 && strides[i] != expect {
			return Errorf(ErrInvalidArgument, "strides %v are not contiguous for shape %v: only compact row-major tensors are supported", strides, shape)
		}
		expect *= shape[i]
	}
	return nil
}

// Matches checks that target can receive src: same shape and dtype, and a
// device type that src's bytes can land in (see CanLand; the device index
// may differ).
func (src TensorDesc) Matches(target TensorDesc) error {
	if err := CanLand(src.Device.Type, target.Device); err != nil {
		return err
	}
	if src.DType != target.DType {
		return Errorf(ErrInvalidArgument, "dtype %s does not match the source dtype %s", target.DType, src.DType)
	}
	if len(src.Shape) != len(target.Shape) {
		return Errorf(ErrInvalidArgument, "shape %v does not match the source shape %v", target.Shape, src.Shape)
	}
	for i := range src.Shape {
		if src.Shape[i] != target.Shape[i] {
			return Errorf(ErrInvalidArgument, "shape %v does not match the source shape %v", target.Shape, src.Shape)
		}
	}
	return nil
}

// CanLand checks that bytes of src memory may be received into target
// memory: the same device type, or any two of host-accessible and CUDA
// memory.
func CanLand(src DeviceType, target Device) error {
	if src == target.Type {
		return nil
	}
	if (src == DeviceCUDA || src.HostAccessible()) && (target.Type == DeviceCUDA || target.Type.HostAccessible()) {
		return nil
	}
	return Errorf(ErrInvalidArgument, "device %s does not match the source device type %s (a receive across device types goes between host and CUDA memory only)", target, src)
}

// Bytes views n bytes of host memory at addr. The memory must be host
// accessible and live for as long as the slice is used.
func Bytes(addr uintptr, n uint64) []byte {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(Foreign(addr)), n)
}

// Foreign is the memory at addr as a pointer: the one place a tensor's
// address, which comes as an integer (from C, a framework, a mapping),
// becomes one. That is safe where a uintptr-to-Pointer conversion
// usually is not because such memory is not Go's: the collector never
// moves or frees it, so the integer stays valid for as long as its owner
// keeps the memory, which the caller must see to. go vet cannot tell
// foreign memory from Go's, so the conversion goes through the address's
// bits rather than unsafe.Pointer(addr).
func Foreign(addr uintptr) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&addr))
}

// Join views a and b as one slice when b starts where a ends in memory
// (views of one buffer), so that a transport moves them as one span; ok
// is false otherwise, and when either is empty.
func Join(a, b []byte) (joined []byte, ok bool) {
	if len(a) == 0 || len(b) == 0 || uintptr(unsafe.Pointer(&a[0]))+uintptr(len(a)) != uintptr(unsafe.Pointer(&b[0])) {
		return nil, false
	}
	return unsafe.Slice(&a[0], len(a)+len(b)), true
}
