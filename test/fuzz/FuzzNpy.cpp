//===- FuzzNpy.cpp - libFuzzer target: the .npy reader --------------------===//
//
// The input is the bytes of a .npy file. It is read twice, as `pagedc run`
// reads it (readNpy on a path; the path is a memfd, so nothing touches the
// disk) and from memory (parseNpy), each time as plain types and with '<u2'
// as bf16. pagedc::Error is the expected answer to a bad file.
//
// Findings: a crash, a sanitizer report or any other exception; the two
// readers disagreeing (one accepts what the other rejects, or different
// tensors); an accepted tensor whose data size does not match its shape; an
// accepted tensor that does not survive encodeNpy -> parseNpy unchanged.
//
//===----------------------------------------------------------------------===//

#include "pagedc/Error.h"
#include "pagedc/Npy.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

using namespace pagedc;

namespace {

[[noreturn]] void finding(const std::string &what) {
  std::fprintf(stderr, "pagedc-fuzz-npy: FINDING: %s\n", what.c_str());
  std::abort();
}

/// The tensor, or nothing when the reader threw pagedc::Error.
template <typename Read> std::optional<HostTensor> attempt(Read read) {
  try {
    return read();
  } catch (const Error &) {
    return std::nullopt;
  }
}

bool sameTensor(const HostTensor &a, const HostTensor &b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape())
    return false;
  size_t bytes = static_cast<size_t>(a.numel()) * dtypeSize(a.dtype());
  return bytes == 0 || std::memcmp(a.data(), b.data(), bytes) == 0;
}

void checkTensor(const HostTensor &tensor, const std::string &how) {
  int64_t count = 1;
  for (int64_t dim : tensor.shape()) {
    if (dim < 0)
      finding(how + ": negative dimension");
    if (dim != 0 && count > INT64_MAX / dim)
      finding(how + ": the element count overflows");
    count *= dim;
  }
  if (tensor.numel() != count)
    finding(how + ": numel() differs from the product of the shape");
  if (count > INT64_MAX / int64_t(dtypeSize(tensor.dtype())))
    finding(how + ": accepted a shape whose byte size overflows 64 bits");
  // Round trip: what we write, we read back the same.
  std::vector<int64_t> shape = tensor.shape();
  HostTensor copy = tensor;
  std::vector<uint8_t> encoded = encodeNpy(copy.view());
  NpyReadOptions options;
  options.uint16AsBF16 = tensor.dtype() == DType::BF16;
  std::optional<HostTensor> again =
      attempt([&] { return parseNpy(encoded, "roundtrip.npy", options); });
  if (!again)
    finding(how + ": encodeNpy output is rejected by parseNpy");
  if (!sameTensor(tensor, *again))
    finding(how + ": encodeNpy -> parseNpy changes the tensor");
}

/// A file descriptor holding the input, reopened by path as /proc/self/fd/N.
class MemoryFile {
public:
  MemoryFile() : fd_(memfd_create("pagedc-fuzz-npy", 0)) {
    if (fd_ < 0)
      std::abort();
  }
  std::string write(const uint8_t *data, size_t size) {
    if (ftruncate(fd_, 0) != 0 || lseek(fd_, 0, SEEK_SET) != 0)
      std::abort();
    for (size_t done = 0; done < size;) {
      ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0)
        std::abort();
      done += static_cast<size_t>(n);
    }
    return "/proc/self/fd/" + std::to_string(fd_);
  }

private:
  int fd_;
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static MemoryFile file;
  std::vector<uint8_t> bytes(data, data + size);
  std::string path = file.write(data, size);
  for (bool asBF16 : {false, true}) {
    NpyReadOptions options;
    options.uint16AsBF16 = asBF16;
    const char *mode = asBF16 ? " (u2 as bf16)" : "";
    std::optional<HostTensor> fromMemory =
        attempt([&] { return parseNpy(bytes, "fuzz.npy", options); });
    std::optional<HostTensor> fromFile =
        attempt([&] { return readNpy(path, options); });
    if (fromMemory.has_value() != fromFile.has_value())
      finding(std::string("parseNpy and readNpy disagree on acceptance") +
              mode);
    if (!fromMemory)
      continue;
    if (!sameTensor(*fromMemory, *fromFile))
      finding(std::string("parseNpy and readNpy read different tensors") +
              mode);
    checkTensor(*fromMemory, std::string("parseNpy") + mode);
  }
  return 0;
}
