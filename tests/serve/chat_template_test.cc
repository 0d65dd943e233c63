// The chat-template interpreter (common/chat): the Jinja features the real templates use, its
// errors (a clear Status, never a crash), the model-directory loader, the default template,
// and the BOS rule of a chat prompt's ids. Golden renderings against @huggingface/jinja are in
// chat_template_golden_test.cc.
#include "common/chat/chat_template.h"

#include <algorithm>
#include <ctime>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/serve/test_util.h"

namespace specloop {
namespace {

using json = nlohmann::json;

// Renders `source` with `vars` (plus messages = [] unless given) and add_generation_prompt.
Status Render(const std::string& source, const json& vars, std::string* out,
              bool add_generation_prompt = true) {
  std::unique_ptr<ChatTemplate> t;
  SPECLOOP_RETURN_IF_ERROR(ChatTemplate::Compile(source, json::object(), &t));
  ChatRenderOptions o;
  o.add_generation_prompt = add_generation_prompt;
  json v = vars;
  json messages = v.contains("messages") ? v["messages"] : json::array();
  v.erase("messages");
  o.variables = v;
  return t->Render(messages, o, out);
}

std::string R(const std::string& source, const json& vars = json::object()) {
  std::string out;
  Status s = Render(source, vars, &out);
  EXPECT_TRUE(s.ok()) << source << ": " << s.ToString();
  return out;
}

json Chat() {
  return json::array({{{"role", "system"}, {"content", "Be brief."}},
                      {{"role", "user"}, {"content", "Hi"}},
                      {{"role", "assistant"}, {"content", "Hello."}},
                      {{"role", "user"}, {"content", "Bye"}}});
}

TEST(ChatTemplateTest, DefaultTemplateWritesOneLinePerMessageThenTheAssistantPrompt) {
  auto t = ChatTemplate::Default();
  ASSERT_TRUE(t);
  EXPECT_TRUE(t->is_default());
  std::string out;
  ASSERT_TRUE(t->Render(Chat(), ChatRenderOptions(), &out).ok());
  EXPECT_EQ(out, "system: Be brief.\nuser: Hi\nassistant: Hello.\nuser: Bye\nassistant:");
  ChatRenderOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  ASSERT_TRUE(t->Render(Chat(), no_prompt, &out).ok());
  EXPECT_EQ(out, "system: Be brief.\nuser: Hi\nassistant: Hello.\nuser: Bye\n");
}

TEST(ChatTemplateTest, FixtureModelHasNoTemplateAndGetsTheDefaultWithItsSpecialTokens) {
  std::unique_ptr<ChatTemplate> t;
  ASSERT_TRUE(ChatTemplate::FromModelDir(serve_test::TargetDir(), &t).ok());
  EXPECT_TRUE(t->is_default());
  EXPECT_EQ(t->source(), kDefaultChatTemplate);
  EXPECT_EQ(t->bos_token(), "<s>");
  EXPECT_EQ(t->eos_token(), "</s>");
}

TEST(ChatTemplateTest, FromModelDirReadsEveryPlaceATemplateLives) {
  serve_test::TempDir dir;
  const std::string cfg = dir.path() + "/tokenizer_config.json";
  // A string, with AddedToken-style special tokens.
  std::ofstream(cfg) << json{{"chat_template", "{{ bos_token }}[{{ messages[0].content }}]"},
                             {"bos_token", {{"content", "<B>"}, {"lstrip", false}}},
                             {"eos_token", "<E>"}}
                            .dump();
  std::unique_ptr<ChatTemplate> t;
  std::string out;
  ASSERT_TRUE(ChatTemplate::FromModelDir(dir.path(), &t).ok());
  EXPECT_FALSE(t->is_default());
  ASSERT_TRUE(t->Render(json::array({{{"role", "user"}, {"content", "x"}}}), {}, &out).ok());
  EXPECT_EQ(out, "<B>[x]");
  EXPECT_EQ(t->eos_token(), "<E>");
  // A list of named templates: "default" wins wherever it is.
  std::ofstream(cfg) << json{{"chat_template", json::array({{{"name", "tool_use"},
                                                             {"template", "tools"}},
                                                            {{"name", "default"},
                                                             {"template", "plain"}}})}}
                            .dump();
  ASSERT_TRUE(ChatTemplate::FromModelDir(dir.path(), &t).ok());
  ASSERT_TRUE(t->Render(json::array(), {}, &out).ok());
  EXPECT_EQ(out, "plain");
  // chat_template.jinja beside a config without one (newer transformers save it there).
  std::ofstream(cfg) << json{{"eos_token", "<E>"}}.dump();
  std::ofstream(dir.path() + "/chat_template.jinja") << "{{ eos_token }}!\n";
  ASSERT_TRUE(ChatTemplate::FromModelDir(dir.path(), &t).ok());
  ASSERT_TRUE(t->Render(json::array(), {}, &out).ok());
  EXPECT_EQ(out, "<E>!");  // the file's one trailing newline is dropped, as Jinja2 does
  // Broken files are errors, not crashes.
  std::ofstream(cfg) << json{{"chat_template", json::array({{{"name", 7}, {"template", "t"}}})}}
                            .dump();
  ASSERT_TRUE(ChatTemplate::FromModelDir(dir.path(), &t).ok());  // a non-string name: not "default"
  ASSERT_TRUE(t->Render(json::array(), {}, &out).ok());
  EXPECT_EQ(out, "t");
  std::ofstream(cfg) << "{not json";
  EXPECT_TRUE(ChatTemplate::FromModelDir(dir.path(), &t).IsCorruption());
  std::ofstream(cfg) << json{{"chat_template", "{% if %}"}}.dump();
  Status s = ChatTemplate::FromModelDir(dir.path(), &t);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("line 1"), std::string::npos) << s.message();
}

TEST(ChatTemplateTest, LoopsAndTheirVariables) {
  EXPECT_EQ(R("{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
              "{{ x }}{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %},{% endfor %}"),
            "103aF,212b,321cL,");
  EXPECT_EQ(R("{% for x in [1,2,3,4] if x is even %}{{ x }}/{{ loop.length }} {% endfor %}"),
            "2/2 4/2 ");
  EXPECT_EQ(R("{% for x in [] %}no{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"a", 1}, {"b", 2}}}}),
            "a=1;b=2;");
  EXPECT_EQ(R("{% for x in range(5) %}{% if x == 3 %}{% break %}{% endif %}"
              "{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}"),
            "02");
  EXPECT_EQ(R("{% for x in 'ab' %}{{ loop.cycle('<', '>') }}{{ x }}{% endfor %}"), "<a>b");
  // A set inside a loop does not outlive its iteration; a namespace carries values out.
  EXPECT_EQ(R("{% set n = 0 %}{% for x in [1,2] %}{% set n = n + x %}{% endfor %}{{ n }}"), "0");
  EXPECT_EQ(R("{% set ns = namespace(n=0, seen=false) %}{% for x in [1,2,3] %}"
              "{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }} {{ ns.seen }}"),
            "6 False");
}

TEST(ChatTemplateTest, ExpressionsFiltersTestsAndMethods) {
  const json m = {{"messages", Chat()}};
  EXPECT_EQ(R("{{ messages[0]['role'] }} {{ messages[-1].content }} {{ messages|length }}", m),
            "system Bye 4");
  EXPECT_EQ(R("{% for m in messages[::-1] %}{{ m.content[0] }}{% endfor %}", m), "BHHB");
  EXPECT_EQ(R("{{ messages[1:3]|map(attribute='role')|join(',') }}", m), "user,assistant");
  EXPECT_EQ(R("{{ 'abcdef'[1:-1] }} {{ 'abc'[::-1] }} {{ 'héllo'[1] }} {{ 'héllo'|length }}"),
            "bcde cba é 5");
  EXPECT_EQ(R("{{ '  x \n'|trim }}|{{ '\n\nx\n'.lstrip('\n') }}|{{ 'x..'.rstrip('.') }}|"
              "{{ '--x--'.strip('-') }}"),
            "x|x\n|x|x");
  // Python's strip(chars) strips only those characters (Qwen3's .lstrip('\n') keeps spaces).
  EXPECT_EQ(R("[{{ '  \nx'.lstrip('\n') }}]"), "[  \nx]");
  EXPECT_EQ(R("{{ 'a</think>b'.split('</think>')[-1] }} {{ 'a  b c'.split() }} "
              "{{ 'a,b,c'.split(',', 1) }}"),
            "b ['a', 'b', 'c'] ['a', 'b,c']");
  EXPECT_EQ(R("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'bc')) }} "
              "{{ 'b' in 'abc' }} {{ 'z' not in 'abc' }} {{ 'role' in messages[0] }}",
              m),
            "True True True True True");
  EXPECT_EQ(R("{{ x is defined }} {{ y is not defined }} {{ none is none }} {{ 'a' is string }} "
              "{{ d is mapping }} {{ [1] is iterable }} {{ 3 is odd }}",
              {{"x", 1}, {"d", json::object()}}),
            "True True True True True True True");
  EXPECT_EQ(R("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ 'é\n\"' | tojson }}",
              {{"d", {{"b", json::array({1, 2.5, nullptr, true})}, {"a", "x"}}}}),
            R"({"a": "x", "b": [1, 2.5, null, true]}|{
  "a": "x",
  "b": [
    1,
    2.5,
    null,
    true
  ]
}|"é\n\"")");
  EXPECT_EQ(R("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 1 / 4 }} {{ 'ab' * 2 }} "
              "{{ 'x' ~ 1 ~ none }} {{ 1 + 2.0 }} {{ 10 - 3 * 2 }}"),
            "3 -4 1 1024 0.25 abab x1None 3.0 4");
  EXPECT_EQ(R("{{ 'yes' if x else 'no' }} {{ 'yes' if y else 'no' }} {{ (x and 'a') or 'b' }}",
              {{"x", true}}),
            "yes no a");
  EXPECT_EQ(R("{{ missing|default('dflt') }} {{ ''|default('e', true) }} {{ [3,1,2]|sort|list }} "
              "{{ ['b','a','b']|unique|list }} {{ 'hello world'|title }} {{ 'X'|lower }} "
              "{{ [1,2,3]|first }}{{ [1,2,3]|last }} {{ 'a b'|replace(' ', '_') }}"),
            "dflt e [1, 2, 3] ['b', 'a'] Hello World x 13 a_b");
  EXPECT_EQ(R("{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|join('+') }}"
              " {{ messages|rejectattr('role', 'in', ['user', 'system'])|list|length }}",
              m),
            "Hi+Bye 1");
  EXPECT_EQ(R("{{ d.get('a') }} {{ d.get('z', 0) }} {{ d.keys()|list }} {{ d['a'] }}",
              {{"d", {{"a", 1}}}}),
            "1 0 ['a'] 1");
  EXPECT_EQ(R("{{ \"it's\" }} {{ 'say \"hi\"' }} {{ 'tab\\there' }} {{ '\\u00e9' }}"),
            "it's say \"hi\" tab\there é");
}

TEST(ChatTemplateTest, WhitespaceControlTrimBlocksAndLstripBlocks) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(R("{% if true %}\n  yes\n  {% endif %}\nafter"), "  yes\nafter");
  // - strips every whitespace character on its side, newlines included.
  EXPECT_EQ(R("a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}\n  c"), "abc");
  EXPECT_EQ(R("a\n{{- ' x ' -}}\nb"), "a x b");
  // {{ }} is not a block: no trim, no lstrip.
  EXPECT_EQ(R("  {{ 'v' }}\nw"), "  v\nw");
  // {%+ keeps the indentation; comments behave like blocks.
  EXPECT_EQ(R("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(R("a\n  {# note #}\nb"), "a\nb");
  // One trailing newline of the template goes.
  EXPECT_EQ(R("x\n"), "x");
}

TEST(ChatTemplateTest, MacrosSetBlocksAndGlobals) {
  EXPECT_EQ(R("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
              "{{ greet('a') }} {{ greet('b', punct='?') }}"),
            "Hi a! Hi b?");
  EXPECT_EQ(R("{% set x %}inner {{ 1 + 1 }}{% endset %}[{{ x }}]"), "[inner 2]");
  EXPECT_EQ(R("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  auto today = [] {
    char buf[64];
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    return std::string(buf, std::strftime(buf, sizeof(buf), "%d %b %Y", &tm));
  };
  const std::string before = today();
  const std::string got = R("{{ strftime_now('%d %b %Y') }}");
  // (A render at midnight may see the next day.)
  EXPECT_TRUE(got == before || got == today()) << got << " vs " << before;
  // Generation markers (transformers' assistant masks) render nothing.
  EXPECT_EQ(R("{% generation %}a{% endgeneration %}"), "a");
}

TEST(ChatTemplateTest, TemplateErrorsAreClearStatusesNeverCrashes) {
  struct Case {
    std::string source, want;
  } cases[] = {
      {"{% if x %}never closed", "missing {% endif %}"},
      {"{{ 'unterminated }}", "unterminated string"},
      {"{% for %}", "line 1"},
      {"line one\n{{ x | no_such_filter }}", "line 2: unknown filter 'no_such_filter'"},
      {"{{ x is no_such_test }}", "unknown test"},
      {"{% include 'x' %}", "unsupported statement 'include'"},
      {"{{ raise_exception('Roles must alternate') }}", "raised: Roles must alternate"},
      {"{{ 1 / 0 }}", "division by zero"},
      {"{{ 'a' - 1 }}", "unsupported operand"},
      {"{{ [1][0:1:0] }}", "slice step"},
      {"{{ x.y.z.w() }}", "no method"},
      {"{{ nope() }}", "'nope' is not callable"},
      {"{% set x = 1 %}{% set x.y = 2 %}", "not a namespace"},
      {"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "nested too deeply"},
      {"{% for i in range(100000000) %}{% endfor %}", "range() too long"},
      {"{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(10) %}"
       "{% endfor %}{% endfor %}{% endfor %}",
       "too many loop iterations"},
      {std::string(5000, '(') + "1" + std::string(5000, ')'), "nested too deeply"},
      {"{{ '" + std::string(1000, 'x') + "' * 100000 }}", "too long"},
      // A namespace that holds itself, printed (found by chat_template_fuzzer).
      {"{% set ns = namespace(i=0) %}{% set ns.i = ns %}{{ ns.i }}", "nested too deeply"},
  };
  for (const Case& c : cases) {
    std::string out;
    Status s = Render(c.source.size() > 5000 ? "{{ " + c.source + " }}" : c.source, json::object(),
                      &out);
    ASSERT_FALSE(s.ok()) << c.source.substr(0, 80) << " rendered " << out.substr(0, 80);
    EXPECT_TRUE(s.IsInvalidArgument());
    EXPECT_NE(s.message().find(c.want), std::string::npos)
        << c.source.substr(0, 80) << ": " << s.message();
    EXPECT_EQ(s.message().rfind("chat template ", 0), 0u) << s.message();
  }
  // messages must be an array.
  std::string out;
  EXPECT_TRUE(ChatTemplate::Default()->Render(json::object(), {}, &out).IsInvalidArgument());
}

// chat_template.h's contract: Render may run on many threads at once (the server renders on
// its handler threads). Run under TSan this also checks for races.
TEST(ChatTemplateTest, RendersConcurrentlyAsAlone) {
  std::unique_ptr<ChatTemplate> t;
  ASSERT_TRUE(ChatTemplate::Compile(
                  "{{ bos_token }}{% set ns = namespace(n=0) %}{% for m in messages %}"
                  "{% set ns.n = ns.n + m.content|length %}{% macro tag(r) %}<{{ r|upper }}>"
                  "{% endmacro %}{{ tag(m.role) }}{{ m.content.split(' ')|reverse|join(' ') }}"
                  "{% endfor %}{{ ns.n }}{{ [1, 2]|tojson }}",
                  {{"bos_token", "<s>"}}, &t)
                  .ok());
  std::string alone;
  ASSERT_TRUE(t->Render(Chat(), {}, &alone).ok());
  std::vector<std::string> got(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 200; ++k) {
        std::string out;
        const Status s = t->Render(Chat(), {}, &out);
        got[i] = s.ok() ? out : s.ToString();
        if (got[i] != alone) return;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const std::string& g : got) EXPECT_EQ(g, alone);
}

TEST(ChatTemplateTest, PromptIdsCarryExactlyOneBos) {
  std::unique_ptr<Tokenizer> tok;
  ModelConfig config;
  ASSERT_TRUE(Tokenizer::Load(serve_test::TargetDir(), &tok).ok());
  ASSERT_TRUE(ModelConfig::FromDir(serve_test::TargetDir(), &config).ok());
  ASSERT_TRUE(config.add_bos_token);
  const std::vector<int> body = tok->Encode("user: hi\nassistant:");
  // The default template writes no BOS: the model's is prepended, as for completions.
  std::vector<int> ids = EncodeChatPrompt("user: hi\nassistant:", "<s>", config, *tok);
  ASSERT_EQ(ids.size(), body.size() + 1);
  EXPECT_EQ(ids[0], config.bos_token_id);
  EXPECT_TRUE(std::equal(body.begin(), body.end(), ids.begin() + 1));
  // A template that writes the BOS text gets the BOS id once, not "<s>" read as text as well.
  std::unique_ptr<ChatTemplate> t;
  ASSERT_TRUE(ChatTemplate::Compile("{{ bos_token }}{% for m in messages %}{{ m.role }}: "
                                    "{{ m.content }}\n{% endfor %}assistant:",
                                    {{"bos_token", "<s>"}}, &t)
                  .ok());
  std::string prompt;
  ASSERT_TRUE(t->Render(json::array({{{"role", "user"}, {"content", "hi"}}}), {}, &prompt).ok());
  ASSERT_EQ(prompt, "<s>user: hi\nassistant:");
  ids = EncodeChatPrompt(prompt, t->bos_token(), config, *tok);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], config.bos_token_id);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), config.bos_token_id), 1);
  EXPECT_EQ(std::vector<int>(ids.begin() + 1, ids.end()), body);
  // A model that adds no BOS gets none unless the template writes it.
  config.add_bos_token = false;
  EXPECT_EQ(EncodeChatPrompt("user: hi\nassistant:", "<s>", config, *tok), body);
}

}  // namespace
}  // namespace specloop
