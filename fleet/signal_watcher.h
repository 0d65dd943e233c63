// SignalWatcher: SIGINT and SIGTERM call `stop` on a thread of its own, for the server
// commands (`specloop serve`, `specloop proxy`). A handler may only write a byte to a pipe;
// the thread reads it and calls `stop` (library thread pools started before main() may
// receive the signal, so masks alone do not work). One watcher per process at a time.
#pragma once

#include <functional>
#include <thread>

#include "common/base/status.h"

namespace specloop {

class SignalWatcher {
 public:
  SignalWatcher() = default;
  // Resets SIGINT and SIGTERM to their default actions, and wakes and joins the thread:
  // `stop` runs once more if no signal came (harmless: the server had stopped by itself).
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  // Installs the handlers and starts the thread. IOError when no pipe can be made.
  Status Start(std::function<void()> stop);

 private:
  std::thread thread_;
};

}  // namespace specloop
