#include "serve/text_stream.h"

#include <algorithm>

namespace specloop {

TextStream::TextStream(const Tokenizer* tokenizer, int prev, std::vector<std::string> stop)
    : tokenizer_(tokenizer), prev_(prev) {
  for (auto& s : stop) {
    if (s.empty()) continue;
    max_stop_ = std::max(max_stop_, s.size());
    stop_.push_back(std::move(s));
  }
}

std::string TextStream::Release(size_t n) {
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  return out;
}

std::string TextStream::Push(const std::vector<int>& ids) {
  if (stopped_ || ids.empty()) return "";
  for (int id : ids) {
    pending_ += tokenizer_->Decode({id}, prev_);
    prev_ = id;
  }
  // Invalid UTF-8 (ids a model put in a bad order) becomes U+FFFD; an unfinished tail waits.
  const size_t complete = RepairUtf8(&pending_, /*final=*/false);
  // A complete stop string: cut before the earliest one and stop.
  size_t cut = std::string::npos;
  for (const auto& s : stop_) cut = std::min(cut, pending_.find(s));
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = Release(cut);
    pending_.clear();
    return out;
  }
  // Hold back the earliest tail that is a proper prefix of some stop string.
  size_t safe = pending_.size();
  const size_t from = pending_.size() > max_stop_ ? pending_.size() - max_stop_ : 0;
  for (size_t p = from; p < pending_.size() && safe == pending_.size(); ++p) {
    const size_t tail = pending_.size() - p;
    for (const auto& s : stop_) {
      if (tail < s.size() && pending_.compare(p, tail, s, 0, tail) == 0) {
        safe = p;
        break;
      }
    }
  }
  // And any bytes that may end inside a UTF-8 sequence.
  safe = std::min(safe, complete);
  return Release(safe);
}

std::string TextStream::Finish() {
  if (stopped_) return "";
  RepairUtf8(&pending_, /*final=*/true);
  return Release(pending_.size());
}

}  // namespace specloop
