// The trainer options the tests that train on testing::MakeTrafficBuffer's buffer start from
// (trainer_loop_test, tests/buffer/salvage_trainer_test): each test then changes only what it
// is about.
#pragma once

#include <string>

#include "tests/testing/temp_dir.h"
#include "trainer/trainer.h"

namespace specloop {
namespace testing {

// draft-prose-1m (the draft the traffic buffer's records were verified against) distilled from
// the buffer at `buffer_dir` into checkpoints under `checkpoint_dir`; a quarter of the records
// held out, batches of 6 records, AdamW at lr 1e-3, seed 7; every other field at its default.
inline trainer::TrainerOptions TrafficTrainerOptions(const std::string& buffer_dir,
                                                     const std::string& checkpoint_dir) {
  trainer::TrainerOptions o;
  o.draft_dir = SharedDir() + "/models/draft-prose-1m";
  o.buffer_dirs = {buffer_dir};
  o.checkpoint_dir = checkpoint_dir;
  o.heldout_fraction = 0.25;
  o.batch_records = 6;
  o.adamw.lr = 1e-3;
  o.seed = 7;
  return o;
}

}  // namespace testing
}  // namespace specloop
