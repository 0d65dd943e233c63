#include "common/spec/suffix_proposer.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <utility>

namespace specloop {

double SuffixIndex::Speculation::expected_accepted() const {
  double sum = 0.0;
  for (double p : probs) sum += p;
  return sum;
}

SuffixIndex::SuffixIndex(const Options& options) : options_(options) {
  options_.max_depth = std::max(1, options_.max_depth);
  // Positions and counts are 32-bit.
  options_.max_tokens = std::clamp<int64_t>(options_.max_tokens, 1,
                                            std::numeric_limits<int32_t>::max());
  nodes_.emplace_back();  // the root: len 0, counts every suffix
}

int SuffixIndex::Label(int node, int j) const {
  const Node& n = nodes_[node];
  return seqs_[static_cast<size_t>(n.seq - first_id_)][n.end - n.len + 1 + j];
}

int SuffixIndex::FindChild(int node, int token) const {
  const auto& ch = nodes_[node].children;
  auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(token, INT32_MIN));
  return it != ch.end() && it->first == token ? it->second : -1;
}

void SuffixIndex::SetChild(int node, int token, int child) {
  auto& ch = nodes_[node].children;
  auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(token, INT32_MIN));
  if (it != ch.end() && it->first == token) {
    it->second = child;
  } else {
    ch.insert(it, {token, child});
  }
}

void SuffixIndex::EraseChild(int node, int token) {
  auto& ch = nodes_[node].children;
  auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(token, INT32_MIN));
  assert(it != ch.end() && it->first == token);
  ch.erase(it);
}

int SuffixIndex::NewNode(int64_t seq, int end, int len, int count) {
  int id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = static_cast<int>(nodes_.size());
    nodes_.emplace_back();
  }
  Node& n = nodes_[id];
  n.seq = seq;
  n.end = end;
  n.len = len;
  n.count = count;
  return id;
}

void SuffixIndex::FreeNode(int node) {
  std::vector<std::pair<int32_t, int32_t>>().swap(nodes_[node].children);
  nodes_[node].count = 0;
  free_.push_back(node);
}

bool SuffixIndex::Walk(const int* tokens, int n, Point* at) const {
  int u = 0, off = 0;  // the root: off == len == 0
  for (int d = 0; d < n; ++d) {
    if (off == nodes_[u].len) {
      const int c = FindChild(u, tokens[d]);
      if (c < 0) return false;
      u = c;
      off = 1;
    } else {
      if (Label(u, off) != tokens[d]) return false;
      ++off;
    }
  }
  *at = {u, off};
  return true;
}

void SuffixIndex::InsertSuffix(int64_t id, const std::vector<int>& s, int i) {
  const int n = static_cast<int>(s.size());
  const int len = std::min(n - i, options_.max_depth);
  ++nodes_[0].count;
  int u = 0;
  for (int d = 0; d < len;) {
    const int t = s[i + d];
    const int c = FindChild(u, t);
    if (c < 0) {  // a new branch: the rest of the suffix is one leaf
      const int leaf = NewNode(id, i + len - 1, len - d, 1);
      SetChild(u, t, leaf);
      return;
    }
    const int clen = nodes_[c].len;
    int j = 1;
    while (j < clen && d + j < len && Label(c, j) == s[i + d + j]) ++j;
    if (j == clen) {  // through c: this sequence is now the newest through it
      Node& cn = nodes_[c];
      ++cn.count;
      cn.seq = id;
      cn.end = i + d + j - 1;
      u = c;
      d += j;
      continue;
    }
    // The suffix ends or diverges j tokens into c's edge: split it there.
    const int mid = NewNode(id, i + d + j - 1, j, nodes_[c].count + 1);
    SetChild(u, t, mid);
    nodes_[c].len -= j;
    SetChild(mid, Label(c, 0), c);
    if (d + j < len) {
      const int leaf = NewNode(id, i + len - 1, len - d - j, 1);
      SetChild(mid, s[i + d + j], leaf);
    }
    return;
  }
}

void SuffixIndex::RemoveSuffix(const std::vector<int>& s, int i) {
  const int n = static_cast<int>(s.size());
  const int len = std::min(n - i, options_.max_depth);
  path_.assign(1, 0);
  int d = 0;
  for (int u = 0; d < len;) {
    const int c = FindChild(u, s[i + d]);
    assert(c >= 0);
    path_.push_back(c);
    d += nodes_[c].len;
    u = c;
  }
  assert(d == len);  // every suffix ends at a node
  for (int x : path_) --nodes_[x].count;
  // Nodes that only this suffix went through: path_[k..], freed (their subtrees are the path).
  size_t k = 1;
  int depth = 0;  // depth of path_[k - 1]
  while (k < path_.size() && nodes_[path_[k]].count > 0) depth += nodes_[path_[k++]].len;
  const int last = path_[k - 1];
  if (k < path_.size()) {
    EraseChild(last, s[i + depth]);
    for (size_t x = k; x < path_.size(); ++x) FreeNode(path_[x]);
  }
  // `last` lost a child or a suffix ending there: merge it with an only child it now equals.
  Node& p = nodes_[last];
  if (last != 0 && p.children.size() == 1 && nodes_[p.children[0].second].count == p.count) {
    const int c = p.children[0].second;
    Node& cn = nodes_[c];
    p.len += cn.len;
    p.seq = cn.seq;  // the newest through c is the newest through p: the same suffixes
    p.end = cn.end;
    p.children = std::move(cn.children);
    FreeNode(c);
  }
}

void SuffixIndex::EvictOldest() {
  const std::vector<int>& s = seqs_.front();
  for (int i = 0; i < static_cast<int>(s.size()); ++i) RemoveSuffix(s, i);
  num_tokens_ -= static_cast<int64_t>(s.size());
  seqs_.pop_front();
  ++first_id_;
}

void SuffixIndex::Add(const std::vector<int>& sequence) {
  if (sequence.empty()) return;
  const int64_t keep =
      std::min<int64_t>(static_cast<int64_t>(sequence.size()), options_.max_tokens);
  // Evict first: the index never holds more than max_tokens, not even during Add.
  while (!seqs_.empty() && num_tokens_ + keep > options_.max_tokens) EvictOldest();
  seqs_.emplace_back(sequence.end() - keep, sequence.end());
  const int64_t id = first_id_ + static_cast<int64_t>(seqs_.size()) - 1;
  const std::vector<int>& s = seqs_.back();  // deque::emplace_back keeps references valid
  for (int i = 0; i < static_cast<int>(s.size()); ++i) InsertSuffix(id, s, i);
  num_tokens_ += keep;
}

int64_t SuffixIndex::Count(const int* tokens, int n) const {
  assert(n > 0 && n <= options_.max_depth);
  Point at;
  return Walk(tokens, n, &at) ? nodes_[at.node].count : 0;
}

void SuffixIndex::Speculate(const std::vector<int>& context, int max_match, int max_k,
                            double min_prob, Speculation* out) const {
  out->tokens.clear();
  out->probs.clear();
  out->match_length = 0;
  out->match_count = 0;
  if (max_k <= 0) return;
  const int len = static_cast<int>(context.size());
  Point at{0, 0};
  int m = std::min({max_match, len, options_.max_depth});
  for (; m > 0; --m) {
    if (!Walk(context.data() + len - m, m, &at)) continue;
    const Node& n = nodes_[at.node];
    if (at.off < n.len || !n.children.empty()) break;  // a continuation follows
  }
  if (m == 0) return;
  out->match_length = m;
  out->match_count = nodes_[at.node].count;
  double p = 1.0;
  while (static_cast<int>(out->tokens.size()) < max_k) {
    const Node& n = nodes_[at.node];
    int token = -1;
    Point next;
    if (at.off < n.len) {  // inside an edge: one continuation, probability 1
      token = Label(at.node, at.off);
      next = {at.node, at.off + 1};
    } else {  // at a node: its most frequent child, ties to the newest
      int best = -1;
      for (const auto& [t, c] : n.children) {
        if (best < 0 || nodes_[c].count > nodes_[best].count ||
            (nodes_[c].count == nodes_[best].count && nodes_[c].seq > nodes_[best].seq)) {
          best = c;
          token = t;
        }
      }
      if (best < 0) break;  // end of every sequence here, or max_depth
      p *= static_cast<double>(nodes_[best].count) / n.count;
      next = {best, 1};
    }
    if (p < min_prob) break;
    out->tokens.push_back(token);
    out->probs.push_back(p);
    at = next;
  }
}

void SuffixProposer::Propose(const std::vector<int>& context, int max_k, DraftBlock* out) {
  out->Clear();
  index_->Speculate(context, max_match_, max_k, min_prob_, &last_);
  out->tokens = last_.tokens;
  if (!greedy_) {
    const int k = static_cast<int>(out->tokens.size());
    out->probs.assign(static_cast<size_t>(k) * vocab_, 0.0f);
    for (int i = 0; i < k; ++i) out->probs[static_cast<size_t>(i) * vocab_ + out->tokens[i]] = 1.0f;
  }
}

}  // namespace specloop
