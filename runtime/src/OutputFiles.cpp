//===- OutputFiles.cpp - Writing a set of output files all or nothing -----===//
#include "OutputFiles.h"

#include "pagedc/Error.h"

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace pagedc::files {
namespace {

std::string directoryOf(const std::string &path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string baseNameOf(const std::string &path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

/// Where an output really goes: a symlink is followed to its target.
struct Destination {
  std::string path;     // the file written or replaced
  bool inPlace = false; // a device or FIFO: opened and written, not replaced
  bool isStdout = false; // "-" or /dev/stdout: file descriptor 1, as it is
  bool exists = false;
  bool regular = false;  // an existing regular file (stdout's included)
  dev_t device = 0; // of the file, or of its directory when it does not exist
  ino_t inode = 0;
  mode_t mode = 0;  // of an existing regular file, kept by its replacement
};

/// Standard output is "-" and /dev/stdout: written through file descriptor
/// 1 as the shell set it up (a pipe, a terminal, a file opened for
/// appending), never reopened or replaced.
bool namesStdout(const std::string &path) { return path == "-" || path == "/dev/stdout"; }

Destination resolve(const NamedPath &output) {
  const std::string &path = output.path;
  if (path.empty())
    throw Error(fmt::format("{}: the output path is empty", output.label));
  Destination destination;
  destination.path = path;
  struct stat info;
  if (namesStdout(path)) {
    destination.isStdout = destination.inPlace = true;
    if (::fstat(STDOUT_FILENO, &info) != 0)
      throw Error(fmt::format("{} '{}': standard output is not open ({})", output.label, path,
                              std::strerror(errno)));
    destination.exists = true;
    destination.regular = S_ISREG(info.st_mode);
    destination.device = info.st_dev;
    destination.inode = info.st_ino;
    return destination;
  }
  if (path.back() == '/')
    throw Error(fmt::format("{} '{}': is a directory, not a file", output.label, path));
  // What the path names, through any symlinks (/dev/fd/1 into a pipe
  // included: such a link has no path to resolve, but it can be opened).
  if (::stat(path.c_str(), &info) == 0) {
    if (S_ISDIR(info.st_mode))
      throw Error(fmt::format("{} '{}': is a directory, not a file", output.label, path));
    destination.exists = true;
    destination.device = info.st_dev;
    destination.inode = info.st_ino;
    destination.inPlace = S_ISCHR(info.st_mode) || S_ISBLK(info.st_mode) || S_ISFIFO(info.st_mode);
    destination.regular = S_ISREG(info.st_mode);
    destination.mode = info.st_mode & 07777;
    if (!destination.inPlace && !destination.regular)
      throw Error(fmt::format("{} '{}': is not a regular file, device or FIFO (a socket?)",
                              output.label, path));
  } else if (errno != ENOENT) {
    throw Error(fmt::format("{} '{}': {}", output.label, path, std::strerror(errno)));
  }
  // A regular file behind a symlink is replaced where it is: the link stays.
  struct stat link;
  if (!destination.inPlace && ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    char resolved[PATH_MAX];
    if (!destination.exists || !::realpath(path.c_str(), resolved))
      throw Error(fmt::format("{} '{}': is a symlink whose target cannot be resolved ({}); "
                              "remove it or point it at a file",
                              output.label, path,
                              destination.exists ? std::strerror(errno) : "it does not exist"));
    destination.path = resolved;
  }
  if (destination.exists)
    return destination;
  const std::string directory = directoryOf(destination.path);
  if (::stat(directory.c_str(), &info) != 0 || !S_ISDIR(info.st_mode))
    throw Error(fmt::format("{} '{}': its directory '{}' does not exist", output.label, path,
                            directory));
  destination.device = info.st_dev;
  destination.inode = info.st_ino;
  return destination;
}

bool sameFile(const Destination &a, const Destination &b) {
  if (a.isStdout && b.isStdout)
    return true;
  if (a.exists != b.exists || a.device != b.device || a.inode != b.inode)
    return false;
  return a.exists || baseNameOf(a.path) == baseNameOf(b.path); // new: same directory + name
}

std::atomic<unsigned> temporaryCounter{0};

/// Writes all of `bytes` to `fd`; false with errno set on failure.
bool writeFully(int fd, const std::vector<uint8_t> &bytes) {
  const uint8_t *data = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t written = ::write(fd, data, std::min<size_t>(left, 1u << 30));
    if (written < 0 && errno == EINTR)
      continue;
    if (written == 0)
      errno = EIO; // nothing written and no reason given
    if (written <= 0)
      return false;
    data += written;
    left -= static_cast<size_t>(written);
  }
  return true;
}

} // namespace

void checkOutputs(const std::vector<NamedPath> &outputs, const std::vector<NamedPath> &inputs) {
  std::vector<Destination> destinations;
  for (const NamedPath &output : outputs) {
    Destination destination = resolve(output);
    for (size_t i = 0; i < destinations.size(); ++i)
      if ((!destination.inPlace || destination.isStdout) &&
          sameFile(destination, destinations[i]))
        throw Error(fmt::format("{} '{}' and {} '{}' are the same file; each output needs its "
                                "own",
                                outputs[i].label, outputs[i].path, output.label, output.path));
    // Devices and FIFOs may be inputs and outputs at once (/dev/null); a
    // regular file, standard output redirected to one included, may not.
    if (destination.exists && destination.regular)
      for (const NamedPath &input : inputs) {
        struct stat info;
        const int status = input.path == "-" ? ::fstat(STDIN_FILENO, &info)
                                             : ::stat(input.path.c_str(), &info);
        if (status == 0 && info.st_dev == destination.device &&
            info.st_ino == destination.inode)
          throw Error(fmt::format("{} '{}' is the same file as the input {} '{}'; refusing to "
                                  "overwrite an input",
                                  output.label, output.path, input.label, input.path));
      }
    // A regular file is replaced by a rename in its directory: say now that
    // the directory refuses it, before any work is done for the output.
    if (!destination.inPlace) {
      const std::string directory = directoryOf(destination.path);
      if (::access(directory.c_str(), W_OK | X_OK) != 0)
        throw Error(fmt::format("cannot write {} '{}': its directory '{}' is not writable ({})",
                                output.label, output.path, directory, std::strerror(errno)));
    }
    destinations.push_back(std::move(destination));
  }
}

void writeAll(const std::vector<OutputFile> &files) {
  struct Pending {
    const OutputFile *file;
    Destination destination;
    std::string temporary;
  };
  std::vector<Pending> pending;
  auto removeTemporaries = [&] {
    for (const Pending &p : pending)
      if (!p.temporary.empty())
        ::unlink(p.temporary.c_str());
  };
  try {
    for (const OutputFile &file : files)
      pending.push_back({&file, resolve(file.name), {}});
    // 1. Every regular output into a temporary file next to its target.
    for (Pending &p : pending) {
      if (p.destination.inPlace)
        continue;
      const std::string directory = directoryOf(p.destination.path);
      std::string temporary;
      int fd = -1;
      for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
        temporary = fmt::format("{}/.{}.tmp-{}-{}", directory, baseNameOf(p.destination.path),
                                static_cast<long>(::getpid()), temporaryCounter++);
        fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST)
          break;
      }
      if (fd < 0)
        throw Error(fmt::format("cannot write {} '{}': {}", p.file->name.label, p.file->name.path,
                                std::strerror(errno)));
      p.temporary = temporary;
      // The replacement keeps the permissions of the file it replaces.
      bool ok = (!p.destination.exists || ::fchmod(fd, p.destination.mode) == 0) &&
                writeFully(fd, p.file->bytes);
      int error = errno;
      if (::close(fd) != 0 && ok) {
        ok = false;
        error = errno;
      }
      if (!ok)
        throw Error(fmt::format("cannot write {} '{}': {}", p.file->name.label,
                                p.file->name.path, std::strerror(error)));
    }
    // 2. Devices and FIFOs, written in place.
    for (Pending &p : pending) {
      if (!p.destination.inPlace)
        continue;
      if (p.destination.isStdout) {
        if (!writeFully(STDOUT_FILENO, p.file->bytes))
          throw Error(fmt::format("cannot write {} '{}': {}", p.file->name.label,
                                  p.file->name.path, std::strerror(errno)));
        continue;
      }
      int fd = ::open(p.destination.path.c_str(), O_WRONLY | O_CLOEXEC);
      bool ok = fd >= 0 && writeFully(fd, p.file->bytes);
      int error = errno;
      if (fd >= 0 && ::close(fd) != 0 && ok) {
        ok = false;
        error = errno;
      }
      if (!ok)
        throw Error(fmt::format("cannot write {} '{}': {}", p.file->name.label,
                                p.file->name.path, std::strerror(error)));
    }
  } catch (...) {
    removeTemporaries();
    throw;
  }
  // 3. Renames: each is atomic; all targets were checked to be writable
  // directories, so a failure here is a race with another process.
  for (size_t i = 0; i < pending.size(); ++i) {
    Pending &p = pending[i];
    if (p.temporary.empty())
      continue;
    if (::rename(p.temporary.c_str(), p.destination.path.c_str()) != 0) {
      int error = errno;
      for (size_t j = i; j < pending.size(); ++j)
        if (!pending[j].temporary.empty())
          ::unlink(pending[j].temporary.c_str());
      throw Error(fmt::format("cannot write {} '{}': {}", p.file->name.label, p.file->name.path,
                              std::strerror(error)));
    }
    p.temporary.clear();
  }
}

} // namespace pagedc::files
