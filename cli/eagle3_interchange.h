// EAGLE-3 heads between specloop and the servers that run them (`specloop draft export` and
// `specloop draft import`). The native layout (Eagle3Head::Save) already IS the interchange
// layout, LlamaForCausalLMEagle3: config.json (Eagle3Config::ToJson, aux ids in vLLM's and
// SGLang's form) and model.safetensors with fc.weight, midlayer.*, norm.weight, lm_head.weight,
// d2t (int64 offsets: draft id d is target id d + d2t[d]) and t2d (bool over the target's
// vocabulary). What differs is dtype (published heads ship every float tensor in 16 bits,
// norms included; training wants float32), the embedding (SpecForge's heads carry the
// target's as embed_tokens.weight) and how other tools spell the names on import.
#pragma once

#include <memory>
#include <string>

#include "common/base/status.h"
#include "common/model/eagle3_head.h"
#include "common/model/llama_model.h"

namespace specloop {

struct Eagle3ExportOptions {
  // Every floating-point tensor's dtype: "float16", "bfloat16" or "float32". Default: float16,
  // as published heads ship.
  std::string dtype = "float16";
  // Also write the target's embedding as embed_tokens.weight (SpecForge's heads carry it; vLLM
  // uses it when present, SGLang takes the target's). Default: false.
  bool with_embedding = false;
};

// OK when DIR is absent, or a directory holding no weights file but model.safetensors (which a
// head's writer replaces): another .safetensors, an index, a .bin / .pt / .pth / .gguf would be
// read instead of or beside the new file. InvalidArgument names the file in the way.
Status CheckHeadOutputDir(const std::string& dir);

// Writes `head` to DIR/config.json and DIR/model.safetensors in the layout vLLM and SGLang load,
// in options.dtype (config.json's torch_dtype says which), the vocabulary map as int64 d2t and
// bool t2d. DIR is created and must pass CheckHeadOutputDir; only config.json and
// model.safetensors are written. InvalidArgument names a bad dtype or a file in the way; IOError
// a write that failed.
Status ExportEagle3Head(const Eagle3Head& head, const std::string& dir,
                        const Eagle3ExportOptions& options);

// What ImportEagle3Head found in a published head (for the command's report).
struct Eagle3ImportReport {
  std::string aux_ids_form;     // "vLLM", "SGLang", "vLLM + SGLang" or "none (the target's default)"
  std::string names_form;       // "as published (midlayer.*)" or the renamings applied
  std::string embedding;        // "absent" or "equal to the target's (DTYPE)"
  std::string vocabulary_map;   // "d2t + t2d", "d2t (t2d rebuilt)", "t2d (d2t rebuilt)", "none"
  std::string weights_dtype;    // the file's float dtype(s)
};

// Reads the published head in DIR for `target` and loads it as an Eagle3Head (float32 on the
// target's device, for training). Accepted forms: config.json as vLLM or SGLang reads it
// (Eagle3Config::FromJson); weights in model.safetensors (or sharded with an index); tensor
// names bare, with a `model.` prefix (SGLang tries both), with `layers.0.` for `midlayer.`
// (vLLM's renamed form) and `draft_id_to_target_id` for d2t; embed_tokens.weight present (it
// must equal the target's embedding in the file's dtype, else refused naming it) or absent;
// d2t and t2d both, either one (the other is rebuilt: the draft vocabulary is ascending target
// ids) or neither (the full vocabulary). A pytorch_model.bin is NotSupported, naming it (convert
// it to safetensors). Every error names the file, key, tensor or shape at fault. `report` may
// be null.
Status ImportEagle3Head(const std::string& dir, const LlamaModel& target,
                        std::unique_ptr<Eagle3Head>* out, Eagle3ImportReport* report);

}  // namespace specloop
