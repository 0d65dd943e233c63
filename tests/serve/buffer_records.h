// Reads back what a test's server or logger wrote to a replay buffer.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "buffer/replay_reader.h"

namespace specloop {
namespace serve_test {

// Every record of the buffer in `dir`, in time order; a failed open or scan fails the test.
inline std::vector<Record> ReadRecords(const std::string& dir) {
  std::vector<Record> records;
  std::unique_ptr<ReplayReader> reader;
  const Status opened = ReplayReader::Open(ReaderOptions(), {dir}, &reader);
  if (!opened.ok()) {
    ADD_FAILURE() << "opening " << dir << ": " << opened.ToString();
    return records;
  }
  const Status scanned = reader->Scan(ScanOptions(), [&](size_t, const Record& r) {
    records.push_back(r);
    return true;
  });
  if (!scanned.ok()) ADD_FAILURE() << "reading " << dir << ": " << scanned.ToString();
  return records;
}

}  // namespace serve_test
}  // namespace specloop
