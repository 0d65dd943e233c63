// Helpers of the fleet tests: what buffers hold, read as the trainer reads them.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "buffer/record_codec.h"
#include "buffer/replay_reader.h"

namespace specloop {
namespace fleet {

// Record key -> encoding, of every record in `dirs` (opened as a secondary, so the buffers
// may be live).
inline std::map<std::string, std::string> Contents(const std::vector<std::string>& dirs) {
  std::map<std::string, std::string> out;
  std::unique_ptr<ReplayReader> reader;
  EXPECT_TRUE(ReplayReader::Open(ReaderOptions(), dirs, &reader).ok());
  if (!reader) return out;
  EXPECT_TRUE(reader
                  ->ScanKeyed(ScanOptions(),
                              [&](size_t, std::string_view key, const Record& r) {
                                std::string bytes;
                                EXPECT_TRUE(EncodeRecord(r, &bytes).ok());
                                out[std::string(key)] = bytes;
                                return true;
                              })
                  .ok());
  return out;
}

}  // namespace fleet
}  // namespace specloop
