// ReplayReader: the trainer's read-only view of one or more buffer directories, each opened as
// a RocksDB secondary instance (the serving workers keep writing as primaries). CatchUp()
// (or a background thread, ReaderOptions::catch_up_interval_ms) makes records the primaries
// wrote since visible.
//
// Reads never scan everything: a time range is a key range of the records, a domain is a key
// range of the by_domain index (buffer/keys.h). Sampling draws from an in-memory catalog of
// record keys (about 60 bytes per record) kept current by CatchUp().
//
// Thread safety: all methods may be called concurrently.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "buffer/record.h"
#include "common/base/rng.h"
#include "common/base/status.h"

namespace specloop {

struct ReaderOptions {
  // Where the secondary instances keep their own files (one subdirectory per buffer).
  // Empty: a fresh directory under $TMPDIR, removed when the reader is destroyed.
  // Default: empty.
  std::string secondary_root;
  // Period of the background catch-up thread; 0: only explicit CatchUp() calls. Default: 0.
  uint32_t catch_up_interval_ms = 0;
};

struct ScanOptions {
  // Records with since_us <= time_us < until_us. Default: all.
  uint64_t since_us = 0;
  uint64_t until_us = std::numeric_limits<uint64_t>::max();
  // Only this domain (read through the index); nullopt: every domain. Default: nullopt.
  std::optional<std::string> domain;
};

struct SampleOptions {
  // Records per batch. Default: 32.
  size_t batch_size = 32;
  // Each record of a batch first draws a domain with probability proportional to its weight
  // (domains missing here weigh default_domain_weight; weight 0 excludes a domain), then a
  // record of that domain with weight 2^(-age / half_life), age measured from the domain's
  // newest record. half_life_seconds = 0 means uniform within the domain. Draws are with
  // replacement.
  std::map<std::string, double> domain_weights;
  double default_domain_weight = 1.0;
  double half_life_seconds = 0.0;
};

class ReplayReader {
 public:
  // Opens every directory in `dirs` as a secondary and catches up once. NotFound/IOError when
  // a directory is not a buffer.
  static Status Open(const ReaderOptions& options, const std::vector<std::string>& dirs,
                     std::unique_ptr<ReplayReader>* reader);
  ~ReplayReader();
  ReplayReader(const ReplayReader&) = delete;
  ReplayReader& operator=(const ReplayReader&) = delete;

  // Catches every secondary up with its primary, then brings the sampling catalog up to date
  // (new records in, records dropped by retention out).
  Status CatchUp();

  // Calls visit(dir_index, record) for every matching record in time order (merged across
  // directories; ties in directory order) until it returns false. Damage does not end a
  // scan: records that do not decode and damaged SST blocks are stepped over and counted
  // (records_skipped()); errors other than corruption (IOError) do end it.
  using Visitor = std::function<bool(size_t dir_index, const Record& record)>;
  Status Scan(const ScanOptions& options, const Visitor& visit);
  // Scan(), also passing each record's key (buffer/keys.h; valid during the call), for a
  // later Read().
  using KeyedVisitor =
      std::function<bool(size_t dir_index, std::string_view key, const Record& record)>;
  Status ScanKeyed(const ScanOptions& options, const KeyedVisitor& visit);
  // ScanKeyed() without decoding: each record as stored (buffer/record_codec.h), valid during
  // the call (a shipper forwards the bytes as they are).
  using EncodedVisitor =
      std::function<bool(size_t dir_index, std::string_view key, std::string_view data)>;
  Status ScanEncoded(const ScanOptions& options, const EncodedVisitor& visit);
  // The record at `key` in directory `dir_index` (as ScanKeyed() passed them). NotFound when
  // it is gone: removed by retention, or damaged (in a damaged block, or its bytes do not
  // decode; counted in records_skipped(), the message says "damaged record"), so a caller that
  // skips vanished records skips damaged ones too.
  Status Read(size_t dir_index, std::string_view key, Record* record);
  // For a caller of ScanEncoded() that decodes the bytes itself and finds they do not decode:
  // counts the record at `key` of directory `dir_index` (as ScanEncoded() passed them) under
  // "undecodable" in records_skipped(), once per record however often it is met (as Scan()
  // and Read() count one), without reading it again. InvalidArgument for a directory index
  // out of range or a key that is no record key (buffer/keys.h).
  Status CountUndecodableRecord(size_t dir_index, std::string_view key);

  // Replaces *batch with options.batch_size records drawn as SampleOptions describes, using
  // `rng` (the same catalog, options and seed give the same batch). NotFound when no record
  // has positive weight. Records that retention removed since the last CatchUp() are redrawn;
  // so are damaged ones, which also leave the catalog (counted once in records_skipped()).
  Status Sample(const SampleOptions& options, Rng* rng, std::vector<Record>* batch);

  // Records per domain in the catalog (as of the last CatchUp()).
  std::map<std::string, uint64_t> DomainCounts() const;
  uint64_t num_records() const;
  // Records decoded by Scan() and Sample() so far (shows that reads touch only what they
  // return).
  uint64_t records_decoded() const { return records_decoded_.load(); }

  // What reads stepped over so far, by reason, each counted once per reader:
  //   "damaged_block"  records in damaged SST blocks of the records (counted per damaged file
  //                    when a read first meets its damage: the file's entries less those
  //                    readable, buffer/sst_damage.h)
  //   "undecodable"    records whose bytes are readable but do not decode (checksum, format)
  //   "damaged_index"  index entries in damaged SST blocks of the index (their records are
  //                    still scanned, but not sampled)
  //   "damaged_wal"    records lost with damaged WAL records, counted at Open as the gaps in
  //                    the records' sequence numbers (buffer/sst_damage.h MissingSeqs); such a
  //                    directory is read as it was at Open (CatchUp() skips it). A WAL that
  //                    merely ends early (cut short) reads as a crash did: nothing to count.
  // Every reason is present (0 when none).
  std::map<std::string, uint64_t> records_skipped() const;
  // Paths of the damaged table files met so far.
  std::vector<std::string> damaged_files() const;

 private:
  struct Dir;
  struct Entry {
    uint64_t time_us;
    uint32_t dir;
    char key[20];
  };
  struct DomainCatalog {
    std::vector<Entry> entries;  // sorted by (time_us, dir, key)
    std::vector<double> cum;     // recency prefix sums, valid when cum_half_life matches
    double cum_half_life = -1;
  };

  ReplayReader() = default;
  Status RefreshCatalog();  // REQUIRES: catch_up_mu_ held
  Status ReadRecord(size_t dir, std::string_view key, Record* record);
  // Counts the damage of the table files of column family `cf` (0 records, 1 index) in `dir`
  // that meet [lo, hi] ("" unbounded), each file once.
  void CountDamage(size_t dir, int cf, const std::string& lo, const std::string& hi);
  // Counts an undecodable record once.
  void CountUndecodable(size_t dir, std::string_view key);
  // Removes a record from the sampling catalog.
  void Forget(size_t dir, std::string_view key);
  void CatchUpLoop();

  ReaderOptions options_;
  std::string secondary_root_;
  bool owns_secondary_root_ = false;
  std::vector<std::unique_ptr<Dir>> dirs_;
  std::atomic<uint64_t> records_decoded_{0};

  mutable std::mutex damage_mu_;
  std::map<std::string, uint64_t> skipped_;                  // GUARDED_BY(damage_mu_)
  std::set<std::pair<size_t, uint64_t>> counted_files_;      // GUARDED_BY(damage_mu_)
  std::set<std::pair<size_t, std::string>> undecodable_;     // GUARDED_BY(damage_mu_)
  std::vector<std::string> damaged_files_;                   // GUARDED_BY(damage_mu_)

  std::mutex catch_up_mu_;    // serializes CatchUp()
  mutable std::mutex mu_;     // guards catalog_
  std::map<std::string, DomainCatalog> catalog_;  // GUARDED_BY(mu_)

  std::condition_variable stop_cv_;
  bool stop_ = false;  // GUARDED_BY(mu_)
  std::thread catch_up_thread_;
};

}  // namespace specloop
