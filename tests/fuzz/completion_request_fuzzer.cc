// The body and X-Domain header of `POST /v1/completions` (serve/completion_params.h), parsed
// for target-6m (its config and tokenizer from ../shared). The input's first line is the
// X-Domain header value, the rest the body. A request either parses into params the scheduler
// can run (a non-empty prompt that, with max_tokens, fits the context and the server's limits;
// a valid domain and sampling) or gets a 400/404 whose OpenAI error JSON serializes.
#include <algorithm>
#include <string>

#include "serve/completion_params.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/served_model.h"

using namespace specloop;

namespace {

bool ValidDomain(const std::string& d) {
  return !d.empty() && d.size() <= 64 &&
         d.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") ==
             std::string::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::ServedModel served;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nl = input.find('\n');
  const std::string header = nl == std::string::npos ? "" : input.substr(0, nl);
  const std::string body = nl == std::string::npos ? input : input.substr(nl + 1);

  CompletionParams p;
  ApiError error;
  if (!ParseCompletionRequest(body, header, served.limits, /*default_seed=*/7, &p, &error)) {
    FUZZ_CHECK(error.status == 400 || error.status == 404);
    FUZZ_CHECK(!error.message.empty());
    (void)error.ToJson().dump();  // throws (aborts here) on a message that is not UTF-8
    return 0;
  }
  const int64_t ctx = served.config.max_model_len;
  const int64_t plen = static_cast<int64_t>(p.prompt.size());
  FUZZ_CHECK(plen >= 1 && p.generate.max_tokens >= 0 && plen + p.generate.max_tokens <= ctx);
  FUZZ_CHECK(plen <= served.limits.max_prompt_tokens &&
             p.generate.max_tokens <= served.limits.max_tokens_limit);
  for (int id : p.prompt) FUZZ_CHECK(id >= 0 && id < served.config.vocab_size);
  FUZZ_CHECK(ValidDomain(p.domain));
  FUZZ_CHECK(p.generate.sampling.Validate().empty());
  FUZZ_CHECK(p.stop.size() <= 4 && std::count(p.stop.begin(), p.stop.end(), "") == 0);
  return 0;
}
