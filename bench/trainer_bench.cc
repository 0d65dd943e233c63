// Trainer benchmark: estimated alpha gain per distillation objective (fkl, rkl, jsd:0.5, tvd)
// on the same buffer and budget. The buffer: target-6m verifying draft-prose-1m (k = 4,
// temperature 1, K = 64) over python, c and legal prompts. Each objective trains a fresh copy
// of draft-prose-1m offline for the same epochs, seed and learning rate, and is scored on the
// same held-out positions (lower-bound alpha-hat). Prints a markdown table.
//
//   trainer_bench [prompts_per_domain=60] [epochs=3] [lr=1e-3]
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "buffer/replay_logger.h"
#include "common/model/threads.h"
#include "trainer/synthetic_traffic.h"
#include "trainer/trainer.h"

using namespace specloop;
using namespace specloop::trainer;

int main(int argc, char** argv) {
  const size_t prompts = argc > 1 ? std::atoi(argv[1]) : 60;
  const int epochs = argc > 2 ? std::atoi(argv[2]) : 3;
  const double lr = argc > 3 ? std::atof(argv[3]) : 1e-3;
  const char* env = std::getenv("SPECLOOP_SHARED");
  const std::string shared = env && *env ? env : SPECLOOP_SHARED_DIR;
  const std::string models = shared + "/models";
  SetComputeThreads(1);
  char tmpl[] = "/tmp/specloop-trainer-bench-XXXXXX";
  const std::string root = mkdtemp(tmpl);
  const char* domains[] = {"python", "c", "legal"};
  {
    std::unique_ptr<LlamaModel> target, draft;
    std::unique_ptr<ReplayLogger> logger;
    Status s = LlamaModel::Load(models + "/target-6m", {}, &target);
    if (s.ok()) s = LlamaModel::Load(models + "/draft-prose-1m", {}, &draft);
    if (s.ok()) s = ReplayLogger::Open({}, {}, root + "/buffer", &logger);
    TrafficOptions o;
    for (const char* d : domains) {
      std::vector<std::vector<int>> ps;
      if (s.ok()) s = LoadDomainPrompts(shared, d, models + "/target-6m", prompts, 128, &ps);
      for (size_t i = 0; s.ok() && i < ps.size(); ++i) {
        Record r;
        o.seed = i;
        s = DecodeToRecord(*target, *draft, ps[i], d, std::string(d) + "-" + std::to_string(i), o,
                           &r);
        if (s.ok() && !logger->Log(&r)) s = Status::IOError("logger dropped a record");
      }
    }
    if (s.ok()) s = logger->Close();
    if (!s.ok()) {
      std::fprintf(stderr, "trainer_bench: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  std::printf("objective comparison: draft-prose-1m distilled toward target-6m, %zu prompts per "
              "domain, %d epochs, lr %g, batch 8, seed 1; held-out alpha-hat (lower bound)\n\n",
              prompts, epochs, lr);
  std::printf("| objective | python | c | legal | overall before | overall after | gain |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const char* obj : {"fkl", "rkl", "jsd:0.5", "tvd"}) {
    TrainerOptions t;
    t.draft_dir = models + "/draft-prose-1m";
    t.buffer_dirs = {root + "/buffer"};
    t.checkpoint_dir = root + "/ckpt-" + obj;
    t.adamw.lr = lr;
    t.heldout_fraction = 0.2;
    Status s = ObjectiveSpec::Parse(obj, &t.objective);
    std::unique_ptr<Trainer> tr;
    if (s.ok()) s = Trainer::Open(t, nullptr, &tr);
    EvalResult r;
    if (s.ok()) s = tr->RunOffline(epochs, /*force=*/true, {}, &r);
    if (!s.ok()) {
      std::fprintf(stderr, "trainer_bench: %s: %s\n", obj, s.ToString().c_str());
      return 1;
    }
    std::printf("| %s |", obj);
    for (const char* d : domains) {
      std::printf(" %.4f -> %.4f |", r.live.domains[d].logged, r.candidate.domains[d].logged);
    }
    std::printf(" %.4f | %.4f | %+.4f |\n", r.live.overall.logged, r.candidate.overall.logged,
                r.candidate.overall.logged - r.live.overall.logged);
    std::fflush(stdout);
  }
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
  return 0;
}
