// The trainer's per-domain floors (trainer.h: replay_floor_records, heldout_floor_per_domain):
// a domain that went idle keeps its place in every batch and in the held-out set after the
// buffer's retention removed its records. A buffer of two domains, "docs" logged an hour ago
// and "python" now; age retention (10 minutes) then removes every docs record.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "buffer/replay_buffer.h"
#include "tests/trainer/test_util.h"
#include "trainer/trainer.h"
#include "trainer/training_examples.h"

namespace specloop {
namespace trainer {
namespace {

using testing::SharedDir;
using testing::TempDir;

constexpr int kPerDomain = 60;
constexpr double kHeldOutFraction = 0.5;

uint64_t Now() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A record with a distinct prompt (its hash decides held out or not) and no logged step: the
// floors are about which records are kept, not what they train.
Record Make(const std::string& domain, int i, uint64_t time_us) {
  Record r;
  r.domain = domain;
  r.time_us = time_us;
  r.request_id = domain + "-" + std::to_string(i);
  r.target_id = "target-6m";
  r.tokens = {1, 100 + i, domain == "docs" ? 7 : 9, 5, 6};
  r.prompt_len = 3;
  return r;
}

class DomainFloorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BufferOptions bo;
    bo.max_age_seconds = 600;
    ASSERT_TRUE(ReplayBuffer::Open(bo, dir_.Sub("buffer"), &buffer_).ok());
    std::vector<SequencedRecord> records;
    const uint64_t now = Now();
    for (int i = 0; i < kPerDomain; ++i) {
      records.push_back({next_seq_++, Make("docs", i, now - 3600000000ull + i * 1000)});
      records.push_back({next_seq_++, Make("python", i, now - 60000000ull + i * 1000)});
    }
    ASSERT_TRUE(buffer_->Write(records, /*sync=*/false).ok());
    ASSERT_TRUE(buffer_->Flush().ok());
    for (const SequencedRecord& r : records) {
      (IsHeldOut(r.record, kHeldOutFraction) ? held_out_ : training_)[r.record.domain].push_back(
          r.record.time_us);
    }
    ASSERT_GT(held_out_["docs"].size(), 6u);  // the floors below must bind
    ASSERT_LT(held_out_["docs"].size(), kPerDomain - 10u);
  }

  TrainerOptions Options(size_t heldout_floor, int replay_floor) {
    TrainerOptions o;
    o.draft_dir = SharedDir() + "/models/draft-prose-1m";
    o.buffer_dirs = {dir_.Sub("buffer")};
    o.checkpoint_dir = dir_.Sub("checkpoints-" + std::to_string(heldout_floor) + "-" +
                                std::to_string(replay_floor));
    o.heldout_fraction = kHeldOutFraction;
    o.heldout_floor_per_domain = heldout_floor;
    o.replay_floor_records = replay_floor;
    o.reserve_records_per_domain = 5;
    o.batch_records = 8;
    return o;
  }

  // Drops every docs record from the buffer (age retention) and catches the trainers up.
  void RetainOnlyPython(const std::vector<Trainer*>& trainers) {
    RetentionResult rr;
    ASSERT_TRUE(buffer_->EnforceRetention(Now(), &rr).ok());
    ASSERT_TRUE(buffer_->Flush().ok());
    for (Trainer* t : trainers) ASSERT_TRUE(t->CatchUp().ok());
  }

  static std::map<std::string, std::vector<uint64_t>> HeldOutTimes(Trainer* t) {
    std::vector<Record> records;
    EXPECT_TRUE(t->LoadHeldOut(&records).ok());
    std::map<std::string, std::vector<uint64_t>> out;
    for (const Record& r : records) out[r.domain].push_back(r.time_us);
    for (auto& [d, v] : out) std::sort(v.begin(), v.end());
    return out;
  }

  TempDir dir_;
  std::unique_ptr<ReplayBuffer> buffer_;
  uint64_t next_seq_ = 1;
  // By domain, in time order.
  std::map<std::string, std::vector<uint64_t>> held_out_, training_;
};

TEST_F(DomainFloorTest, HeldOutFloorOutlivesRetention) {
  const size_t floors[] = {4, 0};
  std::unique_ptr<Trainer> trainers[2];
  for (int i = 0; i < 2; ++i) {  // both open before retention
    Status s = Trainer::Open(Options(floors[i], 1), nullptr, &trainers[i]);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(HeldOutTimes(trainers[i].get())["docs"], held_out_["docs"]);
  }
  RetainOnlyPython({trainers[0].get(), trainers[1].get()});
  for (int i = 0; i < 2; ++i) {
    const auto after = HeldOutTimes(trainers[i].get());
    EXPECT_EQ(after.count("python") ? after.at("python") : std::vector<uint64_t>(),
              held_out_["python"]);
    // The newest `floor` held-out docs records stay; none without a floor.
    const std::vector<uint64_t>& all = held_out_["docs"];
    const std::vector<uint64_t> newest(all.end() - floors[i], all.end());
    EXPECT_EQ(after.count("docs") ? after.at("docs") : std::vector<uint64_t>(), newest)
        << "floor " << floors[i];
  }
}

TEST_F(DomainFloorTest, ReplayFloorKeepsAnIdleDomainInEveryBatch) {
  const int floors[] = {1, 0};
  std::unique_ptr<Trainer> trainers[2];
  for (int i = 0; i < 2; ++i) {  // both open before retention
    Status s = Trainer::Open(Options(4, floors[i]), nullptr, &trainers[i]);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  RetainOnlyPython({trainers[0].get(), trainers[1].get()});
  for (int i = 0; i < 2; ++i) {
    int batches_with_docs = 0;
    for (int b = 0; b < 40; ++b) {
      std::vector<Record> batch;
      Status s = trainers[i]->SampleBatch(&batch);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_EQ(batch.size(), 8u);
      int docs = 0;
      for (const Record& r : batch) {
        if (r.domain == "docs") {
          ++docs;
          EXPECT_FALSE(IsHeldOut(r, kHeldOutFraction)) << "a held-out record in replay";
          // From the reserve: the newest 5 training records of docs.
          EXPECT_GE(r.time_us, training_["docs"].end()[-5]);
        }
      }
      batches_with_docs += docs > 0;
    }
    // With the floor, every batch; without it docs is gone with its records.
    EXPECT_EQ(batches_with_docs, floors[i] > 0 ? 40 : 0) << "floor " << floors[i];
  }
}

TEST_F(DomainFloorTest, ReplayFloorTakesAtMostHalfTheBatch) {
  std::unique_ptr<Trainer> t;
  TrainerOptions o = Options(4, 3);  // 2 domains x 3 > 8 / 2: they take turns
  Status s = Trainer::Open(o, nullptr, &t);
  ASSERT_TRUE(s.ok()) << s.ToString();
  RetainOnlyPython({t.get()});  // docs now comes from its floor slots only
  for (int b = 0; b < 10; ++b) {
    std::vector<Record> batch;
    ASSERT_TRUE(t->SampleBatch(&batch).ok());
    ASSERT_EQ(batch.size(), 8u);
    int docs = 0;
    for (const Record& r : batch) docs += r.domain == "docs";
    EXPECT_EQ(docs, 2) << "4 floor slots, 2 domains taking turns";
  }
}

}  // namespace
}  // namespace trainer
}  // namespace specloop
