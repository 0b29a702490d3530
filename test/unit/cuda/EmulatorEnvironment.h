//===- EmulatorEnvironment.h - The emulated driver, every checker on -----===//
//
// Included by the CUDA tests that run on the SIMT emulator: registers a
// gtest environment that selects the emulated driver with every checker on
// (a report fails the launch) before the first test runs.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_TEST_UNIT_CUDA_EMULATORENVIRONMENT_H
#define PAGEDC_TEST_UNIT_CUDA_EMULATORENVIRONMENT_H

#include <gtest/gtest.h>

#include <cstdlib>

namespace pagedc::test {

class EmulatorEnvironment : public ::testing::Environment {
public:
  void SetUp() override {
    ::setenv("PAGEDC_CUDA_DRIVER", "emu", 1);
    ::setenv("PAGEDC_EMU_CHECKS", "all", 1);
    ::setenv("PAGEDC_EMU_QUIET", "1", 0);
  }
};

inline const ::testing::Environment *const gEmulatorEnvironment =
    ::testing::AddGlobalTestEnvironment(new EmulatorEnvironment);

} // namespace pagedc::test

#endif // PAGEDC_TEST_UNIT_CUDA_EMULATORENVIRONMENT_H
