// Chunked prefill's budget (Scheduler::TakePrefillChunks): how many prompt tokens a step may
// carry beside its decoding sequences, priced by the step cost table. Pure logic.
//
// Alone, a step carries up to kMaxPrefillChunk tokens. Beside decoding sequences the step's
// time is shared by sequence: the chunks may add max(kMinPrefillShare, prefilling / decoding
// sequences) times the seconds of the forward they will join (the decoding rows and one row
// per prefilling sequence), so that each prefilling sequence gets what a decoding one gets and
// a lone long prompt stretches the others' steps by about half instead of stalling them for
// its whole prefill; and at least kMinPrefillChunk tokens, so that a prompt always advances.
// Priced at the decoding rows alone, fewer decoding sequences would make a cheaper step, a
// smaller chunk and so fewer decoding sequences: 16 closed-loop clients settled at 6-9
// decoding beside 6-8 waiting in prefill, and stayed there.
#pragma once

#include <cstdint>

#include "common/spec/step_cost_table.h"

namespace specloop {

constexpr int64_t kMinPrefillChunk = 4;
constexpr int64_t kMaxPrefillChunk = 512;
constexpr double kMinPrefillShare = 0.5;

// Seconds that `tokens` prompt tokens after `prefix` cached ones add to a target forward over
// `rows` other rows: the forward's growth by the table, and the chunk's own attention.
double PrefillChunkSeconds(const StepCostTable& costs, int rows, int64_t tokens, int64_t prefix);

// Prompt tokens the step may carry (see the header comment): beside `decode_rows` rows of
// `decoding` sequences (0: none decode) after `context` cached tokens each, for `prefilling`
// >= 1 prefilling sequences, the first of them after `prefix` cached tokens.
int64_t PrefillBudget(const StepCostTable& costs, int decode_rows, int decoding, int prefilling,
                      double context, int64_t prefix);

}  // namespace specloop
