//===- TestUtil.h - Helpers shared by the runtime unit tests ----*- C++ -*-===//
#ifndef PAGEDC_TEST_UNIT_RUNTIME_TESTUTIL_H
#define PAGEDC_TEST_UNIT_RUNTIME_TESTUTIL_H

#include "pagedc/Error.h"
#include "pagedc/Tensor.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pagedc::test {

/// A rank-1 i32 view of `values` (which must outlive it).
inline TensorView i32View(std::vector<int32_t> &values) {
  return TensorView(values.data(), DType::I32, {static_cast<int64_t>(values.size())});
}

/// A row-major i32 view of `values` with `shape`.
inline TensorView i32View(std::vector<int32_t> &values, std::vector<int64_t> shape) {
  return TensorView(values.data(), DType::I32, shape);
}

/// Runs `body` and returns the pagedc::Error message it throws, or a marker
/// that no error was thrown.
template <typename Body> std::string errorOf(Body &&body) {
  try {
    body();
  } catch (const Error &error) {
    return error.what();
  }
  return "<no error>";
}

} // namespace pagedc::test

/// Expects `statement` to throw pagedc::Error whose message contains `text`.
#define EXPECT_PAGEDC_ERROR(statement, text)                                                       \
  do {                                                                                             \
    std::string message_ = ::pagedc::test::errorOf([&] { statement; });                            \
    EXPECT_NE(message_.find(text), std::string::npos)                                              \
        << "expected an error containing \"" << (text) << "\" but got \"" << message_ << "\"";     \
  } while (0)

#endif // PAGEDC_TEST_UNIT_RUNTIME_TESTUTIL_H
