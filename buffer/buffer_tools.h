// Offline tools over a buffer directory, behind `specloop buffer stats|export|verify`. Each
// opens the directory as a RocksDB secondary in a temporary directory, so they also work while
// a serving worker writes to it (they see the state at open).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "buffer/record.h"
#include "common/base/status.h"

namespace specloop {

struct BufferStats {
  uint64_t records = 0;
  uint64_t steps = 0;
  uint64_t value_bytes = 0;  // encoded records (keys excluded)
  uint64_t disk_bytes = 0;   // every file in the directory (SST, WAL, MANIFEST, logs)
  uint64_t min_time_us = 0, max_time_us = 0;  // 0 when empty
  std::map<std::string, uint64_t> domains;          // records per domain
  std::map<uint64_t, uint64_t> draft_versions;      // records per draft version
  uint64_t corrupt = 0;                             // records that did not decode (skipped)
};
Status ComputeBufferStats(const std::string& dir, BufferStats* stats);

struct ExportOptions {
  std::optional<std::string> domain;  // only this domain; default all
  uint64_t since_us = 0;              // only records with time_us >= since_us
};
// Writes one JSON object per record (RecordToJson), in time order, to `out`; *count gets the
// number written. Corruption on a record that does not decode.
Status ExportJsonl(const std::string& dir, const ExportOptions& options, std::ostream& out,
                   uint64_t* count);
// {"time_us", "domain", "request_id", "worker_id", "draft_version", "target_id", "sampling":
// {...}, "prompt_len", "tokens", "top_k", "steps": [{"start_pos", "draft_tokens",
// "num_accepted", "topk_ids": [[...] per position], "topk_logprobs": [[float]...],
// "tail_mass": [...]}]}: one line, no trailing newline.
std::string RecordToJson(const Record& r);

struct VerifyReport {
  uint64_t records = 0;          // record values checked
  uint64_t corrupt_records = 0;  // failing checksum or format
  uint64_t bad_keys = 0;         // key malformed or not matching the record's time/worker
  uint64_t index_entries = 0;
  uint64_t dangling_index = 0;    // index entries without their record (or wrong domain)
  uint64_t unindexed_records = 0;  // records without their index entry
  std::vector<std::string> problems;  // the first few, human-readable
  bool ok() const {
    return corrupt_records == 0 && bad_keys == 0 && dangling_index == 0 &&
           unindexed_records == 0;
  }
};
// Checks RocksDB's block checksums, then decodes every record (checksum and format), checks
// each key against its record and the index against the records. Returns Corruption when any
// check fails (details in *report), IOError/NotFound when the directory cannot be opened.
Status VerifyBuffer(const std::string& dir, VerifyReport* report);

}  // namespace specloop
