// Training examples: the logged positions of replay-buffer records, as the tensors the losses
// and the acceptance estimates take.
//
// Which rows of a step are used. A SpecStep verified k draft tokens; row j in [0, k] of its
// target distribution predicts the token at index start_pos + j of the sequence the target
// saw, given the context tokens[0, start_pos) + draft_tokens[0, j) (buffer/record.h). For
// j <= num_accepted that context is a prefix of Record::tokens (the first num_accepted drafts
// were accepted, so they are tokens[start_pos, start_pos + j)); for j > num_accepted it holds a
// rejected draft token that Record::tokens does not. So the trainer uses rows
// j = 0 .. num_accepted of each step: one forward over the record's tokens gives the draft's
// logits for all of them (row j is read at input index start_pos + j - 1). The rows past the
// first rejection are dropped: recovering them costs one more forward per step.
//
// Records of one batch may log different K: the batch uses the smallest, and a row logged
// with more entries keeps its first K and moves the mass of the others into its tail.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "buffer/record.h"

namespace specloop {
namespace trainer {

struct PositionBatch {
  // Per record that contributed a position, the tokens to feed (a prefix of its tokens) and
  // the indices of those tokens whose logits its positions read, in position order: a forward
  // of `inputs` with these as ForwardInput::logit_rows returns row n for position n.
  std::vector<std::vector<int64_t>> inputs;
  std::vector<std::vector<int64_t>> logit_rows;
  // For every position n (N in all):
  at::Tensor target_ids;       // [N, K] int64
  at::Tensor target_logprobs;  // [N, K] float32
  at::Tensor target_tail;      // [N] float32
  std::vector<std::string> domains;  // [N]: the record's domain
  std::vector<int32_t> record_index;  // [N]: the record's index in BuildPositionBatch's input
  std::vector<int64_t> predicted;     // [N]: index in Record::tokens of the token predicted
  std::vector<int32_t> draft_index;   // [N]: j, the row's index in its step (start_pos + j)
  int64_t size() const { return static_cast<int64_t>(domains.size()); }
};

// Which positions a batch takes. Serving also logs the target's row at the prompt positions
// its prefill computed (steps with no draft tokens at start_pos < prompt_len): training
// distils on them as on the others (the prompt is text of the request's domain, and the row
// is the target's distribution there); evaluation leaves them out, since acceptance is
// measured on what the target generates.
enum class Positions { kAll, kGenerated };

// Builds the positions of `records` (rows chosen as above). Rows with an id outside
// [0, vocab), a repeated id, a NaN log-prob or no target mass are skipped, as are positions at
// or beyond max_positions (the draft's context limit). An empty batch (size() == 0) is valid.
void BuildPositionBatch(const std::vector<const Record*>& records, int vocab, int max_positions,
                        Positions which, PositionBatch* out);

// Input tokens of one forward pass of training or evaluation, at most (a longer record goes
// alone). The pass holds a few logits-sized tensors (and their gradients when training), each
// tokens * vocab * 4 bytes (16 KiB per token at vocab 4096): a batch of long records used to
// make a step's transient memory several hundred MiB, and the heap's high-water mark (glibc
// returns little of it) followed the longest batch seen so far. This bounds it per pass.
inline constexpr size_t kMaxForwardTokens = 512;

// Splits `records`, in order, into groups of at most max_records records (0: no limit) and at
// most max_tokens Record::tokens in all; a record longer than max_tokens forms a group alone.
// Every record lands in exactly one group; no group is empty.
std::vector<std::vector<const Record*>> SplitForForward(const std::vector<const Record*>& records,
                                                        size_t max_records, size_t max_tokens);

// Deterministic hold-out (heldout_split.h): true for about `fraction` of records, chosen by a
// hash of the prompt ids (of the request id, or of time, worker and domain, for a record
// without a prompt), so all records of one prompt are on one side, in every run and trainer.
bool IsHeldOut(const Record& record, double fraction);

}  // namespace trainer
}  // namespace specloop
