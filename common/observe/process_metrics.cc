#include "common/observe/process_metrics.h"

#include <unistd.h>

#include <fstream>
#include <string>

namespace specloop {

uint64_t ResidentBytes(int pid) {
  std::ifstream in("/proc/" + (pid > 0 ? std::to_string(pid) : std::string("self")) + "/statm");
  uint64_t size_pages = 0, resident_pages = 0;
  if (!(in >> size_pages >> resident_pages)) return 0;
  return resident_pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

Status AddProcessMetrics(metrics::Registry* registry) {
  return registry->AddCallbackGauge("process_resident_memory_bytes",
                                    "Resident memory size in bytes.", {},
                                    [] { return static_cast<double>(ResidentBytes()); });
}

}  // namespace specloop
