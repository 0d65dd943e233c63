#include "common/engine/feature_draft_proposer.h"

#include <algorithm>
#include <chrono>

#include <c10/core/InferenceMode.h>

#include "common/base/clock.h"
#include "common/engine/device_draw.h"
#include "common/spec/tensor_upload.h"

namespace specloop {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

FeatureDraftProposer::FeatureDraftProposer(const Eagle3Head* head, const SamplingParams& sampling,
                                           float min_confidence)
    : head_(head),
      sampling_(sampling),
      min_confidence_(min_confidence),
      rng_(sampling.seed ^ 0xea61e3f0d4a7ULL),
      cache_(head->NewCache()) {}

void FeatureDraftProposer::AddFeatures(int64_t first, const at::Tensor& rows) {
  TORCH_CHECK(rows.dim() == 2 && rows.size(1) == head_->feature_width(), "features of shape ",
              rows.sizes(), ", the head reads rows of ", head_->feature_width());
  const int64_t known_end = next_position() + (pending_.defined() ? pending_.size(0) : 0);
  if (first > known_end || first < base_) {  // a gap, or before the head's context: restart
    base_ = first;
    fed_ = 0;
    cache_.length = 0;
    pending_ = rows;
    return;
  }
  if (first < next_position()) {  // replaces positions the head ran: roll its cache back
    fed_ = first - base_;
    cache_.length = fed_;
    pending_ = rows;
    return;
  }
  const int64_t keep = first - next_position();  // pending rows before `first`
  pending_ = keep == 0 || !pending_.defined() ? rows
                                              : at::cat({pending_.narrow(0, 0, keep), rows}, 0);
}

void FeatureDraftProposer::SetHead(const Eagle3Head* head) {
  const bool same_features = head->config().aux_layers == head_->config().aux_layers;
  head_ = head;
  cache_ = head->NewCache();
  base_ = next_position();
  fed_ = 0;
  if (!same_features) pending_ = at::Tensor();
}

int64_t FeatureDraftProposer::CatchUpTokens(const std::vector<int>& context) const {
  // A block runs the positions verified since the last one: at most its tokens and the
  // pending one's.
  const int64_t rows = static_cast<int64_t>(context.size()) - 1 - next_position();
  return rows > last_block_ + 1 ? rows : 0;
}

int FeatureDraftProposer::Draw(const float* row, DraftBlock* out) {
  const int Vd = head_->draft_vocab_size(), V = head_->config().layer.vocab_size;
  int d;
  if (sampling_.greedy()) {
    d = Argmax(row, Vd);
    if (min_confidence_ > 0.0f) {
      Softmax(row, Vd, &scratch_);
      if (scratch_[d] < min_confidence_) return -1;
    }
  } else {
    ProcessedDistribution(row, Vd, sampling_, &scratch_);
    if (min_confidence_ > 0.0f &&
        *std::max_element(scratch_.begin(), scratch_.end()) < min_confidence_) {
      return -1;
    }
    d = SampleFrom(scratch_.data(), Vd, &rng_);
    // q over the target's vocabulary: the draft vocabulary's ids, zero elsewhere.
    const size_t at = out->probs.size();
    out->probs.resize(at + V, 0.0f);
    for (int i = 0; i < Vd; ++i) out->probs[at + head_->ToTarget(i)] = scratch_[i];
  }
  const int token = head_->ToTarget(d);
  out->tokens.push_back(token);
  return token;
}

void FeatureDraftProposer::Propose(const std::vector<int>& context, int max_k, DraftBlock* out) {
  ProposeBatch({{this, &context, max_k, out}});
}

void FeatureDraftProposer::ProposeBatch(const std::vector<BatchItem>& items, bool on_device) {
  c10::InferenceMode guard;
  // The chains that can draft: features up to the position before the pending token.
  std::vector<const BatchItem*> chains;
  std::vector<Eagle3Head::Input> inputs;
  for (const BatchItem& item : items) {
    FeatureDraftProposer& p = *item.proposer;
    item.out->Clear();
    p.device_probs_ = at::Tensor();
    p.device_rows_.clear();
    p.last_seconds_ = 0.0;
    p.last_catch_up_ = CatchUp();
    p.cache_.length = p.fed_;  // the last block's drafts leave the head's cache
    const int64_t last = static_cast<int64_t>(item.context->size()) - 2;  // last verified
    const int64_t rows = last + 1 - p.next_position();
    if (item.max_k <= 0 || rows <= 0 || !p.pending_.defined() || p.pending_.size(0) < rows ||
        p.cache_.length + rows + item.max_k > p.head_->config().layer.max_model_len) {
      p.last_block_ = 0;
      continue;
    }
    Eagle3Head::Input in;
    in.cache = &p.cache_;
    in.hidden = p.pending_.narrow(0, 0, rows);
    for (int64_t t = p.next_position(); t <= last; ++t) in.tokens.push_back((*item.context)[t + 1]);
    inputs.push_back(std::move(in));
    chains.push_back(&item);
  }
  if (chains.empty()) return;
  const Eagle3Head& head = *chains.front()->proposer->head_;
  const int Vd = head.draft_vocab_size(), V = head.config().layer.vocab_size;
  const size_t n = chains.size();
  // The head's logits where drafting reads them: on the host, or where the forward left them.
  auto logits_of = [&](const at::Tensor& logits) {
    return on_device ? logits : logits.to(at::kCPU).contiguous();
  };
  at::Tensor target_ids;  // on the device, where the draft vocabulary is smaller: its target ids
  std::vector<double> seconds(n, 0.0);
  std::vector<int> forwards(n, 0);

  // Where no chain stops early on the device, the drawn tokens stay there, each forward
  // reading the last draw's (Eagle3Head::Forward's token_ids), and one copy at the end brings
  // them back; the forwards are then timed together by that copy's end, each split by its
  // rows (a catch-up waits for its own first forward to be timed apart).
  bool deferred = on_device;
  for (const BatchItem* c : chains) deferred = deferred && c->proposer->min_confidence_ <= 0;
  std::vector<double> weight(n, 0.0);  // deferred: each chain's share of the untimed forwards
  int untimed = 0;
  std::vector<at::Tensor> drawn_at;             // deferred, per position: its rows' target ids
  std::vector<std::vector<size_t>> row_of;      // ... and the chain of each row

  // The first forward: every chain's new positions; its time split by rows.
  std::vector<int64_t> fed(n);
  int64_t total_fed = 0;
  bool catch_up = false;
  for (size_t j = 0; j < n; ++j) {
    total_fed += fed[j] = inputs[j].tokens.size();
    catch_up = catch_up || fed[j] > chains[j]->proposer->last_block_ + 1;
  }
  auto t0 = Clock::now();
  at::Tensor hidden;
  at::Tensor logits = logits_of(head.Forward(inputs, &hidden));
  const bool timed = !deferred || catch_up;
  if (deferred && catch_up) logits.select(0, 0).select(0, 0).item<float>();  // waits for it
  double dt = SecondsSince(t0);
  if (!timed) ++untimed;
  for (size_t j = 0; j < n; ++j) {
    FeatureDraftProposer& p = *chains[j]->proposer;
    p.fed_ += fed[j];
    p.pending_ = p.pending_.size(0) > fed[j]
                     ? p.pending_.narrow(0, fed[j], p.pending_.size(0) - fed[j])
                     : at::Tensor();
    const double share = dt * fed[j] / std::max<int64_t>(1, total_fed);
    if (fed[j] > p.last_block_ + 1) {
      p.last_catch_up_ = {fed[j], share};
    } else {
      if (timed) {
        seconds[j] += share;
      } else {
        weight[j] += 1.0 / n;
      }
      forwards[j] = 1;
    }
  }
  if (deferred && timed) t0 = Clock::now();  // the untimed forwards start here

  // Then one forward per drafted position over the chains still drafting; row r of `logits`
  // and `hidden` belongs to chain active[r].
  std::vector<size_t> active(n);
  for (size_t j = 0; j < n; ++j) active[j] = j;
  try {
    for (int i = 0; !active.empty(); ++i) {
      std::vector<size_t> next_active;
      std::vector<int64_t> kept_rows;
      inputs.clear();
      std::vector<int64_t> drawn;  // on the device: the rows' draft ids
      at::Tensor q;                // ... and their q over the target's vocabulary
      if (on_device) {
        std::vector<DrawRow> rows;
        for (size_t j : active) {
          FeatureDraftProposer& p = *chains[j]->proposer;
          rows.push_back({p.sampling_, p.min_confidence_, &p.rng_});
        }
        at::Tensor draft_ids;
        if (deferred) {
          draft_ids = DrawOnDeviceAsync(logits, rows, &q);
        } else {
          drawn = DrawOnDevice(logits, rows, &q);
        }
        if ((q.defined() || deferred) && Vd < V && !target_ids.defined()) {
          const std::vector<int>& map = head.draft_to_target();
          target_ids = spec::ToDeviceAsync(
              at::tensor(std::vector<int64_t>(map.begin(), map.end())), logits.device());
        }
        if (q.defined() && Vd < V) {  // q over the target's vocabulary, zero elsewhere
          q = at::zeros({q.size(0), V}, q.options()).index_copy_(1, target_ids, q);
        }
        if (deferred) {
          drawn_at.push_back(Vd < V ? target_ids.index_select(0, draft_ids) : draft_ids);
          row_of.push_back(active);
        }
      }
      for (size_t r = 0; r < active.size(); ++r) {
        const BatchItem& item = *chains[active[r]];
        FeatureDraftProposer& p = *item.proposer;
        int token = -1;
        if (!on_device) {
          token = p.Draw(logits.data_ptr<float>() + r * Vd, item.out);
        } else if (deferred || drawn[r] >= 0) {
          token = deferred ? 0 : p.head_->ToTarget(static_cast<int>(drawn[r]));  // 0: comes last
          item.out->tokens.push_back(token);
          if (!p.sampling_.greedy()) p.device_rows_.push_back(q.select(0, r));
        }
        // The last token of a block is never fed: its q is all verification needs.
        if (token < 0 || i + 1 == item.max_k) continue;
        Eagle3Head::Input in;
        in.cache = &p.cache_;
        in.hidden = hidden.narrow(0, r, 1);
        in.tokens = {token};
        inputs.push_back(std::move(in));
        next_active.push_back(active[r]);
        kept_rows.push_back(r);
      }
      at::Tensor ids;  // deferred: the next forward's tokens
      if (deferred && !next_active.empty()) {
        ids = drawn_at.back();
        if (next_active.size() < active.size()) {
          ids = ids.index_select(
              0, spec::ToDeviceAsync(at::tensor(kept_rows, at::kLong), ids.device()));
        }
      }
      active = std::move(next_active);
      if (active.empty()) break;
      if (!deferred) t0 = Clock::now();
      logits = logits_of(head.Forward(inputs, &hidden, ids));
      if (deferred) {
        ++untimed;
        for (size_t j : active) {
          weight[j] += 1.0 / active.size();
          ++forwards[j];
        }
        continue;
      }
      dt = SecondsSince(t0);
      for (size_t j : active) {
        seconds[j] += dt / active.size();
        ++forwards[j];
      }
    }
    if (deferred) {
      const at::Tensor tokens = at::cat(drawn_at).to(at::kCPU);  // the one copy back
      const double wait = SecondsSince(t0);
      const int64_t* t = tokens.data_ptr<int64_t>();
      for (size_t i = 0; i < drawn_at.size(); ++i) {
        for (const size_t j : row_of[i]) chains[j]->out->tokens[i] = static_cast<int>(*t++);
      }
      for (size_t j = 0; j < n; ++j) {
        if (untimed > 0) seconds[j] += wait * weight[j] / untimed;
      }
    }
  } catch (...) {  // no placeholder token reaches a caller
    for (const BatchItem* c : chains) {
      c->out->Clear();
      c->proposer->device_rows_.clear();
    }
    throw;
  }
  for (size_t j = 0; j < n; ++j) {
    FeatureDraftProposer& p = *chains[j]->proposer;
    if (!p.device_rows_.empty()) {
      p.device_probs_ = at::stack(p.device_rows_);
      p.device_rows_.clear();
    }
    const int drafted = chains[j]->out->tokens.size();
    p.last_block_ = drafted;
    p.last_seconds_ = forwards[j] > 0 ? seconds[j] * drafted / forwards[j]
                                      : (drafted > 0 ? -1.0 : 0.0);
  }
}

}  // namespace specloop
