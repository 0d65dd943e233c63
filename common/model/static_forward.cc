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
// the graphs captured over the pool's storage (a bounded pool's storage never moves).
struct LlamaModel::StaticState {
  struct Graph {
    std::unique_ptr<DeviceGraph> graph;
    AtenPlan plan;              // the capture's: its upload is the graph's input buffer
    // The graph's outputs at every padded row: the final norm's (the lm_head runs outside the
    // graph on the rows asked alone) and the layers' hidden states.
    at::Tensor normed, hidden;
  };
  struct Pool {
    std::weak_ptr<KVBlockPool> pool;  // its graphs are dropped once the pool is gone
    int32_t scratch = -1;
    std::map<StaticShape, Graph> graphs;
    ~Pool() {
      graphs.clear();  // before the pool's block goes back
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
                                            const StaticShape& shape, int32_t scratch) const {
  const auto& c = config_;
  AtenPlan p;
  p.f = Flatten(batch);
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
  p.pools = {batch.front().cache->pool()};
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
                                     const std::vector<int>& layers, at::Tensor* hidden) const {
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
  AtenPlan plan = PlanStatic(batch, shape, entry->scratch);  // throws before any change

  at::Tensor normed, states;  // every padded row
  const bool graphs = cuda_graphs_ && device().is_cuda() && DeviceGraph::Supported() &&
                      static_->stats.capture_failures == 0;
  auto it = graphs ? entry->graphs.find(shape) : entry->graphs.end();
  if (it != entry->graphs.end()) {  // this shape's graph: the indices into its buffer, replayed
    StaticState::Graph& g = it->second;
    plan.upload.UploadInto(g.plan.upload.uploaded());
    g.graph->Replay();
    normed = g.normed;
    states = g.hidden;
  } else {
    plan.upload.Upload(device());
    if (graphs && static_cast<int>(entry->graphs.size()) < kStaticGraphs) {
      if (!static_->have_graph_pool) {
        static_->graph_pool = DeviceGraph::NewPool();
        static_->have_graph_pool = true;
      }
      StaticState::Graph g;
      try {
        g.graph = DeviceGraph::Capture(device(), static_->graph_pool,
                                       [&] { g.normed = RunAten(plan, layers, &g.hidden); });
        g.graph->Replay();  // the capture ran nothing: this forward's work
        normed = g.normed;
        states = g.hidden;
        g.plan = plan;
        entry->graphs.emplace(shape, std::move(g));
        ++static_->stats.captures;
      } catch (const c10::Error& e) {  // the forward runs eagerly from now on
        ++static_->stats.capture_failures;
        static_->stats.capture_error = e.what_without_backtrace();
      }
    }
    if (!normed.defined()) normed = RunAten(plan, layers, &states);
  }
  // The returned rows; the parts are those of this forward's indices wherever they lie.
  const FlatBatch& f = plan.f;
  const int64_t real = f.ids.size();
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

}  // namespace specloop
