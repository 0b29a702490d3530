//===- Tensor.h - Non-owning tensor views and element types ----*- C++ -*-===//
//
// TensorView is what every runtime entry point takes: a data pointer, an
// element type, a shape, strides in elements, and a device. It maps one to
// one onto DLPack's DLTensor, so framework tensors can be handed in without a
// copy. HostTensor is a small owning CPU tensor for tools and tests.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_TENSOR_H
#define PAGEDC_TENSOR_H

#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

namespace pagedc {

/// Element types the runtime understands. F8E4M3 and F8E5M2 are the OCP
/// 8-bit floats (e4m3fn: no infinities, NaN 0x7f/0xff, largest 448; e5m2:
/// IEEE-like, largest 57344), stored by KV caches with a scale.
enum class DType : uint8_t { F32, F64, F16, BF16, I32, I64, U8, Bool, F8E4M3, F8E5M2 };

/// Bytes per element.
size_t dtypeSize(DType type);
/// "f32", "bf16", ...
const char *dtypeName(DType type);

enum class DeviceKind : uint8_t { CPU, CUDA };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;
  static Device cpu() { return {DeviceKind::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceKind::CUDA, index}; }
  bool operator==(const Device &other) const {
    return kind == other.kind && index == other.index;
  }
  bool operator!=(const Device &other) const { return !(*this == other); }
};
std::string deviceName(Device device);

/// The DLPack tensor layout (DLPack's DLTensor ABI, declared here so that
/// pagedc needs no dlpack header). A framework's DLTensor can be passed by
/// reinterpreting its address as PagedcDLTensor.
struct PagedcDLDevice {
  int32_t device_type; // 1 = CPU, 2 = CUDA
  int32_t device_id;
};
struct PagedcDLDataType {
  uint8_t code; // 0 = int, 1 = uint, 2 = float, 4 = bfloat, 6 = bool
  uint8_t bits;
  uint16_t lanes;
};
struct PagedcDLTensor {
  void *data;
  PagedcDLDevice device;
  int32_t ndim;
  PagedcDLDataType dtype;
  int64_t *shape;
  int64_t *strides; // in elements; may be null for compact row-major
  uint64_t byte_offset;
};

/// A non-owning view of a strided tensor of rank 0..kMaxRank.
class TensorView {
public:
  static constexpr int kMaxRank = 6;

  TensorView() = default;
  /// A compact row-major view.
  TensorView(void *data, DType dtype, std::initializer_list<int64_t> shape,
             Device device = Device::cpu());
  TensorView(void *data, DType dtype, const std::vector<int64_t> &shape,
             Device device = Device::cpu());
  TensorView(void *data, DType dtype, const std::vector<int64_t> &shape,
             const std::vector<int64_t> &strides, Device device);

  /// Wraps a DLPack tensor (no copy). Throws pagedc::Error for types or
  /// devices pagedc does not support.
  static TensorView fromDLPack(const PagedcDLTensor &tensor);
  /// Describes this view as a DLPack tensor; shape and strides point into
  /// this object, which must outlive the result.
  PagedcDLTensor toDLPack() const;

  void *data() const { return data_; }
  template <typename T> T *dataAs() const { return static_cast<T *>(data_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int rank() const { return rank_; }
  int64_t size(int dim) const { return shape_[dim]; }
  int64_t stride(int dim) const { return strides_[dim]; }
  std::vector<int64_t> shape() const {
    return std::vector<int64_t>(shape_.begin(), shape_.begin() + rank_);
  }
  std::vector<int64_t> strides() const {
    return std::vector<int64_t>(strides_.begin(), strides_.begin() + rank_);
  }
  int64_t numel() const;
  bool isContiguous() const;
  bool empty() const { return data_ == nullptr && numel() == 0; }
  /// "[2, 8, 128, 64]"
  std::string shapeString() const;

private:
  void *data_ = nullptr;
  DType dtype_ = DType::F32;
  Device device_{};
  int rank_ = 0;
  std::array<int64_t, kMaxRank> shape_{};
  std::array<int64_t, kMaxRank> strides_{};
  mutable std::array<int64_t, kMaxRank> dlShape_{};
  mutable std::array<int64_t, kMaxRank> dlStrides_{};
};

/// An owning, compact, row-major CPU tensor, zero-filled. Large tensors
/// live in transparent huge pages, which attention streams faster.
class HostTensor {
public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape);
  HostTensor(const HostTensor &other);
  HostTensor(HostTensor &&other) noexcept;
  HostTensor &operator=(HostTensor other) noexcept;
  ~HostTensor();
  DType dtype() const { return dtype_; }
  const std::vector<int64_t> &shape() const { return shape_; }
  int64_t numel() const;
  void *data() { return data_; }
  const void *data() const { return data_; }
  template <typename T> T *dataAs() { return static_cast<T *>(data_); }
  template <typename T> const T *dataAs() const { return static_cast<const T *>(data_); }
  TensorView view() { return TensorView(data(), dtype_, shape_); }

private:
  DType dtype_ = DType::F32;
  std::vector<int64_t> shape_;
  void *data_ = nullptr; // null when the tensor has no elements
  size_t bytes_ = 0;
};

/// Whether `type` is one of the 8-bit floats.
inline bool isFloat8(DType type) { return type == DType::F8E4M3 || type == DType::F8E5M2; }

/// The value of an 8-bit float code (NaN codes give NaN, e5m2's infinity
/// codes infinity).
float float8ToFloat(uint8_t code, DType type);
/// The values of all 256 codes of an 8-bit float type, indexed by code.
const float *float8Values(DType type);
/// The code nearest to `value`, as PTX's cvt.rn.satfinite does: round to
/// nearest, ties to the even code; magnitudes past the largest finite value
/// (infinity included) saturate to it, keeping the sign; NaN gives the
/// format's canonical NaN (0x7f).
uint8_t floatToFloat8(float value, DType type);

/// IEEE half and bfloat16 conversions (round to nearest even).
uint16_t floatToHalf(float value);
float halfToFloat(uint16_t bits);
inline uint16_t floatToBF16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) // NaN: keep it a quiet NaN
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
inline float bf16ToFloat(uint16_t bits) {
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

} // namespace pagedc

#endif // PAGEDC_TENSOR_H
