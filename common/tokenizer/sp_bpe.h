// SpBpe: the BPE model of sentencepiece-style tokenizer.json files (Llama 2, Mistral 7B, Gemma),
// exactly as tokenizers.js runs it on one pre-tokenized word:
//
// 1. With ignore_merges, a word that is itself a token is that token.
// 2. The word starts as one symbol per character (code point). The adjacent pair with the
//    lowest-ranked merge rule is replaced by the concatenation of its two strings, the leftmost
//    on ties, until no adjacent pair has a rule. Rules act on strings: their parts and results
//    need not be tokens (such strings get symbol numbers beyond the vocabulary). A rule listed
//    twice takes its last rank.
// 3. Each string left that is a token becomes its id. One that is not becomes the "<0xNN>"
//    tokens of its UTF-8 bytes when byte_fallback is on and all of them exist, else the unknown
//    token (nothing when there is none).
// 4. With fuse_unk, each run of unknown tokens in the output of one call becomes one.
//
// A word is first cut between adjacent characters (a, b) that no rule can join (no rule's left
// part ends with a and right part starts with b: in Llama 2's vocabulary, before each "▁" after
// another character); the parts merge independently, which gives the same strings. Parts of up
// to 64 characters merge on the stack, longer ones through a heap, O(n log n).
// Immutable after Build; thread-safe for concurrent const calls.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/status.h"

namespace specloop {

class SpBpe {
 public:
  struct Options {
    bool byte_fallback = false;  // Default: false.
    bool ignore_merges = false;  // Default: false.
    bool fuse_unk = false;       // Default: false.
    int unk_id = -1;             // the unknown token's id; -1: unknown strings are dropped
  };

  // `tokens`: string -> id, later entries overriding earlier ones for the same string (the
  // vocabulary, then the added tokens' contents, as tokenizers.js's tokens_to_ids). `merges`:
  // the rules, rank 0 first. Corruption for an empty rule part or a negative id.
  static Status Build(const std::vector<std::pair<std::string, int>>& tokens,
                      const std::vector<std::pair<std::string, std::string>>& merges,
                      const Options& options, SpBpe* out);

  // The id of the token spelled `s` (vocabulary and added tokens), or -1.
  int Find(std::string_view s) const;

  // Appends the ids of `words` (the pre-tokens of one stretch of text, fuse_unk applying across
  // them). REQUIRES: each word is valid UTF-8.
  void Encode(const std::vector<std::string_view>& words, std::vector<int>* ids) const;

 private:
  struct Rule {
    uint64_t key = ~0ULL;  // left symbol << 32 | right symbol; ~0: empty slot
    int rank = -1;
    int merged = -1;  // the symbol of the concatenation
  };
  // A symbol of a word being merged: its number (-1: a character no rule or token knows) and
  // the bytes of the word it covers.
  struct Piece {
    int symbol;
    uint32_t begin, end;
  };

  // The symbol of `s`, or -1.
  int FindSymbol(std::string_view s) const;
  // The symbol of the character `cp`, or -1.
  int CharSymbol(uint32_t cp) const;
  const Rule* FindRule(int left, int right) const;

  void EncodeWord(std::string_view word, std::vector<int>* ids) const;
  // Whether some rule's left part ends with `a` and its right part starts with `b`.
  bool Joinable(uint32_t a, uint32_t b) const;
  // Merges the `n` pieces at `p` in place; returns how many are left (the final strings, in
  // order, at the front).
  int MergeShort(Piece* p, int n) const;  // REQUIRES: n <= 64
  int MergeLong(Piece* p, int n) const;
  // Appends the ids of one final string of `word`.
  void EmitPiece(std::string_view word, const Piece& p, std::vector<int>* ids) const;

  Options options_;
  std::vector<std::string> symbols_;   // symbol -> its string
  std::vector<int> symbol_token_;      // symbol -> token id, or -1 when the string is no token
  std::vector<uint64_t> symbol_slots_;  // open addressing over symbols_: hash << 32 | symbol
  std::vector<std::pair<uint32_t, int>> char_slots_;  // open addressing: code point, symbol
  int ascii_symbol_[128];
  std::vector<Rule> rules_;            // open addressing by pair
  // Open addressing over (last character of a rule's left part) << 32 | (first of its right).
  std::vector<uint64_t> joinable_;
  int byte_ids_[256];                  // byte -> id of "<0xNN>", or -1
};

}  // namespace specloop
