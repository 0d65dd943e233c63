// The trainer on a damaged buffer (issue 47 item 3): a real logged buffer (target-6m verifying
// draft-prose-1m) with 256 bytes of its records' table file overwritten and one record whose
// bytes do not decode. The online path (catch-up, batches, steps, evaluation) and the offline
// path keep going; the damage is counted, the same count an independent reader finds, and
// exported as specloop_train_records_skipped_total{reason} and in `train --offline`'s report.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <rocksdb/db.h>

#include "buffer/replay_buffer.h"
#include "buffer/replay_reader.h"
#include "common/observe/metrics.h"
#include "tests/trainer/test_util.h"
#include "tests/trainer/traffic_trainer_options.h"
#include "trainer/trainer.h"

namespace specloop {
namespace {

namespace fs = std::filesystem;
using testing::SharedDir;
using testing::TempDir;

class SalvageTrainer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("specloop-salvage-trainer");
    const std::string buf = dir_->Sub("buffer");
    Status s = testing::MakeTrafficBuffer(buf);
    ASSERT_TRUE(s.ok()) << s.ToString();
    {  // one record whose bytes do not decode
      std::unique_ptr<ReplayBuffer> b;
      ASSERT_TRUE(ReplayBuffer::Open(BufferOptions(), buf, &b).ok());
      std::unique_ptr<rocksdb::Iterator> it(
          b->db()->NewIterator(rocksdb::ReadOptions(), b->records_cf()));
      it->SeekToLast();
      ASSERT_TRUE(it->Valid());
      std::string key = it->key().ToString(), value = it->value().ToString();
      it.reset();
      value[value.size() / 2] ^= 0x10;
      ASSERT_TRUE(b->db()->Put(rocksdb::WriteOptions(), b->records_cf(), key, value).ok());
      ASSERT_TRUE(b->Flush().ok());
    }
    std::string sst;  // the largest table file: the records'
    uintmax_t size = 0;
    for (const auto& e : fs::directory_iterator(buf)) {
      if (e.path().extension() == ".sst" && e.file_size() > size) {
        sst = e.path().string();
        size = e.file_size();
      }
    }
    ASSERT_FALSE(sst.empty());
    std::fstream f(sst, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2));
    const std::string junk(256, '\x5a');
    f.write(junk.data(), junk.size());
  }
  static void TearDownTestSuite() { delete dir_; }

  static trainer::TrainerOptions Options(const std::string& checkpoints) {
    return testing::TrafficTrainerOptions(dir_->Sub("buffer"), checkpoints);
  }

  // What an independent reader finds: records read, and skipped by reason.
  static void ReaderCounts(uint64_t* read, std::map<std::string, uint64_t>* skipped) {
    std::unique_ptr<ReplayReader> r;
    ASSERT_TRUE(ReplayReader::Open(ReaderOptions(), {dir_->Sub("buffer")}, &r).ok());
    *read = 0;
    ASSERT_TRUE(r->Scan(ScanOptions(), [&](size_t, const Record&) {
                   ++*read;
                   return true;
                 }).ok());
    *skipped = r->records_skipped();
  }

  static TempDir* dir_;
};
TempDir* SalvageTrainer::dir_ = nullptr;

TEST_F(SalvageTrainer, OnlineKeepsTrainingAndCountsTheDamage) {
  uint64_t read = 0;
  std::map<std::string, uint64_t> expect;
  ReaderCounts(&read, &expect);
  ASSERT_GT(expect["damaged_block"], 0u);
  ASSERT_EQ(expect["undecodable"], 1u);
  ASSERT_GT(read, 0u);

  TempDir ckpt;
  metrics::Registry registry;
  std::unique_ptr<trainer::Trainer> t;
  Status s = trainer::Trainer::Open(Options(ckpt.path()), &registry, &t);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(t->CatchUp().ok());
  int steps = 0;
  for (int i = 0; i < 12; i++) {
    std::vector<Record> batch;
    s = t->SampleBatch(&batch);
    ASSERT_TRUE(s.ok()) << s.ToString();
    std::vector<const Record*> ptrs;
    for (const Record& r : batch) ptrs.push_back(&r);
    double loss = 0;
    s = t->TrainStep(ptrs, &loss);
    ASSERT_TRUE(s.ok()) << s.ToString();
    steps += loss != 0;
  }
  EXPECT_GT(steps, 0);
  trainer::EvalResult r;
  s = t->EvaluateAndPublish(nullptr, /*force=*/true, &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(t->CatchUp().ok());  // exports the counts
  const auto skipped = t->records_skipped();
  EXPECT_EQ(skipped.at("damaged_block"), expect["damaged_block"]);
  EXPECT_EQ(skipped.at("undecodable"), 1u);
  const std::string text = registry.Serialize();
  EXPECT_NE(text.find("specloop_train_records_skipped_total{reason=\"damaged_block\"} " +
                      std::to_string(expect["damaged_block"])),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("specloop_train_records_skipped_total{reason=\"undecodable\"} 1"),
            std::string::npos);
  std::cout << "damaged buffer: " << read << " records read, " << expect["damaged_block"]
            << " lost in a damaged block, 1 undecodable; " << steps << " of 12 steps trained\n";
}

TEST_F(SalvageTrainer, OfflineTrainsOnTheIntactRecords) {
  uint64_t read = 0;
  std::map<std::string, uint64_t> expect;
  ReaderCounts(&read, &expect);
  TempDir ckpt;
  std::unique_ptr<trainer::Trainer> t;
  Status s = trainer::Trainer::Open(Options(ckpt.path()), nullptr, &t);
  ASSERT_TRUE(s.ok()) << s.ToString();
  trainer::EvalResult r;
  s = t->RunOffline(1, /*force=*/true, {}, &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(t->steps(), 0);
  const auto skipped = t->records_skipped();
  EXPECT_EQ(skipped.at("damaged_block"), expect["damaged_block"]);
  EXPECT_EQ(skipped.at("undecodable"), 1u);
}

// `specloop train --offline` as users run it: exit 0 (--force), and the JSON report's
// "records_skipped" carries the damage an independent reader counts.
TEST_F(SalvageTrainer, OfflineCommandReportsTheDamage) {
  uint64_t read = 0;
  std::map<std::string, uint64_t> expect;
  ReaderCounts(&read, &expect);
  TempDir ckpt;
  const std::string cmd = std::string("'") + SPECLOOP_BINARY + "' train --draft '" +
                          SharedDir() + "/models/draft-prose-1m' --buffer '" +
                          dir_->Sub("buffer") + "' --checkpoints '" + ckpt.path() +
                          "' --lr 1e-3 --metrics-port 0 --threads 1 --offline --epochs 1 "
                          "--force 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[8192];
  std::string last;
  while (fgets(buf, sizeof(buf), p)) {
    if (buf[0] == '{') last = buf;
  }
  const int status = pclose(p);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  ASSERT_FALSE(last.empty());
  const auto j = nlohmann::json::parse(last);
  EXPECT_EQ(j["records_skipped"]["damaged_block"].get<uint64_t>(), expect["damaged_block"]);
  EXPECT_EQ(j["records_skipped"]["undecodable"].get<uint64_t>(), 1u);
  EXPECT_EQ(j["records_skipped"]["damaged_wal"].get<uint64_t>(), 0u);
  EXPECT_GT(j["steps"].get<int64_t>(), 0);
}

}  // namespace
}  // namespace specloop
