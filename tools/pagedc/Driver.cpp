//===- Driver.cpp - The pagedc command line -------------------------------===//

#include "Driver.h"

#include "OutputFiles.h"
#include "pagedc/Error.h"
#include "pagedc/ProgramFile.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Config/llvm-config.h"

#include <algorithm>

using namespace pagedc;
using namespace pagedc::driver;

#ifndef PAGEDC_VERSION
#define PAGEDC_VERSION "unknown"
#endif

namespace {

/// A usage error: one line, a hint to --help, exit status 2.
int usageError(const llvm::Twine &message) {
  llvm::errs() << "pagedc: error: " << message << "\n"
               << "Run 'pagedc --help' for usage.\n";
  return kExitUsageError;
}

bool isIdentifier(llvm::StringRef text) {
  if (text.empty() ||
      !(std::isalpha(static_cast<unsigned char>(text[0])) || text[0] == '_'))
    return false;
  return llvm::all_of(text, [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

std::string defaultStage(const Registry &registry) {
  if (registry.findStage("lowered"))
    return "lowered";
  return registry.getStages().empty() ? std::string()
                                      : registry.getStages().back().name;
}

void printHelp(const Registry &registry, llvm::raw_ostream &os) {
  os << "OVERVIEW: pagedc - compiles attention mods written in the .attn "
        "language\n\n"
     << "USAGE: pagedc [options] FILE.attn      (FILE '-' reads standard "
        "input)\n";
  for (const Subcommand &subcommand : registry.getSubcommands())
    os << "       pagedc " << subcommand.name << " ...   " << subcommand.help
       << "\n";
  os << "\nOPTIONS:\n";
  auto row = [&](const std::string &left, const std::string &help) {
    os << "  " << left;
    if (left.size() < 22)
      os.indent(22 - left.size());
    else
      os << "\n" << std::string(24, ' ');
    os << help << "\n";
  };
  for (const OptionSpec &option : registry.getOptions()) {
    std::string left = option.name;
    if (!option.valueName.empty())
      left += (llvm::StringRef(option.name).starts_with("--") ? "=" : " ") +
              option.valueName;
    row(left, option.help);
    if (option.name == "--emit") {
      for (const EmitStage &stage : registry.getStages())
        os << std::string(26, ' ') << stage.name
           << std::string(stage.name.size() < 9 ? 9 - stage.name.size() : 1,
                          ' ')
           << stage.help
           << (stage.name == defaultStage(registry) ? " (default)" : "")
           << "\n";
    }
  }
  row("-h, --help", "Print this help and exit");
  row("--version", "Print the version and exit");
  os << "\nA program is at most " << kMaxProgramText
     << "; a larger FILE, or more\n"
     << "than that on standard input, is an error.\n"
     << "PATH '-' or /dev/stdout is standard output; devices and FIFOs are "
        "written in place,\n"
     << "a symlink's target is replaced, and an output that is the input is "
        "refused.\n";
  os << "\nEXIT STATUS: 0 on success, 1 when the input has errors or cannot be "
        "read or\n"
     << "written (no output file is written), 2 on a usage error.\n";
}

} // namespace

OptionHandler pagedc::driver::storeExtra(std::string key) {
  return [key](Options &options, llvm::StringRef value) {
    options.extra[key] = value.str();
    return std::string();
  };
}

const EmitStage *Registry::findStage(llvm::StringRef name) const {
  for (const EmitStage &stage : stages)
    if (stage.name == name)
      return &stage;
  return nullptr;
}

const Subcommand *Registry::findSubcommand(llvm::StringRef name) const {
  for (const Subcommand &subcommand : subcommands)
    if (subcommand.name == name)
      return &subcommand;
  return nullptr;
}

void pagedc::driver::registerCoreOptions(Registry &registry) {
  registry.addOption({"--emit", "STAGE",
                      "What to write (default: lowered, or the last stage this "
                      "build has):",
                      [](Options &options, llvm::StringRef value) {
                        options.emit = value.str();
                        return std::string();
                      }});
  registry.addOption({"-o", "PATH",
                      "Write the output to PATH (default: standard output)",
                      [](Options &options, llvm::StringRef value) {
                        if (value.empty())
                          return std::string("-o needs a non-empty PATH");
                        options.outputPath = value.str();
                        return std::string();
                      }});
  registry.addOption(
      {"-D", "NAME=VALUE",
       "Override constant NAME with an int or float VALUE (repeatable)",
       [](Options &options, llvm::StringRef value) {
         auto [name, number] = value.split('=');
         if (!value.contains('=') || !isIdentifier(name))
           return "-D expects NAME=VALUE, got '" + value.str() + "'";
         ast::ConstantValue parsed;
         std::string reason;
         if (!parseOverrideValue(number, parsed, &reason))
           return "-D " + value.str() + ": the value '" + number.str() + "' " +
                  reason;
         options.constOverrides.push_back({name.str(), number.str()});
         return std::string();
       }});
  registry.addOption(
      {"--mask", "NAME", "Select the mask mod NAME (must exist in the file)",
       [](Options &options, llvm::StringRef value) {
         if (!isIdentifier(value))
           return "--mask expects a mod name, got '" + value.str() + "'";
         options.maskName = value.str();
         return std::string();
       }});
  registry.addOption(
      {"--score", "NAME", "Select the score mod NAME (must exist in the file)",
       [](Options &options, llvm::StringRef value) {
         if (!isIdentifier(value))
           return "--score expects a mod name, got '" + value.str() + "'";
         options.scoreName = value.str();
         return std::string();
       }});
}

void pagedc::driver::registerFrontendStages(Registry &registry) {
  registry.addStage({"tokens", "the tokens, one per line",
                     /*needsProgram=*/false,
                     [](Compilation &compilation, llvm::raw_ostream &os) {
                       std::vector<Token> tokens = lex(compilation.diags);
                       if (compilation.diags.hasErrors())
                         return int(kExitInputError);
                       dumpTokens(tokens, os);
                       return int(kExitSuccess);
                     }});
  registry.addStage({"ast", "the checked syntax tree, with types",
                     /*needsProgram=*/true,
                     [](Compilation &compilation, llvm::raw_ostream &os) {
                       dumpAST(*compilation.program, os);
                       return int(kExitSuccess);
                     }});
}

bool pagedc::driver::checkModSelection(const Options &options,
                                       const ast::Program &program,
                                       DiagnosticEngine &diags) {
  bool ok = true;
  auto check = [&](const std::string &name, bool wantMask) {
    if (name.empty())
      return;
    llvm::StringRef option = wantMask ? "--mask" : "--score";
    const ast::ModDecl *mod = program.findMod(name);
    if (!mod) {
      diags.error(option + "=" + name + ": there is no mod named '" + name +
                  "'");
      ok = false;
    } else if (mod->isMask() != wantMask) {
      diags.error(option + "=" + name + ": '" + name + "' is a " +
                  (mod->isMask() ? "mask" : "score") + " mod, not a " +
                  (wantMask ? "mask" : "score") + " mod");
      ok = false;
    }
  };
  check(options.maskName, /*wantMask=*/true);
  check(options.scoreName, /*wantMask=*/false);
  return ok;
}

int pagedc::driver::runDriver(const Registry &registry, int argc,
                              const char **argv) {
  llvm::ArrayRef<const char *> args(argv + 1, argv + std::max(argc, 1));
  if (!args.empty()) {
    if (const Subcommand *subcommand = registry.findSubcommand(args.front()))
      return subcommand->run(args.drop_front());
  }

  Options options;
  options.emit = defaultStage(registry);
  std::vector<std::string> inputs;
  bool optionsDone = false;
  for (size_t i = 0; i < args.size(); ++i) {
    llvm::StringRef arg = args[i];
    if (optionsDone || arg == "-" || !arg.starts_with("-")) {
      inputs.push_back(arg.str());
      continue;
    }
    if (arg == "--") {
      optionsDone = true;
      continue;
    }
    if (arg == "--help" || arg == "-h" || arg == "-help") {
      printHelp(registry, llvm::outs());
      return kExitSuccess;
    }
    if (arg == "--version") {
      llvm::outs() << "pagedc version " << PAGEDC_VERSION << " (LLVM/MLIR "
                   << LLVM_VERSION_STRING << ")\n";
      return kExitSuccess;
    }

    // Find the option: `--name=value`, `--name value`, `-Xvalue`, `-X value`.
    const OptionSpec *match = nullptr;
    std::optional<std::string> value;
    for (const OptionSpec &option : registry.getOptions()) {
      llvm::StringRef name = option.name;
      if (arg == name) {
        match = &option;
        break;
      }
      if (name.starts_with("--") && arg.starts_with(name) &&
          arg[name.size()] == '=') {
        match = &option;
        value = arg.drop_front(name.size() + 1).str();
        break;
      }
      if (!name.starts_with("--") && name.size() == 2 &&
          arg.starts_with(name) && !option.valueName.empty()) {
        match = &option;
        value = arg.drop_front(2).str();
        break;
      }
    }
    if (!match)
      return usageError("unknown option '" + arg + "'");
    if (match->valueName.empty()) {
      if (value)
        return usageError("option '" + match->name + "' takes no value");
      value = std::string();
    } else if (!value) {
      if (i + 1 >= args.size())
        return usageError("option '" + match->name + "' needs a value (" +
                          match->valueName + ")");
      value = args[++i];
    }
    std::string error = match->apply(options, *value);
    if (!error.empty())
      return usageError(error);
  }

  if (inputs.empty())
    return usageError(
        "no input file (give FILE.attn, or '-' for standard input)");
  if (inputs.size() > 1)
    return usageError("more than one input file ('" + inputs[0] + "', '" +
                      inputs[1] + "')");
  options.inputPath = inputs.front();
  const EmitStage *stage = registry.findStage(options.emit);
  if (!stage) {
    std::string known;
    for (const EmitStage &candidate : registry.getStages())
      known += (known.empty() ? "" : ", ") + candidate.name;
    return usageError("unknown --emit stage '" + options.emit +
                      "' (this build has: " + known + ")");
  }

  // An output that must not be written (the input itself, a directory, a
  // directory that refuses files) fails before any work. A stage that
  // writes a directory checks its own.
  const std::vector<files::NamedPath> outputs = {{"-o", options.outputPath}};
  if (!stage->writesOutputPath) {
    try {
      files::checkOutputs(outputs, {{"FILE", options.inputPath}});
    } catch (const Error &error) {
      llvm::errs() << "pagedc: error: " << error.what() << "\n";
      return kExitInputError;
    }
  }

  // Read the input, at most kMaxProgramBytes of it.
  std::string input;
  std::string readError = readProgramFile(options.inputPath, input);
  if (!readError.empty()) {
    llvm::errs() << "pagedc: error: " << readError << "\n";
    return kExitInputError;
  }
  DiagnosticEngine diags(options.inputPath, input, llvm::errs());
  Compilation compilation{options, diags, nullptr};

  if (stage->needsProgram) {
    FrontendOptions frontendOptions;
    frontendOptions.constOverrides = options.constOverrides;
    compilation.program = parseAndAnalyze(diags, frontendOptions);
    if (!compilation.program)
      return kExitInputError;
    if (!checkModSelection(options, *compilation.program, diags))
      return kExitInputError;
  }

  // Run the stage into memory; only a complete result is written out,
  // through the one output writer (OutputFiles.h).
  std::string output;
  llvm::raw_string_ostream outputStream(output);
  int status = stage->run(compilation, outputStream);
  if (status != kExitSuccess || stage->writesOutputPath)
    return status;
  outputStream.flush();
  llvm::outs().flush();
  try {
    files::writeAll({{outputs.front(),
                      std::vector<uint8_t>(output.begin(), output.end())}});
  } catch (const Error &error) {
    llvm::errs() << "pagedc: error: " << error.what() << "\n";
    return kExitInputError;
  }
  return kExitSuccess;
}
