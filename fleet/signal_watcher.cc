#include "fleet/signal_watcher.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace specloop {

namespace {

int g_pipe[2] = {-1, -1};

void OnSignal(int) {
  const char b = 1;
  if (write(g_pipe[1], &b, 1) < 0) {
  }
}

}  // namespace

Status SignalWatcher::Start(std::function<void()> stop) {
  if (pipe(g_pipe) != 0) return Status::IOError("pipe failed");
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  thread_ = std::thread([stop = std::move(stop)] {
    char b;
    while (read(g_pipe[0], &b, 1) < 0 && errno == EINTR) {
    }
    stop();
  });
  return Status::OK();
}

SignalWatcher::~SignalWatcher() {
  if (!thread_.joinable()) return;
  OnSignal(0);  // wakes the thread when no signal came
  thread_.join();
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  close(g_pipe[0]);
  close(g_pipe[1]);
  g_pipe[0] = g_pipe[1] = -1;
}

}  // namespace specloop
