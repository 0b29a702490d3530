# Helpers shared by every part of the build.

# pagedc_add_unittest(NAME SOURCES ... LIBS ...)
# Builds a GoogleTest binary into bin/ and registers it with ctest as
# "unit.NAME". Unit tests share one ctest entry per binary to keep ctest fast.
function(pagedc_add_unittest name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main Threads::Threads)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/test/unit)
  # Full gtest output: when a test times out, ctest shows which case was
  # running.
  add_test(NAME unit.${name} COMMAND ${name})
  set_tests_properties(unit.${name} PROPERTIES LABELS unit)
endfunction()

# Warnings we keep at zero for our own code.
function(pagedc_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
endfunction()
