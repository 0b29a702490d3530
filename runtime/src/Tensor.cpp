//===- Tensor.cpp - Tensor views, DLPack mapping, float conversions -------===//
#include "pagedc/Tensor.h"
#include "pagedc/Error.h"
#include "HostMemory.h"
#include "TensorChecks.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

namespace pagedc {

size_t dtypeSize(DType type) {
  switch (type) {
  case DType::F32: return 4;
  case DType::F64: return 8;
  case DType::F16: return 2;
  case DType::BF16: return 2;
  case DType::I32: return 4;
  case DType::I64: return 8;
  case DType::U8: return 1;
  case DType::Bool: return 1;
  case DType::F8E4M3: return 1;
  case DType::F8E5M2: return 1;
  }
  return 0;
}

const char *dtypeName(DType type) {
  switch (type) {
  case DType::F32: return "f32";
  case DType::F64: return "f64";
  case DType::F16: return "f16";
  case DType::BF16: return "bf16";
  case DType::I32: return "i32";
  case DType::I64: return "i64";
  case DType::U8: return "u8";
  case DType::Bool: return "bool";
  case DType::F8E4M3: return "f8e4m3";
  case DType::F8E5M2: return "f8e5m2";
  }
  return "?";
}

std::string deviceName(Device device) {
  return device.kind == DeviceKind::CPU ? std::string("cpu")
                                        : fmt::format("cuda:{}", device.index);
}

static void checkRank(size_t rank) {
  if (rank > static_cast<size_t>(TensorView::kMaxRank))
    throw Error(fmt::format("tensor rank {} exceeds the supported maximum of {}", rank,
                            TensorView::kMaxRank));
}

/// The element count of `shape` must fit int64, so numel() and every offset
/// computed from a compact layout cannot overflow.
static void checkElementCount(const std::vector<int64_t> &shape) {
  int64_t count = 1;
  for (int64_t extent : shape)
    if (extent > 0 && __builtin_mul_overflow(count, extent, &count))
      throw Error(fmt::format("tensor shape with extent {} has more elements than int64 can "
                              "count",
                              extent));
}

TensorView::TensorView(void *data, DType dtype, std::initializer_list<int64_t> shape,
                       Device device)
    : TensorView(data, dtype, std::vector<int64_t>(shape), device) {}

TensorView::TensorView(void *data, DType dtype, const std::vector<int64_t> &shape,
                       Device device)
    : data_(data), dtype_(dtype), device_(device), rank_(static_cast<int>(shape.size())) {
  checkRank(shape.size());
  checkElementCount(shape);
  int64_t stride = 1;
  for (int i = rank_ - 1; i >= 0; --i) {
    if (shape[i] < 0)
      throw Error(fmt::format("negative extent {} in dimension {}", shape[i], i));
    shape_[i] = shape[i];
    strides_[i] = stride;
    stride *= shape[i];
  }
}

TensorView::TensorView(void *data, DType dtype, const std::vector<int64_t> &shape,
                       const std::vector<int64_t> &strides, Device device)
    : data_(data), dtype_(dtype), device_(device), rank_(static_cast<int>(shape.size())) {
  checkRank(shape.size());
  checkElementCount(shape);
  if (strides.size() != shape.size())
    throw Error(fmt::format("shape has {} dimensions but strides have {}", shape.size(),
                            strides.size()));
  for (int i = 0; i < rank_; ++i) {
    if (shape[i] < 0)
      throw Error(fmt::format("negative extent {} in dimension {}", shape[i], i));
    shape_[i] = shape[i];
    strides_[i] = strides[i];
  }
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i)
    n *= shape_[i];
  return n;
}

bool TensorView::isContiguous() const {
  int64_t expected = 1;
  for (int i = rank_ - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != expected)
      return false;
    expected *= shape_[i];
  }
  return true;
}

std::string TensorView::shapeString() const {
  return detail::shapeText(shape());
}

static DType dtypeFromDLPack(PagedcDLDataType type) {
  if (type.lanes != 1)
    throw Error(fmt::format("DLPack tensors with {} lanes are not supported", type.lanes));
  switch (type.code) {
  case 0:
    if (type.bits == 32) return DType::I32;
    if (type.bits == 64) return DType::I64;
    break;
  case 1:
    if (type.bits == 8) return DType::U8;
    break;
  case 2:
    if (type.bits == 16) return DType::F16;
    if (type.bits == 32) return DType::F32;
    if (type.bits == 64) return DType::F64;
    break;
  case 4:
    if (type.bits == 16) return DType::BF16;
    break;
  case 6:
    if (type.bits == 8) return DType::Bool;
    break;
  case 10: // kDLFloat8_e4m3fn
    if (type.bits == 8) return DType::F8E4M3;
    break;
  case 12: // kDLFloat8_e5m2
    if (type.bits == 8) return DType::F8E5M2;
    break;
  }
  throw Error(fmt::format("unsupported DLPack dtype (code {}, {} bits)", type.code, type.bits));
}

static PagedcDLDataType dtypeToDLPack(DType type) {
  switch (type) {
  case DType::I32: return {0, 32, 1};
  case DType::I64: return {0, 64, 1};
  case DType::U8: return {1, 8, 1};
  case DType::F16: return {2, 16, 1};
  case DType::F32: return {2, 32, 1};
  case DType::F64: return {2, 64, 1};
  case DType::BF16: return {4, 16, 1};
  case DType::Bool: return {6, 8, 1};
  case DType::F8E4M3: return {10, 8, 1};
  case DType::F8E5M2: return {12, 8, 1};
  }
  return {2, 32, 1};
}

//===----------------------------------------------------------------------===//
// 8-bit floats
//===----------------------------------------------------------------------===//

namespace {

/// The value of every code of one format, from its fields.
struct Float8Table {
  float value[256];
  /// The largest finite code's value; codes 0..maxCode are the non-negative
  /// finite values in increasing order.
  float maxFinite;
  uint8_t maxCode;
  Float8Table(int exponentBits, int mantissaBits, bool finiteOnly) {
    const int bias = (1 << (exponentBits - 1)) - 1;
    const int exponentMask = (1 << exponentBits) - 1, mantissaMask = (1 << mantissaBits) - 1;
    for (int code = 0; code < 256; ++code) {
      const int sign = code >> 7;
      const int exponent = (code >> mantissaBits) & exponentMask;
      const int mantissa = code & mantissaMask;
      float magnitude;
      if (finiteOnly && exponent == exponentMask && mantissa == mantissaMask)
        magnitude = std::numeric_limits<float>::quiet_NaN(); // e4m3fn's only NaN
      else if (!finiteOnly && exponent == exponentMask)
        magnitude = mantissa ? std::numeric_limits<float>::quiet_NaN()
                             : std::numeric_limits<float>::infinity();
      else if (exponent == 0)
        magnitude = std::ldexp(static_cast<float>(mantissa), 1 - bias - mantissaBits);
      else
        magnitude = std::ldexp(static_cast<float>(mantissa | (1 << mantissaBits)),
                               exponent - bias - mantissaBits);
      value[code] = sign ? -magnitude : magnitude;
    }
    maxCode = static_cast<uint8_t>(finiteOnly ? 0x7e : (exponentMask << mantissaBits) - 1);
    maxFinite = value[maxCode];
  }
};

const Float8Table &float8Table(DType type) {
  static const Float8Table e4m3(4, 3, true), e5m2(5, 2, false);
  return type == DType::F8E4M3 ? e4m3 : e5m2;
}

} // namespace

float float8ToFloat(uint8_t code, DType type) { return float8Table(type).value[code]; }

const float *float8Values(DType type) { return float8Table(type).value; }

uint8_t floatToFloat8(float value, DType type) {
  const Float8Table &table = float8Table(type);
  if (std::isnan(value))
    return 0x7f;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const float magnitude = std::fabs(value);
  if (magnitude >= table.maxFinite)
    return sign | table.maxCode;
  // The non-negative finite codes increase with their values: find the
  // first code not below `magnitude`, then the nearer of it and the one
  // before, ties to the even code (an even mantissa).
  int low = 0, high = table.maxCode;
  while (low < high) {
    const int middle = (low + high) / 2;
    if (table.value[middle] < magnitude)
      low = middle + 1;
    else
      high = middle;
  }
  int code = low;
  if (code > 0) {
    const float above = table.value[code] - magnitude;
    const float below = magnitude - table.value[code - 1];
    if (below < above || (below == above && ((code - 1) & 1) == 0))
      code -= 1;
  }
  return static_cast<uint8_t>(sign | code);
}

TensorView TensorView::fromDLPack(const PagedcDLTensor &tensor) {
  Device device;
  if (tensor.device.device_type == 1)
    device = Device::cpu();
  else if (tensor.device.device_type == 2)
    device = Device::cuda(tensor.device.device_id);
  else
    throw Error(fmt::format("unsupported DLPack device type {}", tensor.device.device_type));
  if (tensor.ndim < 0)
    throw Error("DLPack tensor with a negative rank");
  checkRank(static_cast<size_t>(tensor.ndim));
  if (tensor.ndim > 0 && !tensor.shape)
    throw Error(fmt::format("DLPack tensor of rank {} has no shape", tensor.ndim));
  DType dtype = dtypeFromDLPack(tensor.dtype);
  std::vector<int64_t> shape(tensor.shape, tensor.shape + tensor.ndim);
  char *data = static_cast<char *>(tensor.data) + tensor.byte_offset;
  if (!tensor.strides)
    return TensorView(data, dtype, shape, device);
  std::vector<int64_t> strides(tensor.strides, tensor.strides + tensor.ndim);
  return TensorView(data, dtype, shape, strides, device);
}

PagedcDLTensor TensorView::toDLPack() const {
  for (int i = 0; i < rank_; ++i) {
    dlShape_[i] = shape_[i];
    dlStrides_[i] = strides_[i];
  }
  PagedcDLTensor tensor{};
  tensor.data = data_;
  tensor.device.device_type = device_.kind == DeviceKind::CPU ? 1 : 2;
  tensor.device.device_id = device_.index;
  tensor.ndim = rank_;
  tensor.dtype = dtypeToDLPack(dtype_);
  tensor.shape = dlShape_.data();
  tensor.strides = dlStrides_.data();
  tensor.byte_offset = 0;
  return tensor;
}

HostTensor::HostTensor(DType dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  int64_t bytes = static_cast<int64_t>(dtypeSize(dtype_));
  for (int64_t extent : shape_) {
    if (extent < 0)
      throw Error(fmt::format("negative extent {}", extent));
    if (__builtin_mul_overflow(bytes, extent, &bytes))
      throw Error(fmt::format("a {} tensor with an extent of {} is too large: its byte size "
                              "overflows 64 bits",
                              dtypeName(dtype_), extent));
  }
  if (bytes == 0)
    return;
  data_ = allocateZeroedHost(static_cast<size_t>(bytes));
  if (!data_)
    throw Error(fmt::format("out of memory allocating a {} tensor of {} bytes", dtypeName(dtype_),
                            bytes));
  bytes_ = static_cast<size_t>(bytes);
}

HostTensor::HostTensor(const HostTensor &other) : dtype_(other.dtype_), shape_(other.shape_) {
  if (other.bytes_ == 0)
    return;
  data_ = allocateZeroedHost(other.bytes_);
  if (!data_)
    throw Error(fmt::format("out of memory copying a {} tensor of {} bytes", dtypeName(dtype_),
                            other.bytes_));
  bytes_ = other.bytes_;
  std::memcpy(data_, other.data_, bytes_);
}

HostTensor::HostTensor(HostTensor &&other) noexcept
    : dtype_(other.dtype_), shape_(std::move(other.shape_)),
      data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {
  other.shape_.clear();
}

HostTensor &HostTensor::operator=(HostTensor other) noexcept {
  std::swap(dtype_, other.dtype_);
  std::swap(shape_, other.shape_);
  std::swap(data_, other.data_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

HostTensor::~HostTensor() { freeHost(data_, bytes_); }

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t extent : shape_)
    n *= extent;
  return n;
}

uint16_t floatToHalf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t exponent = (bits >> 23) & 0xffu;
  uint32_t mantissa = bits & 0x7fffffu;
  if (exponent == 0xff) // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (mantissa ? 0x200u : 0u));
  int32_t e = static_cast<int32_t>(exponent) - 127 + 15;
  if (e >= 0x1f) // overflow to inf
    return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) { // subnormal or zero
    if (e < -10)
      return static_cast<uint16_t>(sign);
    mantissa |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mantissa >> shift;
    uint32_t remainder = mantissa & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (half & 1u)))
      ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mantissa >> 13);
  uint32_t remainder = mantissa & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (half & 1u)))
    ++half; // may carry into the exponent, which rounds up to inf correctly
  return static_cast<uint16_t>(half);
}

float halfToFloat(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t result;
  if (exponent == 0) {
    if (mantissa == 0) {
      result = sign;
    } else { // subnormal: normalise
      int32_t e = -1;
      do {
        ++e;
        mantissa <<= 1;
      } while ((mantissa & 0x400u) == 0);
      result = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mantissa & 0x3ffu) << 13);
    }
  } else if (exponent == 0x1f) {
    result = sign | 0x7f800000u | (mantissa << 13);
  } else {
    result = sign | ((exponent - 15 + 127) << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &result, 4);
  return value;
}

} // namespace pagedc
