#include "fleet/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

namespace specloop {

namespace {

// The wake pipe of the supervisor whose Run() is in progress (signal handlers write to it).
volatile sig_atomic_t g_wake_fd = -1;

void WakeWith(char b) {
  const int fd = g_wake_fd;
  if (fd < 0) return;
  const int saved = errno;
  if (write(fd, &b, 1) < 0) {
  }
  errno = saved;
}
void OnChild(int) { WakeWith('C'); }
void OnStopSignal(int) { WakeWith('S'); }

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "stopped (status " + std::to_string(status) + ")";
}

}  // namespace

struct Supervisor::Child {
  ChildSpec spec;
  pid_t pid = -1;          // -1: not running
  int out_fd = -1;         // read end of the child's stdout+stderr
  std::string partial;     // output after the last newline
  bool ready = false;      // ready_text seen (or none asked for)
  bool started = false;    // started at least once
  double started_at = 0;   // Now() at the last start
  double restart_at = -1;  // >= 0: restart due at this time
  double backoff = 0;      // delay of the next restart
  int restarts = 0;
  int last_status = 0;     // waitpid status of the last exit
  bool stopping = false;   // sent SIGTERM by StopAll()
};

Supervisor::Supervisor(SupervisorOptions options) : options_(std::move(options)) {
  if (!options_.print) {
    options_.print = [](const std::string& line) {
      std::fwrite(line.data(), 1, line.size(), stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
    };
  }
  if (pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) wake_pipe_[0] = wake_pipe_[1] = -1;
}

Supervisor::~Supervisor() {
  for (Child* c : children_) {
    if (c->out_fd >= 0) close(c->out_fd);
    delete c;
  }
  if (wake_pipe_[0] >= 0) close(wake_pipe_[0]);
  if (wake_pipe_[1] >= 0) close(wake_pipe_[1]);
}

void Supervisor::Add(ChildSpec spec) {
  Child* c = new Child;
  c->spec = std::move(spec);
  c->ready = c->spec.ready_text.empty();
  c->backoff = options_.initial_backoff_seconds;
  children_.push_back(c);
}

void Supervisor::RequestStop() {
  const char b = 'S';
  if (wake_pipe_[1] >= 0 && write(wake_pipe_[1], &b, 1) < 0) {
  }
}

void Supervisor::StopOnSignals() { stop_on_signals_ = true; }

void Supervisor::Print(const std::string& line) { options_.print(line); }

Status Supervisor::Spawn(Child* c) {
  const std::vector<std::string>& args = c->spec.argv;
  if (args.empty() || access(args[0].c_str(), X_OK) != 0) {
    return Status::InvalidArgument(c->spec.name + ": cannot execute " +
                                   (args.empty() ? std::string("(empty argv)") : args[0]));
  }
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return Status::IOError("pipe: " + std::string(strerror(errno)));
  // Signals stay blocked across fork so that the child cannot run this process's handlers
  // (a SIGTERM there would be swallowed); the child resets them before unblocking.
  sigset_t all, old_mask;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &old_mask);
  const pid_t pid = fork();
  if (pid != 0) sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  if (pid < 0) {
    close(out[0]);
    close(out[1]);
    return Status::IOError("fork: " + std::string(strerror(errno)));
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until execv.
    setpgid(0, 0);                    // terminal signals reach the supervisor alone
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // the supervisor died: stop too
    signal(SIGCHLD, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(out[1], STDOUT_FILENO);
    dup2(out[1], STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
  c->pid = pid;
  c->out_fd = out[0];
  c->partial.clear();
  c->started = true;
  c->started_at = Now();
  c->restart_at = -1;
  Print(options_.name + ": started " + c->spec.name + " (pid " + std::to_string(pid) + ")");
  return Status::OK();
}

void Supervisor::PumpOutput(Child* c) {
  char buf[4096];
  while (c->out_fd >= 0) {
    const ssize_t n = read(c->out_fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;  // nothing more for now
    if (n > 0) {
      c->partial.append(buf, static_cast<size_t>(n));
    } else {  // EOF (or a read error): the child closed its output
      close(c->out_fd);
      c->out_fd = -1;
      if (!c->partial.empty()) c->partial += '\n';
    }
    size_t start = 0, nl;
    while ((nl = c->partial.find('\n', start)) != std::string::npos) {
      const std::string line = c->partial.substr(start, nl - start);
      start = nl + 1;
      Print("[" + c->spec.name + "] " + line);
      if (!c->ready && line.find(c->spec.ready_text) != std::string::npos) {
        c->ready = true;
        Print(options_.name + ": " + c->spec.name + " is ready");
      }
    }
    c->partial.erase(0, start);
  }
}

void Supervisor::Reap(double now, bool stopping) {
  for (Child* c : children_) {
    if (c->pid < 0) continue;
    int status = 0;
    pid_t r;
    do {
      r = waitpid(c->pid, &status, WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == 0) continue;
    PumpOutput(c);  // what the child wrote before it died
    if (c->out_fd >= 0) {
      close(c->out_fd);
      c->out_fd = -1;
    }
    c->pid = -1;
    c->last_status = status;
    const double ran = now - c->started_at;
    if (stopping) {
      Print(options_.name + ": " + c->spec.name + " " + DescribeExit(status));
      continue;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == options_.fatal_exit_code) {
      Print(options_.name + ": " + c->spec.name + " " + DescribeExit(status) +
            ": bad configuration, not restarting");
      if (fatal_.ok()) {
        fatal_ = Status::InvalidArgument(c->spec.name + " " + DescribeExit(status));
      }
      continue;
    }
    if (ran >= options_.stable_seconds) c->backoff = options_.initial_backoff_seconds;
    const double delay = c->backoff;
    c->backoff = std::min(c->backoff * 2, options_.max_backoff_seconds);
    c->restart_at = now + delay;
    ++c->restarts;
    char msg[64];
    std::snprintf(msg, sizeof(msg), "; restarting in %.1f s", delay);
    Print(options_.name + ": " + c->spec.name + " " + DescribeExit(status) + msg);
  }
}

// Waits for readable output or a wake byte for at most timeout_ms, then copies the output.
// Returns true when a stop byte arrived.
bool Supervisor::WaitAndPump(int timeout_ms) {
  std::vector<pollfd> fds;
  fds.push_back({wake_pipe_[0], POLLIN, 0});
  std::vector<Child*> owners;
  for (Child* c : children_) {
    if (c->out_fd < 0) continue;
    fds.push_back({c->out_fd, POLLIN, 0});
    owners.push_back(c);
  }
  bool stop = false;
  if (poll(fds.data(), fds.size(), std::max(timeout_ms, 0)) > 0) {
    if (fds[0].revents & POLLIN) {
      char b[64];
      ssize_t n;
      while ((n = read(wake_pipe_[0], b, sizeof(b))) > 0) {
        if (std::memchr(b, 'S', static_cast<size_t>(n))) stop = true;
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) PumpOutput(owners[i - 1]);
    }
  }
  return stop;
}

Status Supervisor::StopAll() {
  bool killed = false;
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    (*it)->stopping = (*it)->pid > 0;  // one waiting for a restart simply stays down
    if ((*it)->stopping) kill((*it)->pid, SIGTERM);
  }
  const double deadline = Now() + options_.stop_grace_seconds;
  for (;;) {
    Reap(Now(), /*stopping=*/true);
    const bool any = std::any_of(children_.begin(), children_.end(),
                                 [](const Child* c) { return c->pid > 0; });
    if (!any) break;
    const double left = deadline - Now();
    if (left <= 0) {
      for (Child* c : children_) {
        if (c->pid <= 0) continue;
        Print(options_.name + ": " + c->spec.name + " did not stop in time: SIGKILL");
        kill(c->pid, SIGKILL);
        killed = true;
      }
      for (Child* c : children_) {
        if (c->pid > 0) {
          while (waitpid(c->pid, &c->last_status, 0) < 0 && errno == EINTR) {
          }
        }
        c->pid = -1;
      }
      break;
    }
    WaitAndPump(static_cast<int>(std::min(left, 0.2) * 1000));
  }
  if (killed) return Status::IOError("a child had to be killed");
  for (const Child* c : children_) {
    if (!c->stopping) continue;
    const int st = c->last_status;
    const bool clean = (WIFEXITED(st) && WEXITSTATUS(st) == 0) ||
                       (WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
    if (!clean) return Status::IOError(c->spec.name + " " + DescribeExit(st) + " on stop");
  }
  return Status::OK();
}

Status Supervisor::Run() {
  if (wake_pipe_[0] < 0) return Status::IOError("supervisor: pipe failed");
  g_wake_fd = wake_pipe_[1];
  struct sigaction sa = {}, old_chld = {}, old_int = {}, old_term = {};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sa.sa_handler = OnChild;
  sigaction(SIGCHLD, &sa, &old_chld);
  if (stop_on_signals_) {
    sa.sa_flags = SA_RESTART;
    sa.sa_handler = OnStopSignal;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
  }

  Status s;
  size_t next = 0;  // the next child to start for the first time
  bool stop = false;
  while (!stop && s.ok() && fatal_.ok()) {
    const double now = Now();
    Reap(now, /*stopping=*/false);
    if (!fatal_.ok()) break;
    double due = now + 1.0;
    for (Child* c : children_) {
      if (c->pid > 0 || c->restart_at < 0) continue;
      if (c->restart_at <= now) {
        s = Spawn(c);
        if (!s.ok()) break;
      } else {
        due = std::min(due, c->restart_at);
      }
    }
    while (s.ok() && next < children_.size() && (next == 0 || children_[next - 1]->ready)) {
      s = Spawn(children_[next++]);
    }
    if (!s.ok()) break;
    stop = WaitAndPump(static_cast<int>((due - Now()) * 1000) + 1);
  }
  if (stop) Print(options_.name + ": stopping");
  Status stopped = StopAll();
  g_wake_fd = -1;
  sigaction(SIGCHLD, &old_chld, nullptr);
  if (stop_on_signals_) {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  }
  if (!s.ok()) return s;
  if (!fatal_.ok()) return fatal_;
  return stopped;
}

}  // namespace specloop
