//===- SealedFile.h - Checksummed files of the on-disk kernel cache -*- C++ -*-===//
//
// The kernel cache's entries and the variant index share one file layout:
//
//   MAGIC LINE
//   name=value            header lines of the caller
//   ...
//   size=N                the payload's size in bytes
//   checksum=HEX          XXH3-64 of the payload
//   header_checksum=HEX   XXH3-64 of every header line above
//   (empty line)
//   payload bytes
//
// A file that is truncated, padded, or has a flipped byte anywhere fails to
// open; the callers treat that as a miss and rewrite the file.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_CUDA_SEALEDFILE_H
#define PAGEDC_CUDA_SEALEDFILE_H

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace pagedc::sealed {

/// The file for `payload` under `magic` (which ends with a newline) and the
/// caller's `header` lines ("name=value\n" each; the names size, checksum and
/// header_checksum are added here).
std::string seal(std::string_view magic, std::string header, std::string_view payload);

/// Checks a file written by seal(): the magic, both checksums and the
/// payload size. On success fills `fields` with every header line and
/// `payload` with a view into `bytes`; false for anything malformed.
bool open(std::string_view bytes, std::string_view magic,
          std::map<std::string, std::string> &fields, std::string_view &payload);

/// Writes `bytes` to `path` through a temporary file in the same directory
/// (created if missing) and rename(), which replaces the destination
/// atomically: readers see the old file, no file, or the complete new one.
/// False when it could not be written (nothing is left behind); a cache
/// that cannot be written is only slower, so callers may ignore it.
bool writeAtomically(const std::string &path, std::string_view bytes);

/// What readEntryFile() found at a path.
enum class ReadStatus { Missing, NotRegular, TooLarge, Unreadable, Read };

/// Reads a cache file without ever blocking or following a symlink: opened
/// with O_NOFOLLOW | O_NONBLOCK, checked with fstat, and read only when it is
/// a regular file of at most `maxBytes` bytes (one sized read; no buffer is
/// sized before that check, so a sparse 64 GiB file costs nothing). A FIFO,
/// a symlink (to /dev/zero or anything else), a directory or a device is
/// NotRegular, a larger file TooLarge: the caller treats either as a corrupt
/// entry, removes it (removeEntry) and rebuilds.
ReadStatus readEntryFile(const std::string &path, std::string &bytes, uint64_t maxBytes);

/// Whether a status is a file that exists but is no entry: NotRegular or
/// TooLarge (the callers drop it); Missing and Unreadable are plain misses.
inline bool isCorrupt(ReadStatus status) {
  return status == ReadStatus::NotRegular || status == ReadStatus::TooLarge;
}

/// Removes whatever is at `path` (a directory with its contents, a symlink
/// itself, never its target), so an atomic rename can put a file there.
void removeEntry(const std::string &path);

/// Lowercase 16-digit hexadecimal.
std::string hex64(unsigned long long value);

} // namespace pagedc::sealed

#endif // PAGEDC_CUDA_SEALEDFILE_H
