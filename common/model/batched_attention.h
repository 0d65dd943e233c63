// BatchedAttention: the attention of LlamaModel's ATen forward for a whole batch at once over
// the paged KV cache (kv_block_pool.h), one set of operators per layer whatever the batch.
//
// Built once per forward on the host from each sequence's block table, cached length, new
// tokens and tree: every index it needs (the cache slots the new keys and values go to, the
// cached slots each sequence reads, the padding of the batch's queries to [sequences, nmax])
// goes into one IndexUpload, moved to the device in one copy, from which Prepare() builds the
// attention mask on the device. Per layer, Layer() then writes the layer's new keys and values
// into the pool with one index_put_, gathers the batch's cached blocks with one indexing op
// into [2, kv_heads, sequences, Pmax, head_dim] (the one copy of the cached keys and values),
// and runs one masked attention for every sequence and head group together, in two parts:
// the scores of the cached keys and of the new keys, joined ([cached | new]: only this
// [.., nmax, Pmax + nmax] tensor is concatenated), one softmax over both, and the output as
// probs_cached x values_cached + probs_new x values_new. No host loop runs per layer.
//
// Keys and values: a sequence attends to its cached positions [0, past) read from the pool, and
// to this forward's new keys and values taken from the layer's activations (the same values the
// pool gets, detached). Under autograd, gradients therefore reach the new keys and values and a
// cached prefix is a constant, as training needs; no in-place update enters the graph.
//
// Masks: query j of a sequence sees every cached position, and new token i when i is j or an
// ancestor of j (a chain: i <= j; a tree: ForwardInput::parents). Padded queries and keys are
// masked so that no row is empty (padded queries see the sequence's first new token), so no
// NaN arises even in rows that are dropped. Masked keys and values are read all the same (whole
// blocks): this relies on the pool's never-written slots being finite (KVBlockPool zeroes a
// block when it first hands it out).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

namespace specloop {

// Host-side int64 arrays collected into one buffer and moved to a device in one copy.
class IndexUpload {
 public:
  // Appends `values` and returns the part's id.
  int Append(const std::vector<int64_t>& values);
  // One copy of everything appended to `device` (a copy on the CPU too: autograd may keep
  // index tensors after the host vectors are gone).
  void Upload(at::Device device);
  // The same copy into `buffer`, a long tensor of exactly the appended size, whose views
  // part() then returns (a CUDA graph's inputs stay where it was captured).
  void UploadInto(const at::Tensor& buffer);
  // A part, on the device. REQUIRES Upload() first.
  at::Tensor part(int id) const { return device_.narrow(0, offsets_[id], sizes_[id]); }
  // Every part, on the device. REQUIRES Upload() first.
  const at::Tensor& uploaded() const { return device_; }

 private:
  std::vector<int64_t> host_, offsets_, sizes_;
  at::Tensor device_;
};

// One sequence's part of the batch.
struct AttentionInput {
  const std::vector<int32_t>* blocks = nullptr;  // the cache's block table
  int64_t row = 0;                   // its first new token's row among the forward's tokens
  int64_t past = 0;                  // positions already cached, read from the pool
  int64_t tokens = 0;                // new tokens, written at slots past, past + 1, ...
  const std::vector<int>* parents = nullptr;  // a tree (ForwardInput::parents), or null/empty
  // The first `written` new tokens go to the sequence's slots; the rest (padding of the
  // shape-static forward) to the scratch block. -1: all of them.
  int64_t written = -1;
};

// The sequences of one pool (block ids index one pool's storage): a forward whose caches lie in
// several pools (private caches) runs one BatchedAttention per pool.
class BatchedAttention {
 public:
  // Host work: the batch's indices, appended to `upload`. `rows`: the forward's new tokens in
  // all (of every pool). Pads the inputs to at least `min_tokens` new tokens and `min_past`
  // cached positions: a forward over several pools passes its largest, so that every sequence
  // is computed with the same shapes, and so the same bits, however its batch is pooled.
  // `scratch`: a block of the pool no cache reads, where tokens past an input's `written` go.
  // REQUIRES: each sequence's blocks cover slots [0, past + written); parents, when non-empty,
  // has `tokens` entries with parents[i] < i (LlamaModel::Flatten checks); the inputs' rows do
  // not overlap.
  BatchedAttention(const std::vector<AttentionInput>& inputs, int64_t rows, int64_t min_tokens,
                   int64_t min_past, int64_t heads, int64_t kv_heads, int64_t head_dim,
                   IndexUpload* upload, int32_t scratch = -1);
  // After upload->Upload(): the mask on the device, in the activations' dtype (`act`).
  void Prepare(const IndexUpload& upload, const at::TensorOptions& act);

  // One layer. q [rows, heads, head_dim], k and v [rows, kv_heads, head_dim]: the forward's new
  // tokens. Writes this pool's inputs' k and v into `storage` ([blocks, layers, 2, kv_heads,
  // kBlockTokens, head_dim]) at layer `layer` and returns softmax(q k^T * scale + mask) v as
  // [tokens, heads * head_dim] for the inputs' tokens in input order, heads in order.
  at::Tensor Layer(const at::Tensor& storage, int64_t layer, const at::Tensor& q,
                   const at::Tensor& k, const at::Tensor& v, double scale) const;

 private:
  int64_t seqs_ = 0, nmax_ = 0, pmax_ = 0, tokens_ = 0;
  int64_t heads_, kv_heads_, head_dim_;
  bool padded_ = false;  // the new-token counts differ, or the inputs are not every row
  // Part ids in the upload.
  int write_block_ = -1, write_offset_ = -1;  // [N]: where each new token's keys go
  int read_block_ = -1;  // [seqs * BlocksFor(pmax)]: the blocks of the cached slots read
  // [seqs * nmax]: the forward's row per padded row; [tokens_]: the padded row of each token;
  // [tokens_]: the forward's row of each token (when padded_).
  int pad_src_ = -1, unpad_ = -1, rows_ = -1;
  int past_ = -1;                             // [seqs]
  int q_pre_ = -1, k_pre_ = -1, k_end_ = -1;  // [seqs * nmax]: tree order, see Prepare()
  // Device tensors (Prepare()).
  at::Tensor write_block_t_, write_offset_t_, read_block_t_, pad_src_t_,
      unpad_t_, rows_t_;
  at::Tensor mask_;  // [1, seqs, 1, nmax, pmax + nmax]: 0 or -inf
};

}  // namespace specloop
