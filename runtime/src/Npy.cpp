//===- Npy.cpp - Reading and writing NumPy .npy files ---------------------===//
#include "pagedc/Npy.h"
#include "pagedc/Error.h"

#include "OutputFiles.h"
#include "TensorChecks.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <new>
#include <stdexcept>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace pagedc {
namespace {

using detail::shapeText;

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLength = 6;
/// The largest header read. NumPy writes a few hundred bytes at most (a dict
/// of three keys; pagedc's ranks are at most 6); versions 2.0 and 3.0 let the
/// length field claim 4 GiB, which would otherwise size the buffer the header
/// is read into.
constexpr uint64_t kMaxHeaderBytes = uint64_t(1) << 20;

[[noreturn]] void fail(const std::string &name, const std::string &problem) {
  throw Error(fmt::format("npy file '{}': {}", name, problem));
}

/// The header dictionary of a .npy file.
struct Header {
  std::string descr;
  bool fortranOrder = false;
  std::vector<int64_t> shape;
};

/// A parser for the Python dict literal that forms the header, e.g.
/// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class HeaderParser {
public:
  HeaderParser(const std::string &text, const std::string &name) : text_(text), name_(name) {}

  Header parse() {
    Header header;
    bool seenDescr = false, seenOrder = false, seenShape = false;
    expect('{');
    for (;;) {
      skipSpace();
      if (peek() == '}') {
        ++pos_;
        break;
      }
      std::string key = parseString();
      expect(':');
      skipSpace();
      if (key == "descr") {
        if (peek() != '\'' && peek() != '"')
          fail(name_, "unsupported dtype: descr is not a simple type string "
                      "(structured arrays are not supported)");
        header.descr = parseString();
        seenDescr = true;
      } else if (key == "fortran_order") {
        header.fortranOrder = parseBool();
        seenOrder = true;
      } else if (key == "shape") {
        header.shape = parseShape();
        seenShape = true;
      } else {
        fail(name_, fmt::format("bad header: unexpected key '{}'", key));
      }
      skipSpace();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}')
        bad("expected ',' or '}'");
    }
    skipSpace();
    if (pos_ != text_.size())
      bad("text after the closing '}'");
    if (!seenDescr || !seenOrder || !seenShape)
      fail(name_, "bad header: it needs the keys 'descr', 'fortran_order' and 'shape'");
    return header;
  }

private:
  [[noreturn]] void bad(const std::string &what) {
    fail(name_, fmt::format("bad header: {} at offset {} of \"{}\"", what, pos_, text_));
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skipSpace() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_])))
      ++pos_;
  }
  void expect(char c) {
    skipSpace();
    if (peek() != c)
      bad(fmt::format("expected '{}'", c));
    ++pos_;
  }
  std::string parseString() {
    skipSpace();
    char quote = peek();
    if (quote != '\'' && quote != '"')
      bad("expected a quoted string");
    size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string::npos)
      bad("unterminated string");
    std::string value = text_.substr(pos_ + 1, end - pos_ - 1);
    pos_ = end + 1;
    return value;
  }
  bool parseBool() {
    if (text_.compare(pos_, 4, "True") == 0) {
      pos_ += 4;
      return true;
    }
    if (text_.compare(pos_, 5, "False") == 0) {
      pos_ += 5;
      return false;
    }
    bad("expected True or False");
  }
  std::vector<int64_t> parseShape() {
    std::vector<int64_t> shape;
    expect('(');
    for (;;) {
      skipSpace();
      if (peek() == ')') {
        ++pos_;
        return shape;
      }
      if (!std::isdigit(static_cast<unsigned char>(peek())))
        bad("expected a non-negative integer dimension");
      int64_t value = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        if (value > (INT64_MAX - 9) / 10)
          bad("dimension too large");
        value = value * 10 + (text_[pos_++] - '0');
      }
      if (peek() == 'L') // Python 2 long suffix
        ++pos_;
      shape.push_back(value);
      skipSpace();
      if (peek() == ',')
        ++pos_;
      else if (peek() != ')')
        bad("expected ',' or ')' in the shape");
    }
  }

  const std::string &text_;
  const std::string &name_;
  size_t pos_ = 0;
};

/// Maps a descr to a dtype, or fails with the reason.
DType dtypeOfDescr(const std::string &descr, const std::string &name,
                   const NpyReadOptions &options) {
  if (descr.size() < 2)
    fail(name, fmt::format("unsupported dtype '{}'", descr));
  char order = descr[0];
  std::string type = descr.substr(1);
  bool singleByte = type == "u1" || type == "b1" || type == "i1";
  if (order == '>' && !singleByte)
    fail(name, fmt::format("big-endian dtype '{}' is not supported (use '<{}')", descr, type));
  if (order != '<' && order != '|' && order != '=' && order != '>')
    fail(name, fmt::format("unsupported dtype '{}'", descr));
  if (type == "f4") return DType::F32;
  if (type == "f8") return DType::F64;
  if (type == "f2") return DType::F16;
  if (type == "i4") return DType::I32;
  if (type == "i8") return DType::I64;
  if (type == "u1") return DType::U8;
  if (type == "b1") return DType::Bool;
  if (type == "u2") {
    if (options.uint16AsBF16)
      return DType::BF16;
    fail(name, "unsupported dtype '<u2' (uint16); bf16 data stored as uint16 must be "
               "read with uint16AsBF16");
  }
  fail(name, fmt::format("unsupported dtype '{}'", descr));
}

uint32_t readLittleEndian(const uint8_t *p, int bytes) {
  uint32_t value = 0;
  for (int i = bytes - 1; i >= 0; --i)
    value = (value << 8) | p[i];
  return value;
}

} // namespace

std::string npyDescr(DType dtype) {
  switch (dtype) {
  case DType::F32: return "<f4";
  case DType::F64: return "<f8";
  case DType::F16: return "<f2";
  case DType::BF16: return "<u2";
  case DType::I32: return "<i4";
  case DType::I64: return "<i8";
  case DType::U8: return "|u1";
  case DType::Bool: return "|b1";
  case DType::F8E4M3:
  case DType::F8E5M2:
    break; // .npy has no 8-bit float type
  }
  throw Error(fmt::format("{} tensors cannot be written as .npy", dtypeName(dtype)));
}

namespace {

/// What a .npy header says: where the data starts and how it is laid out.
struct NpyLayout {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t dataStart = 0;
  uint64_t dataBytes = 0;
};

/// The bytes of the prefix (magic, version, header length) and how long the
/// whole prefix + header is; fails for a wrong magic or version. `available`
/// is the size of the file (or buffer).
uint64_t prefixLength(const uint8_t *bytes, uint64_t size, uint64_t available,
                      const std::string &name, uint64_t &headerLength) {
  if (size < kMagicLength + 2 || std::memcmp(bytes, kMagic, kMagicLength) != 0)
    fail(name, "wrong magic: not a .npy file");
  int major = bytes[kMagicLength], minor = bytes[kMagicLength + 1];
  if (major < 1 || major > 3)
    fail(name, fmt::format("unsupported .npy version {}.{} (1.0, 2.0 and 3.0 are)", major, minor));
  int lengthBytes = major == 1 ? 2 : 4;
  uint64_t headerStart = kMagicLength + 2 + lengthBytes;
  if (size < headerStart)
    fail(name, "truncated header");
  headerLength = readLittleEndian(bytes + kMagicLength + 2, lengthBytes);
  if (headerLength > kMaxHeaderBytes)
    fail(name, fmt::format("header of {} bytes is larger than the {} a .npy header may be",
                           headerLength, kMaxHeaderBytes));
  if (available < headerStart + headerLength)
    fail(name, fmt::format("truncated header: it declares {} bytes, the file has {}",
                           headerLength, available - headerStart));
  return headerStart;
}

/// Parses the header dictionary at `text` and checks it against `options`;
/// every size is computed without overflow.
NpyLayout parseLayout(const std::string &text, uint64_t dataStart, const std::string &name,
                      const NpyReadOptions &options) {
  Header header = HeaderParser(text, name).parse();
  NpyLayout layout;
  layout.dtype = dtypeOfDescr(header.descr, name, options);
  if (header.fortranOrder && header.shape.size() > 1)
    fail(name, "Fortran-order arrays are not supported (save with C order)");
  if (header.shape.size() > static_cast<size_t>(TensorView::kMaxRank))
    fail(name, fmt::format("rank {} exceeds the supported maximum of {}", header.shape.size(),
                           TensorView::kMaxRank));
  if (options.expectDType && *options.expectDType != layout.dtype)
    fail(name, fmt::format("dtype mismatch: expected {}, the file holds {} ('{}')",
                           dtypeName(*options.expectDType), dtypeName(layout.dtype), header.descr));
  if (options.expectShape && *options.expectShape != header.shape)
    fail(name, fmt::format("shape mismatch: expected {}, the file holds {}",
                           shapeText(*options.expectShape), shapeText(header.shape)));
  // The byte size must fit int64 (and so size_t and file offsets), and so
  // must the byte strides of the C-order layout: a zero extent makes the
  // size 0, but (0, 7e14, 5e8) still has strides no int64 holds, which
  // TensorView refuses, so the reader refuses it too.
  int64_t bytes = static_cast<int64_t>(dtypeSize(layout.dtype));
  int64_t span = bytes;
  for (int64_t extent : header.shape)
    if (__builtin_mul_overflow(bytes, extent, &bytes) ||
        (extent > 0 && __builtin_mul_overflow(span, extent, &span)))
      fail(name, fmt::format("shape {} of {} is too large: its byte size (or a stride) "
                             "overflows 64 bits",
                             shapeText(header.shape), header.descr));
  layout.shape = std::move(header.shape);
  layout.dataStart = dataStart;
  layout.dataBytes = static_cast<uint64_t>(bytes);
  return layout;
}

void failTruncated(const std::string &name, const NpyLayout &layout, uint64_t available) {
  fail(name, fmt::format("truncated data: shape {} of {} needs {} bytes, the file has {}",
                         shapeText(layout.shape), npyDescr(layout.dtype), layout.dataBytes,
                         available));
}

/// A tensor of the layout's shape, with allocation failures as pagedc::Error.
HostTensor allocateTensor(const std::string &name, const NpyLayout &layout) {
  try {
    return HostTensor(layout.dtype, layout.shape);
  } catch (const std::bad_alloc &) {
    fail(name, fmt::format("out of memory allocating {} bytes for shape {}", layout.dataBytes,
                           shapeText(layout.shape)));
  } catch (const std::length_error &) {
    fail(name, fmt::format("out of memory allocating {} bytes for shape {}", layout.dataBytes,
                           shapeText(layout.shape)));
  }
}

void normaliseBools(HostTensor &tensor) {
  if (tensor.dtype() == DType::Bool)
    for (int64_t i = 0; i < tensor.numel(); ++i)
      tensor.dataAs<uint8_t>()[i] = tensor.dataAs<uint8_t>()[i] != 0;
}

} // namespace

HostTensor parseNpy(const std::vector<uint8_t> &bytes, const std::string &name,
                    const NpyReadOptions &options) {
  uint64_t headerLength = 0;
  uint64_t headerStart = prefixLength(bytes.data(), bytes.size(), bytes.size(), name, headerLength);
  std::string text(reinterpret_cast<const char *>(bytes.data() + headerStart), headerLength);
  NpyLayout layout = parseLayout(text, headerStart + headerLength, name, options);
  if (bytes.size() - layout.dataStart < layout.dataBytes)
    failTruncated(name, layout, bytes.size() - layout.dataStart);
  HostTensor tensor = allocateTensor(name, layout);
  if (layout.dataBytes)
    std::memcpy(tensor.data(), bytes.data() + layout.dataStart, layout.dataBytes);
  normaliseBools(tensor);
  return tensor;
}

//===----------------------------------------------------------------------===//
// NpyFile: a .npy file read in place
//===----------------------------------------------------------------------===//

NpyFile::NpyFile(const std::string &path, const NpyReadOptions &options) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0)
    fail(path, fmt::format("cannot open: {}", std::strerror(errno)));
  try {
    struct stat info;
    if (::fstat(fd_, &info) != 0)
      fail(path, fmt::format("cannot open: {}", std::strerror(errno)));
    if (S_ISDIR(info.st_mode))
      fail(path, "cannot read: it is a directory, not a .npy file");
    if (!S_ISREG(info.st_mode))
      fail(path, "cannot read: not a regular file (a device, FIFO or socket); .npy inputs must "
                 "be regular files");
    fileSize_ = static_cast<uint64_t>(info.st_size);
    uint8_t prefix[kMagicLength + 2 + 4] = {};
    const uint64_t prefixBytes = std::min<uint64_t>(sizeof prefix, fileSize_);
    readAt(0, prefix, prefixBytes);
    uint64_t headerLength = 0;
    uint64_t headerStart = prefixLength(prefix, prefixBytes, fileSize_, path, headerLength);
    std::string text(headerLength, '\0');
    readAt(headerStart, text.data(), headerLength);
    NpyLayout layout = parseLayout(text, headerStart + headerLength, path, options);
    if (fileSize_ - layout.dataStart < layout.dataBytes)
      failTruncated(path, layout, fileSize_ - layout.dataStart);
    dtype_ = layout.dtype;
    shape_ = std::move(layout.shape);
    dataStart_ = layout.dataStart;
    dataBytes_ = layout.dataBytes;
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

NpyFile::~NpyFile() {
  if (fd_ >= 0)
    ::close(fd_);
}

int64_t NpyFile::numel() const {
  int64_t count = 1;
  for (int64_t extent : shape_)
    count *= extent; // checked not to overflow when the header was parsed
  return count;
}

void NpyFile::readAt(uint64_t offset, void *target, uint64_t bytes) const {
  auto *out = static_cast<char *>(target);
  while (bytes > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(bytes, 1u << 30));
    ssize_t got = ::pread(fd_, out, chunk, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      fail(path_, fmt::format("read error: {}", std::strerror(errno)));
    if (got == 0)
      fail(path_, "truncated data: the file shrank while it was read");
    out += got;
    offset += static_cast<uint64_t>(got);
    bytes -= static_cast<uint64_t>(got);
  }
}

void NpyFile::readData(uint64_t offset, void *target, uint64_t bytes) const {
  if (offset > dataBytes_ || bytes > dataBytes_ - offset)
    throw Error(fmt::format("npy file '{}': read of {} bytes at {} is past its {} data bytes",
                            path_, bytes, offset, dataBytes_));
  readAt(dataStart_ + offset, target, bytes);
}

HostTensor NpyFile::read() const {
  NpyLayout layout;
  layout.dtype = dtype_;
  layout.shape = shape_;
  layout.dataBytes = dataBytes_;
  HostTensor tensor = allocateTensor(path_, layout);
  readData(0, tensor.data(), dataBytes_);
  normaliseBools(tensor);
  return tensor;
}

HostTensor readNpy(const std::string &path, const NpyReadOptions &options) {
  return NpyFile(path, options).read();
}

std::vector<uint8_t> encodeNpy(const TensorView &tensor) {
  if (tensor.device().kind != DeviceKind::CPU)
    throw Error(fmt::format("encodeNpy: the tensor is on {}, not the CPU",
                            deviceName(tensor.device())));
  std::vector<int64_t> shape = tensor.shape();
  std::string shapeTuple = "(";
  for (size_t i = 0; i < shape.size(); ++i)
    shapeTuple += (i ? ", " : "") + std::to_string(shape[i]);
  shapeTuple += shape.size() == 1 ? ",)" : ")";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                   npyDescr(tensor.dtype()), shapeTuple);
  // Pad with spaces and end with '\n' so that the data starts on a 64-byte
  // boundary, as NumPy does.
  int lengthBytes = header.size() + 1 + kMagicLength + 4 > 65535 ? 4 : 2;
  size_t prefix = kMagicLength + 2 + lengthBytes;
  size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
  header.append(total - prefix - header.size() - 1, ' ');
  header.push_back('\n');

  size_t elementSize = dtypeSize(tensor.dtype());
  std::vector<uint8_t> bytes(prefix + header.size() + tensor.numel() * elementSize);
  std::memcpy(bytes.data(), kMagic, kMagicLength);
  bytes[kMagicLength] = lengthBytes == 2 ? 1 : 2;
  bytes[kMagicLength + 1] = 0;
  for (int i = 0; i < lengthBytes; ++i)
    bytes[kMagicLength + 2 + i] = static_cast<uint8_t>(header.size() >> (8 * i));
  std::memcpy(bytes.data() + prefix, header.data(), header.size());

  uint8_t *out = bytes.data() + prefix + header.size();
  const uint8_t *base = static_cast<const uint8_t *>(tensor.data());
  int rank = tensor.rank();
  int64_t count = tensor.numel();
  if (count == 0)
    return bytes;
  if (tensor.isContiguous()) {
    std::memcpy(out, base, count * elementSize);
    return bytes;
  }
  std::vector<int64_t> index(rank, 0);
  for (int64_t n = 0; n < count; ++n) {
    int64_t offset = 0;
    for (int d = 0; d < rank; ++d)
      offset += index[d] * tensor.stride(d);
    std::memcpy(out + n * elementSize, base + offset * elementSize, elementSize);
    for (int d = rank - 1; d >= 0; --d) {
      if (++index[d] < shape[d])
        break;
      index[d] = 0;
    }
  }
  return bytes;
}

void writeNpy(const std::string &path, const TensorView &tensor) {
  files::writeAll({{{"npy file", path}, encodeNpy(tensor)}});
}

} // namespace pagedc
