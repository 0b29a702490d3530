//===- SettingsTest.cpp - The emulator's PAGEDC_EMU_* settings ------------===//
//
// Every variable of the table (Settings.cpp) refuses a value that does not
// parse, naming the variable, the value and the valid values; valid values
// give the settings they always gave. Then the emulated driver itself:
// cuInit fails, printing why, on such a value, and initialises once the
// value is fixed.
//
//===----------------------------------------------------------------------===//

#include "pagedc-emu/Settings.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include <dlfcn.h>

namespace {

using namespace pagedc::emu;

std::optional<Settings> parse(const std::map<std::string, std::string> &variables,
                              std::string *error) {
  return parseSettings(
      [&](const char *name) -> const char * {
        auto found = variables.find(name);
        return found == variables.end() ? nullptr : found->second.c_str();
      },
      error);
}

std::string valuesOf(const std::string &variable) {
  for (const SettingInfo &info : settingInfos())
    if (variable == info.variable)
      return info.values;
  ADD_FAILURE() << variable << " is not in the table";
  return "";
}

/// Values that must be refused, per variable.
const std::multimap<std::string, std::string> kGarbage = {
    {"PAGEDC_EMU_CHECKS", "racechek"},
    {"PAGEDC_EMU_CHECKS", "memcheck,,synccheck"},
    {"PAGEDC_EMU_CHECKS", "memcheck,racecheck,initchek"},
    {"PAGEDC_EMU_CHECKS", "All"},
    {"PAGEDC_EMU_THREADS", "four"},
    {"PAGEDC_EMU_THREADS", "0"},
    {"PAGEDC_EMU_THREADS", "257"},
    {"PAGEDC_EMU_THREADS", "8 "},
    {"PAGEDC_EMU_MULTIPROCESSORS", "lots"},
    {"PAGEDC_EMU_MULTIPROCESSORS", "0"},
    {"PAGEDC_EMU_MULTIPROCESSORS", "1025"},
    {"PAGEDC_EMU_MULTIPROCESSORS", "-4"},
    {"PAGEDC_EMU_REGISTERS", "pagedc_decode"},
    {"PAGEDC_EMU_REGISTERS", "pagedc_decode=0"},
    {"PAGEDC_EMU_REGISTERS", "pagedc_decode=256"},
    {"PAGEDC_EMU_REGISTERS", "pagedc_decode=96,"},
    {"PAGEDC_EMU_REGISTERS", "=96"},
    {"PAGEDC_EMU_SAMPLE_BLOCKS", "-1"},
    {"PAGEDC_EMU_SAMPLE_BLOCKS", "32blocks"},
    {"PAGEDC_EMU_SAMPLE_KERNELS", "pagedc_prefill,,pagedc_decode"},
    {"PAGEDC_EMU_SAMPLE_KERNELS", "pagedc prefill"},
    {"PAGEDC_EMU_QUIET", "yes"},
    {"PAGEDC_EMU_QUIET", "2"},
    {"PAGEDC_EMU_REPORT", "/nonexistent-pagedc-directory/reports.jsonl"},
    {"PAGEDC_EMU_COUNTERS", "/nonexistent-pagedc-directory/counters.jsonl"},
    // Directories pass access(W_OK) but take no appended lines.
    {"PAGEDC_EMU_REPORT", "/"},
    {"PAGEDC_EMU_COUNTERS", "/tmp"},
};

TEST(EmulatorSettings, EveryVariableRefusesGarbageWithTheValidValues) {
  std::set<std::string> covered;
  for (const auto &[variable, value] : kGarbage) {
    std::string error;
    EXPECT_FALSE(parse({{variable, value}}, &error)) << variable << "=" << value;
    EXPECT_NE(error.find(variable + " is '" + value + "'"), std::string::npos) << error;
    EXPECT_NE(error.find("expected " + valuesOf(variable)), std::string::npos) << error;
    covered.insert(variable);
  }
  for (const SettingInfo &info : settingInfos())
    EXPECT_TRUE(covered.count(info.variable)) << info.variable << " has no refused value here";
  // The checkers' names are the valid values of PAGEDC_EMU_CHECKS.
  std::string error;
  parse({{"PAGEDC_EMU_CHECKS", "racechek"}}, &error);
  for (const char *checker : {"memcheck", "racecheck", "initcheck", "synccheck"})
    EXPECT_NE(error.find(checker), std::string::npos) << error;
  EXPECT_NE(error.find("unknown checker 'racechek'"), std::string::npos) << error;
}

TEST(EmulatorSettings, AllRefusalsAreReportedTogether) {
  std::string error;
  EXPECT_FALSE(parse({{"PAGEDC_EMU_CHECKS", "racechek"}, {"PAGEDC_EMU_THREADS", "x"}}, &error));
  EXPECT_NE(error.find("PAGEDC_EMU_CHECKS"), std::string::npos) << error;
  EXPECT_NE(error.find("PAGEDC_EMU_THREADS"), std::string::npos) << error;
}

TEST(EmulatorSettings, ValidValuesKeepTheirMeaning) {
  std::string error;
  std::optional<Settings> defaults = parse({}, &error);
  ASSERT_TRUE(defaults) << error;
  EXPECT_TRUE(defaults->checks.memcheck && defaults->checks.racecheck &&
              defaults->checks.initcheck && defaults->checks.synccheck);
  EXPECT_EQ(defaults->threads, 0u);
  EXPECT_EQ(defaults->multiprocessors, 0);
  EXPECT_EQ(defaults->sampleBlocksOf("pagedc_prefill"), 0u);
  EXPECT_EQ(defaults->registersOf("pagedc_decode", 128), 128);
  EXPECT_FALSE(defaults->quiet);

  // An empty value is unset.
  std::optional<Settings> empty =
      parse({{"PAGEDC_EMU_CHECKS", ""}, {"PAGEDC_EMU_THREADS", ""}}, &error);
  ASSERT_TRUE(empty) << error;
  EXPECT_TRUE(empty->checks.racecheck);

  std::optional<Settings> some =
      parse({{"PAGEDC_EMU_CHECKS", "racecheck,initcheck"},
             {"PAGEDC_EMU_THREADS", "4"},
             {"PAGEDC_EMU_MULTIPROCESSORS", "3"},
             {"PAGEDC_EMU_REGISTERS", "pagedc_decode=96,pagedc_prefill=168"},
             {"PAGEDC_EMU_SAMPLE_BLOCKS", "32"},
             {"PAGEDC_EMU_SAMPLE_KERNELS", "pagedc_prefill"},
             {"PAGEDC_EMU_REPORT", "/tmp/reports.jsonl"},
             {"PAGEDC_EMU_QUIET", "1"}},
            &error);
  ASSERT_TRUE(some) << error;
  EXPECT_FALSE(some->checks.memcheck);
  EXPECT_TRUE(some->checks.racecheck);
  EXPECT_TRUE(some->checks.initcheck);
  EXPECT_FALSE(some->checks.synccheck);
  EXPECT_EQ(some->threads, 4u);
  EXPECT_EQ(some->multiprocessors, 3);
  EXPECT_EQ(some->registersOf("pagedc_decode", 128), 96);
  EXPECT_EQ(some->registersOf("pagedc_prefill", 128), 168);
  EXPECT_EQ(some->registersOf("pagedc_merge", 128), 128);
  EXPECT_EQ(some->sampleBlocksOf("pagedc_prefill"), 32u);
  EXPECT_EQ(some->sampleBlocksOf("pagedc_block_mask"), 0u);
  EXPECT_EQ(some->reportPath, "/tmp/reports.jsonl");
  EXPECT_TRUE(some->quiet);

  std::optional<Settings> none =
      parse({{"PAGEDC_EMU_CHECKS", "none"}, {"PAGEDC_EMU_QUIET", "0"}}, &error);
  ASSERT_TRUE(none) << error;
  EXPECT_FALSE(none->checks.memcheck || none->checks.racecheck || none->checks.initcheck ||
               none->checks.synccheck);
  EXPECT_FALSE(none->quiet);
  std::optional<Settings> all = parse({{"PAGEDC_EMU_CHECKS", "all"}}, &error);
  ASSERT_TRUE(all) << error;
  EXPECT_TRUE(all->checks.synccheck);
}

/// The emulated driver, opened as the runtime opens it.
class EmulatedDriverInit : public ::testing::Test {
protected:
  void SetUp() override {
    library_ = dlopen(PAGEDC_EMU_DRIVER_PATH, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(library_, nullptr) << dlerror();
    init_ = reinterpret_cast<int (*)(unsigned)>(dlsym(library_, "cuInit"));
    errorString_ =
        reinterpret_cast<int (*)(int, const char **)>(dlsym(library_, "cuGetErrorString"));
    ASSERT_TRUE(init_ && errorString_);
  }
  void TearDown() override {
    if (library_)
      dlclose(library_);
  }
  void *library_ = nullptr;
  int (*init_)(unsigned) = nullptr;
  int (*errorString_)(int, const char **) = nullptr;
};

TEST_F(EmulatedDriverInit, FailsOnGarbageAndSaysWhy) {
  for (const auto &[variable, value] : kGarbage) {
    ::setenv(variable.c_str(), value.c_str(), 1);
    ::testing::internal::CaptureStderr();
    const int status = init_(0);
    const std::string printed = ::testing::internal::GetCapturedStderr();
    ::unsetenv(variable.c_str());
    EXPECT_EQ(status, 1) << variable << "=" << value << ": CUDA_ERROR_INVALID_VALUE expected";
    EXPECT_NE(printed.find(variable + " is '" + value + "'"), std::string::npos) << printed;
    EXPECT_NE(printed.find(valuesOf(variable)), std::string::npos) << printed;
    const char *text = nullptr;
    errorString_(status, &text);
    ASSERT_NE(text, nullptr);
    EXPECT_NE(std::string(text).find(variable), std::string::npos) << text;
  }
  // Fixed, the same process initialises.
  ::setenv("PAGEDC_EMU_CHECKS", "memcheck,synccheck", 1);
  ::setenv("PAGEDC_EMU_MULTIPROCESSORS", "4", 1);
  EXPECT_EQ(init_(0), 0);
  auto attribute =
      reinterpret_cast<int (*)(int *, int, int)>(dlsym(library_, "cuDeviceGetAttribute"));
  int multiprocessors = 0;
  EXPECT_EQ(attribute(&multiprocessors, 16, 0), 0);
  EXPECT_EQ(multiprocessors, 4);
  ::unsetenv("PAGEDC_EMU_CHECKS");
  ::unsetenv("PAGEDC_EMU_MULTIPROCESSORS");
  EXPECT_EQ(attribute(&multiprocessors, 16, 0), 0);
  EXPECT_EQ(multiprocessors, 132);
}

} // namespace
