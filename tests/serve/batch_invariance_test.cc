// Batch invariance (issue 27, item 5): a request's output does not depend on what else is in
// the batch.
//
// Over HTTP, against `specloop serve` (the real binary, target-6m + draft-mix-1m, a free
// loopback port): several prompts of several domains and lengths are sent one at a time, then
// again while 16 clients keep the batch full with other requests (greedy and sampled, of
// varied prompt lengths and max_tokens, streaming or not), so each measured request joins the
// batch at its own phase among 15 others. The outputs must be byte-identical: greedy under
// `--k auto` (k then changes with the batch and the measured timings), seeded sampling at a
// fixed `--k 4`. That the batch really held many sequences is read from /metrics
// (specloop_active_sequences before the measured requests go, the specloop_batch_size
// histogram over their window), and the lone phase is checked to have run batches of one.
//
// In-process, on the forward itself: a sequence's logits rows have the same bits alone and in
// a batch of 16, and whatever block (k + 1 rows) its position is scored in; and the checks are
// exact, so they see a different arithmetic (the ATen/BLAS path's rows differ in bits from the
// CPU forward's).
#include <signal.h>

#include <atomic>
#include <cstring>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <c10/core/InferenceMode.h>

#include "common/model/llama_model.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/e2e/e2e_util.h"
#include "tests/serve/test_util.h"

namespace specloop {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kClients = 16;
constexpr int kMeasured = 10;  // prompts compared alone vs in the batch
constexpr int kMaxTokens = 48;

// The longest prefix of `s` of at most `n` bytes that does not cut a UTF-8 character.
std::string Utf8Prefix(const std::string& s, size_t n) {
  if (n >= s.size()) return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

// Prompts [first, first + n) of a domain's prompt file.
std::vector<std::string> Prompts(const std::string& domain, size_t first, size_t n) {
  std::ifstream in(serve_test::Shared() + "/prompts/" + domain + ".jsonl");
  std::vector<std::string> out;
  std::string line;
  for (size_t i = 0; out.size() < n && std::getline(in, line); ++i) {
    if (i >= first) out.push_back(json::parse(line)["prompt"].get<std::string>());
  }
  return out;
}

const std::vector<std::string>& Domains() {
  static const std::vector<std::string> d = {"prose", "python", "c", "legal", "docs"};
  return d;
}

struct Job {
  std::string domain, prompt;
  int max_tokens = kMaxTokens;
  double temperature = 0;
  int64_t seed = -1;  // -1: none given
  bool stream = false;
  bool ignore_eos = false;
};

struct Output {
  int status = -1;
  std::string text, finish_reason, error;
  int completion_tokens = -1;
};

// The measured prompts: two per domain, cut to lengths from 40 to 300 bytes.
std::vector<Job> MeasuredJobs(double temperature) {
  static const size_t kLengths[kMeasured] = {60, 240, 120, 300, 90, 180, 40, 270, 150, 210};
  std::vector<Job> jobs;
  for (const std::string& d : Domains()) {
    for (const std::string& p : Prompts(d, 0, 2)) {
      Job j;
      j.domain = d;
      j.prompt = Utf8Prefix(p, kLengths[jobs.size()]);
      j.temperature = temperature;
      if (temperature > 0) j.seed = 1000 + static_cast<int64_t>(jobs.size());
      jobs.push_back(j);
    }
  }
  return jobs;
}

// Background traffic: other prompts, varied lengths and max_tokens, greedy or sampled,
// streaming or not.
Job Filler(int client, int iteration) {
  static const std::vector<std::vector<std::string>> pool = [] {
    std::vector<std::vector<std::string>> p;
    for (const std::string& d : Domains()) p.push_back(Prompts(d, 2, 6));
    return p;
  }();
  const int n = client * 7 + iteration * 3;
  const size_t d = static_cast<size_t>(n) % Domains().size();
  const std::vector<std::string>& prompts = pool[d];
  Job j;
  j.domain = Domains()[d];
  j.prompt = Utf8Prefix(prompts[static_cast<size_t>(n / 5) % prompts.size()],
                        30 + static_cast<size_t>(n * 37) % 330);
  j.max_tokens = 8 + (client * 7 + iteration * 13) % 41;
  j.ignore_eos = true;  // a filler lasts its max_tokens
  j.stream = iteration % 2 == 1;
  if ((client + iteration) % 3 == 0) {
    j.temperature = 1.0;
    j.seed = client * 100 + iteration;
  }
  return j;
}

json Body(const Job& j) {
  json b = {{"model", "target-6m"}, {"prompt", j.prompt},     {"max_tokens", j.max_tokens},
            {"temperature", j.temperature}, {"domain", j.domain}, {"stream", j.stream}};
  if (j.seed >= 0) b["seed"] = j.seed;
  if (j.ignore_eos) b["ignore_eos"] = true;
  return b;
}

Output Send(httplib::Client& c, const Job& j) {
  Output out;
  auto res = c.Post("/v1/completions", Body(j).dump(), "application/json");
  if (!res) {
    out.error = httplib::to_string(res.error());
    return out;
  }
  out.status = res->status;
  if (res->status != 200) {
    out.error = res->body;
    return out;
  }
  auto finish = [&](const json& body) {
    out.finish_reason = body["choices"][0]["finish_reason"];
    out.completion_tokens = body["usage"]["completion_tokens"];
  };
  if (!j.stream) {
    const json body = json::parse(res->body);
    out.text = body["choices"][0]["text"];
    finish(body);
    return out;
  }
  // Server-sent events: "data: {...}\n\n" ... "data: [DONE]\n\n".
  const std::string& b = res->body;
  for (size_t pos = 0, end; (end = b.find("\n\n", pos)) != std::string::npos; pos = end + 2) {
    const std::string data = b.substr(pos + 6, end - pos - 6);
    if (data == "[DONE]") break;
    const json chunk = json::parse(data);
    out.text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) finish(chunk);
  }
  return out;
}

// `specloop serve` on a free loopback port; SIGTERM (then SIGKILL) and reaped at the end.
class ServeProcess {
 public:
  explicit ServeProcess(const std::string& k)
      : child_({SPECLOOP_BINARY, "serve", "--target", serve_test::TargetDir(), "--draft",
                serve_test::DraftDir(), "--port", "0", "--max-batch", std::to_string(kClients),
                "--k", k, "--no-log"},
               /*echo=*/false) {
    const std::string port = child_.Capture("listening on http://127\\.0\\.0\\.1:([0-9]+)", 60);
    port_ = port.empty() ? 0 : std::stoi(port);
  }
  ~ServeProcess() {
    child_.Signal(SIGTERM);
    child_.Wait(20);  // the Child's destructor kills the group if it has not exited
  }
  int port() const { return port_; }
  std::string Output() { return child_.Output(); }
  std::unique_ptr<httplib::Client> Client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_connection_timeout(5);
    c->set_read_timeout(60);
    return c;
  }

 private:
  e2e::Child child_;
  int port_ = 0;
};

// The batch-size histogram (sequences per target forward) at one moment.
struct Batches {
  double forwards = 0, of_one = 0, up_to_8 = 0, sequences = 0;
  static Batches Scrape(int port) {
    std::string text;
    Batches b;
    if (e2e::HttpGet(port, "/metrics", &text) != 200) return b;
    b.forwards = e2e::MetricValue(text, "specloop_batch_size_count");
    b.sequences = e2e::MetricValue(text, "specloop_batch_size_sum");
    b.of_one = e2e::MetricValue(text, "specloop_batch_size_bucket", "le=\"1\"");
    b.up_to_8 = e2e::MetricValue(text, "specloop_batch_size_bucket", "le=\"8\"");
    return b;
  }
  Batches operator-(const Batches& o) const {
    return {forwards - o.forwards, of_one - o.of_one, up_to_8 - o.up_to_8,
            sequences - o.sequences};
  }
};

// Each job alone, one after the other; every target forward of the phase held one sequence.
std::vector<Output> RunAlone(const ServeProcess& server, const std::vector<Job>& jobs) {
  const Batches before = Batches::Scrape(server.port());
  auto c = server.Client();
  std::vector<Output> out;
  for (const Job& j : jobs) out.push_back(Send(*c, j));
  const Batches d = Batches::Scrape(server.port()) - before;
  EXPECT_GT(d.forwards, 0);
  EXPECT_EQ(d.of_one, d.forwards) << "a lone request shared a target forward";
  return out;
}

// The jobs again while 16 clients keep the batch full: client i < jobs.size() sends fillers
// until the batch is seen full, then its job (streaming when i is odd), then fillers again
// until every job is answered; the others send fillers throughout.
std::vector<Output> RunInFullBatch(const ServeProcess& server, const std::vector<Job>& jobs) {
  const int n = static_cast<int>(jobs.size());
  std::vector<Output> out(n);
  std::atomic<bool> release{false}, stop{false};
  std::atomic<int> remaining{n}, filler_failures{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      auto cli = server.Client();
      bool mine_done = c >= n;
      for (int it = 0;; ++it) {
        if (!mine_done && release.load()) {
          Job j = jobs[c];
          j.stream = c % 2 == 1;
          out[c] = Send(*cli, j);
          mine_done = true;
          --remaining;
          continue;
        }
        if (mine_done && stop.load()) break;
        if (Send(*cli, Filler(c, it)).status != 200) ++filler_failures;
      }
    });
  }
  // Let the measured requests go once the batch is seen (nearly) full.
  double active = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (active < kClients - 2 && Clock::now() < deadline) {
    active = std::max(active, e2e::ScrapeMetric(server.port(), "specloop_active_sequences"));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const Batches before = Batches::Scrape(server.port());
  release = true;
  while (remaining.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const Batches d = Batches::Scrape(server.port()) - before;
  stop = true;
  for (std::thread& t : clients) t.join();

  EXPECT_GE(active, kClients - 2) << "the batch never filled up";
  EXPECT_EQ(filler_failures.load(), 0);
  // While the measured requests ran, the target forwards held many sequences.
  EXPECT_GT(d.forwards, 0);
  EXPECT_GT(d.forwards - d.up_to_8, 0) << "no forward held more than 8 sequences";
  // Sequences whose prompt is still being prefilled sit out a step unless a chunk of theirs
  // rides in it (chunked prefill): 16 clients of short fillers held 8.2-9.5 a forward.
  EXPECT_GT(d.sequences / d.forwards, 6.0) << "mean batch " << d.sequences / d.forwards;
  std::printf("in-batch window: %.0f target forwards, mean batch %.1f, %.0f of them > 8\n",
              d.forwards, d.sequences / d.forwards, d.forwards - d.up_to_8);
  return out;
}

void ExpectSameOutputs(const std::vector<Job>& jobs, const std::vector<Output>& alone,
                       const std::vector<Output>& together) {
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i) + " (" + jobs[i].domain + ")");
    ASSERT_EQ(alone[i].status, 200) << alone[i].error;
    ASSERT_EQ(together[i].status, 200) << together[i].error;
    EXPECT_GT(alone[i].completion_tokens, 0);
    EXPECT_EQ(together[i].text, alone[i].text);  // byte equality
    EXPECT_EQ(together[i].completion_tokens, alone[i].completion_tokens);
    EXPECT_EQ(together[i].finish_reason, alone[i].finish_reason);
  }
}

// Distinct outputs: the comparison tells prompts (or seeds) apart.
size_t DistinctTexts(const std::vector<Output>& outs) {
  std::set<std::string> texts;
  for (const Output& o : outs) texts.insert(o.text);
  return texts.size();
}

TEST(BatchInvariance, GreedyOutputIsTheSameAloneAndInAFullBatchUnderAdaptiveK) {
  ServeProcess server("auto");
  ASSERT_GT(server.port(), 0) << server.Output();
  const std::vector<Job> jobs = MeasuredJobs(0.0);
  ASSERT_EQ(jobs.size(), static_cast<size_t>(kMeasured));
  const std::vector<Output> alone = RunAlone(server, jobs);
  const std::vector<Output> together = RunInFullBatch(server, jobs);
  ExpectSameOutputs(jobs, alone, together);
  EXPECT_EQ(DistinctTexts(alone), jobs.size());
}

TEST(BatchInvariance, SeededSamplingIsReproducibleAloneAndInAFullBatchAtFixedK) {
  ServeProcess server("4");
  ASSERT_GT(server.port(), 0) << server.Output();
  const std::vector<Job> jobs = MeasuredJobs(0.8);
  const std::vector<Output> alone = RunAlone(server, jobs);
  const std::vector<Output> together = RunInFullBatch(server, jobs);
  ExpectSameOutputs(jobs, alone, together);
  // The seed decides the text: other seeds give other texts, so a change in how a request's
  // random draws are consumed would show.
  std::vector<Job> reseeded = jobs;
  for (Job& j : reseeded) j.seed += 500;
  const std::vector<Output> other = RunAlone(server, reseeded);
  int differ = 0;
  for (size_t i = 0; i < jobs.size(); ++i) differ += other[i].text != alone[i].text;
  EXPECT_GE(differ, kMeasured / 2);
}

// ---- The forward: a row's bits whatever the batch and the block.

class BatchInvariantForward : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(LlamaModel::Load(serve_test::TargetDir(), {}, &model_).ok());
    ASSERT_TRUE(Tokenizer::Load(serve_test::TargetDir(), &tokenizer_).ok());
    const ModelConfig& c = model_->config();
    // 16 sequences: prompts of every domain, prefixes of 8 to ~120 tokens, blocks of 1 to 6
    // new tokens (a decode step, or a verification of k + 1 positions).
    for (int s = 0; s < kClients; ++s) {
      const std::string& domain = Domains()[s % Domains().size()];
      std::vector<int> ids =
          tokenizer_->Encode(Prompts(domain, static_cast<size_t>(s / 5), 1).at(0));
      if (c.add_bos_token) ids.insert(ids.begin(), c.bos_token_id);
      const size_t block = 1 + s % 6;
      ASSERT_GT(ids.size(), block + 8);
      const size_t past = std::min<size_t>(8 + s * 7, ids.size() - block);
      prefix_.emplace_back(ids.begin(), ids.begin() + past);
      block_.emplace_back(ids.begin() + past, ids.begin() + past + block);
    }
  }

  static ForwardInput Input(KVCache* cache, std::vector<int64_t> tokens, bool all_logits) {
    ForwardInput in;
    in.cache = cache;
    in.tokens = std::move(tokens);
    in.all_logits = all_logits;
    return in;
  }

  // Fresh caches holding each prefix (each prefilled alone).
  std::vector<KVCache> Prefilled() const {
    std::vector<KVCache> caches;
    for (const auto& p : prefix_) {
      caches.push_back(model_->NewCache());
      model_->Forward({Input(&caches.back(), p, false)});
    }
    return caches;
  }

  // The blocks' logits (every row), each sequence alone: [sequence] -> [rows, vocab].
  std::vector<at::Tensor> Alone() const {
    std::vector<KVCache> caches = Prefilled();
    std::vector<at::Tensor> out;
    for (size_t s = 0; s < caches.size(); ++s) {
      out.push_back(model_->Forward({Input(&caches[s], block_[s], true)}));
    }
    return out;
  }

  // The same blocks in one batched forward, split per sequence.
  std::vector<at::Tensor> Batched() const {
    std::vector<KVCache> caches = Prefilled();
    std::vector<ForwardInput> batch;
    for (size_t s = 0; s < caches.size(); ++s) batch.push_back(Input(&caches[s], block_[s], true));
    const at::Tensor all = model_->Forward(batch);
    std::vector<at::Tensor> out;
    int64_t row = 0;
    for (const auto& b : block_) {
      out.push_back(all.narrow(0, row, b.size()).contiguous());
      row += b.size();
    }
    return out;
  }

  static bool SameBits(const at::Tensor& a, const at::Tensor& b) {
    return a.sizes() == b.sizes() &&
           std::memcmp(a.data_ptr<float>(), b.data_ptr<float>(), a.numel() * sizeof(float)) == 0;
  }

  c10::InferenceMode guard_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::vector<int64_t>> prefix_, block_;
};

TEST_F(BatchInvariantForward, ARowHasTheSameBitsAloneAndInABatchOf16) {
  const std::vector<at::Tensor> alone = Alone(), batched = Batched();
  for (int s = 0; s < kClients; ++s) {
    EXPECT_TRUE(SameBits(alone[s], batched[s])) << "sequence " << s;
  }
  // Not vacuous: the sequences' last rows all differ.
  for (int s = 1; s < kClients; ++s) {
    EXPECT_FALSE(SameBits(alone[s].narrow(0, -1, 1).contiguous(),
                          alone[s - 1].narrow(0, -1, 1).contiguous()));
  }
}

TEST_F(BatchInvariantForward, APositionHasTheSameBitsWhateverBlockScoresIt) {
  // A block of k + 1 rows versus the same tokens decoded one at a time (what a different k
  // does to where a position is scored).
  const std::vector<at::Tensor> blocks = Alone();
  std::vector<KVCache> caches = Prefilled();
  for (int s = 0; s < kClients; ++s) {
    for (size_t j = 0; j < block_[s].size(); ++j) {
      const at::Tensor one = model_->Forward({Input(&caches[s], {block_[s][j]}, false)});
      EXPECT_TRUE(SameBits(one, blocks[s].narrow(0, j, 1).contiguous()))
          << "sequence " << s << " row " << j;
    }
  }
}

TEST_F(BatchInvariantForward, TheExactComparisonSeesADifferentArithmetic) {
  // The ATen path (LibTorch operators over BLAS) computes the same function with other
  // summation orders: to float rounding the same logits, but not the same bits, which the
  // exact comparisons above would catch. Whether BLAS gives a row other bits in a batch than
  // alone is reported, not asserted (it depends on the BLAS build and the CPU).
  const std::vector<at::Tensor> cpu = Alone();
  model_->set_use_small_cpu_path(false);
  const std::vector<at::Tensor> aten_alone = Alone(), aten_batched = Batched();
  int differ_from_cpu = 0, differ_in_batch = 0;
  double max_diff = 0;
  for (int s = 0; s < kClients; ++s) {
    differ_from_cpu += !SameBits(aten_alone[s], cpu[s]);
    differ_in_batch += !SameBits(aten_alone[s], aten_batched[s]);
    max_diff = std::max(max_diff, (aten_alone[s] - cpu[s]).abs().max().item<double>());
    max_diff = std::max(max_diff, (aten_batched[s] - cpu[s]).abs().max().item<double>());
  }
  EXPECT_GT(differ_from_cpu, 0);
  EXPECT_LT(max_diff, 1e-3);
  std::printf("ATen path: %d of %d sequences' rows differ in bits from the CPU forward's; "
              "%d of %d differ between alone and in the batch of %d; max |diff| %.3g\n",
              differ_from_cpu, kClients, differ_in_batch, kClients, kClients, max_diff);
  RecordProperty("aten_rows_batch_dependent", differ_in_batch);
}

}  // namespace
}  // namespace specloop
