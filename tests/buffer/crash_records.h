// The deterministic record that crash_writer logs as seq `i` (and crash_test expects).
#pragma once

#include "tests/buffer/test_util.h"

namespace specloop {
namespace testing {

inline Record CrashRecord(uint64_t i) {
  Rng rng(i * 7919 + 17);
  Shape shape;
  shape.max_steps = 6;
  shape.max_top_k = 8;
  Record r = RandomRecord(&rng, shape);
  r.time_us = 1000000 + i;  // increasing, so seq order is key order
  r.request_id = "crash-" + std::to_string(i);
  r.worker_id = 3;
  return r;
}

}  // namespace testing
}  // namespace specloop
