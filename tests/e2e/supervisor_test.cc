// Supervisor (fleet/supervisor.h) with /bin/sh children: output prefixing, start order gated
// on the ready line, restart backoff doubling up to its cap, SIGKILL after the grace period,
// no restart loop on the fatal exit code.
#include "fleet/supervisor.h"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace specloop {
namespace {

ChildSpec Shell(const std::string& name, const std::string& script,
                const std::string& ready = "") {
  ChildSpec c;
  c.name = name;
  c.argv = {"/bin/sh", "-c", script};
  c.ready_text = ready;
  return c;
}

// Collects the supervisor's lines and calls `on_line` with each (from Run()'s thread).
struct Lines {
  std::mutex mu;
  std::vector<std::string> lines;
  size_t Index(const std::string& text) {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].find(text) != std::string::npos) return i;
    }
    return std::string::npos;
  }
  size_t Count(const std::string& text) {
    std::lock_guard<std::mutex> lock(mu);
    size_t n = 0;
    for (const std::string& l : lines) n += l.find(text) != std::string::npos;
    return n;
  }
};

SupervisorOptions Options(Lines* lines, std::function<void(const std::string&)> on_line) {
  SupervisorOptions o;
  o.name = "sup";
  o.print = [lines, on_line](const std::string& line) {
    {
      std::lock_guard<std::mutex> lock(lines->mu);
      lines->lines.push_back(line);
    }
    if (on_line) on_line(line);
  };
  return o;
}

TEST(SupervisorTest, StartsInReadyOrderPrefixesOutputAndStopsCleanly) {
  Lines lines;
  Supervisor* self = nullptr;
  SupervisorOptions o = Options(&lines, [&](const std::string& line) {
    if (line == "[b] b running") self->RequestStop();
  });
  Supervisor sup(o);
  self = &sup;
  sup.Add(Shell("a", "echo starting; sleep 0.3; echo a READY now; exec sleep 30", "READY"));
  sup.Add(Shell("b", "echo b running; exec sleep 30"));
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = sup.Run();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  const size_t ready = lines.Index("[a] a READY now");
  const size_t started_b = lines.Index("sup: started b");
  ASSERT_NE(ready, std::string::npos);
  ASSERT_NE(started_b, std::string::npos);
  EXPECT_LT(ready, started_b) << "b started before a was ready";
  EXPECT_NE(lines.Index("[a] starting"), std::string::npos);
  EXPECT_EQ(lines.Count("killed by signal 15"), 2u);  // both stopped by SIGTERM
  EXPECT_EQ(lines.Count("restarting"), 0u);
}

TEST(SupervisorTest, CrashingChildRestartsWithDoublingBackoffUpToTheCap) {
  Lines lines;
  Supervisor* self = nullptr;
  int crashes = 0;
  SupervisorOptions o = Options(&lines, [&](const std::string& line) {
    if (line.find("restarting in") != std::string::npos && ++crashes == 5) self->RequestStop();
  });
  o.initial_backoff_seconds = 0.1;
  o.max_backoff_seconds = 0.4;
  Supervisor sup(o);
  self = &sup;
  sup.Add(Shell("c", "echo c up; exit 1"));
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = sup.Run();
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(s.ok()) << s.ToString();  // stopped while waiting for a restart
  EXPECT_EQ(lines.Count("[c] c up"), 5u);
  EXPECT_EQ(lines.Count("c exited with status 1; restarting in 0.1 s"), 1u);
  EXPECT_EQ(lines.Count("c exited with status 1; restarting in 0.2 s"), 1u);
  EXPECT_EQ(lines.Count("c exited with status 1; restarting in 0.4 s"), 3u);
  EXPECT_GE(took, 0.1 + 0.2 + 0.4 + 0.4 - 0.05);  // the delays are honoured
}

TEST(SupervisorTest, ChildIgnoringSigtermIsKilledAfterTheGrace) {
  Lines lines;
  Supervisor* self = nullptr;
  SupervisorOptions o = Options(&lines, [&](const std::string& line) {
    if (line == "[stubborn] trapped") self->RequestStop();
  });
  o.stop_grace_seconds = 0.5;
  Supervisor sup(o);
  self = &sup;
  sup.Add(Shell("stubborn", "trap '' TERM; echo trapped; while :; do sleep 0.05; done"));
  const Status s = sup.Run();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(lines.Index("stubborn did not stop in time: SIGKILL"), std::string::npos);
}

TEST(SupervisorTest, FatalExitCodeStopsTheOthersWithoutRestart) {
  Lines lines;
  Supervisor sup(Options(&lines, nullptr));
  sup.Add(Shell("ok", "echo ok READY; exec sleep 30", "READY"));
  sup.Add(Shell("bad", "echo bad args >&2; exit 2"));
  const Status s = sup.Run();  // no RequestStop: the fatal exit ends it
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(lines.Index("[bad] bad args"), std::string::npos);  // stderr is copied too
  EXPECT_NE(lines.Index("not restarting"), std::string::npos);
  EXPECT_EQ(lines.Count("restarting in"), 0u);
  EXPECT_NE(lines.Index("ok killed by signal 15"), std::string::npos);
}

TEST(SupervisorTest, MissingExecutableIsAnError) {
  Lines lines;
  Supervisor sup(Options(&lines, nullptr));
  ChildSpec c;
  c.name = "ghost";
  c.argv = {"/nonexistent/specloop"};
  sup.Add(c);
  EXPECT_TRUE(sup.Run().IsInvalidArgument());
}

}  // namespace
}  // namespace specloop
