//===- Error.h - Errors reported by the pagedc runtime ---------*- C++ -*-===//
//
// The runtime reports bad input by throwing pagedc::Error. Every check runs
// before any state is changed or any work is launched, so a caught Error means
// nothing happened.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_ERROR_H
#define PAGEDC_ERROR_H

#include <stdexcept>
#include <string>

namespace pagedc {

/// The one exception type the runtime throws for invalid input or an
/// exhausted resource. The message names the problem and the values involved.
class Error : public std::runtime_error {
public:
  explicit Error(const std::string &message) : std::runtime_error(message) {}
};

} // namespace pagedc

#endif // PAGEDC_ERROR_H
