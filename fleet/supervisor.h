// A small process supervisor for `specloop up` (DESIGN.md section 1): runs child processes,
// copies their output line by line with a "[name] " prefix, starts them in order (each one
// after the previous printed its ready line), restarts a child that dies with exponential
// backoff, and stops all of them (SIGTERM, then SIGKILL after a grace period) when asked.
//
// Not thread-safe: one thread calls Add() and then Run(). RequestStop() is async-signal-safe
// and may be called from a signal handler or another thread.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace specloop {

struct ChildSpec {
  // Short name: the output prefix and the name in the supervisor's own messages.
  std::string name;
  // argv[0] is the executable path (run with execv, no PATH search).
  std::vector<std::string> argv;
  // The next child is started once a line of this child's output (stdout or stderr) contains
  // this text; empty: the next child starts at once. Only the first start waits for it.
  std::string ready_text;
};

struct SupervisorOptions {
  // Delay before the first restart of a child; doubled after each further crash.
  // Default: 0.5 s.
  double initial_backoff_seconds = 0.5;
  // Largest restart delay. Default: 30 s.
  double max_backoff_seconds = 30;
  // A child that ran at least this long before it died restarts after the initial backoff
  // again. Default: 60 s.
  double stable_seconds = 60;
  // After SIGTERM, how long a child may take to exit before it gets SIGKILL. Default: 20 s.
  double stop_grace_seconds = 20;
  // A child exiting with this status is misconfigured: restarting cannot help, so Run()
  // stops the others and returns an error. Default: 2 (bad arguments in every subcommand).
  int fatal_exit_code = 2;
  // Names the supervisor in its own messages ("NAME: started serve (pid 12)").
  // Default: "supervisor".
  std::string name = "supervisor";
  // Where prefixed child output and the supervisor's messages go. Default: stdout.
  std::function<void(const std::string& line)> print;
};

class Supervisor {
 public:
  explicit Supervisor(SupervisorOptions options);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Adds a child; children start in the order added. REQUIRES: Run() not started.
  void Add(ChildSpec spec);

  // Starts the children and supervises them until RequestStop(), then stops them all and
  // returns. OK when every child running at that point exited after SIGTERM (status 0 or
  // death by SIGTERM; one waiting for its restart is simply not restarted); an error when one
  // had to be killed, could not be started, or exited with fatal_exit_code (the others are
  // stopped first).
  Status Run();

  // Makes Run() stop the children and return. Async-signal-safe; idempotent.
  void RequestStop();

  // Installs SIGINT/SIGTERM handlers that call RequestStop() on this supervisor (one
  // supervisor per process); Run() restores the previous handlers when it returns.
  void StopOnSignals();

 private:
  struct Child;

  Status Spawn(Child* c);
  void PumpOutput(Child* c);
  void Reap(double now, bool stopping);
  bool WaitAndPump(int timeout_ms);
  Status StopAll();
  void Print(const std::string& line);

  SupervisorOptions options_;
  std::vector<Child*> children_;
  int wake_pipe_[2] = {-1, -1};  // a byte per stop request or SIGCHLD
  bool stop_on_signals_ = false;
  Status fatal_;
};

}  // namespace specloop
