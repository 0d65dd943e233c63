#include "common/engine/speculative_decoder.h"

#include <algorithm>
#include <chrono>

#include <c10/core/InferenceMode.h>

#include "common/engine/decode_step.h"
#include "common/engine/draft_model_proposer.h"
#include "common/engine/feature_draft_proposer.h"
#include "common/model/eagle3_head.h"
#include "common/spec/acceptance.h"
#include "common/spec/optimal_acceptance.h"
#include "common/spec/rrs.h"

namespace specloop {

using Clock = std::chrono::steady_clock;

void SpeculativeStats::Add(const SpeculativeStats& o) {
  steps += o.steps;
  drafts += o.drafts;
  drafted += o.drafted;
  accepted += o.accepted;
  tested += o.tested;
  emitted += o.emitted;
  k_sum += o.k_sum;
  optimal += o.optimal;
  optimal_positions += o.optimal_positions;
  if (accepted_at.size() < o.accepted_at.size()) accepted_at.resize(o.accepted_at.size());
  for (size_t i = 0; i < o.accepted_at.size(); ++i) accepted_at[i] += o.accepted_at[i];
}

SpeculativeDecoder::SpeculativeDecoder(const LlamaModel* target, Proposer* proposer,
                                       std::vector<int> prompt, const GenerateOptions& options,
                                       bool defer_prefill, std::shared_ptr<KVBlockPool> pool)
    : target_(target),
      proposer_(proposer),
      features_(dynamic_cast<FeatureDraftProposer*>(proposer)),
      options_(options),
      rng_(options.sampling.seed),
      cache_(pool ? target->NewCache(std::move(pool))
                  : target->NewCache(prompt.size() + options.max_tokens + 16)),
      tokens_(std::move(prompt)),
      prompt_len_(tokens_.size()),
      verifier_(&spec::VerifyChain),
      multi_verifier_(&spec::VerifyRecursiveRejection) {
  c10::InferenceMode guard;
  TORCH_CHECK(!tokens_.empty(), "empty prompt");
  finished_ = options_.max_tokens <= 0;
  AdoptCachedPrefix();
  // Prefill all but the last prompt token: the last one is fed with the first draft block.
  if (!defer_prefill && prefill_remaining() > 0) {
    const int64_t first = prefilled();
    if (features_ == nullptr) {
      target_->Forward({PrefillInput(tokens_.size())});
    } else {
      at::Tensor hidden;
      target_->Forward({PrefillInput(tokens_.size())}, feature_layers(), &hidden);
      PrefillFeatures(first, hidden);
    }
  }
}

std::vector<int> SpeculativeDecoder::feature_layers() const {
  return features_ != nullptr ? features_->feature_layers() : std::vector<int>();
}

void SpeculativeDecoder::PrefillFeatures(int64_t first, const at::Tensor& rows) {
  if (features_ != nullptr) features_->AddFeatures(first, rows);
}

void SpeculativeDecoder::AdoptCachedPrefix() {
  TORCH_CHECK(cached_.empty(), "AdoptCachedPrefix on a filled cache");
  const int64_t n = cache_.AdoptPrefix(tokens_, static_cast<int64_t>(tokens_.size()) - 1);
  cached_.assign(tokens_.begin(), tokens_.begin() + n);
}

bool SpeculativeDecoder::ReserveCache(int64_t positions) {
  return cache_.Reserve(
      std::min<int64_t>(positions, target_->config().max_model_len));
}

void SpeculativeDecoder::DropCache() {
  cache_.Publish(cached_, static_cast<int64_t>(cached_.size()));
  cache_.Clear();
  cached_.clear();
}

ForwardInput SpeculativeDecoder::PrefillInput(int64_t max_tokens) {
  TORCH_CHECK(max_tokens > 0 && prefill_remaining() > 0, "nothing to prefill");
  cache_.Publish(cached_, static_cast<int64_t>(cached_.size()));  // the chunks run so far
  const size_t begin = cached_.size();
  const size_t end = begin + static_cast<size_t>(std::min(max_tokens, prefill_remaining()));
  ForwardInput in;
  in.cache = &cache_;
  in.tokens.assign(tokens_.begin() + begin, tokens_.begin() + end);
  cached_.insert(cached_.end(), tokens_.begin() + begin, tokens_.begin() + end);
  return in;
}

std::vector<int> SpeculativeDecoder::generated() const {
  return std::vector<int>(tokens_.begin() + prompt_len_, tokens_.end());
}

void SpeculativeDecoder::Propose(int k) {
  k = BeginPropose(k);
  proposer_->Propose(tokens_, k, &draft_);
  EndPropose();
}

int SpeculativeDecoder::BeginPropose(int k) {
  // Cache slots left beside the pending token: the most draft tokens a step can score.
  const int64_t room =
      target_->config().max_model_len - static_cast<int64_t>(tokens_.size());
  last_k_ = static_cast<int>(std::clamp<int64_t>(k, 0, room));
  draft_.Clear();
  return last_k_;
}

void SpeculativeDecoder::EndPropose() {
  // A block that would not fit (a tree's nodes, or a proposer overshooting k) is dropped: the
  // step decodes plainly.
  const int64_t room =
      target_->config().max_model_len - static_cast<int64_t>(tokens_.size());
  const int64_t n = draft_.tokens.size();
  if (n > room || (!draft_.is_tree() && n > last_k_)) draft_.Clear();
}

ForwardInput SpeculativeDecoder::TargetInput() {
  // Between steps the cache holds committed tokens only: its full blocks serve later requests.
  cache_.Publish(cached_, static_cast<int64_t>(cached_.size()));
  ForwardInput in{&cache_, std::vector<int64_t>(tokens_.begin() + cached_.size(), tokens_.end()),
                  true};
  const int c = in.tokens.size();  // catch-up tokens: the pending one, after a prompt more
  in.tokens.insert(in.tokens.end(), draft_.tokens.begin(), draft_.tokens.end());
  if (draft_.is_tree()) {
    for (int j = 0; j < c; ++j) in.parents.push_back(j - 1);
    for (int p : draft_.parents) in.parents.push_back(p < 0 ? c - 1 : c + p);
  }
  return in;
}

void SpeculativeDecoder::VerifyTree(const at::Tensor& logits, spec::ChainOutcome* outcome,
                                    std::vector<int>* path) {
  const int V = target_->config().vocab_size;
  const int k = draft_.tokens.size();
  const int c = logits.size(0) - k;  // catch-up rows come first; row c - 1: the pending token
  at::Tensor rows = logits.contiguous();
  const float* r = rows.data_ptr<float>();
  outcome->tokens.clear();
  outcome->num_accepted = 0;
  for (int j = 0; j < c; ++j) path->push_back(j);
  std::vector<int> children, drafts;
  std::vector<float>& p = row_;
  for (int node = -1, row = c - 1;;) {
    children.clear();
    drafts.clear();
    for (int i = 0; i < k; ++i) {
      if (draft_.parents[i] == node) {
        children.push_back(i);
        drafts.push_back(draft_.tokens[i]);
      }
    }
    const float* logits_row = r + static_cast<size_t>(row) * V;
    int accepted = -1, token;
    if (options_.sampling.greedy()) {
      token = Argmax(logits_row, V);
      for (size_t j = 0; j < drafts.size(); ++j) {
        if (drafts[j] == token) accepted = j;
      }
    } else {
      ProcessedDistribution(logits_row, V, options_.sampling, &p);
      if (children.empty()) {  // a leaf: the bonus token
        token = SampleFrom(p.data(), V, &rng_);
      } else {
        spec::MultiDraftOutcome m;
        const float* q = draft_.probs.data() + static_cast<size_t>(node + 1) * V;
        Status s = multi_verifier_(V, drafts, q, p.data(), &rng_, &m);
        TORCH_CHECK(s.ok(), "tree verification failed: ", s.ToString());
        token = m.token;
        accepted = m.accepted_index;
      }
    }
    if (!children.empty()) {
      ++last_tested_;
      if (options_.sampling.greedy()) {
        last_optimal_.expected += accepted >= 0 ? 1.0 : 0.0;
        last_optimal_.positions++;
      } else if (drafts.size() <= 2) {
        const float* q = draft_.probs.data() + static_cast<size_t>(node + 1) * V;
        last_optimal_.expected +=
            spec::OptimalAcceptanceWithoutReplacement(drafts.size(), V, p.data(), q);
        last_optimal_.positions++;
      }
    }
    outcome->tokens.push_back(token);
    if (accepted < 0) return;
    node = children[accepted];
    row = c + node;
    path->push_back(c + node);
    outcome->num_accepted++;
  }
}

std::vector<int> SpeculativeDecoder::Commit(const at::Tensor& logits, const at::Tensor& hidden) {
  const int64_t past = cached_.size();
  std::vector<int64_t> kept;  // rows whose positions the cache keeps, in order
  std::vector<int> emitted = Verify(logits, &kept);
  KeepFeatures(past, std::move(kept), hidden);
  return emitted;
}

void SpeculativeDecoder::KeepFeatures(int64_t past, std::vector<int64_t> kept,
                                      const at::Tensor& hidden) {
  if (features_ == nullptr || !hidden.defined()) return;
  const int64_t n = static_cast<int64_t>(cached_.size()) - past;
  TORCH_CHECK(n <= static_cast<int64_t>(kept.size()), "kept rows out of step");
  kept.resize(n);
  if (n > 0) {
    features_->AddFeatures(
        past, hidden.index_select(0, at::tensor(kept, at::kLong).to(hidden.device())));
  }
}

std::vector<int> SpeculativeDecoder::CommitOutcome(const spec::ChainOutcome& outcome,
                                                   double optimal, const at::Tensor& hidden) {
  const int V = target_->config().vocab_size;
  const int k = static_cast<int>(draft_.tokens.size());
  const int a = outcome.num_accepted;
  TORCH_CHECK(!draft_.is_tree(), "CommitOutcome: a tree block is verified by Commit");
  TORCH_CHECK(a >= 0 && a <= k && outcome.tokens.size() == static_cast<size_t>(a) + 1,
              "CommitOutcome: ", a, " accepted and ", outcome.tokens.size(), " tokens for k = ",
              k);
  for (int i = 0; i <= a; ++i) {
    TORCH_CHECK(outcome.tokens[i] >= 0 && outcome.tokens[i] < V, "CommitOutcome: token ",
                outcome.tokens[i], " outside the vocabulary");
    TORCH_CHECK(i == a || outcome.tokens[i] == draft_.tokens[i],
                "CommitOutcome: accepted token ", i, " is not the draft's");
  }
  // The draws Verify's verifier makes (spec::VerifyChain, or SampleToken for k = 0).
  const int draws = options_.sampling.greedy() ? 0 : k == 0 ? 1 : a == k ? k + 1 : a + 2;
  for (int i = 0; i < draws; ++i) rng_.Uniform();
  const size_t before = tokens_.size();
  const int64_t past = cached_.size();
  last_tree_path_.clear();
  last_tested_ = k > 0 ? a + (a < k ? 1 : 0) : 0;
  last_optimal_ = OptimalAcceptance();
  if (k > 0) last_optimal_ = {optimal, last_tested_};
  // As Verify: the cache holds the catch-up tokens and the whole block, every row kept.
  std::vector<int64_t> kept;
  const int64_t rows = static_cast<int64_t>(tokens_.size() - cached_.size()) + k;
  for (int64_t i = 0; i < rows; ++i) kept.push_back(i);
  cached_.insert(cached_.end(), tokens_.begin() + cached_.size(), tokens_.end());
  cached_.insert(cached_.end(), draft_.tokens.begin(), draft_.tokens.end());
  std::vector<int> emitted = Emit(outcome, k, before);
  KeepFeatures(past, std::move(kept), hidden);
  return emitted;
}

std::vector<int> SpeculativeDecoder::Verify(const at::Tensor& logits, std::vector<int64_t>* kept) {
  const int V = target_->config().vocab_size;
  const int k = static_cast<int>(draft_.tokens.size());
  spec::ChainOutcome outcome;
  const size_t before = tokens_.size();
  last_optimal_ = OptimalAcceptance();
  last_tested_ = 0;
  last_tree_path_.clear();
  if (draft_.is_tree()) {
    // Keep the catch-up tokens and the accepted path in the cache, in order.
    std::vector<int> path;
    VerifyTree(logits, &outcome, &path);
    const int c = logits.size(0) - k;
    for (int row : path) {
      if (row >= c) last_tree_path_.push_back(row - c);
      kept->push_back(row);
    }
    const int64_t past = cached_.size();
    cache_.KeepPath(past, path);
    cached_.insert(cached_.end(), tokens_.begin() + cached_.size(), tokens_.end());
    for (size_t j = 0; j + 1 < outcome.tokens.size(); ++j) cached_.push_back(outcome.tokens[j]);
    return Emit(outcome, k, before);
  }
  // The rows that matter: the last k + 1 (earlier ones, if any, scored catch-up tokens).
  at::Tensor rows = logits.narrow(0, logits.size(0) - (k + 1), k + 1).contiguous();
  const float* r = rows.data_ptr<float>();
  Status s;
  if (k == 0) {
    // Nothing drafted: plain decoding's step, by its own sampler on this stream (the same law
    // as verifying an empty block, without a second copy of p in double precision).
    outcome.tokens.assign(1, SampleToken(r, V, options_.sampling, &rng_, &row_));
  } else if (options_.sampling.greedy()) {
    s = spec::VerifyChainGreedy(k, V, draft_.tokens.data(), r, &outcome);
  } else {
    p_.resize(static_cast<size_t>(k + 1) * V);
    for (int i = 0; i <= k; ++i) {
      ProcessedDistribution(r + static_cast<size_t>(i) * V, V, options_.sampling, &row_);
      std::copy(row_.begin(), row_.end(), p_.begin() + static_cast<size_t>(i) * V);
    }
    s = verifier_(k, V, draft_.tokens.data(), draft_.probs.data(), p_.data(), &rng_, &outcome);
  }
  TORCH_CHECK(s.ok(), "verification failed: ", s.ToString());
  if (k > 0) {
    const int tested = outcome.num_accepted + (outcome.num_accepted < k ? 1 : 0);
    last_tested_ = tested;
    last_optimal_.positions = tested;
    if (options_.sampling.greedy()) {
      last_optimal_.expected = outcome.num_accepted;  // one-hot p and q: min sums to agreement
    } else {
      for (int i = 0; i < tested; ++i) {
        last_optimal_.expected += spec::AcceptanceRate(
            p_.data() + static_cast<size_t>(i) * V, draft_.probs.data() + static_cast<size_t>(i) * V, V);
      }
    }
  }

  for (int64_t i = 0; i < logits.size(0); ++i) kept->push_back(i);
  // What the target's cache now holds: the catch-up tokens and the whole draft block.
  cached_.insert(cached_.end(), tokens_.begin() + cached_.size(), tokens_.end());
  cached_.insert(cached_.end(), draft_.tokens.begin(), draft_.tokens.end());
  return Emit(outcome, k, before);
}

std::vector<int> SpeculativeDecoder::Emit(const spec::ChainOutcome& outcome, int k,
                                          size_t before) {
  last_accepted_ = outcome.num_accepted;
  stats_.steps++;
  stats_.drafts += k > 0 ? 1 : 0;
  stats_.drafted += k;
  stats_.accepted += outcome.num_accepted;
  stats_.tested += last_tested_;
  stats_.emitted += outcome.tokens.size();
  stats_.k_sum += last_k_;
  stats_.optimal += last_optimal_.expected;
  stats_.optimal_positions += last_optimal_.positions;
  if (stats_.accepted_at.size() < static_cast<size_t>(outcome.num_accepted)) {
    stats_.accepted_at.resize(outcome.num_accepted);
  }
  if (!draft_.is_tree() && static_cast<int>(stats_.accepted_at.size()) < k) {
    stats_.accepted_at.resize(k);
  }
  for (int i = 0; i < outcome.num_accepted; ++i) stats_.accepted_at[i]++;

  // Emit, cutting at EOS, max_tokens and the context limit.
  const int limit = target_->config().max_model_len;
  std::vector<int> emitted;
  for (int t : outcome.tokens) {
    tokens_.push_back(t);
    emitted.push_back(t);
    const size_t generated = tokens_.size() - prompt_len_;
    if (options_.stop_at_eos && target_->config().IsEos(t)) {
      hit_eos_ = finished_ = true;
      break;
    }
    if (generated >= static_cast<size_t>(options_.max_tokens) ||
        tokens_.size() >= static_cast<size_t>(limit)) {
      finished_ = true;
      break;
    }
  }
  // Roll the cache back to the longest prefix it shares with the committed tokens.
  size_t keep = before - 1;  // everything before the old pending token was committed already
  while (keep < cached_.size() && keep < tokens_.size() && cached_[keep] == tokens_[keep]) ++keep;
  keep = std::min(keep, tokens_.size() - 1);  // the new pending token stays out
  cache_.Truncate(keep);
  cached_.resize(keep);
  return emitted;
}

// Prefill: the prompt but its last token, in the target. The draft catches up on the prompt
// when it first drafts (work only speculation needs: decode time, and the policy's to price).
SpeculativeGeneration::SpeculativeGeneration(const LlamaModel& target, Proposer* proposer,
                                             const std::vector<int>& prompt,
                                             const SpeculativeOptions& options)
    : target_(target), proposer_(proposer), options_(options) {
  TORCH_CHECK(!options.policy || options.costs, "SpeculativeOptions: a policy needs costs");
  const auto t0 = Clock::now();
  decoder_ = std::make_unique<SpeculativeDecoder>(&target, proposer, prompt, options.generate,
                                                  /*defer_prefill=*/false, options.generate.pool);
  prefill_seconds_ = std::chrono::duration<double>(Clock::now() - t0).count();
  slot_ = std::make_unique<DecodeSlot>();
  slot_->decoder = decoder_.get();
  slot_->proposer = proposer_;
  slot_->draft_proposer = dynamic_cast<DraftModelProposer*>(proposer_);
  slot_->feature_proposer = dynamic_cast<FeatureDraftProposer*>(proposer_);
  slot_->policy = options_.policy;
  if (options_.policy != nullptr && slot_->draft_proposer != nullptr) slot_->tree = options_.tree;
  slot_->fixed_k = options_.k;
}

SpeculativeGeneration::~SpeculativeGeneration() = default;

GenerateResult SpeculativeGeneration::result() const {
  GenerateResult r;
  r.tokens = decoder_->generated();
  r.hit_eos = decoder_->hit_eos();
  r.prefill_seconds = prefill_seconds_;
  r.decode_seconds = decode_seconds_;
  return r;
}

void SpeculativeGeneration::Step() {
  const auto t0 = Clock::now();
  DecodeStep(target_, options_.costs, {slot_.get()});
  TORCH_CHECK(slot_->error.empty(), slot_->error);
  decode_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
}

GenerateResult GenerateSpeculative(const LlamaModel& target, Proposer* proposer,
                                   const std::vector<int>& prompt,
                                   const SpeculativeOptions& options, SpeculativeStats* stats) {
  SpeculativeGeneration g(target, proposer, prompt, options);
  while (!g.finished()) g.Step();
  if (stats) *stats = g.stats();
  return g.result();
}

double VerificationSecondsPerRow(int vocab, const SamplingParams& sampling) {
  if (sampling.greedy()) return 0.0;  // an argmax: noise next to a forward
  std::vector<float> logits(vocab), p;
  Rng rng(1);
  for (float& x : logits) x = static_cast<float>(rng.Uniform() * 10.0);
  const int reps = 16;
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) ProcessedDistribution(logits.data(), vocab, sampling, &p);
  return std::chrono::duration<double>(Clock::now() - t0).count() / reps;
}

namespace {
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

void CalibrateStepCosts(const LlamaModel& target, const LlamaModel* draft, int k_max,
                        StepCostTable* costs, const CalibrationOptions& options) {
  c10::InferenceMode guard;
  const int plain_run = 16;  // plain decoding's forwards timed back to back
  const int room = std::max(k_max + 1, plain_run);  // cache beyond the context
  const int context =
      std::max(1, std::min(options.context, target.config().max_model_len - room - 1));
  const int short_context = options.short_context;
  const bool two = short_context >= 1 && short_context < context;
  auto input = [](KVCache* cache, int n, bool all_logits) {
    ForwardInput in;
    in.cache = cache;
    in.tokens.assign(n, 3);
    in.all_logits = all_logits;
    return in;
  };
  // Off the CPU a forward returns once its work is queued: each timed one waits for its
  // result. And its caches lie in bounded pools, as a server's, so that a CUDA target and draft
  // are timed as they decode, replaying CUDA graphs (LlamaModel::Forward); on the CPU each
  // cache has a pool of its own.
  const bool device = !target.device().is_cpu();
  auto done = [device](const at::Tensor& out) {
    if (device) (void)out.reshape(-1)[0].item<float>();
  };
  const int64_t calibration_blocks =
      (std::max(1, options.max_batch) + 2) * KVBlockPool::BlocksFor(context + room) + 1;
  std::shared_ptr<KVBlockPool> target_pool, draft_pool;
  if (device) {
    target_pool = target.NewBlockPool(calibration_blocks, false);
    if (draft != nullptr) draft_pool = draft->NewBlockPool(calibration_blocks, false);
  }
  auto prefilled = [&](const LlamaModel& m, int tokens) {
    const std::shared_ptr<KVBlockPool>& pool = &m == &target ? target_pool : draft_pool;
    KVCache c = pool ? m.NewCache(pool) : m.NewCache(tokens + room);
    done(m.Forward({input(&c, tokens, false)}));
    return c;
  };
  auto seconds = [&](const LlamaModel& m, std::vector<KVCache>* caches, int n, int64_t past) {
    std::vector<ForwardInput> in;
    for (KVCache& c : *caches) in.push_back(input(&c, n, n > 1));
    const auto t0 = Clock::now();
    done(m.Forward(in));
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    for (KVCache& c : *caches) c.Truncate(past);
    return s;
  };
  // Plain decoding, as it runs: one-row forwards back to back on a growing cache. Timed amid
  // forwards of other sizes and caches they cost 8-10% more (target-6m).
  auto plain = [&](std::vector<KVCache>* caches, int64_t past) {
    std::vector<double> v;
    for (int i = 0; i < plain_run; ++i) {
      std::vector<ForwardInput> in;
      for (KVCache& c : *caches) in.push_back(input(&c, 1, false));
      const auto t0 = Clock::now();
      done(target.Forward(in));
      v.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    for (KVCache& c : *caches) c.Truncate(past);
    return Median(v);
  };
  // Each scored row is also turned into a processed distribution (verification); each drafted
  // token too (sampling it).
  const double row = VerificationSecondsPerRow(target.config().vocab_size, options.sampling);
  // The draft's forwards: a draft model's, or a head's (CalibrationOptions::head) over caches
  // of `context` positions of features; each drafting forward is one row per sequence.
  const Eagle3Head* head = draft == nullptr ? options.head : nullptr;
  const bool drafts = draft != nullptr || head != nullptr;
  struct DraftCaches {
    std::vector<KVCache> model;
    std::vector<Eagle3Head::Cache> head;
  };
  auto head_feed = [&](Eagle3Head::Cache* c, int n) {
    const at::Tensor rows =
        at::zeros({n, head->feature_width()}, at::TensorOptions().device(target.device()));
    done(head->Forward({{c, rows, std::vector<int64_t>(n, 3)}}, nullptr));
  };
  auto draft_caches = [&](int b) {
    DraftCaches dc;
    for (int i = 0; i < b; ++i) {
      if (draft) {
        dc.model.push_back(prefilled(*draft, context));
      } else {
        dc.head.push_back(head->NewCache(context + room));
        head_feed(&dc.head.back(), context);
      }
    }
    return dc;
  };
  auto draft_seconds = [&](DraftCaches* dc) {
    if (draft) return seconds(*draft, &dc->model, 1, context);
    std::vector<Eagle3Head::Input> in;
    const at::Tensor own =
        at::zeros({1, head->hidden_size()}, at::TensorOptions().device(target.device()));
    for (Eagle3Head::Cache& c : dc->head) in.push_back({&c, own, {3}});
    const auto t0 = Clock::now();
    done(head->Forward(in, nullptr));
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    for (Eagle3Head::Cache& c : dc->head) c.length = context;
    return s;
  };

  // One sequence: rounds over every size, so that a shared machine's load spreads over all
  // sizes alike; each verification-sized forward after a draft forward, as decoding runs it
  // (two models taking turns evict each other's weights from the CPU's caches).
  std::vector<KVCache> longc, shortc;
  DraftCaches draftc;
  longc.push_back(prefilled(target, context));
  if (two) shortc.push_back(prefilled(target, short_context));
  if (drafts) {  // its prompt-sized catch-up, timed
    const auto t0 = Clock::now();
    draftc = draft_caches(1);
    costs->ObserveCatchUp(context, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::vector<std::vector<double>> t(k_max + 2), t_short(k_max + 2);
  std::vector<double> d;
  for (int round = 0; round < 7; ++round) {
    for (int n = 1; n <= k_max + 1; ++n) {
      if (drafts && n > 1) d.push_back(draft_seconds(&draftc));
      t[n].push_back(seconds(target, &longc, n, context));
      if (!two) continue;
      if (drafts && n > 1) d.push_back(draft_seconds(&draftc));
      t_short[n].push_back(seconds(target, &shortc, n, short_context));
    }
  }
  if (drafts && d.empty()) d.push_back(draft_seconds(&draftc));
  std::vector<double> at(k_max + 2), slopes;
  for (int n = 1; n <= k_max + 1; ++n) {
    at[n] = n == 1 ? plain(&longc, context) : Median(t[n]);
    if (two) {
      const double at_short = n == 1 ? plain(&shortc, short_context) : Median(t_short[n]);
      slopes.push_back(std::max(0.0, at[n] - at_short) / (n * double(context - short_context)));
    }
  }
  costs->set_context_slope(slopes.empty() ? 0.0 : Median(slopes));
  for (int n = 1; n <= k_max + 1; ++n) {
    costs->ObserveTarget(n, double(n) * context, at[n] + n * row, /*after_draft=*/true);
  }
  if (drafts) costs->ObserveDraft(1, Median(d) + row);

  // Batches (a server's): b sequences of n rows each, and the draft over b sequences.
  std::vector<int> batches, sizes;
  for (int b = 2; b < options.max_batch; b *= 2) batches.push_back(b);
  if (options.max_batch >= 2) batches.push_back(options.max_batch);
  for (int n : {1, 2, 3, 5, k_max + 1}) {
    if (n <= k_max + 1 && std::find(sizes.begin(), sizes.end(), n) == sizes.end()) {
      sizes.push_back(n);
    }
  }
  for (int b : batches) {
    std::vector<KVCache> caches;
    for (int i = 0; i < b; ++i) caches.push_back(prefilled(target, context));
    for (int n : sizes) {
      std::vector<double> v;
      if (n == 1) {
        v.push_back(plain(&caches, context));
      } else {
        for (int rep = 0; rep < 3; ++rep) v.push_back(seconds(target, &caches, n, context));
      }
      costs->ObserveTarget(b * n, double(b) * n * context, Median(v) + b * n * row, true);
    }
    if (!drafts) continue;
    DraftCaches dcaches = draft_caches(b);
    std::vector<double> v;
    for (int rep = 0; rep < 3; ++rep) v.push_back(draft_seconds(&dcaches));
    costs->ObserveDraft(b, Median(v) + b * row);
  }
}

}  // namespace specloop
