#include "common/model/batched_attention.h"

#include <algorithm>
#include <limits>

#include "common/model/kv_block_pool.h"
#include "common/spec/tensor_upload.h"

namespace specloop {

int IndexUpload::Append(const std::vector<int64_t>& values) {
  offsets_.push_back(static_cast<int64_t>(host_.size()));
  sizes_.push_back(static_cast<int64_t>(values.size()));
  host_.insert(host_.end(), values.begin(), values.end());
  return static_cast<int>(offsets_.size()) - 1;
}

void IndexUpload::Upload(at::Device device) {
  device_ = spec::ToDeviceAsync(at::from_blob(host_.data(), {static_cast<int64_t>(host_.size())},
                                              at::TensorOptions().dtype(at::kLong)),
                                device);
}

void IndexUpload::UploadInto(const at::Tensor& buffer) {
  TORCH_CHECK(buffer.dim() == 1 && buffer.numel() == static_cast<int64_t>(host_.size()) &&
                  buffer.scalar_type() == at::kLong,
              "an index buffer of ", buffer.numel(), " entries for ", host_.size());
  spec::CopyToDeviceAsync(buffer, at::from_blob(host_.data(), {static_cast<int64_t>(host_.size())},
                                                at::TensorOptions().dtype(at::kLong)));
  device_ = buffer;
}

namespace {

c10::List<c10::optional<at::Tensor>> Indices(const at::Tensor& a, const at::Tensor& b) {
  c10::List<c10::optional<at::Tensor>> list;
  list.push_back(a);
  list.push_back(b);
  return list;
}

// Pre-order numbers and subtree ends of a forest of `n` tokens given by parents (parents[i] <
// i, -1 for a root): token a is an ancestor of b, or b itself, iff pre[a] <= pre[b] < end[a].
// A chain (parents empty) is the forest 0 -> 1 -> ... -> n - 1.
void TreeOrder(const std::vector<int>* parents, int64_t n, int64_t* pre, int64_t* end) {
  if (parents == nullptr || parents->empty()) {
    for (int64_t i = 0; i < n; ++i) {
      pre[i] = i;
      end[i] = n;
    }
    return;
  }
  std::vector<int64_t> size(n, 1), next(n);
  for (int64_t i = n - 1; i > 0; --i) {
    if ((*parents)[i] >= 0) size[(*parents)[i]] += size[i];
  }
  int64_t next_root = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int p = (*parents)[i];
    int64_t& from = p < 0 ? next_root : next[p];
    pre[i] = from;
    from += size[i];
    next[i] = pre[i] + 1;
    end[i] = pre[i] + size[i];
  }
}

}  // namespace

BatchedAttention::BatchedAttention(const std::vector<AttentionInput>& inputs, int64_t rows,
                                   int64_t min_tokens, int64_t min_past, int64_t heads,
                                   int64_t kv_heads, int64_t head_dim, IndexUpload* upload,
                                   int32_t scratch)
    : nmax_(min_tokens), pmax_(min_past), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim) {
  constexpr int64_t B = KVBlockPool::kBlockTokens;
  seqs_ = static_cast<int64_t>(inputs.size());
  for (const AttentionInput& in : inputs) {
    nmax_ = std::max(nmax_, in.tokens);
    pmax_ = std::max(pmax_, in.past);
    tokens_ += in.tokens;
  }
  int64_t next_row = 0;  // the inputs are the forward's rows in order: no gathering needed
  for (const AttentionInput& in : inputs) {
    padded_ = padded_ || in.tokens != nmax_ || in.row != next_row;
    next_row += in.tokens;
  }
  padded_ = padded_ || next_row != rows;

  std::vector<int64_t> block, offset;  // where the new keys and values go
  block.reserve(tokens_);
  offset.reserve(tokens_);
  for (const AttentionInput& in : inputs) {
    const int64_t written = in.written < 0 ? in.tokens : in.written;
    TORCH_CHECK(written == in.tokens || scratch >= 0, "padding tokens without a scratch block");
    for (int64_t i = 0; i < in.tokens; ++i) {
      const int64_t slot = in.past + i;
      block.push_back(i < written ? (*in.blocks)[slot / B] : scratch);
      offset.push_back(i < written ? slot % B : i % B);
    }
  }
  write_block_ = upload->Append(block);
  write_offset_ = upload->Append(offset);

  if (pmax_ > 0) {  // the blocks of cached slots each sequence reads; padding reads its first
    const int64_t nb = KVBlockPool::BlocksFor(pmax_);
    block.assign(seqs_ * nb, 0);
    for (int64_t s = 0; s < seqs_; ++s) {
      const AttentionInput& in = inputs[s];
      const int64_t own = KVBlockPool::BlocksFor(in.past);  // blocks holding its cached slots
      for (int64_t i = 0; i < nb; ++i) block[s * nb + i] = (*in.blocks)[i < own ? i : 0];
    }
    read_block_ = upload->Append(block);
  }

  std::vector<int64_t> past(seqs_), q_pre(seqs_ * nmax_, 0), k_pre(seqs_ * nmax_, nmax_ + 1),
      k_end(seqs_ * nmax_, nmax_ + 1);  // padding: queries see pre 0, keys are never seen
  std::vector<int64_t> pad_src, unpad, token_rows;
  for (int64_t s = 0; s < seqs_; ++s) {
    const AttentionInput& in = inputs[s];
    past[s] = in.past;
    TreeOrder(in.parents, in.tokens, &k_pre[s * nmax_], &k_end[s * nmax_]);
    std::copy_n(&k_pre[s * nmax_], in.tokens, &q_pre[s * nmax_]);
    if (padded_) {
      for (int64_t j = 0; j < nmax_; ++j) pad_src.push_back(in.row + std::min(j, in.tokens - 1));
      for (int64_t j = 0; j < in.tokens; ++j) {
        unpad.push_back(s * nmax_ + j);
        token_rows.push_back(in.row + j);
      }
    }
  }
  past_ = upload->Append(past);
  q_pre_ = upload->Append(q_pre);
  k_pre_ = upload->Append(k_pre);
  k_end_ = upload->Append(k_end);
  if (padded_) {
    pad_src_ = upload->Append(pad_src);
    unpad_ = upload->Append(unpad);
    rows_ = upload->Append(token_rows);
  }
}

void BatchedAttention::Prepare(const IndexUpload& upload, const at::TensorOptions& act) {
  write_block_t_ = upload.part(write_block_);
  write_offset_t_ = upload.part(write_offset_);
  if (padded_) {
    pad_src_t_ = upload.part(pad_src_);
    unpad_t_ = upload.part(unpad_);
    rows_t_ = upload.part(rows_);
  }
  // New token j sees new token i iff i is j or an ancestor of j (TreeOrder).
  const at::Tensor q_pre = upload.part(q_pre_).view({seqs_, nmax_, 1});
  const at::Tensor k_pre = upload.part(k_pre_).view({seqs_, 1, nmax_});
  const at::Tensor k_end = upload.part(k_end_).view({seqs_, 1, nmax_});
  at::Tensor seen = k_pre.le(q_pre).logical_and_(q_pre.lt(k_end));  // [seqs, nmax, nmax]
  if (pmax_ > 0) {
    read_block_t_ = upload.part(read_block_);
    const at::Tensor past = upload.part(past_).view({seqs_, 1, 1});
    const at::Tensor cached = at::arange(pmax_, past.options()).view({1, 1, pmax_}).lt(past);
    seen = at::cat({cached.expand({seqs_, nmax_, pmax_}), seen}, 2);
  }
  mask_ = at::zeros(seen.sizes(), act)
              .masked_fill_(seen.logical_not(), -std::numeric_limits<float>::infinity())
              .view({1, seqs_, 1, nmax_, pmax_ + nmax_});
}

at::Tensor BatchedAttention::Layer(const at::Tensor& storage, int64_t layer, const at::Tensor& q,
                                   const at::Tensor& k, const at::Tensor& v, double scale) const {
  const int64_t S = seqs_, n = nmax_, H = heads_, KVH = kv_heads_, D = head_dim_;
  const int64_t G = H / KVH, P = pmax_, T = pmax_ + n;
  // The layer's slots, [blocks, kBlockTokens, 2, KVH, D] (a view of the pool).
  const at::Tensor slots = storage.select(1, layer).permute({0, 3, 1, 2, 4});
  const at::Tensor kv = at::stack({k, v}, 1).detach();  // [rows, 2, KVH, D]
  slots.index_put_(Indices(write_block_t_, write_offset_t_),
                   padded_ ? kv.index_select(0, rows_t_) : kv);

  // The new tokens padded to [S, n, ...] (each sequence's rows repeat its last to fill), batched
  // (kv head, sequence): the order in which the cached keys and values are gathered below.
  const at::Tensor qn = padded_ ? q.index_select(0, pad_src_t_) : q;
  const at::Tensor kn = padded_ ? k.index_select(0, pad_src_t_) : k;
  const at::Tensor vn = padded_ ? v.index_select(0, pad_src_t_) : v;
  // Queries grouped by their key/value head: [KVH, S, G * n, D], rows ordered (group, token).
  const at::Tensor qg =
      qn.reshape({S, n, KVH, G, D}).permute({2, 0, 3, 1, 4}).reshape({KVH, S, G * n, D});
  const at::Tensor keys = kn.view({S, n, KVH, D}).permute({2, 0, 3, 1});    // [KVH, S, D, n]
  const at::Tensor values = vn.view({S, n, KVH, D}).permute({2, 0, 1, 3});  // [KVH, S, n, D]
  at::Tensor scores = at::matmul(qg, keys);  // [KVH, S, G * n, n]
  at::Tensor cached;  // [2, KVH, S, P, D]: keys and values of the cached slots (constants)
  if (P > 0) {
    // One copy of the cached blocks, straight into the layout the matmuls read: the pool's
    // layer as [2, KVH, blocks, kBlockTokens, D] indexed on its block dimension. Slots past a
    // sequence's length are masked out; they hold finite values (the pool zeroes new blocks).
    const int64_t nb = KVBlockPool::BlocksFor(P), B = KVBlockPool::kBlockTokens;
    c10::List<c10::optional<at::Tensor>> blocks;
    blocks.push_back(c10::nullopt);
    blocks.push_back(c10::nullopt);
    blocks.push_back(read_block_t_);
    cached = at::index(storage.select(1, layer).permute({1, 2, 0, 3, 4}), blocks)
                 .view({2, KVH, S, nb * B, D})
                 .narrow(3, 0, P);
    // Only the scores are joined, [cached | new]: keys and values are never concatenated.
    scores = at::cat({at::matmul(qg, cached[0].transpose(2, 3)), scores}, 3);  // [.., G n, T]
  }
  scores.mul_(scale);
  scores.view({KVH, S, G, n, T}).add_(mask_);
  const at::Tensor probs = at::softmax(scores, -1);
  at::Tensor o = at::matmul(probs.narrow(3, P, n), values);  // [KVH, S, G * n, D]
  if (P > 0) o = o + at::matmul(probs.narrow(3, 0, P), cached[1]);
  o = o.view({KVH, S, G, n, D}).permute({1, 3, 0, 2, 4}).reshape({S * n, H * D});
  return padded_ ? o.index_select(0, unpad_t_) : o;
}

}  // namespace specloop
