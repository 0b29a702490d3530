//===- OutputFiles.h - Writing a set of output files all or nothing -*- C++ -*-===//
//
// The one writer of output files: `pagedc` compile mode's -o, `pagedc run`'s
// -o/--lse, `pagedc-jit --stats=`, writeNpy(). Rules:
//
//  * checkOutputs() runs before any work: an output that is the same file as
//    an input (same device and inode, however the path is spelt, symlinks
//    followed) or as another output, a directory, a dangling symlink, a
//    missing directory or a directory that is not writable is an error
//    naming the option and the path.
//  * "-" and "/dev/stdout" are standard output, written through file
//    descriptor 1 as it is (a pipe, a terminal, a file the shell opened).
//  * A symlink is written through: its target is what gets replaced (the
//    link stays). A character or block device or a FIFO is written in place
//    (`-o /dev/null` writes to the device, never replaces it with a file).
//  * Regular files (and new ones) are written to temporary files in their
//    target directories, then renamed into place together, keeping the
//    replaced file's permissions; any failure before the renames removes
//    every temporary, so no output appears.
//  * Every write and every close is checked: a full device (/dev/full) or a
//    failed close is an error naming the output and the system's reason.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_RUNTIME_OUTPUTFILES_H
#define PAGEDC_RUNTIME_OUTPUTFILES_H

#include <cstdint>
#include <string>
#include <vector>

namespace pagedc::files {

/// A path named by a command-line option (or API argument): `label` is how
/// errors refer to it, e.g. "-o" or "--lse".
struct NamedPath {
  std::string label;
  std::string path;
};

/// Throws pagedc::Error when an output cannot or must not be written (see
/// above). Inputs that do not exist are ignored (their readers report them).
void checkOutputs(const std::vector<NamedPath> &outputs, const std::vector<NamedPath> &inputs);

struct OutputFile {
  NamedPath name;
  std::vector<uint8_t> bytes;
};

/// Writes every file as described above; throws pagedc::Error naming the
/// file on failure, after removing every temporary file it made.
void writeAll(const std::vector<OutputFile> &files);

} // namespace pagedc::files

#endif // PAGEDC_RUNTIME_OUTPUTFILES_H
