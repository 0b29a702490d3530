//===- EmulatorEnvironment.h - The emulated driver, every checker on -----===//
//
// Included by the CUDA tests that run on the SIMT emulator: registers a
// gtest environment that selects the emulated driver with every checker on
// (a report fails the launch) before the first test runs.
//
// PAGEDC_TEST_CUDA_DRIVER=system runs the same tests on the system's NVIDIA
// driver instead (a GPU machine: the checks against float64 then hold for
// the hardware's kernels); what only the emulator can observe (its
// counters) is left out there.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_TEST_UNIT_CUDA_EMULATORENVIRONMENT_H
#define PAGEDC_TEST_UNIT_CUDA_EMULATORENVIRONMENT_H

#include <gtest/gtest.h>

#include <cstdlib>
#include <string_view>

namespace pagedc::test {

/// True unless PAGEDC_TEST_CUDA_DRIVER=system asks for the system's driver.
inline bool onEmulator() {
  const char *driver = std::getenv("PAGEDC_TEST_CUDA_DRIVER");
  return !(driver && std::string_view(driver) == "system");
}

class EmulatorEnvironment : public ::testing::Environment {
public:
  void SetUp() override {
    if (!onEmulator()) {
      ::unsetenv("PAGEDC_CUDA_DRIVER");
      return;
    }
    ::setenv("PAGEDC_CUDA_DRIVER", "emu", 1);
    ::setenv("PAGEDC_EMU_CHECKS", "all", 1);
    ::setenv("PAGEDC_EMU_QUIET", "1", 0);
  }
};

inline const ::testing::Environment *const gEmulatorEnvironment =
    ::testing::AddGlobalTestEnvironment(new EmulatorEnvironment);

} // namespace pagedc::test

#endif // PAGEDC_TEST_UNIT_CUDA_EMULATORENVIRONMENT_H
