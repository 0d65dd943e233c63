// LlamaModel's shape-static forward (llama_model.h, Forward()): decode-shaped batches padded to
// powers of two, so that each padded shape runs the same operators on the same buffers every
// time, which a CUDA graph then replays (device_graph.h).
#include <algorithm>
#include <map>
#include <mutex>

#include "common/model/device_graph.h"
#include "common/model/kv_block_pool.h"
#include "common/model/llama_model.h"

namespace specloop {

namespace {

int64_t PowerOfTwoAtLeast(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

}  // namespace

// What the shape-static forward keeps per pool: a scratch block for the padding's writes and
// the padded shapes met or prepared, each with the graph captured over the pool's storage (a
// bounded pool's storage never moves) where graphs are on.
struct LlamaModel::StaticState {
  struct Shape {
    std::unique_ptr<DeviceGraph> graph;  // null: the shape runs eagerly
    at::Tensor inputs;  // the graph's index buffer (the capture's upload)
    // The graph's outputs at every padded row: the final norm's (the lm_head runs outside the
    // graph on the rows asked alone) and the layers' hidden states.
    at::Tensor normed, hidden;
  };
  struct Pool {
    std::weak_ptr<KVBlockPool> pool;  // its graphs are dropped once the pool is gone
    int32_t scratch = -1;
    std::map<StaticShape, Shape> shapes;
    ~Pool() {
      shapes.clear();  // before the pool's block goes back
      if (std::shared_ptr<KVBlockPool> p = pool.lock()) p->Release(scratch);
    }
  };

  // The pool's entry, taking its scratch block first; null when the pool has no free block or
  // kStaticPools other live pools have entries.
  Pool* For(const std::shared_ptr<KVBlockPool>& pool) {
    pools.erase(std::remove_if(pools.begin(), pools.end(),
                               [](const std::unique_ptr<Pool>& e) { return e->pool.expired(); }),
                pools.end());
    for (const std::unique_ptr<Pool>& e : pools) {
      if (e->pool.lock() == pool) return e.get();
    }
    std::vector<int32_t> block;
    if (static_cast<int>(pools.size()) == kStaticPools || !pool->Allocate(1, &block)) {
      return nullptr;
    }
    pools.push_back(std::make_unique<Pool>());
    pools.back()->pool = pool;
    pools.back()->scratch = block[0];
    return pools.back().get();
  }

  // Whether new shapes are captured: on CUDA with LoadOptions::cuda_graphs, until a capture
  // fails.
  bool GraphsOn(const LlamaModel& m) const {
    return m.cuda_graphs_ && m.device().is_cuda() && DeviceGraph::Supported() &&
           stats.capture_failures == 0;
  }

  // Adds `shape` to `entry` from `plan` (uploaded): its graph, captured over the plan, where
  // graphs are on. Runs nothing of the capture (callers replay it or run the plan eagerly).
  // Null once the entry holds kStaticGraphs shapes.
  Shape* Add(const LlamaModel& m, Pool* entry, const StaticShape& shape, AtenPlan& plan,
             const std::vector<int>& layers) {
    if (static_cast<int>(entry->shapes.size()) >= kStaticGraphs) return nullptr;
    Shape added;
    if (GraphsOn(m)) {
      if (!have_graph_pool) {
        graph_pool = DeviceGraph::NewPool();
        have_graph_pool = true;
      }
      try {
        added.graph = DeviceGraph::Capture(m.device(), graph_pool, [&] {
          added.normed = m.RunAten(plan, layers, &added.hidden);
        });
        added.inputs = plan.upload.uploaded();
        ++stats.captures;
      } catch (const c10::Error& e) {  // the model runs eagerly from now on
        added = Shape();
        ++stats.capture_failures;
        stats.capture_error = e.what_without_backtrace();
      }
    }
    ++stats.shapes;
    return &entry->shapes.emplace(shape, std::move(added)).first->second;
  }

  std::mutex mu;  // everything below; held through a forward (replays share buffers)
  std::vector<std::unique_ptr<Pool>> pools;
  bool have_graph_pool = false;
  DeviceGraph::Pool graph_pool;
  StaticStats stats;
};

std::shared_ptr<LlamaModel::StaticState> LlamaModel::NewStaticState() {
  return std::make_shared<StaticState>();
}

LlamaModel::StaticStats LlamaModel::static_stats() const {
  std::lock_guard<std::mutex> lock(static_->mu);
  return static_->stats;
}

LlamaModel::AtenPlan LlamaModel::PlanStatic(const std::vector<ForwardInput>& batch,
                                            const StaticShape& shape, KVBlockPool* pool,
                                            int32_t scratch) const {
  const auto& c = config_;
  AtenPlan p;
  if (!batch.empty()) p.f = Flatten(batch);
  const FlatBatch& f = p.f;
  const int64_t n = shape.tokens, N = p.rows = shape.seqs * n;
  const int64_t real = f.ids.size();
  std::vector<int64_t> ids(N, 0), positions(N, 0), row_of(real);  // row_of: flat -> padded
  for (size_t b = 0; b < batch.size(); ++b) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = b * n + i;
      if (i < f.lengths[b]) {
        row_of[f.starts[b] + i] = r;
        ids[r] = f.ids[f.starts[b] + i];
        positions[r] = f.positions[f.starts[b] + i];
      } else {
        positions[r] = f.past[b];  // padding: any finite position
      }
    }
  }
  p.tokens = p.upload.Append(ids);
  p.positions = p.upload.Append(positions);
  // Padding tokens come after a sequence's own, so none of its tokens sees them: a chain's
  // mask is causal, and a tree's padding are roots of their own.
  std::vector<std::vector<int>> parents(batch.size());
  std::vector<AttentionInput> inputs;
  const std::vector<int32_t> scratch_table = {scratch};
  for (int64_t b = 0; b < shape.seqs; ++b) {
    if (b < static_cast<int64_t>(batch.size())) {
      const ForwardInput& in = batch[b];
      const std::vector<int>* tree = nullptr;
      if (!in.parents.empty()) {
        parents[b] = in.parents;
        parents[b].resize(n, -1);
        tree = &parents[b];
      }
      inputs.push_back({&in.cache->blocks(), b * n, f.past[b], n, tree, f.lengths[b]});
    } else {
      inputs.push_back({&scratch_table, b * n, 0, n, nullptr, 0});
    }
  }
  p.pools = {pool};
  p.attention.emplace_back(inputs, N, n, shape.past, c.num_attention_heads,
                           c.num_key_value_heads, c.head_dim, &p.upload, scratch);
  // The rows of the logits and hidden states returned, padded to N so that the upload's size
  // depends on the shape alone (ForwardStatic reads the first out_rows.size() and real).
  std::vector<int64_t> select(N, 0), select_hidden(N, 0);
  for (size_t i = 0; i < f.out_rows.size(); ++i) select[i] = row_of[f.out_rows[i]];
  std::copy(row_of.begin(), row_of.end(), select_hidden.begin());
  p.select = p.upload.Append(select);
  p.select_hidden = p.upload.Append(select_hidden);
  return p;
}

at::Tensor LlamaModel::ForwardStatic(const std::vector<ForwardInput>& batch,
                                     const std::vector<int>& layers, at::Tensor* hidden,
                                     const at::Tensor& token_ids) const {
  KVCache* first = batch.front().cache;
  if (first == nullptr || first->pool() == nullptr || !first->pool()->bounded() ||
      static_cast<int64_t>(batch.size()) > kStaticSeqs) {
    return {};
  }
  int64_t nmax = 0, pmax = 0;
  for (const ForwardInput& in : batch) {
    if (in.cache == nullptr || in.cache->pool() != first->pool()) return {};
    nmax = std::max<int64_t>(nmax, in.tokens.size());
    pmax = std::max(pmax, in.cache->length());
  }
  if (nmax == 0 || nmax > kStaticTokens) return {};
  StaticShape shape;
  shape.seqs = PowerOfTwoAtLeast(batch.size());
  shape.tokens = PowerOfTwoAtLeast(nmax);
  shape.past = PowerOfTwoAtLeast(std::max(pmax, KVBlockPool::kBlockTokens));
  shape.layers = layers;

  std::lock_guard<std::mutex> lock(static_->mu);
  StaticState::Pool* entry = static_->For(first->pool_);
  if (entry == nullptr) return {};
  AtenPlan plan = PlanStatic(batch, shape, first->pool(), entry->scratch);  // throws first

  // A known shape's graph replays with this forward's indices in its buffer. A new shape is
  // added (its graph captured where graphs are on); a capture runs nothing, so the new graph's
  // first replay is this forward's work.
  auto it = entry->shapes.find(shape);
  StaticState::Shape* known = it != entry->shapes.end() ? &it->second : nullptr;
  auto replays = [&] { return known != nullptr && known->graph && static_->GraphsOn(*this); };
  if (replays()) {
    plan.upload.UploadInto(known->inputs);
  } else {
    plan.upload.Upload(device());
    if (known == nullptr) known = static_->Add(*this, entry, shape, plan, layers);
  }
  const FlatBatch& f = plan.f;
  const int64_t real = f.ids.size();
  if (token_ids.defined()) {  // into the real tokens' rows of the padded ids
    plan.upload.part(plan.tokens)
        .index_copy_(0, plan.upload.part(plan.select_hidden).narrow(0, 0, real), token_ids);
  }
  at::Tensor normed, states;  // every padded row
  if (replays()) {
    known->graph->Replay();
    normed = known->normed;
    states = known->hidden;
  } else {
    normed = RunAten(plan, layers, &states);
  }
  // The returned rows; the parts are those of this forward's indices wherever they lie.
  const at::Tensor rows =
      plan.upload.part(plan.select).narrow(0, 0, static_cast<int64_t>(f.out_rows.size()));
  at::Tensor result = at::linear(normed.index_select(0, rows), lm_head_).to(at::kFloat);
  if (hidden != nullptr) {
    *hidden = states.index_select(0, plan.upload.part(plan.select_hidden).narrow(0, 0, real));
  }
  for (size_t b = 0; b < batch.size(); ++b) batch[b].cache->length_ = f.past[b] + f.lengths[b];
  ++static_->stats.forwards;
  return result;
}

int LlamaModel::PrepareStaticShapes(const std::shared_ptr<KVBlockPool>& pool, int64_t max_seqs,
                                    int64_t max_tokens, int64_t max_past,
                                    const std::vector<int>& layers) const {
  if (pool == nullptr || !pool->bounded() || max_seqs < 1 || max_tokens < 1) return 0;
  for (const int l : layers) {
    TORCH_CHECK(l >= 0 && l < config_.num_hidden_layers, "hidden states of layer ", l,
                " asked of a model of ", config_.num_hidden_layers, " layers");
  }
  std::lock_guard<std::mutex> lock(static_->mu);
  if (!static_shapes_ && !static_->GraphsOn(*this)) return 0;
  StaticState::Pool* entry = static_->For(pool);
  if (entry == nullptr) return 0;
  c10::InferenceMode guard;  // as serving's forwards run
  const int64_t seqs_max = PowerOfTwoAtLeast(std::min(max_seqs, kStaticSeqs));
  const int64_t tokens_max = PowerOfTwoAtLeast(std::min(max_tokens, kStaticTokens));
  // A forward's past is its longest cache before the new tokens, so below the context limit.
  const int64_t past_max = PowerOfTwoAtLeast(std::max<int64_t>(
      std::min<int64_t>(max_past, config_.max_model_len) - 1, KVBlockPool::kBlockTokens));
  StaticShape shape;
  shape.layers = layers;
  for (shape.past = KVBlockPool::kBlockTokens; shape.past <= past_max; shape.past *= 2) {
    for (shape.seqs = 1; shape.seqs <= seqs_max; shape.seqs *= 2) {
      for (shape.tokens = 1; shape.tokens <= tokens_max; shape.tokens *= 2) {
        if (entry->shapes.count(shape) != 0) continue;
        AtenPlan plan = PlanStatic({}, shape, pool.get(), entry->scratch);
        plan.upload.Upload(device());
        StaticState::Shape* added = static_->Add(*this, entry, shape, plan, layers);
        if (added == nullptr || static_->stats.capture_failures > 0) {
          return static_cast<int>(entry->shapes.size());
        }
        if (!added->graph) {  // no graph (forced static shapes): the plan runs all the same
          at::Tensor states;
          RunAten(plan, layers, &states);
        }
      }
    }
  }
  return static_cast<int>(entry->shapes.size());
}

}  // namespace specloop
