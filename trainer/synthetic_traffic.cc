#include "trainer/synthetic_traffic.h"

#include <c10/core/InferenceMode.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "buffer/record_builder.h"
#include "common/engine/draft_model_proposer.h"
#include "common/engine/speculative_decoder.h"
#include "common/tokenizer/tokenizer.h"

namespace specloop {
namespace trainer {

Status DecodeToRecord(const LlamaModel& target, const LlamaModel& draft,
                      const std::vector<int>& prompt, const std::string& domain,
                      const std::string& request_id, const TrafficOptions& o, Record* record) {
  if (prompt.empty()) return Status::InvalidArgument("empty prompt");
  RecordInfo info;
  info.domain = domain;
  info.request_id = request_id;
  info.target_id = "target";
  info.top_k = o.top_k;
  GenerateOptions go;
  go.max_tokens = o.max_tokens;
  go.sampling.temperature = o.temperature;
  go.sampling.seed = o.seed;
  info.sampling = go.sampling;
  RecordBuilder builder(info, static_cast<uint32_t>(prompt.size()));
  try {
    c10::InferenceMode guard;
    DraftModelProposer proposer(&draft, go.sampling);
    SpeculativeDecoder dec(&target, &proposer, prompt, go, /*defer_prefill=*/true);
    if (dec.prefill_remaining() > 0) {
      // The prefill as serving logs it: the target's row at every prompt position but the
      // first (row i predicts tokens[i + 1]); the last position's row is the first step's.
      ForwardInput in = dec.PrefillInput(dec.prefill_remaining());
      in.all_logits = true;
      const at::Tensor rows = target.Forward({in}).to(at::kCPU, at::kFloat).contiguous();
      SPECLOOP_RETURN_IF_ERROR(builder.AddPromptRows(1, rows.data_ptr<float>(),
                                                     static_cast<int>(rows.size(0)),
                                                     static_cast<int>(rows.size(1))));
    }
    while (!dec.finished()) {
      dec.Propose(o.k);
      const uint32_t start_pos = static_cast<uint32_t>(dec.tokens().size());
      std::vector<int32_t> drafts(dec.draft().tokens.begin(), dec.draft().tokens.end());
      const int64_t k = static_cast<int64_t>(drafts.size());
      at::Tensor logits = target.Forward({dec.TargetInput()}).to(at::kCPU, at::kFloat);
      const at::Tensor rows = logits.narrow(0, logits.size(0) - (k + 1), k + 1).contiguous();
      dec.Commit(logits);
      SPECLOOP_RETURN_IF_ERROR(builder.AddStep(
          start_pos, std::move(drafts), static_cast<uint32_t>(dec.last_accepted()),
          rows.data_ptr<float>(), static_cast<int>(rows.size(0)), static_cast<int>(rows.size(1))));
    }
    return builder.Finish(std::vector<int32_t>(dec.tokens().begin(), dec.tokens().end()), record);
  } catch (const c10::Error& e) {
    return Status::IOError(std::string("decoding: ") + e.what_without_backtrace());
  }
}

Status LoadDomainPrompts(const std::string& shared_dir, const std::string& domain,
                         const std::string& model_dir, size_t max_prompts, int max_prompt_tokens,
                         std::vector<std::vector<int>>* out) {
  std::unique_ptr<Tokenizer> tok;
  SPECLOOP_RETURN_IF_ERROR(Tokenizer::Load(model_dir, &tok));
  ModelConfig c;
  SPECLOOP_RETURN_IF_ERROR(ModelConfig::FromDir(model_dir, &c));
  const std::string path = shared_dir + "/prompts/" + domain + ".jsonl";
  std::ifstream in(path);
  if (!in) return Status::NotFound("cannot open " + path);
  out->clear();
  std::string line;
  while (out->size() < max_prompts && std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) continue;
    std::vector<int> ids = tok->Encode(j["prompt"].get<std::string>());
    const size_t keep = static_cast<size_t>(std::max(1, max_prompt_tokens - 1));
    if (ids.size() > keep) ids.erase(ids.begin(), ids.end() - keep);
    if (c.add_bos_token) ids.insert(ids.begin(), c.bos_token_id);
    if (ids.size() >= 2) out->push_back(std::move(ids));
  }
  return Status::OK();
}

}  // namespace trainer
}  // namespace specloop
