// The held-out split: which logged traffic the trainer evaluates on and never trains on.
//
// A record is held out when a hash of its prompt ids (Record::tokens[0, prompt_len)) falls
// below `fraction`, so every record of one prompt lands on the same side in every run and
// every trainer: a prompt repeated in traffic never trains the draft that is then evaluated
// on it. A client that must keep its prompts out of evaluation (the domain-shift benchmark)
// calls IsHeldOutPrompt on the ids the server encodes, BOS included when the model adds one.
// Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace specloop {
namespace trainer {

// True for about `fraction` of all prompts (none when fraction <= 0).
bool IsHeldOutPrompt(const int32_t* ids, size_t n, double fraction);

// The same split over any key, for records without a prompt (prompt_len == 0).
bool IsHeldOutKey(const std::string& key, double fraction);

}  // namespace trainer
}  // namespace specloop
