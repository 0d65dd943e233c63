// ByteBpe: rank-ordered BPE merges over bytes, the model inside byte-level tokenizers (GPT-2,
// Llama 3, Qwen). A piece starts as one token per byte; the adjacent pair with the lowest-ranked
// merge rule is merged, the leftmost on ties, until no adjacent pair has a rule.
//
// Lookups go through open-addressing tables (one cache miss each, no allocation); pieces of up
// to 64 bytes merge in place on the stack, longer ones through a heap (O(n log n)).
// Immutable after construction; thread-safe for concurrent const calls.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace specloop {

class ByteBpe {
 public:
  struct Rule {
    int left, right, merged;  // token ids
  };

  ByteBpe() = default;
  // `tokens[id]`: the bytes of token `id` ("" where there is none); the first id wins for bytes
  // spelled twice.
  explicit ByteBpe(std::vector<std::string> tokens);
  // Sets the merge rules, highest priority (rank 0) first; the first rule for a pair wins.
  void SetRules(const std::vector<Rule>& rules);

  // The id of the token spelled `bytes`, or -1.
  int Find(std::string_view bytes) const;
  // Appends the ids `piece` merges into. A byte without a token becomes `unk`, or is dropped
  // when `unk` < 0.
  void Encode(std::string_view piece, int unk, std::vector<int>* ids) const;

 private:
  struct Merge {
    uint64_t key = 0;  // left << 32 | right
    int rank = -1;     // -1: empty slot
    int merged = -1;
  };
  // The rule of the pair (left, right), or nullptr.
  const Merge* FindMerge(int left, int right) const;
  void EncodeShort(std::string_view piece, int unk, std::vector<int>* ids) const;
  void EncodeLong(std::string_view piece, int unk, std::vector<int>* ids) const;

  std::vector<std::string> tokens_;
  // Open addressing over tokens_: hash << 32 | id (the hash's high half tags the slot), or
  // kEmpty.
  std::vector<uint64_t> token_slots_;
  std::vector<Merge> merges_;  // open addressing by pair
  int byte_ids_[256];
};

}  // namespace specloop
