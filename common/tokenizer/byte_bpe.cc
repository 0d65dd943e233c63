#include "common/tokenizer/byte_bpe.h"

#include <algorithm>
#include <climits>
#include <functional>
#include <queue>

#include "common/tokenizer/bpe_tables.h"

namespace specloop {

using bpe::kEmpty;
using bpe::MixBits;
using bpe::PairKey;
using bpe::TableSize;

ByteBpe::ByteBpe(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  token_slots_.assign(TableSize(tokens_.size()), kEmpty);
  const size_t mask = token_slots_.size() - 1;
  for (int id = 0; id < static_cast<int>(tokens_.size()); ++id) {
    const std::string& t = tokens_[id];
    if (t.empty() || Find(t) >= 0) continue;
    const uint64_t h = std::hash<std::string_view>()(t);
    size_t slot = h & mask;
    while (token_slots_[slot] != kEmpty) slot = (slot + 1) & mask;
    token_slots_[slot] = (h & 0xFFFFFFFF00000000ULL) | static_cast<uint32_t>(id);
    if (t.size() == 1) byte_ids_[static_cast<unsigned char>(t[0])] = id;
  }
}

int ByteBpe::Find(std::string_view bytes) const {
  if (token_slots_.empty()) return -1;
  const uint64_t h = std::hash<std::string_view>()(bytes);
  const size_t mask = token_slots_.size() - 1;
  for (size_t slot = h & mask;; slot = (slot + 1) & mask) {
    const uint64_t entry = token_slots_[slot];
    if (entry == kEmpty) return -1;
    const int id = static_cast<int>(entry & 0xFFFFFFFF);
    if ((entry >> 32) == (h >> 32) && tokens_[id] == bytes) return id;
  }
}

void ByteBpe::SetRules(const std::vector<Rule>& rules) {
  merges_.assign(TableSize(rules.size()), Merge());
  const size_t mask = merges_.size() - 1;
  for (size_t rank = 0; rank < rules.size(); ++rank) {
    if (rules[rank].left < 0 || rules[rank].right < 0 || rules[rank].merged < 0) continue;
    const uint64_t key = PairKey(rules[rank].left, rules[rank].right);
    size_t slot = MixBits(key) & mask;
    while (merges_[slot].rank >= 0 && merges_[slot].key != key) slot = (slot + 1) & mask;
    if (merges_[slot].rank >= 0) continue;  // a higher-priority rule has the pair
    merges_[slot] = {key, static_cast<int>(rank), rules[rank].merged};
  }
}

const ByteBpe::Merge* ByteBpe::FindMerge(int left, int right) const {
  if (left < 0 || right < 0 || merges_.empty()) return nullptr;
  const uint64_t key = PairKey(left, right);
  const size_t mask = merges_.size() - 1;
  for (size_t slot = MixBits(key) & mask;; slot = (slot + 1) & mask) {
    const Merge& m = merges_[slot];
    if (m.rank < 0) return nullptr;
    if (m.key == key) return &m;
  }
}

void ByteBpe::Encode(std::string_view piece, int unk, std::vector<int>* ids) const {
  if (piece.size() <= 64) {
    EncodeShort(piece, unk, ids);
  } else {
    EncodeLong(piece, unk, ids);
  }
}

void ByteBpe::EncodeShort(std::string_view piece, int unk, std::vector<int>* ids) const {
  // Symbols and the rank of the merge with their right neighbour, compacted after each merge.
  int sym[64], rank[64], merged[64];
  int n = static_cast<int>(piece.size());
  for (int i = 0; i < n; ++i) sym[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
  auto score = [&](int i) {
    const Merge* m = i + 1 < n ? FindMerge(sym[i], sym[i + 1]) : nullptr;
    rank[i] = m ? m->rank : INT_MAX;
    merged[i] = m ? m->merged : -1;
  };
  for (int i = 0; i < n; ++i) score(i);
  while (true) {
    int best = -1;
    for (int i = 0; i + 1 < n; ++i) {
      if (rank[i] != INT_MAX && (best < 0 || rank[i] < rank[best])) best = i;  // leftmost min
    }
    if (best < 0) break;
    sym[best] = merged[best];
    for (int i = best + 1; i + 1 < n; ++i) {
      sym[i] = sym[i + 1];
      rank[i] = rank[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) score(best - 1);
    score(best);
  }
  for (int i = 0; i < n; ++i) {
    if (sym[i] >= 0 || unk >= 0) ids->push_back(sym[i] >= 0 ? sym[i] : unk);
  }
}

void ByteBpe::EncodeLong(std::string_view piece, int unk, std::vector<int>* ids) const {
  // Symbols linked in a list; a min-heap of candidate merges by (rank, position), checked
  // against the current symbols when popped (entries go stale as neighbours merge).
  struct Symbol {
    int id, prev, next;
  };
  struct Candidate {
    int rank, pos, left, right, merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const int n = static_cast<int>(piece.size());
  std::vector<Symbol> symbols(n);
  for (int i = 0; i < n; ++i) {
    symbols[i] = {byte_ids_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push_pair = [&](int pos) {
    const int next = symbols[pos].next;
    if (next < 0) return;
    if (const Merge* m = FindMerge(symbols[pos].id, symbols[next].id)) {
      heap.push({m->rank, pos, symbols[pos].id, symbols[next].id, m->merged});
    }
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& s = symbols[c.pos];
    if (s.id != c.left || s.next < 0 || symbols[s.next].id != c.right) continue;  // stale
    symbols[s.next].id = -2;  // merged away
    s.id = c.merged;
    s.next = symbols[s.next].next;
    if (s.next >= 0) symbols[s.next].prev = c.pos;
    if (s.prev >= 0) push_pair(s.prev);
    push_pair(c.pos);
  }
  for (int i = 0; i >= 0; i = symbols[i].next) {
    if (symbols[i].id >= 0 || unk >= 0) ids->push_back(symbols[i].id >= 0 ? symbols[i].id : unk);
  }
}

}  // namespace specloop
