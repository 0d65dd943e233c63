#include "buffer/replay_reader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "buffer/keys.h"
#include "buffer/record_codec.h"
#include "buffer/rocksdb_options.h"
#include "buffer/salvage_iterator.h"
#include "buffer/sst_damage.h"
#include "common/base/remove_tree.h"

namespace specloop {

struct ReplayReader::Dir {
  std::string path;
  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;  // [records, index, meta]
  bool read_only = false;  // opened read-only past a damaged WAL record: no catch-up
  // Per domain, the last index key already in the catalog. GUARDED_BY(catch_up_mu_)
  std::map<std::string, std::string> last_index_key;
  ~Dir() { CloseDb(db, &handles); }

  // The stored bytes of the record at `key` (NotFound once retention removed it).
  Status Get(std::string_view key, rocksdb::PinnableSlice* value) const {
    value->Reset();
    return FromRocks(db->Get(rocksdb::ReadOptions(), handles[0],
                             rocksdb::Slice(key.data(), key.size()), value),
                     "reading record");
  }
  // Column family `cf` (0 records, 1 index) under `ro` (which must outlive it), stepping over
  // damaged blocks.
  std::unique_ptr<SalvagingIterator> Salvaging(int cf, const rocksdb::ReadOptions* ro) const {
    rocksdb::DB* d = db;
    rocksdb::ColumnFamilyHandle* h = handles[cf];
    return std::make_unique<SalvagingIterator>([d, h, ro] { return d->NewIterator(*ro, h); },
                                               cf == 0 ? kRecordKeySize : kRecordKeySize + 64);
  }
};

namespace {

std::string_view View(const rocksdb::Slice& s) { return std::string_view(s.data(), s.size()); }

bool EntryLess(uint64_t t1, uint32_t d1, const char* k1, uint64_t t2, uint32_t d2,
               const char* k2) {
  if (t1 != t2) return t1 < t2;
  if (d1 != d2) return d1 < d2;
  return std::memcmp(k1, k2, kRecordKeySize) < 0;
}

}  // namespace

Status ReplayReader::Open(const ReaderOptions& options, const std::vector<std::string>& dirs,
                          std::unique_ptr<ReplayReader>* reader) {
  if (dirs.empty()) return Status::InvalidArgument("no buffer directories");
  std::unique_ptr<ReplayReader> r(new ReplayReader());
  r->options_ = options;
  if (options.secondary_root.empty()) {
    SPECLOOP_RETURN_IF_ERROR(MakeTempDir("secondary", &r->secondary_root_));
    r->owns_secondary_root_ = true;
  } else {
    r->secondary_root_ = options.secondary_root;
  }
  for (size_t i = 0; i < dirs.size(); i++) {
    if (!std::filesystem::exists(dirs[i] + "/CURRENT")) {
      return Status::NotFound("not a replay buffer (no CURRENT file): " + dirs[i]);
    }
    auto d = std::make_unique<Dir>();
    d->path = dirs[i];
    const std::string sec = r->secondary_root_ + "/" + std::to_string(i);
    std::error_code ec;
    std::filesystem::create_directories(sec, ec);
    SPECLOOP_RETURN_IF_ERROR(OpenSecondary(dirs[i], sec, &d->db, &d->handles, &d->read_only));
    if (d->read_only) {  // read past a damaged WAL record: count the writes lost
      uint64_t missing = 0;
      SPECLOOP_RETURN_IF_ERROR(MissingSeqs(d->db, d->handles, &missing).Annotate(dirs[i]));
      std::lock_guard<std::mutex> lock(r->damage_mu_);
      r->skipped_["damaged_wal"] += missing;
    }
    r->dirs_.push_back(std::move(d));
  }
  {
    std::lock_guard<std::mutex> lock(r->catch_up_mu_);
    SPECLOOP_RETURN_IF_ERROR(r->RefreshCatalog());
  }
  if (options.catch_up_interval_ms > 0) {
    ReplayReader* self = r.get();
    r->catch_up_thread_ = std::thread([self] { self->CatchUpLoop(); });
  }
  *reader = std::move(r);
  return Status::OK();
}

ReplayReader::~ReplayReader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (catch_up_thread_.joinable()) catch_up_thread_.join();
  dirs_.clear();
  if (owns_secondary_root_) (void)RemoveTree(secondary_root_);
}

void ReplayReader::CatchUpLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    stop_cv_.wait_for(lock, std::chrono::milliseconds(options_.catch_up_interval_ms));
    if (stop_) break;
    lock.unlock();
    CatchUp().ok();  // a failed catch-up is retried on the next period
    lock.lock();
  }
}

Status ReplayReader::CatchUp() {
  std::lock_guard<std::mutex> lock(catch_up_mu_);
  for (auto& d : dirs_) {
    if (d->read_only) continue;  // opened past a damaged WAL: the state at open
    SPECLOOP_RETURN_IF_ERROR(
        FromRocks(d->db->TryCatchUpWithPrimary(), "catching up with " + d->path));
  }
  return RefreshCatalog();
}

Status ReplayReader::RefreshCatalog() {
  std::map<std::string, std::vector<Entry>> fresh;
  std::vector<uint64_t> oldest(dirs_.size(), 0);
  const rocksdb::ReadOptions ro;
  for (size_t di = 0; di < dirs_.size(); di++) {
    Dir& d = *dirs_[di];
    {
      auto it = d.Salvaging(0, &ro);
      it->SeekToFirst();
      if (it->Valid()) ParseRecordKey(View(it->key()), &oldest[di], nullptr, nullptr);
      SPECLOOP_RETURN_IF_ERROR(it->status().Annotate("reading " + d.path));
      if (!it->damaged().empty()) {
        CountDamage(di, 0, "", it->Valid() ? it->key().ToString() : std::string());
      }
    }
    auto it = d.Salvaging(1, &ro);
    it->SeekToFirst();
    while (it->Valid()) {
      std::string_view domain, rk;
      if (!ParseDomainIndexKey(View(it->key()), &domain, &rk)) {
        return Status::Corruption("malformed index key in " + d.path);
      }
      const std::string dom(domain);
      const std::string prefix = DomainPrefix(dom);
      auto last = d.last_index_key.find(dom);
      if (last != d.last_index_key.end()) {
        it->Seek(last->second);
        if (it->Valid() && View(it->key()) == last->second) it->Next();
      }
      std::vector<Entry>& out = fresh[dom];
      for (; it->Valid() && it->key().starts_with(prefix); it->Next()) {
        Entry e;
        ParseDomainIndexKey(View(it->key()), &domain, &rk);
        ParseRecordKey(rk, &e.time_us, nullptr, nullptr);
        e.dir = static_cast<uint32_t>(di);
        std::memcpy(e.key, rk.data(), kRecordKeySize);
        out.push_back(e);
        d.last_index_key[dom] = it->key().ToString();
      }
      if (!it->status().ok()) break;
      std::string next = dom;
      next.push_back('\x01');  // past every key of this domain
      it->Seek(next);
    }
    SPECLOOP_RETURN_IF_ERROR(it->status().Annotate("reading index of " + d.path));
    for (const DamagedRange& r : it->damaged()) CountDamage(di, 1, r.after, r.resume);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [dom, entries] : fresh) {
    if (entries.empty()) continue;
    DomainCatalog& c = catalog_[dom];
    const size_t old_size = c.entries.size();
    c.entries.insert(c.entries.end(), entries.begin(), entries.end());
    auto less = [](const Entry& a, const Entry& b) {
      return EntryLess(a.time_us, a.dir, a.key, b.time_us, b.dir, b.key);
    };
    std::sort(c.entries.begin() + old_size, c.entries.end(), less);
    std::inplace_merge(c.entries.begin(), c.entries.begin() + old_size, c.entries.end(), less);
    c.cum_half_life = -1;
  }
  // Forget what retention dropped (the oldest records of each directory).
  for (auto it = catalog_.begin(); it != catalog_.end();) {
    DomainCatalog& c = it->second;
    const size_t before = c.entries.size();
    c.entries.erase(std::remove_if(c.entries.begin(), c.entries.end(),
                                   [&](const Entry& e) { return e.time_us < oldest[e.dir]; }),
                    c.entries.end());
    if (c.entries.size() != before) c.cum_half_life = -1;
    it = c.entries.empty() ? catalog_.erase(it) : std::next(it);
  }
  return Status::OK();
}

Status ReplayReader::ReadRecord(size_t dir, std::string_view key, Record* record) {
  Dir& d = *dirs_[dir];
  rocksdb::PinnableSlice value;
  Status s = d.Get(key, &value);
  if (s.IsCorruption()) {  // a damaged block: count its file
    const std::string k(key);
    CountDamage(dir, 0, k, k);
  }
  SPECLOOP_RETURN_IF_ERROR(s);
  records_decoded_.fetch_add(1);
  s = DecodeRecord(std::string_view(value.data(), value.size()), record);
  if (!s.ok()) CountUndecodable(dir, key);
  return s.Annotate("in " + d.path);
}

void ReplayReader::CountDamage(size_t dir, int cf, const std::string& lo, const std::string& hi) {
  Dir& d = *dirs_[dir];
  const std::string name = cf == 0 ? rocksdb::kDefaultColumnFamilyName : kIndexColumnFamily;
  for (const rocksdb::LiveFileMetaData& m : LiveTableFiles(d.db, name, lo, hi)) {
    {
      std::lock_guard<std::mutex> lock(damage_mu_);
      if (!counted_files_.insert({dir, m.file_number}).second) continue;
    }
    FileDamage fd;
    if (!ScanTableFile(m, &fd).ok() || !fd.damaged()) {
      std::lock_guard<std::mutex> lock(damage_mu_);
      counted_files_.erase({dir, m.file_number});  // not (yet) known damaged: look again later
      continue;
    }
    std::lock_guard<std::mutex> lock(damage_mu_);
    skipped_[cf == 0 ? "damaged_block" : "damaged_index"] += fd.lost();
    damaged_files_.push_back(fd.file);
  }
}

void ReplayReader::CountUndecodable(size_t dir, std::string_view key) {
  std::lock_guard<std::mutex> lock(damage_mu_);
  if (undecodable_.insert({dir, std::string(key)}).second) skipped_["undecodable"]++;
}

void ReplayReader::Forget(size_t dir, std::string_view key) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [dom, c] : catalog_) {
    const size_t before = c.entries.size();
    c.entries.erase(std::remove_if(c.entries.begin(), c.entries.end(),
                                   [&](const Entry& e) {
                                     return e.dir == dir &&
                                            std::string_view(e.key, kRecordKeySize) == key;
                                   }),
                    c.entries.end());
    if (c.entries.size() != before) c.cum_half_life = -1;
  }
}

std::map<std::string, uint64_t> ReplayReader::records_skipped() const {
  std::lock_guard<std::mutex> lock(damage_mu_);
  std::map<std::string, uint64_t> out = {
      {"damaged_block", 0}, {"undecodable", 0}, {"damaged_index", 0}, {"damaged_wal", 0}};
  for (const auto& [reason, n] : skipped_) out[reason] += n;
  return out;
}

std::vector<std::string> ReplayReader::damaged_files() const {
  std::lock_guard<std::mutex> lock(damage_mu_);
  return damaged_files_;
}

Status ReplayReader::Read(size_t dir_index, std::string_view key, Record* record) {
  if (dir_index >= dirs_.size()) {
    return Status::InvalidArgument("no buffer directory " + std::to_string(dir_index));
  }
  Status s = ReadRecord(dir_index, key, record);
  return s.IsCorruption() ? Status::NotFound("damaged record: " + s.ToString()) : s;
}

Status ReplayReader::CountUndecodableRecord(size_t dir_index, std::string_view key) {
  if (dir_index >= dirs_.size()) {
    return Status::InvalidArgument("no buffer directory " + std::to_string(dir_index));
  }
  if (key.size() != kRecordKeySize) {
    return Status::InvalidArgument("not a record key (" + std::to_string(key.size()) +
                                   " bytes, a record key has " +
                                   std::to_string(kRecordKeySize) + ")");
  }
  CountUndecodable(dir_index, key);
  return Status::OK();
}

Status ReplayReader::Scan(const ScanOptions& options, const Visitor& visit) {
  return ScanKeyed(options, [&](size_t dir, std::string_view, const Record& r) {
    return visit(dir, r);
  });
}

Status ReplayReader::ScanKeyed(const ScanOptions& options, const KeyedVisitor& visit) {
  Record record;
  return ScanEncoded(options, [&](size_t dir, std::string_view key, std::string_view data) {
    records_decoded_.fetch_add(1);
    if (!DecodeRecord(data, &record).ok()) {
      CountUndecodable(dir, key);
      return true;
    }
    return visit(dir, key, record);
  });
}

Status ReplayReader::ScanEncoded(const ScanOptions& options, const EncodedVisitor& visit) {
  if (options.since_us >= options.until_us) return Status::OK();
  // One cursor per directory, over the records or over the domain's index keys.
  struct Cursor {
    std::unique_ptr<SalvagingIterator> it;
    std::string upper;
    rocksdb::Slice upper_slice;
    rocksdb::ReadOptions ro;
    size_t prefix_len = 0;
  };
  const std::string prefix = options.domain ? DomainPrefix(*options.domain) : std::string();
  const std::string until_key = options.until_us == std::numeric_limits<uint64_t>::max()
                                    ? std::string(kRecordKeySize, '\xff') + '\xff'
                                    : TimeKey(options.until_us);
  std::vector<Cursor> cursors(dirs_.size());
  for (size_t i = 0; i < dirs_.size(); i++) {
    Cursor& c = cursors[i];
    c.upper = prefix + until_key;
    c.upper_slice = rocksdb::Slice(c.upper);
    c.prefix_len = prefix.size();
    c.ro.iterate_upper_bound = &c.upper_slice;
    c.ro.fill_cache = false;
    c.it = dirs_[i]->Salvaging(options.domain ? 1 : 0, &c.ro);
    c.it->Seek(prefix + TimeKey(options.since_us));
  }
  // Counts what the cursors stepped over, once the scan ends.
  struct CountOnExit {
    ReplayReader* self;
    std::vector<Cursor>* cursors;
    int cf;
    ~CountOnExit() {
      for (size_t i = 0; i < cursors->size(); i++) {
        for (const DamagedRange& r : (*cursors)[i].it->damaged()) {
          self->CountDamage(i, cf, r.after, r.to_end ? std::string() : r.resume);
        }
      }
    }
  } count_on_exit{this, &cursors, options.domain ? 1 : 0};
  rocksdb::PinnableSlice value;
  for (;;) {
    int best = -1;
    std::string_view best_key;
    for (size_t i = 0; i < cursors.size(); i++) {
      if (!cursors[i].it->Valid()) {
        SPECLOOP_RETURN_IF_ERROR(cursors[i].it->status().Annotate("scanning"));
        continue;
      }
      std::string_view k = View(cursors[i].it->key()).substr(cursors[i].prefix_len);
      if (best < 0 || k < best_key) {
        best = static_cast<int>(i);
        best_key = k;
      }
    }
    if (best < 0) return Status::OK();
    Cursor& c = cursors[best];
    std::string_view data;
    if (options.domain) {  // the index holds keys: the record is read from the records
      Status s = dirs_[best]->Get(best_key, &value);
      if (s.IsNotFound() || s.IsCorruption()) {  // gone by retention / in a damaged block
        if (s.IsCorruption()) {
          const std::string k(best_key);
          CountDamage(best, 0, k, k);
        }
        c.it->Next();
        continue;
      }
      SPECLOOP_RETURN_IF_ERROR(s);
      data = std::string_view(value.data(), value.size());
    } else {
      data = View(c.it->value());
    }
    if (!visit(best, best_key, data)) return Status::OK();
    c.it->Next();
  }
}

Status ReplayReader::Sample(const SampleOptions& options, Rng* rng, std::vector<Record>* batch) {
  batch->clear();
  if (options.batch_size == 0) return Status::OK();
  const double half_life_us = options.half_life_seconds * 1e6;
  // Draw (dir, key) pairs under the lock, read them after.
  std::vector<std::pair<uint32_t, std::string>> picks;
  size_t attempts = 0;
  while (batch->size() < options.batch_size) {
    picks.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<DomainCatalog*> doms;
      std::vector<double> dom_cum;
      double total = 0;
      for (auto& [name, c] : catalog_) {
        auto w = options.domain_weights.find(name);
        const double weight =
            w != options.domain_weights.end() ? w->second : options.default_domain_weight;
        if (!(weight > 0) || c.entries.empty()) continue;
        total += weight;
        doms.push_back(&c);
        dom_cum.push_back(total);
      }
      if (doms.empty()) return Status::NotFound("no records to sample from");
      for (size_t n = batch->size(); n < options.batch_size; n++) {
        const double u = rng->Uniform() * total;
        size_t di = std::upper_bound(dom_cum.begin(), dom_cum.end(), u) - dom_cum.begin();
        DomainCatalog& c = *doms[std::min(di, doms.size() - 1)];
        size_t idx;
        if (half_life_us <= 0) {
          idx = static_cast<size_t>(rng->Uniform() * c.entries.size());
        } else {
          if (c.cum_half_life != half_life_us) {
            const double newest = static_cast<double>(c.entries.back().time_us);
            c.cum.resize(c.entries.size());
            double acc = 0;
            for (size_t i = 0; i < c.entries.size(); i++) {
              acc += std::exp2(-(newest - static_cast<double>(c.entries[i].time_us)) /
                               half_life_us);
              c.cum[i] = acc;
            }
            c.cum_half_life = half_life_us;
          }
          const double v = rng->Uniform() * c.cum.back();
          idx = std::upper_bound(c.cum.begin(), c.cum.end(), v) - c.cum.begin();
        }
        idx = std::min(idx, c.entries.size() - 1);
        picks.emplace_back(c.entries[idx].dir, std::string(c.entries[idx].key, kRecordKeySize));
      }
    }
    for (auto& [dir, key] : picks) {
      Record r;
      Status s = ReadRecord(dir, key, &r);
      if (s.IsNotFound()) continue;  // dropped by retention since the last CatchUp()
      if (s.IsCorruption()) {        // damaged (counted by ReadRecord): never drawn again
        Forget(dir, key);
        continue;
      }
      SPECLOOP_RETURN_IF_ERROR(s);
      batch->push_back(std::move(r));
    }
    if (++attempts > 16) return Status::NotFound("sampled records keep disappearing");
  }
  return Status::OK();
}

std::map<std::string, uint64_t> ReplayReader::DomainCounts() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, uint64_t> out;
  for (const auto& [name, c] : catalog_) out[name] = c.entries.size();
  return out;
}

uint64_t ReplayReader::num_records() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& [name, c] : catalog_) n += c.entries.size();
  return n;
}

}  // namespace specloop
