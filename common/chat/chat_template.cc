#include "common/chat/chat_template.h"

#include <sys/stat.h>

#include "common/chat/jinja.h"

namespace specloop {

using json = nlohmann::json;

const char kDefaultChatTemplate[] =
    "{% for message in messages %}"
    "{{ message['role'] + ': ' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}";

namespace {

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A special token as tokenizer_config.json writes it: a string or an AddedToken object.
bool TokenText(const json& v, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return true;
  }
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    *out = v["content"].get<std::string>();
    return true;
  }
  return false;
}

}  // namespace

ChatTemplate::~ChatTemplate() = default;

Status ChatTemplate::Compile(const std::string& source, const json& special_tokens,
                             std::unique_ptr<ChatTemplate>* out) {
  if (!special_tokens.is_object()) {
    return Status::InvalidArgument("special tokens must be a JSON object");
  }
  std::unique_ptr<ChatTemplate> t(new ChatTemplate());
  Status s = jinja::Template::Parse(source, &t->program_);
  if (!s.ok()) return Status::InvalidArgument("chat template " + s.message());
  t->source_ = source;
  t->special_tokens_ = special_tokens;
  *out = std::move(t);
  return Status::OK();
}

std::unique_ptr<ChatTemplate> ChatTemplate::Default(const json& special_tokens) {
  std::unique_ptr<ChatTemplate> t;
  Status s = Compile(kDefaultChatTemplate,
                     special_tokens.is_object() ? special_tokens : json::object(), &t);
  if (!s.ok()) return nullptr;  // unreachable: the default template is tested
  t->is_default_ = true;
  return t;
}

Status ChatTemplate::FromModelDir(const std::string& dir, std::unique_ptr<ChatTemplate>* out) {
  json special = json::object();
  std::string source;
  bool found = false;
  const std::string config_path = dir + "/tokenizer_config.json";
  if (FileExists(config_path)) {
    std::string text;
    SPECLOOP_RETURN_IF_ERROR(ReadFileToString(config_path, &text));
    const json cfg = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (cfg.is_discarded() || !cfg.is_object()) {
      return Status::Corruption(config_path + " is not a JSON object");
    }
    for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
      std::string tok;
      if (cfg.contains(key) && TokenText(cfg[key], &tok)) special[key] = tok;
    }
    if (auto it = cfg.find("chat_template"); it != cfg.end() && !it->is_null()) {
      if (it->is_string()) {
        source = it->get<std::string>();
        found = true;
      } else if (it->is_array()) {
        for (const json& named : *it) {
          if (!named.is_object() || !named.contains("template") || !named["template"].is_string()) {
            return Status::Corruption(config_path + ": chat_template list entries need a template");
          }
          const auto name = named.find("name");
          const bool is_default = name != named.end() && *name == "default";
          if (!found || is_default) {
            source = named["template"].get<std::string>();
            found = true;
          }
          if (is_default) break;
        }
      } else {
        return Status::Corruption(config_path + ": chat_template must be a string or a list");
      }
    }
  }
  if (!found && FileExists(dir + "/chat_template.jinja")) {
    SPECLOOP_RETURN_IF_ERROR(ReadFileToString(dir + "/chat_template.jinja", &source));
    found = true;
  }
  if (!found && FileExists(dir + "/chat_template.json")) {
    std::string text;
    SPECLOOP_RETURN_IF_ERROR(ReadFileToString(dir + "/chat_template.json", &text));
    const json j = json::parse(text, nullptr, false);
    if (j.is_object() && j.contains("chat_template") && j["chat_template"].is_string()) {
      source = j["chat_template"].get<std::string>();
      found = true;
    }
  }
  if (!found) {
    *out = Default(special);
    return Status::OK();
  }
  Status s = Compile(source, special, out);
  return s.ok() ? s : s.Annotate(dir);
}

Status ChatTemplate::Render(const json& messages, const ChatRenderOptions& options,
                            std::string* prompt) const {
  if (!messages.is_array()) return Status::InvalidArgument("messages must be an array");
  if (!options.variables.is_object()) {
    return Status::InvalidArgument("chat template variables must be a JSON object");
  }
  jinja::Value context = jinja::Value::MakeObject();
  jinja::Object& c = context.mutable_object();
  c.Set("tools", jinja::Value::None());
  c.Set("documents", jinja::Value::None());
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) {
    c.Set(it.key(), jinja::Value::FromJson(it.value()));
  }
  for (auto it = options.variables.begin(); it != options.variables.end(); ++it) {
    c.Set(it.key(), jinja::Value::FromJson(it.value()));
  }
  c.Set("messages", jinja::Value::FromJson(messages));
  c.Set("add_generation_prompt", jinja::Value::Bool(options.add_generation_prompt));
  jinja::RenderLimits limits;
  limits.max_output_bytes = options.max_prompt_bytes;
  Status s = program_->Render(context, limits, prompt);
  return s.ok() ? s : Status::InvalidArgument("chat template " + s.message());
}

std::string ChatTemplate::bos_token() const {
  auto it = special_tokens_.find("bos_token");
  return it != special_tokens_.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string ChatTemplate::eos_token() const {
  auto it = special_tokens_.find("eos_token");
  return it != special_tokens_.end() && it->is_string() ? it->get<std::string>() : "";
}

std::vector<int> EncodeChatPrompt(const std::string& prompt, const std::string& bos_token,
                                  const ModelConfig& config, const Tokenizer& tokenizer) {
  std::vector<int> ids;
  std::string rest = prompt;
  if (!bos_token.empty() && prompt.compare(0, bos_token.size(), bos_token) == 0) {
    ids.push_back(config.bos_token_id);
    rest = prompt.substr(bos_token.size());
  } else if (config.add_bos_token) {
    ids.push_back(config.bos_token_id);
  }
  if (!rest.empty()) {
    const std::vector<int> body = tokenizer.Encode(rest);
    ids.insert(ids.end(), body.begin(), body.end());
  }
  return ids;
}

}  // namespace specloop
