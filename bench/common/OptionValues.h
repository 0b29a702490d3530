//===- OptionValues.h - Values of the benchmarks' command-line options ----===//
//
// The CPU benchmarks read `--option VALUE` pairs; a missing value or a count
// that is not a whole number in range ends the program with a usage error
// (exit 2) naming the option, rather than an uncaught exception.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_BENCH_OPTIONVALUES_H
#define PAGEDC_BENCH_OPTIONVALUES_H

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace pagedc::bench {

/// The value after argv[i] (i advances past it).
inline std::string optionValue(int argc, char **argv, int &i) {
  if (i + 1 >= argc) {
    fmt::print(stderr, "{} needs a value\n", argv[i]);
    std::exit(2);
  }
  ++i;
  return argv[i];
}

/// The whole number after argv[i], at least `least`.
inline int optionCount(int argc, char **argv, int &i, int least) {
  const std::string option = argv[i];
  const std::string text = optionValue(argc, argv, i);
  try {
    size_t used = 0;
    const int parsed = std::stoi(text, &used);
    if (used == text.size() && parsed >= least)
      return parsed;
  } catch (const std::exception &) {
  }
  fmt::print(stderr, "{} needs an integer of at least {}, got '{}'\n", option, least, text);
  std::exit(2);
}

} // namespace pagedc::bench

#endif // PAGEDC_BENCH_OPTIONVALUES_H
