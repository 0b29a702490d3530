//===- Npy.h - Reading and writing NumPy .npy files ------------*- C++ -*-===//
//
// The .npy format (versions 1.0, 2.0 and 3.0; C order, little-endian) to and
// from HostTensor, so tests, tools and users can exchange arrays with NumPy.
// Supported element types: f32 '<f4', f64 '<f8', f16 '<f2', i32 '<i4',
// i64 '<i8', u8 '|u1', bool '|b1', and bf16, which NumPy has no type for and
// which is stored as uint16 '<u2' (the reader maps '<u2' to bf16 only when
// asked to).
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_NPY_H
#define PAGEDC_NPY_H

#include "pagedc/Tensor.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pagedc {

/// What readNpy() accepts.
struct NpyReadOptions {
  /// Read '<u2' arrays as bf16 bit patterns (DType::BF16).
  bool uint16AsBF16 = false;
  /// When set, a file of another element type is an error.
  std::optional<DType> expectDType;
  /// When set, a file of another shape is an error.
  std::optional<std::vector<int64_t>> expectShape;
};

/// Reads a .npy file with one sized read straight into the tensor (no other
/// copy). Throws pagedc::Error naming the file and the problem: unreadable
/// file, a directory, device, FIFO or socket (only regular files are read, so
/// `/dev/zero` is refused instead of read until memory runs out), wrong magic, unsupported version, malformed header,
/// Fortran order, unsupported or big-endian dtype, truncated data, or a
/// dtype / shape other than the expected one.
HostTensor readNpy(const std::string &path, const NpyReadOptions &options = {});

/// An open .npy file whose header has been read and checked (the same
/// checks and errors as readNpy(), including a byte size that must fit in
/// 64 bits and data the file really holds); the data is read on demand, in
/// whole or in pieces, so a caller can stream it somewhere without holding
/// a second copy.
class NpyFile {
public:
  explicit NpyFile(const std::string &path, const NpyReadOptions &options = {});
  ~NpyFile();
  NpyFile(const NpyFile &) = delete;
  NpyFile &operator=(const NpyFile &) = delete;

  const std::string &path() const { return path_; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t> &shape() const { return shape_; }
  int64_t numel() const;
  uint64_t dataBytes() const { return dataBytes_; }
  /// Reads `bytes` bytes of the array data starting at byte `offset` of it.
  void readData(uint64_t offset, void *target, uint64_t bytes) const;
  /// The whole array.
  HostTensor read() const;

private:
  void readAt(uint64_t offset, void *target, uint64_t bytes) const;
  std::string path_;
  int fd_ = -1;
  uint64_t fileSize_ = 0;
  DType dtype_ = DType::F32;
  std::vector<int64_t> shape_;
  uint64_t dataStart_ = 0;
  uint64_t dataBytes_ = 0;
};

/// Parses .npy bytes held in memory; `name` is used in error messages.
HostTensor parseNpy(const std::vector<uint8_t> &bytes, const std::string &name,
                    const NpyReadOptions &options = {});

/// Encodes a CPU tensor of any strides as .npy bytes (version 1.0, or 2.0
/// when the header needs it), C order. bf16 is written as '<u2'.
std::vector<uint8_t> encodeNpy(const TensorView &tensor);

/// Writes encodeNpy(tensor) to `path` through a temporary file renamed into
/// place, so a failure never leaves a partial file. Throws pagedc::Error.
void writeNpy(const std::string &path, const TensorView &tensor);

/// The .npy descr of a dtype: "<f4", "<u2" for bf16, ...
std::string npyDescr(DType dtype);

} // namespace pagedc

#endif // PAGEDC_NPY_H
