// Clock helpers shared by the libraries: wall-clock microseconds (what records and retention
// are stamped with), monotonic microseconds (deadlines and intervals, immune to clock steps),
// elapsed seconds since a time point of any std::chrono clock, and the calling thread's CPU
// time (benchmarks on a shared machine). Header-only; pure C++ but for ThreadCpuSeconds (POSIX).
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>
#include <limits>

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

#if defined(CLOCK_THREAD_CPUTIME_ID)
// Seconds of CPU time the calling thread has used (POSIX clock_gettime(CLOCK_THREAD_CPUTIME_ID):
// user plus system time of this thread only, not of the process; time spent descheduled or
// blocked does not count, time stalled on memory does). Arbitrary origin: only differences
// between two calls on the same thread mean anything. Resolution: nanoseconds as read (Linux
// accounts thread time from the scheduler clock, so steps are far below a microsecond; a
// double keeps nanosecond precision up to ~100 days of CPU time). Returns NaN if the clock
// cannot be read (not expected on Linux). Only where the platform defines
// CLOCK_THREAD_CPUTIME_ID (Linux, the tree's target): elsewhere it is not declared, so a use
// fails to compile instead of silently measuring something else (process or wall time).
inline double ThreadCpuSeconds() {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
#endif

}  // namespace specloop
