// SalvagingIterator: one key range of a RocksDB column family (or of one SST file) in key
// order, stepping over what cannot be read. A step or seek that ends in Corruption (a damaged
// SST data block, or a table file that cannot be opened) is answered by finding the smallest
// key past the damage whose seek reads cleanly and resuming there; each step over is recorded
// as a DamagedRange. Internal to buffer/ (ReplayReader, buffer tools).
//
// How the resume key is found: a seek reads the block that would hold its target, so "seek(T)
// fails" holds for T in (last readable key, the damaged block's last separator] and no longer
// beyond it. Probes are byte strings `key_width` wide (shorter keys zero-padded), tried at
// distance 1, 2, 4, ... past the damage, then bisected. Within one file this finds the first
// key after the damaged block exactly; across files, two damaged blocks closer together than
// the search's step may swallow the readable keys between them. Keys longer than key_width
// that share a probe's prefix may be passed over; record keys are exactly kRecordKeySize.
//
// Each probe uses a fresh iterator from the factory, so an error status never lingers. Errors
// other than Corruption (IOError, ...) end the iteration and stay in status().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <rocksdb/iterator.h>

#include "common/base/status.h"

namespace specloop {

// One stretch of keys that could not be read.
struct DamagedRange {
  std::string after;   // the last key read before it (or the seek target; "" at the start)
  std::string resume;  // the first key read after it; empty when the damage runs to the end
  bool to_end = false;
  std::string error;   // RocksDB's message for the first failed read
};

class SalvagingIterator {
 public:
  // `make` returns a fresh iterator over the range (iterate_upper_bound, if any, set by the
  // caller; it must outlive this object).
  SalvagingIterator(std::function<rocksdb::Iterator*()> make, size_t key_width);

  void SeekToFirst();
  void Seek(const rocksdb::Slice& target);
  void Next();
  bool Valid() const { return it_ && it_->Valid(); }
  rocksdb::Slice key() const { return it_->key(); }
  rocksdb::Slice value() const { return it_->value(); }
  // OK, or the first error that is not Corruption.
  Status status() const { return status_; }
  // Every stretch stepped over so far, in key order.
  const std::vector<DamagedRange>& damaged() const { return damaged_; }

 private:
  enum class Probe { kOk, kCorrupt, kError };
  // Positions it_ at the first readable key > `after`, where seeking just past `after` failed
  // (`after` is the last key read, or a seek target whose own seek failed: a key equal to it
  // would lie in the damaged block).
  void StepOver(const std::string& after, const std::string& error);
  Probe SeekFresh(const std::string& target);

  std::function<rocksdb::Iterator*()> make_;
  size_t key_width_;
  std::unique_ptr<rocksdb::Iterator> it_;
  std::string last_;  // the key before the last Next()
  Status status_;
  std::vector<DamagedRange> damaged_;
};

}  // namespace specloop
