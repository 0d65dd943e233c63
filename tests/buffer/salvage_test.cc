// Damaged buffers salvaged (issue 47 item 3): real RocksDB buffers on disk, damaged three ways
// (256 bytes of a table file overwritten, a record whose bytes do not decode, the WAL cut
// short), then read by the reader (the trainer's path), stats, verify and repair. Each test
// checks the records recovered against the records written: every intact record recovered
// byte for byte, every damaged one counted.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <rocksdb/db.h>

#include "buffer/buffer_tools.h"
#include "buffer/keys.h"
#include "buffer/record_codec.h"
#include "buffer/replay_buffer.h"
#include "buffer/replay_reader.h"
#include "buffer/rocksdb_options.h"
#include "buffer/salvage_iterator.h"
#include "tests/buffer/test_util.h"

namespace specloop {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr int kRecords = 400;

// Small records (about 15 to a 4 KiB block), distinct request ids, increasing times.
std::vector<Record> MakeRecords(uint64_t seed) {
  testing::Shape shape;
  shape.max_tokens = 16;
  shape.max_steps = 2;
  shape.max_k = 2;
  shape.max_top_k = 4;
  Rng rng(seed);
  std::vector<Record> out;
  for (int i = 0; i < kRecords; i++) {
    Record r = testing::RandomRecord(&rng, shape);
    r.time_us = 1700000000000000ull + 1000ull * i;
    r.request_id = "r" + std::to_string(i);
    r.domain = i % 3 == 0 ? "python" : "prose";
    out.push_back(std::move(r));
  }
  return out;
}

std::string Encoded(const Record& r) {
  std::string v;
  EXPECT_TRUE(EncodeRecord(r, &v).ok());
  return v;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The largest table file in `dir`: the records' (the index and meta files are small).
std::string LargestSst(const std::string& dir) {
  std::string best;
  uintmax_t best_size = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".sst" && e.file_size() > best_size) {
      best = e.path().string();
      best_size = e.file_size();
    }
  }
  return best;
}

// Every record the reader scans, by request id (encoded bytes).
std::map<std::string, std::string> ScanAll(const std::string& dir,
                                           std::map<std::string, uint64_t>* skipped) {
  std::unique_ptr<ReplayReader> reader;
  Status s = ReplayReader::Open(ReaderOptions(), {dir}, &reader);
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::map<std::string, std::string> out;
  if (!s.ok()) return out;
  s = reader->Scan(ScanOptions(), [&](size_t, const Record& r) {
    out[r.request_id] = Encoded(r);
    return true;
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  *skipped = reader->records_skipped();
  return out;
}

// Every record in a buffer read as primary (after RocksDB's RepairDB), by request id.
std::map<std::string, std::string> ReadPrimary(const std::string& dir) {
  std::map<std::string, std::string> out;
  std::unique_ptr<ReplayBuffer> buf;
  BufferOptions bo;
  bo.create_if_missing = false;
  Status s = ReplayBuffer::Open(bo, dir, &buf);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return out;
  std::unique_ptr<rocksdb::Iterator> it(
      buf->db()->NewIterator(rocksdb::ReadOptions(), buf->records_cf()));
  Record r;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (DecodeRecord(std::string_view(it->value().data(), it->value().size()), &r).ok()) {
      out[r.request_id] = Encoded(r);
    }
  }
  return out;
}

class Salvage : public ::testing::Test {
 protected:
  void SetUp() override {
    records_ = MakeRecords(47);
    dir_ = tmp_.Sub("buf");
    std::unique_ptr<ReplayBuffer> buf;
    ASSERT_TRUE(ReplayBuffer::Open(BufferOptions(), dir_, &buf).ok());
    for (int i = 0; i < kRecords; i++) {
      ASSERT_TRUE(buf->Write({SequencedRecord{static_cast<uint64_t>(i), records_[i]}}, false)
                      .ok());
    }
    ASSERT_TRUE(buf->Flush().ok());
  }
  TempDir tmp_;
  std::string dir_;
  std::vector<Record> records_;
};

// 256 bytes in the middle of the records' table file overwritten: the reader, stats, verify
// and repair recover every record outside the damaged blocks, and count the rest.
TEST_F(Salvage, DamagedSstBlock) {
  const std::string sst = LargestSst(dir_);
  ASSERT_FALSE(sst.empty());
  const std::string pristine = ReadFile(sst);
  const size_t off = pristine.size() / 2;
  {
    std::fstream f(sst, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(off));
    const std::string junk(256, '\x5a');
    f.write(junk.data(), junk.size());
  }
  // An independent oracle from the undamaged file (no compression: each record's bytes lie in
  // it as written): a record overlapping the overwritten bytes must be lost; one further than
  // a block (4 KiB) plus a record from them cannot be in a damaged block and must be recovered.
  size_t max_len = 0;
  for (const Record& r : records_) max_len = std::max(max_len, Encoded(r).size());
  std::set<std::string> must_lose, must_keep;
  for (const Record& r : records_) {
    const std::string v = Encoded(r);
    const size_t at = pristine.find(v);
    ASSERT_NE(at, std::string::npos) << r.request_id;
    if (at < off + 256 && at + v.size() > off) must_lose.insert(r.request_id);
    const size_t margin = 4096 + 2 * max_len;
    if (at + v.size() + margin < off || at > off + 256 + margin) must_keep.insert(r.request_id);
  }
  ASSERT_FALSE(must_lose.empty());

  std::map<std::string, uint64_t> skipped;
  const auto got = ScanAll(dir_, &skipped);
  const uint64_t lost = skipped["damaged_block"];
  EXPECT_EQ(got.size() + lost, static_cast<size_t>(kRecords));
  EXPECT_EQ(skipped["undecodable"], 0u);
  EXPECT_GT(lost, 0u);
  for (const Record& r : records_) {
    auto it = got.find(r.request_id);
    if (it != got.end()) EXPECT_EQ(it->second, Encoded(r)) << r.request_id;
    if (must_lose.count(r.request_id)) EXPECT_EQ(it, got.end()) << r.request_id;
    if (must_keep.count(r.request_id)) EXPECT_NE(it, got.end()) << r.request_id;
  }
  std::cout << "damaged SST block: written " << kRecords << ", recovered " << got.size()
            << ", counted lost " << lost << " (" << must_lose.size()
            << " overlap the overwritten bytes)\n";

  // Sampling (the online trainer) keeps drawing intact records.
  {
    std::unique_ptr<ReplayReader> reader;
    ASSERT_TRUE(ReplayReader::Open(ReaderOptions(), {dir_}, &reader).ok());
    Rng rng(1);
    SampleOptions so;
    so.batch_size = 64;
    for (int i = 0; i < 20; i++) {
      std::vector<Record> batch;
      Status s = reader->Sample(so, &rng, &batch);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_EQ(batch.size(), 64u);
      for (const Record& r : batch) EXPECT_EQ(must_lose.count(r.request_id), 0u);
    }
    EXPECT_EQ(reader->records_skipped()["damaged_block"], lost);
    ASSERT_EQ(reader->damaged_files().size(), 1u);
    EXPECT_EQ(reader->damaged_files()[0], sst);
    // A scan by domain reads records through the index: the same intact ones.
    size_t by_domain = 0;
    for (const char* d : {"prose", "python"}) {
      ScanOptions so2;
      so2.domain = d;
      ASSERT_TRUE(reader->Scan(so2, [&](size_t, const Record&) {
                          by_domain++;
                          return true;
                        }).ok());
    }
    EXPECT_EQ(by_domain, got.size());
  }

  BufferStats st;
  Status s = ComputeBufferStats(dir_, &st);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(st.records, got.size());
  EXPECT_EQ(st.damaged_block_records, lost);
  EXPECT_TRUE(st.damaged());

  VerifyReport vr;
  s = VerifyBuffer(dir_, &vr);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_EQ(vr.records, got.size());
  EXPECT_EQ(vr.damaged_block_records, lost);
  ASSERT_EQ(vr.damaged_files.size(), 1u);
  EXPECT_EQ(vr.damaged_files[0].file, sst);
  EXPECT_FALSE(vr.damaged_files[0].ranges.empty());

  RepairReport rr, again;
  s = RepairBuffer(dir_, tmp_.Sub("repaired"), &rr);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(rr.copied, got.size());
  EXPECT_EQ(rr.damaged_block_records, lost);
  VerifyReport clean;
  s = VerifyBuffer(tmp_.Sub("repaired"), &clean);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(clean.records, got.size());
  std::map<std::string, uint64_t> none;
  EXPECT_EQ(ScanAll(tmp_.Sub("repaired"), &none), got);
  EXPECT_TRUE(RepairBuffer(dir_, tmp_.Sub("repaired"), &again).IsInvalidArgument());

  // RocksDB's RepairDB on a copy, for comparison: what it keeps of the same damage.
  fs::copy(dir_, tmp_.Sub("rocks"), fs::copy_options::recursive);
  rocksdb::Options opt = MakeDbOptions(BufferOptions());
  s = FromRocks(rocksdb::RepairDB(tmp_.Sub("rocks"), opt, ColumnFamilies(opt)), "RepairDB");
  ASSERT_TRUE(s.ok()) << s.ToString();
  const auto rocks = ReadPrimary(tmp_.Sub("rocks"));
  for (const auto& [id, v] : rocks) EXPECT_EQ(got.count(id), 1u) << id;
  EXPECT_LE(rocks.size(), got.size());
  std::cout << "RepairDB kept " << rocks.size() << " of " << kRecords
            << "; buffer repair kept " << rr.copied << "\n";
}

// On an intact buffer the salvaging iterator reads what a plain iterator reads; its cost beside
// one is printed (ratio per round, 7 rounds alternating, each 200 full scans of 400 records).
TEST_F(Salvage, IntactScanMatchesAPlainIterator) {
  std::unique_ptr<ReplayBuffer> buf;
  ASSERT_TRUE(ReplayBuffer::Open(BufferOptions(), dir_, &buf).ok());
  rocksdb::DB* db = buf->db();
  rocksdb::ColumnFamilyHandle* cf = buf->records_cf();
  auto plain = [&] {
    uint64_t n = 0, bytes = 0;
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), cf));
    for (it->SeekToFirst(); it->Valid(); it->Next()) n++, bytes += it->value().size();
    EXPECT_TRUE(it->status().ok());
    return n * 1000003 + bytes;
  };
  auto salvaging = [&] {
    uint64_t n = 0, bytes = 0;
    SalvagingIterator it([&] { return db->NewIterator(rocksdb::ReadOptions(), cf); },
                         kRecordKeySize);
    for (it.SeekToFirst(); it.Valid(); it.Next()) n++, bytes += it.value().size();
    EXPECT_TRUE(it.status().ok());
    EXPECT_TRUE(it.damaged().empty());
    return n * 1000003 + bytes;
  };
  ASSERT_EQ(plain(), salvaging());
  EXPECT_EQ(plain() / 1000003, static_cast<uint64_t>(kRecords));
  std::vector<double> ratios;
  for (int round = 0; round < 7; round++) {
    double secs[2] = {0, 0};
    for (int which : {round % 2, 1 - round % 2}) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 200; i++) (which == 0 ? plain() : salvaging());
      secs[which] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    ratios.push_back(secs[1] / secs[0]);
  }
  std::sort(ratios.begin(), ratios.end());
  std::cout << "intact scan, salvaging / plain iterator time: median " << ratios[3] << " (range "
            << ratios.front() << " .. " << ratios.back() << ", 7 rounds)\n";
}

// A record whose bytes do not decode (written raw under a valid key, with its index entry):
// every other record is read, the bad one counted once and never sampled.
TEST_F(Salvage, GarbageRecord) {
  const Record& victim = records_[123];
  const std::string key = RecordKey(victim.time_us, victim.worker_id, 123);
  {
    std::unique_ptr<ReplayBuffer> buf;
    ASSERT_TRUE(ReplayBuffer::Open(BufferOptions(), dir_, &buf).ok());
    std::string garbage = Encoded(victim);
    garbage[garbage.size() / 2] ^= 0x40;
    ASSERT_TRUE(buf->db()->Put(rocksdb::WriteOptions(), buf->records_cf(), key, garbage).ok());
  }
  std::map<std::string, uint64_t> skipped;
  const auto got = ScanAll(dir_, &skipped);
  EXPECT_EQ(got.size(), static_cast<size_t>(kRecords - 1));
  EXPECT_EQ(got.count(victim.request_id), 0u);
  EXPECT_EQ(skipped["undecodable"], 1u);
  EXPECT_EQ(skipped["damaged_block"], 0u);
  for (const Record& r : records_) {
    auto it = got.find(r.request_id);
    if (it != got.end()) EXPECT_EQ(it->second, Encoded(r));
  }
  {
    std::unique_ptr<ReplayReader> reader;
    ASSERT_TRUE(ReplayReader::Open(ReaderOptions(), {dir_}, &reader).ok());
    Rng rng(2);
    SampleOptions so;
    so.batch_size = 200;
    for (int i = 0; i < 10; i++) {
      std::vector<Record> batch;
      ASSERT_TRUE(reader->Sample(so, &rng, &batch).ok());
      for (const Record& r : batch) EXPECT_NE(r.request_id, victim.request_id);
    }
    EXPECT_EQ(reader->records_skipped()["undecodable"], 1u);  // once, however often drawn
    Record r;
    EXPECT_TRUE(reader->Read(0, key, &r).IsNotFound());  // gone, as if retention removed it
    EXPECT_EQ(reader->records_skipped()["undecodable"], 1u);
  }
  VerifyReport vr;
  EXPECT_TRUE(VerifyBuffer(dir_, &vr).IsCorruption());
  EXPECT_EQ(vr.corrupt_records, 1u);
  bool named = false;
  for (const auto& p : vr.problems) named |= p.find(DescribeKey(key)) != std::string::npos;
  EXPECT_TRUE(named);
  RepairReport rr;
  ASSERT_TRUE(RepairBuffer(dir_, tmp_.Sub("repaired"), &rr).ok());
  EXPECT_EQ(rr.copied, static_cast<uint64_t>(kRecords - 1));
  EXPECT_EQ(rr.undecodable, 1u);
  VerifyReport clean;
  EXPECT_TRUE(VerifyBuffer(tmp_.Sub("repaired"), &clean).ok());
}

// A ScanEncoded() caller that decodes the bytes itself (the trainer's ScanNew) counts the
// record that does not decode through CountUndecodableRecord(): once, however often it is met,
// and the same record met by Scan() is not counted again. Without the call nothing is counted
// (ScanEncoded() does not decode), so the count comes from it.
TEST_F(Salvage, ScanEncodedCallerCountsAnUndecodableRecordOnce) {
  const Record& victim = records_[77];
  const std::string key = RecordKey(victim.time_us, victim.worker_id, 77);
  {
    std::unique_ptr<ReplayBuffer> buf;
    ASSERT_TRUE(ReplayBuffer::Open(BufferOptions(), dir_, &buf).ok());
    std::string garbage = Encoded(victim);
    garbage[garbage.size() / 2] ^= 0x40;
    ASSERT_TRUE(buf->db()->Put(rocksdb::WriteOptions(), buf->records_cf(), key, garbage).ok());
  }
  std::unique_ptr<ReplayReader> reader;
  ASSERT_TRUE(ReplayReader::Open(ReaderOptions(), {dir_}, &reader).ok());
  const uint64_t decoded_before = reader->records_decoded();
  auto scan = [&](bool count, int* bad, int* good) {
    *bad = *good = 0;
    Record r;
    return reader->ScanEncoded(ScanOptions(), [&](size_t dir, std::string_view k,
                                                  std::string_view data) {
      if (DecodeRecord(data, &r).ok()) {
        ++*good;
        return true;
      }
      ++*bad;
      EXPECT_EQ(k, key);
      if (count) EXPECT_TRUE(reader->CountUndecodableRecord(dir, k).ok());
      return true;
    });
  };
  int bad = 0, good = 0;
  ASSERT_TRUE(scan(false, &bad, &good).ok());
  EXPECT_EQ(bad, 1);
  EXPECT_EQ(good, kRecords - 1);
  EXPECT_EQ(reader->records_skipped()["undecodable"], 0u);  // the companion: nothing counted
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(scan(true, &bad, &good).ok());
    EXPECT_EQ(bad, 1);
    EXPECT_EQ(reader->records_skipped()["undecodable"], 1u);
  }
  EXPECT_EQ(reader->records_decoded(), decoded_before);  // counted without reading it again
  ASSERT_TRUE(reader->Scan(ScanOptions(), [](size_t, const Record&) { return true; }).ok());
  EXPECT_EQ(reader->records_skipped()["undecodable"], 1u);
  EXPECT_EQ(reader->records_skipped()["damaged_block"], 0u);
  EXPECT_TRUE(reader->CountUndecodableRecord(1, key).IsInvalidArgument());
  EXPECT_TRUE(reader->CountUndecodableRecord(0, "short").IsInvalidArgument());
  EXPECT_EQ(reader->records_skipped()["undecodable"], 1u);
}

// A crash image of a buffer whose records are only in its WAL: `image` holds the directory
// as a killed writer would leave it, *wal the WAL's path, (*wal_end)[i] its size after write i.
void WalImage(const std::string& dir, const std::string& image,
              const std::vector<Record>& records, std::string* wal_path,
              std::vector<uintmax_t>* wal_end) {
  std::string wal;
  {
    std::unique_ptr<ReplayBuffer> buf;
    ASSERT_TRUE(ReplayBuffer::Open(BufferOptions(), dir, &buf).ok());
    for (int i = 0; i < kRecords; i++) {
      ASSERT_TRUE(
          buf->Write({SequencedRecord{static_cast<uint64_t>(i), records[i]}}, true).ok());
      if (wal.empty()) {
        for (const auto& e : fs::directory_iterator(dir)) {
          if (e.path().extension() == ".log") wal = e.path().filename().string();
        }
      }
      ASSERT_FALSE(wal.empty());
      wal_end->push_back(fs::file_size(dir + "/" + wal));
    }
    fs::copy(dir, image, fs::copy_options::recursive);  // as a crash would leave it
  }
  fs::remove(image + "/LOCK");
  *wal_path = image + "/" + wal;
  ASSERT_EQ(fs::file_size(*wal_path), wal_end->back());
}

// The WAL cut short (a crash image taken while records were only in the WAL, then
// truncated in the middle of a write): every write completed before the cut is read.
TEST(SalvageWal, TruncatedWal) {
  TempDir tmp;
  const std::string dir = tmp.Sub("buf"), image = tmp.Sub("image");
  const std::vector<Record> records = MakeRecords(48);
  std::vector<uintmax_t> wal_end;
  std::string wal;
  WalImage(dir, image, records, &wal, &wal_end);
  // Cut in the middle of write 300.
  const uintmax_t cut = (wal_end[299] + wal_end[300]) / 2;
  fs::resize_file(wal, cut);
  const size_t intact = 300;  // writes 0..299 end before the cut

  std::map<std::string, uint64_t> skipped;
  const auto got = ScanAll(image, &skipped);
  EXPECT_EQ(got.size(), intact);
  for (size_t i = 0; i < intact; i++) {
    auto it = got.find(records[i].request_id);
    ASSERT_NE(it, got.end()) << i;
    EXPECT_EQ(it->second, Encoded(records[i]));
  }
  BufferStats st;
  ASSERT_TRUE(ComputeBufferStats(image, &st).ok());
  EXPECT_EQ(st.records, intact);
  RepairReport rr;
  ASSERT_TRUE(RepairBuffer(image, tmp.Sub("repaired"), &rr).ok());
  EXPECT_EQ(rr.copied, intact);
}

// Garbage over one write in the middle of the WAL (a secondary refuses such a WAL outright):
// the writes after the damaged log block are read, the lost ones counted.
TEST(SalvageWal, GarbageInWal) {
  TempDir tmp;
  const std::string dir = tmp.Sub("buf"), image = tmp.Sub("image");
  const std::vector<Record> records = MakeRecords(49);
  std::vector<uintmax_t> wal_end;
  std::string wal;
  WalImage(dir, image, records, &wal, &wal_end);
  const uintmax_t off = (wal_end[199] + wal_end[200]) / 2;
  {
    std::fstream f(wal, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(off));
    const std::string junk(32, '\x5a');
    f.write(junk.data(), junk.size());
  }
  // RocksDB's WAL reader drops the rest of a 32 KiB log block after a record that fails its
  // checksum: writes that end before the damage, or start in a later log block, must be read.
  constexpr uintmax_t kLogBlock = 32768;
  const uintmax_t block_end = (off / kLogBlock + 1) * kLogBlock;
  std::map<std::string, uint64_t> skipped;
  const auto got = ScanAll(image, &skipped);
  const uint64_t lost = skipped["damaged_wal"];
  EXPECT_EQ(got.size() + lost, static_cast<size_t>(kRecords));
  EXPECT_EQ(got.count(records[200].request_id), 0u);
  for (int i = 0; i < kRecords; i++) {
    auto it = got.find(records[i].request_id);
    if (it != got.end()) EXPECT_EQ(it->second, Encoded(records[i]));
    if (wal_end[i] <= off || (i > 0 && wal_end[i - 1] >= block_end)) {
      EXPECT_NE(it, got.end()) << i;
    }
  }
  BufferStats st;
  ASSERT_TRUE(ComputeBufferStats(image, &st).ok());
  EXPECT_EQ(st.records, got.size());
  EXPECT_EQ(st.damaged_wal_records, lost);
  EXPECT_TRUE(st.damaged());
  VerifyReport vr;
  EXPECT_TRUE(VerifyBuffer(image, &vr).IsCorruption());
  EXPECT_EQ(vr.damaged_wal_records, lost);
  RepairReport rr;
  ASSERT_TRUE(RepairBuffer(image, tmp.Sub("repaired"), &rr).ok());
  EXPECT_EQ(rr.copied, got.size());
  EXPECT_EQ(rr.damaged_wal_records, lost);
  // RocksDB's own answers to the same image: RepairDB, and a primary open (point in time).
  fs::copy(image, tmp.Sub("rocks"), fs::copy_options::recursive);
  rocksdb::Options opt = MakeDbOptions(BufferOptions());
  ASSERT_TRUE(rocksdb::RepairDB(tmp.Sub("rocks"), opt, ColumnFamilies(opt)).ok());
  const size_t rocks = ReadPrimary(tmp.Sub("rocks")).size();
  fs::copy(image, tmp.Sub("primary"), fs::copy_options::recursive);
  const size_t primary = ReadPrimary(tmp.Sub("primary")).size();
  EXPECT_LE(rocks, rr.copied);
  std::cout << "garbage in the WAL over write 200 of " << kRecords << ": buffer repair kept "
            << rr.copied << ", RepairDB " << rocks << ", a primary open " << primary << "\n";
}

}  // namespace
}  // namespace specloop
