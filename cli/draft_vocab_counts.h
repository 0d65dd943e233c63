// Token counts over a target's vocabulary, from which `specloop draft init` chooses an EAGLE-3
// head's reduced draft vocabulary (the most frequent ids; Eagle3Head::InitOptions).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/tokenizer/tokenizer.h"

namespace specloop {

struct TokenCounts {
  std::vector<int64_t> counts;  // [vocab_size]: occurrences of each id
  int64_t tokens = 0;           // sum of counts
  int64_t sources = 0;          // files read, or buffer records read
};

// Adds to *out (sized vocab_size on first use) the ids of each text file in `files` as
// `tokenizer` encodes it, the whole file as one text (as a prompt of that text would be
// encoded; no BOS). NotFound / IOError name an unreadable file; InvalidArgument an id the
// tokenizer emits outside [0, vocab_size) (a tokenizer of another model).
Status CountTokensInTextFiles(const Tokenizer& tokenizer, const std::vector<std::string>& files,
                              int vocab_size, TokenCounts* out);

// Adds to *out the OUTPUT tokens (tokens[prompt_len:], what the target chose: what a draft must
// predict, as SpecForge counts only the trained-on response tokens) of every record of the
// replay buffers in `dirs`, opened read-only beside any writer (buffer/replay_reader.h).
// Errors name the buffer; InvalidArgument a record holding an id outside [0, vocab_size) (a
// buffer of another target).
Status CountOutputTokensInBuffers(const std::vector<std::string>& dirs, int vocab_size,
                                  TokenCounts* out);

}  // namespace specloop
