// Offline tools over a buffer directory, behind `specloop buffer stats|export|verify|repair`.
// Each opens the directory as a RocksDB secondary in a temporary directory, so they also work
// while a serving worker writes to it (they see the state at open). All of them read past
// damage: a damaged SST block or a record that does not decode is stepped over and counted
// (buffer/salvage_iterator.h, buffer/sst_damage.h), never the end of the read.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "buffer/record.h"
#include "buffer/sst_damage.h"
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
  uint64_t damaged_block_records = 0;  // records lost in damaged SST blocks (skipped)
  std::vector<std::string> damaged_files;  // table files with damage
  bool wal_damaged = false;           // the WAL held damaged records (read past them)
  uint64_t damaged_wal_records = 0;   // records lost with them (sequence gaps)
  bool damaged() const {
    return corrupt > 0 || damaged_block_records > 0 || !damaged_files.empty() || wal_damaged;
  }
};
Status ComputeBufferStats(const std::string& dir, BufferStats* stats);

struct ExportOptions {
  std::optional<std::string> domain;  // only this domain; default all
  uint64_t since_us = 0;              // only records with time_us >= since_us
};
// Writes one JSON object per record (RecordToJson), in time order, to `out`; *count gets the
// number written. Damaged records are skipped (`specloop buffer verify` names them).
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
  uint64_t damaged_block_records = 0;  // records lost in damaged SST blocks
  uint64_t damaged_index_entries = 0;  // index entries lost in damaged SST blocks
  std::vector<FileDamage> damaged_files;  // every table file with damage
  bool wal_damaged = false;               // the WAL held damaged records (read past them)
  uint64_t damaged_wal_records = 0;       // records lost with them (sequence gaps)
  uint64_t bad_keys = 0;         // key malformed or not matching the record's time/worker
  uint64_t index_entries = 0;
  uint64_t dangling_index = 0;    // index entries without their record (or wrong domain)
  uint64_t unindexed_records = 0;  // records without their index entry
  std::vector<std::string> problems;  // the first few, human-readable
  bool ok() const {
    return corrupt_records == 0 && bad_keys == 0 && dangling_index == 0 &&
           unindexed_records == 0 && damaged_files.empty() && !wal_damaged;
  }
};
// Reads every table file on its own (block checksums; damaged blocks named by the keys around
// them, with the entries they cost), then decodes every readable record (checksum and format),
// checks each key against its record and the index against the records. Returns Corruption
// when any check fails (details in *report), IOError/NotFound when the directory cannot be
// opened.
Status VerifyBuffer(const std::string& dir, VerifyReport* report);

struct RepairReport {
  uint64_t copied = 0;                 // intact records written to the new buffer
  uint64_t undecodable = 0;            // records skipped: bytes readable, do not decode
  uint64_t damaged_block_records = 0;  // records skipped: in damaged SST blocks
  uint64_t damaged_wal_records = 0;    // records lost with damaged WAL records
  std::vector<std::string> damaged_files;
};
// Copies every intact record of `dir` into a new buffer at `out_dir` (which must not exist),
// rebuilding the index from the records (so index damage costs nothing). `dir` is only read.
// This per-file salvage recovers more than RocksDB's RepairDB, which sets aside a table file
// whole when one block fails (buffer/README.md, measured by tests/buffer/salvage_test.cc).
Status RepairBuffer(const std::string& dir, const std::string& out_dir, RepairReport* report);

// A record key as "time_us/worker/seq" (or hex when not a record key), for messages.
std::string DescribeKey(std::string_view key);

}  // namespace specloop
