//===- BenchJson.h - Benchmark results as JSON -------------------*- C++ -*-===//
//
// Every benchmark tool builds its result as one ordered JSON document (keys
// in the order a reader expects) and writes it through the runtime's output
// writer, so a result file is written whole or not at all, every write is
// checked, and "-" is standard output as in the CLI.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_BENCH_COMMON_BENCHJSON_H
#define PAGEDC_BENCH_COMMON_BENCHJSON_H

#include "OutputFiles.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <string>

namespace pagedc::bench {

using Json = nlohmann::ordered_json;

/// `value` rounded to `decimals` places: timings carry no more digits than
/// the measurement resolves, and the file no binary-fraction noise.
inline double rounded(double value, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(value * scale) / scale;
}

/// `value` to `digits` significant digits (for errors spanning decades).
inline double significant(double value, int digits) {
  if (value == 0 || !std::isfinite(value))
    return value;
  const int decimals = digits - 1 - static_cast<int>(std::floor(std::log10(std::fabs(value))));
  return rounded(value, decimals);
}

/// Writes `document` (indented, newline-terminated) to `path`; throws
/// pagedc::Error naming `option` and the path on failure.
inline void writeJson(const std::string &option, const std::string &path, const Json &document) {
  const std::string text = document.dump(2) + "\n";
  files::writeAll({{{option, path}, {text.begin(), text.end()}}});
}

} // namespace pagedc::bench

#endif // PAGEDC_BENCH_COMMON_BENCHJSON_H
