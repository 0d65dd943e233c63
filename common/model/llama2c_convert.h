// Conversion of llama2.c checkpoints ("version 0": a 7-int32 header, then float32 weights) to
// a Hugging Face layout directory that LlamaModel::Load reads like any other model.
#pragma once

#include <string>

#include "common/base/status.h"

namespace specloop {

// Writes OUT_DIR/{config.json, model.safetensors, tokenizer.bin, tokenizer_config.json}.
// wq and wk rows are permuted from llama2.c's interleaved RoPE pairs to rotate_half halves.
// Errors: NotFound for missing inputs, Corruption for a header or size that does not add up.
Status ConvertLlama2c(const std::string& checkpoint, const std::string& tokenizer,
                      const std::string& out_dir);

}  // namespace specloop
