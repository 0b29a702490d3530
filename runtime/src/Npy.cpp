//===- Npy.cpp - Reading and writing NumPy .npy files ---------------------===//
#include "pagedc/Npy.h"
#include "pagedc/Error.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

namespace pagedc {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLength = 6;

[[noreturn]] void fail(const std::string &name, const std::string &problem) {
  throw Error(fmt::format("npy file '{}': {}", name, problem));
}

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
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
  }
  throw Error("npyDescr: unknown dtype");
}

HostTensor parseNpy(const std::vector<uint8_t> &bytes, const std::string &name,
                    const NpyReadOptions &options) {
  if (bytes.size() < kMagicLength + 2 || std::memcmp(bytes.data(), kMagic, kMagicLength) != 0)
    fail(name, "wrong magic: not a .npy file");
  int major = bytes[kMagicLength], minor = bytes[kMagicLength + 1];
  if (major < 1 || major > 3)
    fail(name, fmt::format("unsupported .npy version {}.{} (1.0, 2.0 and 3.0 are)", major, minor));
  int lengthBytes = major == 1 ? 2 : 4;
  size_t headerStart = kMagicLength + 2 + lengthBytes;
  if (bytes.size() < headerStart)
    fail(name, "truncated header");
  size_t headerLength = readLittleEndian(bytes.data() + kMagicLength + 2, lengthBytes);
  if (bytes.size() < headerStart + headerLength)
    fail(name, fmt::format("truncated header: it declares {} bytes, the file has {}",
                           headerLength, bytes.size() - headerStart));
  std::string text(reinterpret_cast<const char *>(bytes.data() + headerStart), headerLength);
  Header header = HeaderParser(text, name).parse();

  DType dtype = dtypeOfDescr(header.descr, name, options);
  if (header.fortranOrder && header.shape.size() > 1)
    fail(name, "Fortran-order arrays are not supported (save with C order)");
  if (header.shape.size() > static_cast<size_t>(TensorView::kMaxRank))
    fail(name, fmt::format("rank {} exceeds the supported maximum of {}", header.shape.size(),
                           TensorView::kMaxRank));
  if (options.expectDType && *options.expectDType != dtype)
    fail(name, fmt::format("dtype mismatch: expected {}, the file holds {} ('{}')",
                           dtypeName(*options.expectDType), dtypeName(dtype), header.descr));
  if (options.expectShape && *options.expectShape != header.shape)
    fail(name, fmt::format("shape mismatch: expected {}, the file holds {}",
                           shapeText(*options.expectShape), shapeText(header.shape)));

  uint64_t count = 1;
  for (int64_t extent : header.shape) {
    if (extent != 0 && count > UINT64_MAX / static_cast<uint64_t>(extent))
      fail(name, "shape too large");
    count *= static_cast<uint64_t>(extent);
  }
  uint64_t dataBytes = count * dtypeSize(dtype);
  size_t dataStart = headerStart + headerLength;
  if (bytes.size() - dataStart < dataBytes)
    fail(name, fmt::format("truncated data: shape {} of {} needs {} bytes, the file has {}",
                           shapeText(header.shape), header.descr, dataBytes,
                           bytes.size() - dataStart));
  HostTensor tensor(dtype, header.shape);
  if (dataBytes)
    std::memcpy(tensor.data(), bytes.data() + dataStart, dataBytes);
  if (dtype == DType::Bool)
    for (int64_t i = 0; i < tensor.numel(); ++i)
      tensor.dataAs<uint8_t>()[i] = tensor.dataAs<uint8_t>()[i] != 0;
  return tensor;
}

HostTensor readNpy(const std::string &path, const NpyReadOptions &options) {
  std::ifstream file(path, std::ios::binary);
  if (!file)
    fail(path, fmt::format("cannot open: {}", std::strerror(errno)));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)),
                             std::istreambuf_iterator<char>());
  if (file.bad())
    fail(path, "read error");
  return parseNpy(bytes, path, options);
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
  std::vector<uint8_t> bytes = encodeNpy(tensor);
  std::string temporary = path + ".tmp";
  std::FILE *file = std::fopen(temporary.c_str(), "wb");
  if (!file)
    fail(path, fmt::format("cannot create: {}", std::strerror(errno)));
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size();
  ok = std::fclose(file) == 0 && ok;
  if (!ok || std::rename(temporary.c_str(), path.c_str()) != 0) {
    int error = errno;
    std::remove(temporary.c_str());
    fail(path, fmt::format("cannot write: {}", std::strerror(error)));
  }
}

} // namespace pagedc
