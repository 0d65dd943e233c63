// TextStream: a sequence's generated ids turned into the text a client sees, incrementally:
// each id is decoded after its predecessor (Tokenizer::Decode(ids, prev)), invalid UTF-8 becomes
// U+FFFD (RepairUtf8), bytes that may end inside a UTF-8 sequence are held back until the next
// id completes them, and so is any tail that could be the start of a stop string. When a stop
// string appears, the text is cut just before it and the stream is stopped: nothing after it is
// ever released.
//
// Invariant: the concatenation of everything Push() and Finish() return equals the full text
// (ToValidUtf8 of the decoded ids) up to (not including) the first stop string, or all of it
// when none occurs. Every piece returned is valid UTF-8.
// Not thread-safe (one per sequence, on the scheduler thread).
#pragma once

#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace specloop {

class TextStream {
 public:
  // `prev`: the id before the first generated one (the prompt's last id), for the decoder's
  // leading-space rule. `stop`: stop strings (empty ones are ignored).
  TextStream(const Tokenizer* tokenizer, int prev, std::vector<std::string> stop);

  // Appends newly generated ids and returns the text now safe to release (may be empty).
  // After a stop string, returns "" and ignores further ids.
  std::string Push(const std::vector<int>& ids);
  // The end of generation: releases what was held back (an incomplete UTF-8 tail as U+FFFD),
  // up to any stop string.
  std::string Finish();

  // A stop string was found (finish_reason "stop").
  bool stopped() const { return stopped_; }

 private:
  // Releases pending_[0, n) and keeps the rest.
  std::string Release(size_t n);

  const Tokenizer* tokenizer_;
  int prev_;
  std::vector<std::string> stop_;
  size_t max_stop_ = 0;  // length of the longest stop string
  std::string pending_;  // decoded, not yet released
  bool stopped_ = false;
};

}  // namespace specloop
