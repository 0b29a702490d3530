//===- CorpusSupport.h - The corpus cases and their random bindings -*- C++ -*-===//
//
// Shared by the corpus matrices (CPU backend, CUDA kernels on the emulator):
// every mod of examples/*.attn as a test case, and buffers / params bound
// with values that make sense for what each corpus buffer indexes.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_TEST_UNIT_JIT_CORPUSSUPPORT_H
#define PAGEDC_TEST_UNIT_JIT_CORPUSSUPPORT_H

#include "pagedc/Mods.h"
#include "pagedc/Tensor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace corpus {

/// One case of the matrix: a mask and/or a score mod of one corpus file.
struct CorpusCase {
  std::string file; ///< path of the .attn file
  std::string mask;
  std::string score;
};

/// Readable test names in gtest's failure messages.
inline void PrintTo(const CorpusCase &c, std::ostream *os) {
  *os << std::filesystem::path(c.file).filename().string() << " mask '"
      << c.mask << "' score '" << c.score << "'";
}

inline std::string readFile(const std::string &path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Every mod of every corpus file alone, plus the first mask with the first
/// score of files that have both. Mods are found with a line scan here (the
/// test then checks the list against the front end's).
inline std::vector<CorpusCase> corpusCases() {
  std::vector<std::string> files;
  for (const auto &entry :
       std::filesystem::directory_iterator(PAGEDC_EXAMPLES_DIR))
    if (entry.path().extension() == ".attn")
      files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  std::regex modLine(R"(^(mask|score)\s+([A-Za-z_][A-Za-z0-9_]*)\s*\()");
  std::vector<CorpusCase> cases;
  for (const std::string &file : files) {
    std::istringstream lines(readFile(file));
    std::string line, firstMask, firstScore;
    std::smatch match;
    while (std::getline(lines, line)) {
      if (!std::regex_search(line, match, modLine))
        continue;
      bool isMask = match[1] == "mask";
      std::string name = match[2];
      cases.push_back({file, isMask ? name : "", isMask ? "" : name});
      std::string &first = isMask ? firstMask : firstScore;
      if (first.empty())
        first = name;
    }
    if (!firstMask.empty() && !firstScore.empty())
      cases.push_back({file, firstMask, firstScore});
  }
  return cases;
}

inline std::string caseName(const ::testing::TestParamInfo<CorpusCase> &info) {
  std::string stem = std::filesystem::path(info.param.file).stem().string();
  std::string name = stem + "__" + (info.param.mask.empty() ? "nomask" : info.param.mask) +
                     "__" + (info.param.score.empty() ? "noscore" : info.param.score);
  for (char &c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)))
      c = '_';
  return name;
}

//===----------------------------------------------------------------------===//
// Random bindings with sensible values
//===----------------------------------------------------------------------===//

/// The sizes bindings are made for.
struct Extents {
  int64_t batch, heads, positions;
};

/// Buffers and params for one compiled selection, filled at random. Float
/// buffers are uniform in [-1.5, 1.5]; integer buffers need a recipe that
/// knows what their values index (document ids, offsets, lengths), and a
/// buffer without one fails the test so that new corpus files get one.
class RandomBindings {
public:
  RandomBindings(const pagedc::CompiledMods &mods, const Extents &extents,
                 std::mt19937 &random) {
    std::map<std::string, std::vector<int32_t>> documentStarts;
    for (const pagedc::BufferDecl &decl : mods.buffers) {
      std::vector<int64_t> shape;
      for (const pagedc::BufferDim &dim : decl.dims) {
        if (dim.kind == pagedc::BufferDim::Fixed)
          shape.push_back(dim.size);
        else if (dim.kind == pagedc::BufferDim::Named)
          shape.push_back(dim.name == "B"   ? extents.batch
                          : dim.name == "H" ? extents.heads
                                            : extents.positions);
        else
          shape.push_back(-1); // decided by the recipe below
      }
      storage_.emplace_back();
      pagedc::HostTensor &tensor = storage_.back();
      if (decl.name == "document_id" || decl.name == "doc") {
        // Sorted document ids per batch row; documents of 1..40 tokens.
        tensor = pagedc::HostTensor(pagedc::DType::I32, shape);
        int64_t rows = shape.size() == 2 ? shape[0] : 1;
        int64_t length = shape.back();
        auto *ids = tensor.dataAs<int32_t>();
        for (int64_t r = 0; r < rows; ++r) {
          int32_t id = 0, left = 0;
          std::vector<int32_t> &starts = documentStarts[decl.name];
          for (int64_t s = 0; s < length; ++s) {
            if (left == 0) {
              if (s > 0)
                ++id;
              left = std::uniform_int_distribution<int32_t>(1, 40)(random);
              if (r == 0)
                starts.push_back(static_cast<int32_t>(s));
            }
            --left;
            ids[r * length + s] = id;
          }
        }
      } else if (decl.name == "offsets") {
        // Start position of each document of document_id (declared first).
        const std::vector<int32_t> &starts = documentStarts["document_id"];
        if (starts.empty()) {
          ADD_FAILURE() << "offsets needs document_id declared first";
          return;
        }
        tensor = pagedc::HostTensor(pagedc::DType::I32,
                                    {static_cast<int64_t>(starts.size())});
        std::copy(starts.begin(), starts.end(), tensor.dataAs<int32_t>());
      } else if (decl.name == "kv_len") {
        // Valid lengths per batch entry; 0 for the second one, which masks
        // every one of its rows.
        tensor = pagedc::HostTensor(pagedc::DType::I32, shape);
        for (int64_t b = 0; b < shape[0]; ++b)
          tensor.dataAs<int32_t>()[b] =
              b == 1 ? 0
                     : std::uniform_int_distribution<int32_t>(
                           1, static_cast<int32_t>(extents.positions))(random);
      } else if (decl.elementType == pagedc::DType::F32 ||
                 decl.elementType == pagedc::DType::F16 ||
                 decl.elementType == pagedc::DType::BF16) {
        for (int64_t &size : shape)
          if (size < 0)
            size = 4096; // `?`: larger than any index the small shapes make
        tensor = pagedc::HostTensor(decl.elementType, shape);
        std::uniform_real_distribution<float> uniform(-1.5f, 1.5f);
        for (int64_t i = 0; i < tensor.numel(); ++i) {
          float value = uniform(random);
          if (decl.elementType == pagedc::DType::F32)
            tensor.dataAs<float>()[i] = value;
          else if (decl.elementType == pagedc::DType::F16)
            tensor.dataAs<uint16_t>()[i] = pagedc::floatToHalf(value);
          else
            tensor.dataAs<uint16_t>()[i] = pagedc::floatToBF16(value);
        }
      } else {
        ADD_FAILURE() << "no binding recipe for buffer '" << decl.name
                      << "' of type " << pagedc::dtypeName(decl.elementType)
                      << ": add one to CorpusMatrixTest.cpp";
        return;
      }
      PagedcBufferRef ref{};
      ref.data = tensor.data();
      int64_t stride = 1;
      for (int d = static_cast<int>(tensor.shape().size()) - 1; d >= 0; --d) {
        ref.sizes[d] = tensor.shape()[d];
        ref.strides[d] = stride;
        stride *= tensor.shape()[d];
      }
      buffers_.push_back(ref);
    }
    for (const pagedc::ParamDecl &decl : mods.params) {
      PagedcParamSlot slot{};
      if (decl.name == "softcap")
        slot.f32 = 2.5f; // small enough for tanh to bend the scores
      else if (decl.defaultValue && decl.type == pagedc::ScalarKind::F32)
        slot.f32 = decl.defaultValue->f32;
      else if (decl.defaultValue && decl.type == pagedc::ScalarKind::I32)
        slot.i32 = decl.defaultValue->i32;
      else if (decl.defaultValue)
        slot.i32 = decl.defaultValue->boolean ? 1 : 0;
      else {
        ADD_FAILURE() << "no value for param '" << decl.name << "'";
        return;
      }
      params_.push_back(slot);
    }
    context_ = {buffers_.data(), params_.data()};
    complete_ = true;
  }

  /// False when a buffer or param could not be bound (a failure was added).
  bool complete() const { return complete_; }
  const PagedcModContext *context() const { return &context_; }

private:
  std::vector<pagedc::HostTensor> storage_;
  std::vector<PagedcBufferRef> buffers_;
  std::vector<PagedcParamSlot> params_;
  PagedcModContext context_{nullptr, nullptr};
  bool complete_ = false;
};

} // namespace corpus

#endif // PAGEDC_TEST_UNIT_JIT_CORPUSSUPPORT_H
