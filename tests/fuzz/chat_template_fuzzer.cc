// A chat template (common/chat/chat_template.h) from any bytes: the first line is a JSON
// array of messages (or anything: then a fixed conversation), the rest the template's source.
// Compiling and rendering either succeed or give an InvalidArgument whose message starts with
// "chat template "; never a crash, a hang or unbounded output (the render limits hold).
#include <string>

#include <nlohmann/json.hpp>

#include "common/chat/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

using namespace specloop;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nl = input.find('\n');
  const std::string first = nl == std::string::npos ? "" : input.substr(0, nl);
  const std::string source = nl == std::string::npos ? input : input.substr(nl + 1);
  nlohmann::json messages = nlohmann::json::parse(first, nullptr, /*allow_exceptions=*/false);
  if (!messages.is_array()) {
    messages = {{{"role", "system"}, {"content", "S"}},
                {{"role", "user"}, {"content", " hi\n"}},
                {{"role", "assistant"}, {"content", "<think>x</think>\nok"}},
                {{"role", "user"}, {"content", "bye"}}};
  }
  std::unique_ptr<ChatTemplate> t;
  Status s = ChatTemplate::Compile(source, {{"bos_token", "<s>"}, {"eos_token", "</s>"}}, &t);
  std::string prompt;
  if (s.ok()) {
    ChatRenderOptions o;
    o.max_prompt_bytes = 1 << 20;
    s = t->Render(messages, o, &prompt);
    if (s.ok()) FUZZ_CHECK(prompt.size() <= o.max_prompt_bytes);
  }
  if (!s.ok()) {
    FUZZ_CHECK(s.IsInvalidArgument());
    FUZZ_CHECK(s.message().rfind("chat template ", 0) == 0);
  }
  return 0;
}
