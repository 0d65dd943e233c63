// ChatTemplate: a model's chat template, the Jinja program in its tokenizer_config.json that
// turns chat messages into one prompt string, and the prompt's token ids.
//
// Rendering follows Hugging Face transformers' apply_chat_template: Jinja2 with trim_blocks and
// lstrip_blocks, the variables `messages`, `add_generation_prompt`, `tools` and `documents`
// (none), the special tokens of tokenizer_config.json (`bos_token`, `eos_token`, `unk_token`,
// `pad_token`, each defined only when the file gives it), any extra variables of the request
// (vLLM's chat_template_kwargs, e.g. enable_thinking for Qwen3), and the globals
// raise_exception(msg), strftime_now(format) (local time), range(), namespace() and dict().
// Checked against @huggingface/jinja on the real Llama 3, 3.1, 3.2, Qwen3, Mistral, Mixtral
// and Mistral Small templates (tests/serve/chat_template_golden_test.cc).
//
// The Jinja subset (common/chat/jinja.h):
//   statements  if/elif/else, for (tuple targets, `if` filter, else, loop.index, index0,
//               revindex, revindex0, first, last, length, previtem, nextitem, cycle()),
//               set (names, tuples, ns.attr, {% set x %}block{% endset %}), macro (defaults,
//               keyword arguments), break, continue, comments, whitespace control
//               ({%- -%} {{- -}} {#- -#} and {%+), transformers' {% generation %} markers;
//   expressions literals (strings with Python escapes, ints, floats, lists, tuples, dicts,
//               true/false/none in either case), attribute and subscript access, slices
//               ([::-1]), calls with keyword arguments, + - * / // % ** ~, comparisons,
//               in / not in, and / or / not, a if b else c, filters, `is` tests;
//   filters     trim, length/count, tojson (indent, separators, sort_keys, ensure_ascii),
//               string, int, float, abs, round, upper, lower, capitalize, title, first, last,
//               reverse, join, default/d, list, items, dictsort, sort, unique, min, max, sum,
//               map, select, reject, selectattr, rejectattr, replace, indent, attr, escape,
//               safe, wordcount;
//   tests       defined, undefined, none, string, number, integer, float, boolean, true,
//               false, mapping, iterable, sequence, callable, odd, even, divisibleby, eq /
//               equalto, ne, lt, le, gt, ge, in, sameas, lower, upper;
//   methods     str: strip/lstrip/rstrip(chars), split(sep, maxsplit), startswith/endswith
//               (a string or a tuple), replace, upper, lower, capitalize, title, find, count,
//               join, isspace, isdigit, isalpha; dict: get, items, keys, values.
// Not supported (a template using them fails to compile or render with a clear Status):
// {% call %}, {% filter %}, {% raw %}, {% include/import/extends/block %}, recursive loops,
// "%" string formatting, macros' caller/varargs/kwargs. Case mapping (upper, lower, title)
// changes ASCII letters only. Undefined values are lenient: an attribute of an undefined value
// is undefined (Jinja2 would raise), and a string plus a number concatenates.
//
// Where @huggingface/jinja and Jinja2 (Python, what the models were trained with) differ, this
// follows Jinja2: strip/lstrip/rstrip honour their `chars` argument (Qwen3's .lstrip('\n')
// strips newlines only), whitespace is str.isspace()'s, `none` prints "None", a for loop's `set`
// does not outlive its iteration, and a string's length counts code points.
//
// The default template, for model directories without one (the fixture models):
//   one line per message, "ROLE: CONTENT\n", then "assistant:" when add_generation_prompt.
// Thread-safe: Render may run on many threads at once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/base/status.h"
#include "common/tokenizer/model_config.h"
#include "common/tokenizer/tokenizer.h"

namespace specloop {

namespace jinja {
class Template;
}

// The template's source used when a model directory has none.
extern const char kDefaultChatTemplate[];

struct ChatRenderOptions {
  // End the prompt with the header of an assistant turn. Default: true.
  bool add_generation_prompt = true;
  // Extra template variables, a JSON object (e.g. {"enable_thinking": false}); they may not
  // replace `messages`. Default: none.
  nlohmann::json variables = nlohmann::json::object();
  // Largest rendered prompt, in bytes; a longer one is an error. Default: 16 MiB.
  size_t max_prompt_bytes = 16 << 20;
};

class ChatTemplate {
 public:
  ~ChatTemplate();

  // Compiles `source`. `special_tokens` is a JSON object of the special tokens' texts
  // ({"bos_token": "<s>", "eos_token": "</s>"}; absent ones stay undefined in the template).
  // InvalidArgument "chat template line N: ..." for a syntax error or an unsupported statement.
  static Status Compile(const std::string& source, const nlohmann::json& special_tokens,
                        std::unique_ptr<ChatTemplate>* out);

  // The template of model directory `dir`: tokenizer_config.json's `chat_template` (a string,
  // or a list of {"name", "template"}: the one named "default", else the first), else a
  // chat_template.jinja file, else chat_template.json's `chat_template`; with the special
  // tokens of tokenizer_config.json (strings or {"content": ...} objects). A directory with
  // none of these gets kDefaultChatTemplate (is_default()). Corruption for a malformed
  // tokenizer_config.json, InvalidArgument for a template that does not compile.
  static Status FromModelDir(const std::string& dir, std::unique_ptr<ChatTemplate>* out);

  // kDefaultChatTemplate with `special_tokens`.
  static std::unique_ptr<ChatTemplate> Default(
      const nlohmann::json& special_tokens = nlohmann::json::object());

  // Renders `messages` (a JSON array of message objects, each passed to the template as
  // given) into *prompt. InvalidArgument when `messages` is not an array, for the template's
  // own raise_exception() ("chat template raised: MESSAGE", e.g. roles that do not alternate)
  // and for errors while rendering ("chat template line N: ..."); *prompt is then unspecified.
  Status Render(const nlohmann::json& messages, const ChatRenderOptions& options,
                std::string* prompt) const;

  bool is_default() const { return is_default_; }
  const std::string& source() const { return source_; }
  // The special tokens' texts ("" when the model has none).
  std::string bos_token() const;
  std::string eos_token() const;

 private:
  ChatTemplate() = default;

  std::string source_;
  nlohmann::json special_tokens_;
  bool is_default_ = false;
  std::unique_ptr<jinja::Template> program_;
};

// The token ids of a rendered chat prompt. A prompt that starts with the BOS text `bos_token`
// (non-empty) has it replaced by the BOS id, so a template that writes BOS itself gets exactly
// one; otherwise BOS is prepended when the model adds one (config.add_bos_token), as for a
// completion's prompt. The rest goes through tokenizer.Encode (a tokenizer.json's special
// tokens, such as <|start_header_id|> or <|im_start|>, become their ids there; a
// sentencepiece tokenizer reads them as text).
std::vector<int> EncodeChatPrompt(const std::string& prompt, const std::string& bos_token,
                                  const ModelConfig& config, const Tokenizer& tokenizer);

}  // namespace specloop
