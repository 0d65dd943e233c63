#include "common/engine/draft_model_proposer.h"

#include <algorithm>
#include <chrono>

#include "common/engine/device_draw.h"
#include "common/spec/tensor_upload.h"
#include "common/spec/rrs.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

namespace specloop {
namespace {

// The draft's logits where drafting reads them: float32 rows in host memory (a copy, and a wait
// for the forward, only when the draft runs on a GPU), or where the forward left them.
at::Tensor DraftLogits(const LlamaModel& draft, const std::vector<ForwardInput>& batch,
                       bool on_device = false) {
  const at::Tensor logits = draft.Forward(batch);
  return on_device ? logits : logits.to(at::kCPU, at::kFloat).contiguous();
}

}  // namespace

DraftModelProposer::DraftModelProposer(const LlamaModel* draft, const SamplingParams& sampling,
                                       float min_confidence,
                                       std::shared_ptr<KVBlockPool> pool)
    : draft_(draft),
      sampling_(sampling),
      min_confidence_(min_confidence),
      rng_(sampling.seed ^ 0x5eed0fd4af7ULL),
      cache_(pool ? draft->NewCache(std::move(pool)) : draft->NewCache()) {}

void DraftModelProposer::SetDraft(const LlamaModel* draft, std::shared_ptr<KVBlockPool> pool) {
  draft_ = draft;
  cache_ = pool ? draft->NewCache(std::move(pool)) : draft->NewCache();
  cached_.clear();
  tree_past_ = -1;
}

bool DraftModelProposer::ReserveCache(int64_t positions) {
  return cache_.Reserve(
      std::min<int64_t>(positions, draft_->config().max_model_len));
}

void DraftModelProposer::DropCache(const std::vector<int>& context) {
  cache_.Publish(context, Common(context, context.size()));
  cache_.Clear();
  cached_.clear();
  tree_past_ = -1;
}

void DraftModelProposer::Adopt(const std::vector<int>& context, size_t limit) {
  if (!cached_.empty() || tree_past_ >= 0) return;
  const int64_t n = cache_.AdoptPrefix(context, static_cast<int64_t>(limit));
  cached_.assign(context.begin(), context.begin() + n);
}

void DraftModelProposer::SettleTree(const std::vector<int>& context) {
  if (tree_past_ < 0) return;
  // Walk the tree along the tokens the context accepted after tree_past_; nodes in the cache
  // are the ones the last level's forward did not skip (all but the deepest level).
  std::vector<int> path;
  int node = -1;
  for (size_t pos = tree_past_; pos < context.size(); ++pos) {
    int next = -1;
    for (size_t i = 0; i < tree_.tokens.size(); ++i) {
      if (tree_.parents[i] == node && tree_.tokens[i] == context[pos]) next = i;
    }
    if (next < 0 || tree_past_ + next >= cache_.length()) break;
    path.push_back(next);
    node = next;
  }
  cache_.KeepPath(tree_past_, path);
  cached_.resize(tree_past_);
  for (int i : path) cached_.push_back(tree_.tokens[i]);
  tree_past_ = -1;
}

size_t DraftModelProposer::Common(const std::vector<int>& context, size_t end) const {
  size_t keep = 0;
  while (keep < cached_.size() && keep < end && cached_[keep] == context[keep]) ++keep;
  return keep;
}

size_t DraftModelProposer::Kept(const std::vector<int>& context) const {
  const size_t keep = Common(context, context.size());
  return keep == context.size() && keep > 0 ? keep - 1 : keep;
}

ForwardInput DraftModelProposer::Feed(const std::vector<int>& context, size_t keep, size_t end) {
  // What the cache holds of the context is committed: its full blocks serve later requests.
  cache_.Publish(context, static_cast<int64_t>(keep));
  cache_.Truncate(keep);
  cached_.resize(keep);
  ForwardInput in;
  in.cache = &cache_;
  in.tokens.assign(context.begin() + keep, context.begin() + end);
  cached_.insert(cached_.end(), context.begin() + keep, context.begin() + end);
  return in;
}

ForwardInput DraftModelProposer::FeedInput(const std::vector<int>& context) {
  SettleTree(context);
  Adopt(context, context.size() - 1);  // the last token is fed for the next row
  return Feed(context, Kept(context), context.size());
}

ForwardInput DraftModelProposer::PrefillInput(const std::vector<int>& context, size_t end) {
  SettleTree(context);
  Adopt(context, end);
  return Feed(context, Common(context, end), end);
}

void DraftModelProposer::Begin(DraftBlock* out) {
  out->Clear();
  device_probs_ = at::Tensor();
  device_rows_.clear();
  tree_forwards_.clear();
  last_seconds_ = 0.0;
  last_catch_up_ = CatchUp();
}

int DraftModelProposer::Draw(const float* row, int i, int max_k, DraftBlock* out) {
  const int V = draft_->config().vocab_size;
  // The stop decision reads q before the draw: the draft's most likely token (under greedy
  // decoding its softmax at temperature 1, else its processed q) must reach min_confidence.
  // Deciding on the drawn token instead would keep tokens from q restricted to {q >= c}
  // while verifying them against the whole q, which is not exact.
  int token;
  if (sampling_.greedy()) {
    token = Argmax(row, V);
    if (min_confidence_ > 0.0f) {
      Softmax(row, V, &scratch_);
      if (scratch_[token] < min_confidence_) return -1;
    }
  } else {
    ProcessedDistribution(row, V, sampling_, &scratch_);
    if (min_confidence_ > 0.0f &&
        *std::max_element(scratch_.begin(), scratch_.end()) < min_confidence_) {
      return -1;
    }
    token = SampleFrom(scratch_.data(), V, &rng_);
  }
  if (!sampling_.greedy()) out->probs.insert(out->probs.end(), scratch_.begin(), scratch_.end());
  return Keep(token, i, max_k, out);
}

int DraftModelProposer::Keep(int token, int i, int max_k, DraftBlock* out) {
  out->tokens.push_back(token);
  // The last token of a block is never fed: its q is all verification needs.
  if (i + 1 == max_k ||
      static_cast<int>(cached_.size()) + 1 >= draft_->config().max_model_len) {
    return -1;
  }
  cached_.push_back(token);
  return token;
}

// A block always feeds the pending token, and after a fully accepted block the last draft too;
// more than that is a catch-up.
constexpr size_t kSteadyFeed = 2;

int64_t DraftModelProposer::CatchUpTokens(const std::vector<int>& context) const {
  const size_t kept = Kept(context);
  // The last tree's accepted path settles into the cache without a forward.
  if (tree_past_ >= 0 && kept >= static_cast<size_t>(tree_past_)) return 0;
  const size_t fed = context.size() - kept;
  return fed > kSteadyFeed ? static_cast<int64_t>(fed) : 0;
}

void DraftModelProposer::Propose(const std::vector<int>& context, int max_k, DraftBlock* out) {
  using Clock = std::chrono::steady_clock;
  c10::InferenceMode guard;
  Begin(out);
  if (max_k <= 0 || context.empty()) return;
  // Feeding the pending token (and the last draft, after a fully accepted block) is the
  // block's first forward; a longer feed is a catch-up, timed apart.
  auto t0 = Clock::now();
  ForwardInput feed = FeedInput(context);
  const size_t fed = feed.tokens.size();
  at::Tensor logits = DraftLogits(*draft_, {std::move(feed)});
  const bool steady = fed <= kSteadyFeed;
  if (!steady) {
    const auto t1 = Clock::now();
    last_catch_up_ = {static_cast<int64_t>(fed), std::chrono::duration<double>(t1 - t0).count()};
    t0 = t1;
  }
  int forwards = steady ? 1 : 0;
  if (!branching_.empty()) {
    ProposeTree(max_k, logits, out, &forwards);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    last_seconds_ = forwards > 0 ? seconds : -1.0;
    return;
  }
  for (int i = 0; i < max_k; ++i) {
    const int next = Draw(logits.data_ptr<float>(), i, max_k, out);
    if (next < 0) break;
    logits = DraftLogits(*draft_, {{&cache_, {next}, false}});
    ++forwards;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  // Scale what was timed to one forward per drafted token; nothing timed: unknown.
  const int drafted = out->tokens.size();
  last_seconds_ = forwards > 0 ? seconds * drafted / forwards : (drafted > 0 ? -1.0 : 0.0);
}

void DraftModelProposer::SplitFirstForward(const std::vector<const BatchItem*>& chains,
                                           const std::vector<size_t>& fed, double dt,
                                           std::vector<double>* seconds,
                                           std::vector<int>* forwards) {
  size_t total_fed = 0;
  for (const size_t f : fed) total_fed += f;
  for (size_t j = 0; j < chains.size(); ++j) {
    const double share = dt * fed[j] / std::max<size_t>(1, total_fed);
    if (fed[j] > kSteadyFeed) {
      chains[j]->proposer->last_catch_up_ = {static_cast<int64_t>(fed[j]), share};
    } else {
      (*seconds)[j] += share;
      (*forwards)[j] = 1;
    }
  }
}

void DraftModelProposer::ProposeBatch(const std::vector<BatchItem>& items, bool on_device) {
  using Clock = std::chrono::steady_clock;
  c10::InferenceMode guard;
  std::vector<const BatchItem*> chains;
  for (const BatchItem& item : items) {
    if (!item.proposer->branching_.empty() || item.max_k <= 0 || item.context->empty()) {
      item.proposer->Propose(*item.context, item.max_k, item.out);
    } else {
      item.proposer->Begin(item.out);
      chains.push_back(&item);
    }
  }
  if (chains.empty()) return;
  bool never_stop = on_device;
  for (const BatchItem* c : chains) never_stop = never_stop && c->proposer->min_confidence_ <= 0;
  if (never_stop) {
    ProposeChainsOnDevice(chains);
    return;
  }
  const LlamaModel* draft = chains.front()->proposer->draft_;
  const int V = draft->config().vocab_size;
  const size_t n = chains.size();
  std::vector<double> seconds(n, 0.0);
  std::vector<int> forwards(n, 0);

  // The first forward: every chain's feed; its time split by tokens fed.
  std::vector<ForwardInput> inputs;
  std::vector<size_t> fed(n);
  for (size_t j = 0; j < n; ++j) {
    inputs.push_back(chains[j]->proposer->FeedInput(*chains[j]->context));
    fed[j] = inputs.back().tokens.size();
  }
  auto t0 = Clock::now();
  at::Tensor logits = DraftLogits(*draft, inputs, on_device);
  double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  SplitFirstForward(chains, fed, dt, &seconds, &forwards);

  // Then one forward per drafted position over the chains still drafting; row r of `logits`
  // belongs to chain active[r].
  std::vector<size_t> active(n);
  for (size_t j = 0; j < n; ++j) active[j] = j;
  for (int i = 0; !active.empty(); ++i) {
    std::vector<size_t> next_active;
    inputs.clear();
    std::vector<int64_t> drawn;  // on the device: the rows' tokens
    at::Tensor q;
    if (on_device) {
      std::vector<DrawRow> rows;
      for (size_t j : active) {
        DraftModelProposer& p = *chains[j]->proposer;
        rows.push_back({p.sampling_, p.min_confidence_, &p.rng_});
      }
      drawn = DrawOnDevice(logits, rows, &q);
    }
    for (size_t r = 0; r < active.size(); ++r) {
      const BatchItem& item = *chains[active[r]];
      DraftModelProposer& p = *item.proposer;
      int next = -1;
      if (!on_device) {
        next = p.Draw(logits.data_ptr<float>() + r * V, i, item.max_k, item.out);
      } else if (drawn[r] >= 0) {
        if (!p.sampling_.greedy()) p.device_rows_.push_back(q.select(0, r));
        next = p.Keep(static_cast<int>(drawn[r]), i, item.max_k, item.out);
      }
      if (next < 0) continue;
      ForwardInput in;
      in.cache = &item.proposer->cache_;
      in.tokens = {next};
      inputs.push_back(std::move(in));
      next_active.push_back(active[r]);
    }
    active = std::move(next_active);
    if (active.empty()) break;
    t0 = Clock::now();
    logits = DraftLogits(*draft, inputs, on_device);
    dt = std::chrono::duration<double>(Clock::now() - t0).count();
    for (size_t j : active) {
      seconds[j] += dt / active.size();
      ++forwards[j];
    }
  }
  for (size_t j = 0; j < n; ++j) {
    DraftModelProposer& p = *chains[j]->proposer;
    if (!p.device_rows_.empty()) {
      p.device_probs_ = at::stack(p.device_rows_);
      p.device_rows_.clear();
    }
    const int drafted = chains[j]->out->tokens.size();
    chains[j]->proposer->last_seconds_ =
        forwards[j] > 0 ? seconds[j] * drafted / forwards[j] : (drafted > 0 ? -1.0 : 0.0);
  }
}

// Every row draws (no chain stops early), so which chains go on after a position depends on
// the position alone (Keep), not on the token drawn: the chains' inputs and cached_ hold
// placeholder zeros while the tokens stay on the device, each forward reading the last draw's,
// and one copy at the end puts them in. The forwards are timed together by that copy's end
// (their queueing returns before the device runs them), each split by its rows as
// ProposeBatch's; a catch-up waits for its own first forward to be timed apart.
void DraftModelProposer::ProposeChainsOnDevice(const std::vector<const BatchItem*>& chains) {
  using Clock = std::chrono::steady_clock;
  const LlamaModel* draft = chains.front()->proposer->draft_;
  const size_t n = chains.size();
  std::vector<ForwardInput> inputs;
  std::vector<size_t> fed(n), base(n);  // base: cached_'s length before the drafted tokens
  bool catch_up = false;
  for (size_t j = 0; j < n; ++j) {
    DraftModelProposer& p = *chains[j]->proposer;
    inputs.push_back(p.FeedInput(*chains[j]->context));
    fed[j] = inputs.back().tokens.size();
    base[j] = p.cached_.size();
    catch_up = catch_up || fed[j] > kSteadyFeed;
  }
  std::vector<double> seconds(n, 0.0), weight(n, 0.0);  // weight: its share of `untimed`
  std::vector<int> forwards(n, 0);
  int untimed = 0;  // forwards timed together at the end
  std::vector<at::Tensor> drawn;             // per position: its rows' tokens, on the device
  std::vector<std::vector<size_t>> row_of;   // per position: the chain of each row
  try {
    auto t0 = Clock::now();
    at::Tensor logits = draft->Forward(inputs);
    if (catch_up) {
      logits.select(0, 0).select(0, 0).item<float>();  // waits for this forward alone
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      SplitFirstForward(chains, fed, dt, &seconds, &forwards);
      t0 = Clock::now();
    } else {
      ++untimed;
      for (size_t j = 0; j < n; ++j) {
        weight[j] += 1.0 / n;
        forwards[j] = 1;
      }
    }
    std::vector<size_t> active(n);
    for (size_t j = 0; j < n; ++j) active[j] = j;
    for (int i = 0;; ++i) {
      std::vector<DrawRow> rows;
      for (size_t j : active) {
        DraftModelProposer& p = *chains[j]->proposer;
        rows.push_back({p.sampling_, 0.0f, &p.rng_});
      }
      at::Tensor q;
      drawn.push_back(DrawOnDeviceAsync(logits, rows, &q));
      row_of.push_back(active);
      std::vector<size_t> next_active;
      std::vector<int64_t> kept_rows;
      inputs.clear();
      for (size_t r = 0; r < active.size(); ++r) {
        const BatchItem& item = *chains[active[r]];
        DraftModelProposer& p = *item.proposer;
        if (!p.sampling_.greedy()) p.device_rows_.push_back(q.select(0, r));
        if (p.Keep(0, i, item.max_k, item.out) < 0) continue;  // 0: the token comes at the end
        ForwardInput in;
        in.cache = &p.cache_;
        in.tokens = {0};
        inputs.push_back(std::move(in));
        next_active.push_back(active[r]);
        kept_rows.push_back(r);
      }
      if (next_active.empty()) break;
      at::Tensor ids = drawn.back();
      if (next_active.size() < active.size()) {
        ids = ids.index_select(
            0, spec::ToDeviceAsync(at::tensor(kept_rows, at::kLong), ids.device()));
      }
      active = std::move(next_active);
      logits = draft->Forward(inputs, {}, nullptr, ids);
      ++untimed;
      for (size_t j : active) {
        weight[j] += 1.0 / active.size();
        ++forwards[j];
      }
    }
    const at::Tensor tokens = at::cat(drawn).to(at::kCPU);  // the one copy back
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const int64_t* t = tokens.data_ptr<int64_t>();
    for (size_t i = 0; i < drawn.size(); ++i) {
      for (const size_t j : row_of[i]) {
        DraftModelProposer& p = *chains[j]->proposer;
        chains[j]->out->tokens[i] = static_cast<int>(*t);
        // Every position but a chain's last was fed after cached_'s first base[j] tokens.
        if (base[j] + i < p.cached_.size()) p.cached_[base[j] + i] = static_cast<int>(*t);
        ++t;
      }
    }
    for (size_t j = 0; j < n; ++j) {
      if (untimed > 0) seconds[j] += dt * weight[j] / untimed;
    }
  } catch (...) {
    // No placeholder stays where a later block would read it as a token, and cached_ claims
    // nothing a failed forward left out of the cache (the next feed truncates the cache to it).
    for (size_t j = 0; j < n; ++j) {
      DraftModelProposer& p = *chains[j]->proposer;
      const size_t in_cache = static_cast<size_t>(p.cache_.length());
      p.cached_.resize(std::min({p.cached_.size(), base[j], in_cache}));
      p.device_rows_.clear();
      chains[j]->out->Clear();
    }
    throw;
  }
  for (size_t j = 0; j < n; ++j) {
    DraftModelProposer& p = *chains[j]->proposer;
    if (!p.device_rows_.empty()) {
      p.device_probs_ = at::stack(p.device_rows_);
      p.device_rows_.clear();
    }
    const int drafted = chains[j]->out->tokens.size();
    p.last_seconds_ =
        forwards[j] > 0 ? seconds[j] * drafted / forwards[j] : (drafted > 0 ? -1.0 : 0.0);
  }
}

void DraftModelProposer::ProposeTree(int max_k, at::Tensor logits, DraftBlock* out,
                                     int* forwards) {
  const int V = draft_->config().vocab_size;
  const int limit = draft_->config().max_model_len;
  const bool greedy = sampling_.greedy();
  const int depth_max = std::min<int>(max_k, branching_.size());
  tree_past_ = cache_.length();
  std::vector<int> frontier = {-1};  // nodes whose children are drawn next (-1: the context)
  std::vector<float> q;
  std::vector<int> children;
  for (int depth = 0; depth < depth_max && !frontier.empty(); ++depth) {
    std::vector<int> level;
    for (size_t f = 0; f < frontier.size(); ++f) {  // logits row f belongs to frontier[f]
      const float* row = logits.data_ptr<float>() + f * V;
      const int fan = branching_[depth];
      if (greedy) {  // the draft's top tokens, lowest ids on ties
        children.resize(V);
        for (int v = 0; v < V; ++v) children[v] = v;
        std::partial_sort(children.begin(), children.begin() + fan, children.end(),
                          [&](int a, int b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
        children.resize(fan);
      } else {
        ProcessedDistribution(row, V, sampling_, &q);
        if (!spec::SampleWithoutReplacement(fan, V, q.data(), &rng_, &children).ok()) {
          children.clear();
        }
        const size_t r = frontier[f] + 1;  // row of the q these children were drawn from
        if (out->probs.size() < (r + 1) * V) out->probs.resize((r + 1) * V, 0.0f);
        std::copy(q.begin(), q.end(), out->probs.begin() + r * V);
      }
      for (int c : children) {
        out->tokens.push_back(c);
        out->parents.push_back(frontier[f]);
        level.push_back(out->tokens.size() - 1);
      }
    }
    frontier = level;
    if (depth + 1 == depth_max || frontier.empty() ||
        tree_past_ + static_cast<int64_t>(out->tokens.size()) >= limit) {
      break;
    }
    // The new level's distributions: one forward of the whole tree so far (tree attention;
    // it replaces the previous level's forward in the cache), whose last rows are the level's.
    cache_.Truncate(tree_past_);
    ForwardInput in{&cache_, std::vector<int64_t>(out->tokens.begin(), out->tokens.end()), true,
                    out->parents};
    const auto t0 = std::chrono::steady_clock::now();
    logits = DraftLogits(*draft_, {std::move(in)})
                 .narrow(0, out->tokens.size() - level.size(), level.size())
                 .contiguous();
    tree_forwards_.push_back(
        {static_cast<int>(out->tokens.size()),
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()});
    ++*forwards;
  }
  if (!greedy) out->probs.resize((out->tokens.size() + 1) * V, 0.0f);
  tree_ = *out;
}

}  // namespace specloop
