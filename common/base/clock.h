// Clock helpers shared by the libraries: wall-clock microseconds (what records and retention
// are stamped with), monotonic microseconds (deadlines and intervals, immune to clock steps)
// and elapsed seconds since a time point of any std::chrono clock. Header-only, pure C++.
#pragma once

#include <chrono>
#include <cstdint>

namespace specloop {

// Microseconds since the Unix epoch (std::chrono::system_clock, CLOCK_REALTIME): comparable
// across processes and restarts, may step when the system clock is set. Record::time_us and
// the replay buffer's retention use it.
inline uint64_t NowMicros() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// Microseconds on std::chrono::steady_clock (monotonic, arbitrary epoch): only differences
// mean anything, and only within one process. For deadlines and back-off windows.
inline int64_t SteadyMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Seconds from `t0` to now on t0's own clock (negative if t0 is in that clock's future).
// A template over the clock: a file's own non-template SecondsSince(steady_clock::time_point),
// where one is left, is preferred by overload resolution rather than ambiguous.
template <typename Clock, typename Duration>
double SecondsSince(std::chrono::time_point<Clock, Duration> t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace specloop
