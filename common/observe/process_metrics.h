// The standard process metrics of Prometheus client libraries that operators expect on every
// /metrics page (here: resident memory), read from /proc at scrape time.
#pragma once

#include <cstdint>

#include "common/base/status.h"
#include "common/observe/metrics.h"

namespace specloop {

// Resident set size of process `pid` (0 = this process) in bytes, from /proc/PID/statm;
// 0 when it cannot be read (no such process, no /proc).
uint64_t ResidentBytes(int pid = 0);

// Registers process_resident_memory_bytes (this process) in `registry`.
Status AddProcessMetrics(metrics::Registry* registry);

}  // namespace specloop
