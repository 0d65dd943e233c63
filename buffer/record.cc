#include "buffer/record.h"

#include <cstring>

namespace specloop {

bool SpecStep::operator==(const SpecStep& o) const {
  if (tail_mass.size() != o.tail_mass.size()) return false;
  // Bitwise comparison, so NaN tails compare equal to themselves after a round trip.
  if (!tail_mass.empty() &&
      std::memcmp(tail_mass.data(), o.tail_mass.data(), tail_mass.size() * sizeof(float)) != 0) {
    return false;
  }
  return start_pos == o.start_pos && draft_tokens == o.draft_tokens &&
         num_accepted == o.num_accepted && topk_ids == o.topk_ids &&
         topk_logprobs == o.topk_logprobs;
}

bool Record::operator==(const Record& o) const {
  auto same_float = [](float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; };
  return time_us == o.time_us && domain == o.domain && request_id == o.request_id &&
         worker_id == o.worker_id && draft_version == o.draft_version &&
         target_id == o.target_id && same_float(sampling.temperature, o.sampling.temperature) &&
         sampling.top_k == o.sampling.top_k && same_float(sampling.top_p, o.sampling.top_p) &&
         sampling.seed == o.sampling.seed && prompt_len == o.prompt_len && tokens == o.tokens &&
         top_k == o.top_k && steps == o.steps;
}

std::string ValidateRecord(const Record& r) {
  if (r.domain.size() > 255) return "domain longer than 255 bytes";
  if (r.domain.find('\0') != std::string::npos) return "domain holds a NUL byte";
  if (r.prompt_len > r.tokens.size()) return "prompt_len exceeds the token count";
  for (size_t i = 0; i < r.steps.size(); i++) {
    const SpecStep& s = r.steps[i];
    const size_t k = s.draft_tokens.size();
    const size_t n = (k + 1) * static_cast<size_t>(r.top_k);
    if (s.num_accepted > k) return "step " + std::to_string(i) + ": num_accepted exceeds k";
    if (s.topk_ids.size() != n || s.topk_logprobs.size() != n) {
      return "step " + std::to_string(i) + ": top-K arrays are not (k+1)*K long";
    }
    if (s.tail_mass.size() != k + 1) {
      return "step " + std::to_string(i) + ": tail_mass is not k+1 long";
    }
  }
  return "";
}

}  // namespace specloop
