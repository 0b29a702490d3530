//===- NpyTest.cpp - .npy reading and writing ------------------------------===//
#include "pagedc/Error.h"
#include "pagedc/Npy.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <unistd.h>
#include <sys/stat.h>

using namespace pagedc;

namespace {

/// A fresh path in the system temporary directory.
std::string temporaryPath(const std::string &stem) {
  return ::testing::TempDir() + "pagedc_npy_" + stem + "_" + std::to_string(::getpid()) + ".npy";
}

/// A .npy file image with the given version and header text (padded as
/// NumPy pads it) followed by `data`.
std::vector<uint8_t> npyBytes(int major, const std::string &dict, const std::vector<uint8_t> &data) {
  int lengthBytes = major == 1 ? 2 : 4;
  size_t prefix = 8 + lengthBytes;
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0)
    header.push_back(' ');
  header.push_back('\n');
  std::vector<uint8_t> bytes = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  for (int i = 0; i < lengthBytes; ++i)
    bytes.push_back(static_cast<uint8_t>(header.size() >> (8 * i)));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

std::vector<uint8_t> int32Data(std::initializer_list<int32_t> values) {
  std::vector<uint8_t> data(values.size() * 4);
  std::memcpy(data.data(), values.begin(), data.size());
  return data;
}

/// Expects parseNpy to throw an Error whose message names the file and
/// contains `problem`.
void expectError(const std::vector<uint8_t> &bytes, const std::string &problem,
                 const NpyReadOptions &options = {}) {
  try {
    parseNpy(bytes, "case.npy", options);
    ADD_FAILURE() << "no error; expected one containing '" << problem << "'";
  } catch (const Error &error) {
    std::string message = error.what();
    EXPECT_NE(message.find("case.npy"), std::string::npos) << message;
    EXPECT_NE(message.find(problem), std::string::npos) << message;
  }
}

HostTensor randomTensor(DType dtype, std::vector<int64_t> shape, std::mt19937 &rng) {
  HostTensor tensor(dtype, std::move(shape));
  auto *bytes = static_cast<uint8_t *>(tensor.data());
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t i = 0; i < tensor.numel() * static_cast<int64_t>(dtypeSize(dtype)); ++i)
    bytes[i] = static_cast<uint8_t>(byte(rng));
  if (dtype == DType::Bool)
    for (int64_t i = 0; i < tensor.numel(); ++i)
      bytes[i] &= 1;
  return tensor;
}

TEST(Npy, RoundTripsEveryDtypeAndShapeThroughAFile) {
  std::mt19937 rng(3);
  const DType dtypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16,
                          DType::I32, DType::I64, DType::U8,  DType::Bool};
  const std::vector<std::vector<int64_t>> shapes = {{}, {7}, {0}, {3, 5}, {2, 3, 1, 4}, {2, 0, 3}};
  std::string path = temporaryPath("roundtrip");
  for (DType dtype : dtypes) {
    for (const auto &shape : shapes) {
      SCOPED_TRACE(std::string(dtypeName(dtype)) + " rank " + std::to_string(shape.size()));
      HostTensor original = randomTensor(dtype, shape, rng);
      writeNpy(path, original.view());
      NpyReadOptions options;
      options.uint16AsBF16 = dtype == DType::BF16;
      options.expectDType = dtype;
      options.expectShape = shape;
      HostTensor read = readNpy(path, options);
      EXPECT_EQ(read.dtype(), dtype);
      EXPECT_EQ(read.shape(), shape);
      ASSERT_EQ(read.numel(), original.numel());
      if (original.numel() > 0) {
        EXPECT_EQ(
            std::memcmp(read.data(), original.data(), original.numel() * dtypeSize(dtype)), 0);
      }
    }
  }
  std::remove(path.c_str());
}

TEST(Npy, WritesNumPysExactHeaderLayout) {
  int32_t values[] = {1, -2, 3, 40000, 5, 6};
  std::vector<uint8_t> bytes = encodeNpy(TensorView(values, DType::I32, {2, 3}));
  std::vector<uint8_t> expected =
      npyBytes(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }",
               int32Data({1, -2, 3, 40000, 5, 6}));
  EXPECT_EQ(bytes, expected);
  EXPECT_EQ((bytes.size() - 24) % 64, 0u); // data starts on a 64-byte boundary
  float scalar = 2.5f;
  std::vector<uint8_t> scalarBytes = encodeNpy(TensorView(&scalar, DType::F32, {}));
  std::string text(scalarBytes.begin(), scalarBytes.end());
  EXPECT_NE(text.find("'shape': (), }"), std::string::npos);
  float vector[] = {1, 2};
  std::vector<uint8_t> vectorBytes = encodeNpy(TensorView(vector, DType::F32, {2}));
  std::string vectorText(vectorBytes.begin(), vectorBytes.end());
  EXPECT_NE(vectorText.find("'shape': (2,), }"), std::string::npos);
}

TEST(Npy, StridedViewsAreWrittenInCOrder) {
  // A [3, 2] transposed view of a [2, 3] buffer.
  float buffer[] = {0, 1, 2, 10, 11, 12};
  TensorView transposed(buffer, DType::F32, {3, 2}, {1, 3}, Device::cpu());
  HostTensor read = parseNpy(encodeNpy(transposed), "t.npy");
  const float expected[] = {0, 10, 1, 11, 2, 12};
  ASSERT_EQ(read.shape(), (std::vector<int64_t>{3, 2}));
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(read.dataAs<float>()[i], expected[i]);
}

TEST(Npy, ReadsVersionsTwoAndThreeAndHeaderVariants) {
  for (int major : {1, 2, 3}) {
    HostTensor t = parseNpy(
        npyBytes(major, "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }",
                 int32Data({7, 8, 9})),
        "v.npy");
    ASSERT_EQ(t.shape(), (std::vector<int64_t>{3}));
    EXPECT_EQ(t.dataAs<int32_t>()[2], 9);
  }
  // Key order, double quotes, no trailing comma, a 1-D Fortran array (the
  // same bytes as C order) and '=' (native little-endian) are all accepted.
  HostTensor t = parseNpy(
      npyBytes(1, "{\"shape\": (2,), \"fortran_order\": True, \"descr\": \"=i4\"}",
               int32Data({4, 5})),
      "k.npy");
  EXPECT_EQ(t.dataAs<int32_t>()[1], 5);
}

TEST(Npy, ReportsEachProblemWithTheFileName) {
  std::vector<uint8_t> good =
      npyBytes(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 2), }",
               int32Data({1, 2, 3, 4}));
  std::vector<uint8_t> wrongMagic = good;
  wrongMagic[1] = 'X';
  expectError(wrongMagic, "wrong magic");
  expectError({'a', 'b'}, "wrong magic");
  std::vector<uint8_t> version = good;
  version[6] = 4;
  expectError(version, "unsupported .npy version 4.0");
  expectError(npyBytes(1, "{'descr': '<i4', 'fortran_order': False}", {}), "bad header");
  expectError(npyBytes(1, "{'descr': '<i4', 'fortran_order': Maybe, 'shape': (1,)}", {}),
              "bad header");
  expectError(npyBytes(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (-1,)}", {}),
              "bad header");
  expectError(npyBytes(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (1,), 'x': 1}", {}),
              "unexpected key 'x'");
  expectError(npyBytes(1, "not a dict", {}), "bad header");
  std::vector<uint8_t> shortHeader = good;
  shortHeader.resize(20);
  expectError(shortHeader, "truncated header");
  expectError(npyBytes(1, "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 2), }",
                       int32Data({1, 2, 3, 4})),
              "Fortran");
  expectError(npyBytes(1, "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", {}),
              "unsupported dtype '<c8'");
  expectError(npyBytes(1, "{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (1,), }", {}),
              "unsupported dtype");
  expectError(npyBytes(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (1,), }", {0, 0}),
              "uint16AsBF16");
  expectError(npyBytes(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", {0, 0, 0, 0}),
              "big-endian");
  std::vector<uint8_t> truncated = good;
  truncated.pop_back();
  expectError(truncated, "truncated data");
  NpyReadOptions wantF32;
  wantF32.expectDType = DType::F32;
  expectError(good, "dtype mismatch: expected f32, the file holds i32", wantF32);
  NpyReadOptions wantShape;
  wantShape.expectShape = std::vector<int64_t>{4};
  expectError(good, "shape mismatch: expected [4], the file holds [2, 2]", wantShape);
}

TEST(Npy, FileErrorsNameThePathAndLeaveNothingBehind) {
  std::string missing = temporaryPath("does_not_exist");
  try {
    readNpy(missing);
    ADD_FAILURE() << "reading a missing file succeeded";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find(missing), std::string::npos);
  }
  float value = 1.0f;
  std::string badDirectory = "/nonexistent-pagedc-dir/x.npy";
  EXPECT_THROW(writeNpy(badDirectory, TensorView(&value, DType::F32, {1})), Error);
  std::ifstream probe(badDirectory);
  EXPECT_FALSE(probe.good());
}

} // namespace

// A zero extent makes the byte size 0, but the strides of the other extents
// must still fit int64 (TensorView refuses them, so the reader does too; the
// .npy fuzzer found the reader accepting such a shape and the view aborting).
TEST(NpyHardening, EmptyShapesWhoseStridesOverflowAreRejected) {
  for (const char *shape : {"(0, 700000760134439, 461166281)", "(3, 0, 4611686018427387904)",
                            "(4294967296, 4294967296, 0)"}) {
    const std::string dict =
        "{'descr': '<f4', 'fortran_order': False, 'shape': " + std::string(shape) + ", }";
    try {
      parseNpy(npyBytes(1, dict, {}), "empty.npy");
      ADD_FAILURE() << dict;
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find("overflows 64 bits"), std::string::npos)
          << error.what();
    }
  }
  // An empty shape whose strides fit is a valid empty tensor.
  HostTensor empty = parseNpy(
      npyBytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 1000000, 7), }", {}),
      "empty.npy");
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.view().shape()[1], 1000000);
}

// Issue 10: headers whose byte size overflows 64 bits (a sweep over dtypes
// and extents) are rejected by parseNpy and readNpy, naming the file; paths
// that are not regular files are refused, never read.
TEST(NpyHardening, ByteSizesThatOverflowAreRejected) {
  const std::pair<const char *, uint64_t> dtypes[] = {
      {"<f4", 4}, {"<f2", 2}, {"|u1", 1}, {"<f8", 8}, {"<i8", 8}, {"|b1", 1}};
  const std::vector<std::vector<uint64_t>> shapes = {
      {uint64_t(1) << 62, 4}, {uint64_t(1) << 61, 8}, {uint64_t(1) << 32, uint64_t(1) << 32},
      {1, uint64_t(1) << 62}, {3, 3, uint64_t(1) << 61}, {uint64_t(1) << 31, uint64_t(1) << 31, 4},
      {uint64_t(1) << 60}};
  const std::string path = temporaryPath("overflow");
  for (const auto &[descr, size] : dtypes)
    for (const auto &shape : shapes) {
      std::string tuple;
      unsigned __int128 bytes = size;
      for (uint64_t extent : shape) {
        tuple += std::to_string(extent) + ", ";
        bytes *= extent;
      }
      const std::string dict =
          "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': (" + tuple +
          "), }";
      const std::vector<uint8_t> image = npyBytes(1, dict, {});
      const bool overflows = bytes >= (static_cast<unsigned __int128>(1) << 63);
      const std::string expected = overflows ? "overflows 64 bits" : "truncated data";
      try {
        parseNpy(image, "mem.npy");
        ADD_FAILURE() << dict;
      } catch (const Error &error) {
        EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
      }
      {
        std::ofstream file(path, std::ios::binary | std::ios::trunc);
        file.write(reinterpret_cast<const char *>(image.data()), image.size());
      }
      try {
        readNpy(path);
        ADD_FAILURE() << dict;
      } catch (const Error &error) {
        const std::string text = error.what();
        EXPECT_NE(text.find(expected), std::string::npos) << text;
        EXPECT_NE(text.find(path), std::string::npos) << text;
      }
    }
  std::remove(path.c_str());
}

TEST(NpyHardening, NonRegularFilesAreRefused) {
  const std::string fifo = temporaryPath("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string &path : {::testing::TempDir(), std::string("/dev/zero"),
                                  std::string("/dev/null"), fifo}) {
    try {
      readNpy(path);
      ADD_FAILURE() << path;
    } catch (const Error &error) {
      const std::string text = error.what();
      EXPECT_NE(text.find("'" + path + "'"), std::string::npos) << text;
      EXPECT_TRUE(text.find("directory") != std::string::npos ||
                  text.find("not a regular file") != std::string::npos)
          << text;
    }
  }
  std::remove(fifo.c_str());
}

// The reader allocates from the header only after checking the file holds
// the data: a header declaring 2^40 floats over a tiny file is "truncated",
// never an allocation.
TEST(NpyHardening, HugeDeclaredShapeOverSmallFileIsTruncatedNotAllocated) {
  const std::string path = temporaryPath("huge");
  const std::vector<uint8_t> image =
      npyBytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }",
               {1, 2, 3, 4});
  {
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    file.write(reinterpret_cast<const char *>(image.data()), image.size());
  }
  EXPECT_THROW(readNpy(path), Error);
  EXPECT_THROW(NpyFile{path}, Error);
  std::remove(path.c_str());
}
