#include "trainer/synthetic_traffic.h"

#include <c10/core/InferenceMode.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "buffer/half.h"
#include "common/engine/draft_model_proposer.h"
#include "common/engine/speculative_decoder.h"
#include "common/tokenizer/tokenizer.h"

namespace specloop {
namespace trainer {

Status DecodeToRecord(const LlamaModel& target, const LlamaModel& draft,
                      const std::vector<int>& prompt, const std::string& domain,
                      const std::string& request_id, const TrafficOptions& o, Record* record) {
  Record r;
  r.domain = domain;
  r.request_id = request_id;
  r.target_id = "target";
  r.top_k = static_cast<uint32_t>(o.top_k);
  GenerateOptions go;
  go.max_tokens = o.max_tokens;
  go.sampling.temperature = o.temperature;
  go.sampling.seed = o.seed;
  r.sampling = go.sampling;
  r.prompt_len = static_cast<uint32_t>(prompt.size());
  try {
    c10::InferenceMode guard;
    DraftModelProposer proposer(&draft, go.sampling);
    SpeculativeDecoder dec(&target, &proposer, prompt, go);
    while (!dec.finished()) {
      dec.Propose(o.k);
      SpecStep st;
      st.start_pos = static_cast<uint32_t>(dec.tokens().size());
      st.draft_tokens = dec.draft().tokens;
      const int64_t k = static_cast<int64_t>(st.draft_tokens.size());
      at::Tensor logits = target.Forward({dec.TargetInput()}).to(at::kCPU, at::kFloat);
      at::Tensor lp = at::log_softmax(logits.narrow(0, logits.size(0) - (k + 1), k + 1), -1);
      auto [vals, ids] = lp.topk(o.top_k, -1);
      at::Tensor tail = (1 - vals.exp().sum(-1)).clamp(0, 1).contiguous();
      vals = vals.contiguous();
      ids = ids.to(at::kInt).contiguous();
      const float* v = vals.data_ptr<float>();
      const int32_t* id = ids.data_ptr<int32_t>();
      st.topk_ids.assign(id, id + (k + 1) * o.top_k);
      for (int64_t i = 0; i < (k + 1) * o.top_k; ++i) st.topk_logprobs.push_back(FloatToHalf(v[i]));
      st.tail_mass.assign(tail.data_ptr<float>(), tail.data_ptr<float>() + k + 1);
      dec.Commit(logits);
      st.num_accepted = static_cast<uint32_t>(dec.last_accepted());
      r.steps.push_back(std::move(st));
    }
    r.tokens.assign(dec.tokens().begin(), dec.tokens().end());
  } catch (const c10::Error& e) {
    return Status::IOError(std::string("decoding: ") + e.what_without_backtrace());
  }
  *record = std::move(r);
  return Status::OK();
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
