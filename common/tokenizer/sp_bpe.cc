#include "common/tokenizer/sp_bpe.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <functional>
#include <queue>
#include <unordered_map>

#include "common/tokenizer/bpe_tables.h"

namespace specloop {

namespace {

using bpe::kEmpty;
using bpe::MixBits;
using bpe::PairKey;
using bpe::TableSize;

// The code point starting at s[*i] (valid UTF-8), advancing *i past it.
uint32_t NextCodePoint(std::string_view s, size_t* i) {
  const unsigned char c = s[*i];
  if (c < 0x80) {
    ++*i;
    return c;
  }
  const int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  uint32_t cp = c & (0x3F >> (len - 1));
  for (int k = 1; k < len && *i + k < s.size(); ++k) {
    cp = (cp << 6) | (static_cast<unsigned char>(s[*i + k]) & 0x3F);
  }
  *i += len;
  return cp;
}

// The code point of `s` when it is exactly one character, else -1.
int64_t SingleCodePoint(std::string_view s) {
  if (s.empty()) return -1;
  size_t i = 0;
  const uint32_t cp = NextCodePoint(s, &i);
  return i == s.size() ? static_cast<int64_t>(cp) : -1;
}

}  // namespace

Status SpBpe::Build(const std::vector<std::pair<std::string, int>>& tokens,
                    const std::vector<std::pair<std::string, std::string>>& merges,
                    const Options& options, SpBpe* out) {
  SpBpe& b = *out;
  b = SpBpe();
  b.options_ = options;
  std::unordered_map<std::string, int> index;  // string -> symbol, while building
  index.reserve(tokens.size() + merges.size());
  auto add = [&](const std::string& s) {
    const auto [it, inserted] = index.emplace(s, static_cast<int>(b.symbols_.size()));
    if (inserted) {
      b.symbols_.push_back(s);
      b.symbol_token_.push_back(-1);
    }
    return it->second;
  };
  for (const auto& [s, id] : tokens) {
    if (id < 0) return Status::Corruption("negative id for " + s);
    b.symbol_token_[add(s)] = id;
  }
  struct Triple {
    int left, right, merged;
  };
  std::vector<Triple> rules;
  rules.reserve(merges.size());
  for (const auto& [left, right] : merges) {
    if (left.empty() || right.empty()) {
      return Status::Corruption("merge rule with an empty part: \"" + left + "\" \"" + right + "\"");
    }
    const int l = add(left), r = add(right);
    rules.push_back({l, r, add(left + right)});
  }

  // Lookup tables.
  b.symbol_slots_.assign(TableSize(b.symbols_.size()), kEmpty);
  const size_t mask = b.symbol_slots_.size() - 1;
  std::fill(std::begin(b.ascii_symbol_), std::end(b.ascii_symbol_), -1);
  size_t chars = 0;
  for (const std::string& s : b.symbols_) chars += SingleCodePoint(s) >= 0;
  b.char_slots_.assign(TableSize(chars), {0, -1});
  const size_t char_mask = b.char_slots_.size() - 1;
  for (int sym = 0; sym < static_cast<int>(b.symbols_.size()); ++sym) {
    const std::string& s = b.symbols_[sym];
    const uint64_t h = std::hash<std::string_view>()(s);
    size_t slot = h & mask;
    while (b.symbol_slots_[slot] != kEmpty) slot = (slot + 1) & mask;
    b.symbol_slots_[slot] = (h & 0xFFFFFFFF00000000ULL) | static_cast<uint32_t>(sym);
    const int64_t cp = SingleCodePoint(s);
    if (cp < 0) continue;
    if (cp < 128) b.ascii_symbol_[cp] = sym;
    size_t c = MixBits(static_cast<uint64_t>(cp)) & char_mask;
    while (b.char_slots_[c].second >= 0) c = (c + 1) & char_mask;
    b.char_slots_[c] = {static_cast<uint32_t>(cp), sym};
  }
  b.rules_.assign(TableSize(rules.size()), Rule());
  const size_t rule_mask = b.rules_.size() - 1;
  for (size_t rank = 0; rank < rules.size(); ++rank) {
    const uint64_t key = PairKey(rules[rank].left, rules[rank].right);
    size_t slot = MixBits(key) & rule_mask;
    while (b.rules_[slot].rank >= 0 && b.rules_[slot].key != key) slot = (slot + 1) & rule_mask;
    // A pair listed again takes the later rank (tokenizers.js builds a Map of the rules).
    b.rules_[slot] = {key, static_cast<int>(rank), rules[rank].merged};
  }
  std::vector<uint64_t> joins;
  joins.reserve(rules.size());
  for (const auto& [left, right] : merges) {
    size_t end = left.size();
    while (end > 0 && (static_cast<unsigned char>(left[end - 1]) & 0xC0) == 0x80) --end;
    size_t i = end - 1, j = 0;
    const uint64_t a = NextCodePoint(left, &i), c = NextCodePoint(right, &j);
    joins.push_back(a << 32 | c);
  }
  b.joinable_.assign(TableSize(joins.size()), kEmpty);
  const size_t join_mask = b.joinable_.size() - 1;
  for (uint64_t key : joins) {
    size_t slot = MixBits(key) & join_mask;
    while (b.joinable_[slot] != kEmpty && b.joinable_[slot] != key) slot = (slot + 1) & join_mask;
    b.joinable_[slot] = key;
  }
  for (int byte = 0; byte < 256; ++byte) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", byte);
    b.byte_ids_[byte] = b.Find(name);
  }
  return Status::OK();
}

int SpBpe::FindSymbol(std::string_view s) const {
  if (symbol_slots_.empty()) return -1;
  const uint64_t h = std::hash<std::string_view>()(s);
  const size_t mask = symbol_slots_.size() - 1;
  for (size_t slot = h & mask;; slot = (slot + 1) & mask) {
    const uint64_t entry = symbol_slots_[slot];
    if (entry == kEmpty) return -1;
    const int sym = static_cast<int>(entry & 0xFFFFFFFF);
    if ((entry >> 32) == (h >> 32) && symbols_[sym] == s) return sym;
  }
}

int SpBpe::Find(std::string_view s) const {
  const int sym = FindSymbol(s);
  return sym >= 0 ? symbol_token_[sym] : -1;
}

int SpBpe::CharSymbol(uint32_t cp) const {
  if (cp < 128) return ascii_symbol_[cp];
  if (char_slots_.empty()) return -1;
  const size_t mask = char_slots_.size() - 1;
  for (size_t slot = MixBits(cp) & mask;; slot = (slot + 1) & mask) {
    const auto& [key, sym] = char_slots_[slot];
    if (sym < 0) return -1;
    if (key == cp) return sym;
  }
}

const SpBpe::Rule* SpBpe::FindRule(int left, int right) const {
  if (left < 0 || right < 0 || rules_.empty()) return nullptr;
  const uint64_t key = PairKey(left, right);
  const size_t mask = rules_.size() - 1;
  for (size_t slot = MixBits(key) & mask;; slot = (slot + 1) & mask) {
    const Rule& r = rules_[slot];
    if (r.rank < 0) return nullptr;
    if (r.key == key) return &r;
  }
}

void SpBpe::Encode(const std::vector<std::string_view>& words, std::vector<int>* ids) const {
  const size_t start = ids->size();
  for (std::string_view w : words) EncodeWord(w, ids);
  if (!options_.fuse_unk || options_.unk_id < 0) return;
  const int unk = options_.unk_id;
  auto last = std::unique(ids->begin() + start, ids->end(),
                          [unk](int a, int b) { return a == unk && b == unk; });
  ids->erase(last, ids->end());
}

bool SpBpe::Joinable(uint32_t a, uint32_t b) const {
  if (joinable_.empty()) return false;
  const uint64_t key = static_cast<uint64_t>(a) << 32 | b;
  const size_t mask = joinable_.size() - 1;
  for (size_t slot = MixBits(key) & mask;; slot = (slot + 1) & mask) {
    if (joinable_[slot] == kEmpty) return false;
    if (joinable_[slot] == key) return true;
  }
}

void SpBpe::EncodeWord(std::string_view word, std::vector<int>* ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    const int id = Find(word);
    if (id >= 0) {
      ids->push_back(id);
      return;
    }
  }
  std::vector<Piece> pieces;
  pieces.reserve(word.size());
  uint32_t prev_cp = 0;
  size_t part = 0;  // pieces[part, ...) is the part being collected
  auto finish_part = [&](size_t end) {
    const int n = static_cast<int>(end - part);
    const int left = n > 64 ? MergeLong(&pieces[part], n) : MergeShort(&pieces[part], n);
    for (int k = 0; k < left; ++k) EmitPiece(word, pieces[part + k], ids);
    part = end;
  };
  for (size_t i = 0; i < word.size();) {
    const uint32_t begin = static_cast<uint32_t>(i);
    const uint32_t cp = NextCodePoint(word, &i);
    if (!pieces.empty() && !Joinable(prev_cp, cp)) finish_part(pieces.size());
    pieces.push_back({CharSymbol(cp), begin, static_cast<uint32_t>(std::min(i, word.size()))});
    prev_cp = cp;
  }
  finish_part(pieces.size());
}

int SpBpe::MergeShort(Piece* p, int n) const {
  // The rank and result of the rule for each piece and its right neighbour, compacted after
  // each merge.
  int rank[64], merged[64];
  auto score = [&](int i) {
    const Rule* r = i + 1 < n ? FindRule(p[i].symbol, p[i + 1].symbol) : nullptr;
    rank[i] = r ? r->rank : INT_MAX;
    merged[i] = r ? r->merged : -1;
  };
  for (int i = 0; i < n; ++i) score(i);
  while (true) {
    int best = -1;
    for (int i = 0; i + 1 < n; ++i) {
      if (rank[i] != INT_MAX && (best < 0 || rank[i] < rank[best])) best = i;  // leftmost min
    }
    if (best < 0) break;
    p[best] = {merged[best], p[best].begin, p[best + 1].end};
    for (int i = best + 1; i + 1 < n; ++i) {
      p[i] = p[i + 1];
      rank[i] = rank[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) score(best - 1);
    score(best);
  }
  return n;
}

int SpBpe::MergeLong(Piece* p, int n) const {
  // Pieces linked in a list; a min-heap of candidate merges by (rank, position), checked against
  // the current pieces when popped (entries go stale as neighbours merge; a piece's symbol only
  // changes by merging with its right neighbour, so unchanged symbols mean a live entry).
  struct Candidate {
    int rank, pos, left, right, merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<int> next(n), prev(n);
  for (int i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  std::vector<Candidate> storage;
  storage.reserve(n);
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap(
      std::greater<Candidate>(), std::move(storage));
  auto push_pair = [&](int pos) {
    const int nx = next[pos];
    if (nx < 0) return;
    if (const Rule* r = FindRule(p[pos].symbol, p[nx].symbol)) {
      heap.push({r->rank, pos, p[pos].symbol, p[nx].symbol, r->merged});
    }
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int nx = next[c.pos];
    if (p[c.pos].symbol != c.left || nx < 0 || p[nx].symbol != c.right) continue;  // stale
    p[c.pos] = {c.merged, p[c.pos].begin, p[nx].end};
    p[nx].symbol = -2;  // merged away
    next[c.pos] = next[nx];
    if (next[c.pos] >= 0) prev[next[c.pos]] = c.pos;
    if (prev[c.pos] >= 0) push_pair(prev[c.pos]);
    push_pair(c.pos);
  }
  int kept = 0;
  for (int i = 0; i >= 0; i = next[i]) p[kept++] = p[i];
  return kept;
}

void SpBpe::EmitPiece(std::string_view word, const Piece& p, std::vector<int>* ids) const {
  if (p.symbol >= 0 && symbol_token_[p.symbol] >= 0) {
    ids->push_back(symbol_token_[p.symbol]);
    return;
  }
  if (options_.byte_fallback) {
    bool all = true;
    for (uint32_t i = p.begin; i < p.end && all; ++i) {
      all = byte_ids_[static_cast<unsigned char>(word[i])] >= 0;
    }
    if (all) {
      for (uint32_t i = p.begin; i < p.end; ++i) {
        ids->push_back(byte_ids_[static_cast<unsigned char>(word[i])]);
      }
      return;
    }
  }
  if (options_.unk_id >= 0) ids->push_back(options_.unk_id);
}

}  // namespace specloop
