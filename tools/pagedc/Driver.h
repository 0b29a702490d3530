//===- Driver.h - Option table, emit stages and subcommands ----*- C++ -*-===//
//
// The pagedc command line is assembled from tables so that each part of the
// compiler adds its own options, `--emit=` stages and subcommands without
// touching the others' code:
//
//   void registerCudaStages(pagedc::driver::Registry &registry) {
//     registry.addOption({"--arch", "SM", "GPU architecture, e.g. sm_90",
//                         pagedc::driver::storeExtra("arch")});
//     registry.addStage({"cuda", "CUDA source of the kernel", runCudaStage});
//   }
//
// and one call of that function in main() (pagedc.cpp). Values of added
// options land in Options::extra (by key); stages read them from there.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_TOOLS_DRIVER_H
#define PAGEDC_TOOLS_DRIVER_H

#include "Frontend/Frontend.h"

#include "llvm/Support/raw_ostream.h"

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pagedc {
namespace driver {

/// Exit statuses of pagedc.
enum ExitCode : int {
  kExitSuccess = 0,
  kExitInputError = 1, ///< bad .attn input, unreadable file, failed compilation
  kExitUsageError = 2, ///< bad command line
};

/// Everything the command line says.
struct Options {
  std::string inputPath;        ///< "-" reads stdin
  std::string outputPath = "-"; ///< "-" writes stdout
  std::string emit = "lowered"; ///< the --emit stage
  std::vector<ConstOverride> constOverrides;
  std::string maskName;  ///< --mask (empty: not given)
  std::string scoreName; ///< --score (empty: not given)
  /// Values of options registered by other parts, by key.
  std::map<std::string, std::string> extra;
};

/// Applies an option's value to Options; returns an error message (a usage
/// error) or an empty string.
using OptionHandler =
    std::function<std::string(Options &, llvm::StringRef value)>;

/// One command-line option.
struct OptionSpec {
  /// "--emit", "-o", "-D": long options take `--name=V` or `--name V`,
  /// short ones `-oV` or `-o V`.
  std::string name;
  /// Shown in --help ("PATH"); empty for a flag without a value.
  std::string valueName;
  std::string help;
  OptionHandler apply;
};

/// Handler that stores the value in Options::extra[key].
OptionHandler storeExtra(std::string key);

/// The compilation state stages share: the input, diagnostics, the checked
/// program. Stages run after the front end succeeded (except "tokens").
struct Compilation {
  const Options &options;
  DiagnosticEngine &diags;
  std::unique_ptr<ast::Program> program;
};

/// One `--emit=NAME` stage: writes its output to `os` and returns an exit
/// code. Errors go to llvm::errs(); nothing written to `os` is kept on failure.
struct EmitStage {
  std::string name;
  std::string help;
  /// True for stages that need the checked program (all but "tokens").
  bool needsProgram = true;
  std::function<int(Compilation &, llvm::raw_ostream &os)> run;
  /// The stage writes Options::outputPath itself (a directory, e.g. a kernel
  /// bundle); the driver then writes nothing.
  bool writesOutputPath = false;
};

/// `pagedc NAME ARGS...`: a subcommand gets the arguments after its name.
struct Subcommand {
  std::string name;
  std::string help;
  std::function<int(llvm::ArrayRef<const char *> args)> run;
};

/// The tables of options, stages and subcommands.
class Registry {
public:
  void addOption(OptionSpec option) { options.push_back(std::move(option)); }
  void addStage(EmitStage stage) { stages.push_back(std::move(stage)); }
  void addSubcommand(Subcommand subcommand) {
    subcommands.push_back(std::move(subcommand));
  }

  const std::vector<OptionSpec> &getOptions() const { return options; }
  const std::vector<EmitStage> &getStages() const { return stages; }
  const std::vector<Subcommand> &getSubcommands() const { return subcommands; }
  const EmitStage *findStage(llvm::StringRef name) const;
  const Subcommand *findSubcommand(llvm::StringRef name) const;

private:
  std::vector<OptionSpec> options;
  std::vector<EmitStage> stages;
  std::vector<Subcommand> subcommands;
};

/// Registers --emit, -o, -D, --mask, --score (help and version are built in).
void registerCoreOptions(Registry &registry);
/// Registers the front-end stages: tokens, ast.
void registerFrontendStages(Registry &registry);
/// Registers the MLIR stages (mlir, lowered) when this build has MLIRGen and
/// the pipeline; otherwise does nothing.
void registerMLIRStages(Registry &registry);
/// Registers the CUDA stages (cuda, ptx, cubin, bundle) and their options
/// (tools/pagedc/CudaStages.cpp; built when the CUDA code generator is).
void registerCudaStages(Registry &registry);

/// Runs pagedc with the given registry: parses `argv`, dispatches
/// subcommands, runs the front end and the selected stage, writes the output
/// atomically. Returns the exit code.
int runDriver(const Registry &registry, int argc, const char **argv);

/// Checks --mask/--score against the program: a named mod must exist and be
/// of the right kind. Reports to diags and returns false on error.
bool checkModSelection(const Options &options, const ast::Program &program,
                       DiagnosticEngine &diags);

} // namespace driver
} // namespace pagedc

#endif // PAGEDC_TOOLS_DRIVER_H
