//===- BenchArgs.h - Command lines of the Google Benchmark binaries -------===//
//
// The JIT latency benchmarks print their own table first and then run a few
// Google Benchmark cases. Their command line is read before any work:
// --help prints what the binary measures, an argument neither it nor Google
// Benchmark knows is an error; otherwise the measurement would run (and
// write its results file) before Google Benchmark saw the arguments.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_BENCH_BENCHARGS_H
#define PAGEDC_BENCH_BENCHARGS_H

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cstdio>
#include <string>

namespace pagedc::bench {

/// Returns -1 to go on, else the exit status (0 after --help, 2 for an
/// unknown argument). `about` says what the binary measures and writes.
inline int readBenchmarkArgs(int &argc, char **argv, const char *name, const char *about) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      fmt::print("usage: {} [--benchmark_* flags of Google Benchmark] [--help]\n\n{}\n"
                 "\nThe flags of Google Benchmark (for example --benchmark_filter=REGEX,\n"
                 "--benchmark_repetitions=N) apply to the in-process benchmarks run after\n"
                 "the table.\n",
                 name, about);
      return 0;
    }
  }
  benchmark::Initialize(&argc, argv);
  if (argc > 1) {
    fmt::print(stderr, "{}: unknown argument '{}' (--help lists what it takes)\n", name,
               argv[1]);
    return 2;
  }
  return -1;
}

} // namespace pagedc::bench

#endif // PAGEDC_BENCH_BENCHARGS_H
