// `specloop draft init|export|import` (cli/draft_command.cc), run through the command's CLI11
// registration with its output captured: a head grown from target-6m loads as a draft; the
// draft vocabulary follows the counts; the exported layout matches a published EAGLE-3 head's
// (tests/common/data/eagle3_published_layout.json: config keys, tensor names, dtypes, shape
// pattern); export -> import is bit-identical (float32) or the float16 rounding, and decodes
// the same greedy tokens; SGLang's and vLLM's forms import; what cannot be imported is refused,
// naming what is wrong.
#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "buffer/replay_buffer.h"
#include "common/engine/draft.h"
#include "common/engine/feature_draft_proposer.h"
#include "common/engine/generate.h"
#include "common/engine/speculative_decoder.h"
#include "common/model/eagle3_config.h"
#include "common/model/eagle3_head.h"
#include "common/model/safetensors.h"
#include "common/tokenizer/tokenizer.h"
#include "cli/commands.h"
#include "tests/testing/temp_dir.h"

namespace specloop {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct Result {
  int exit_code = -1;
  std::string out, err;
};

// Runs `specloop ARGS...` as main() would, with std::cout and std::cerr captured.
Result Specloop(std::vector<std::string> args) {
  CLI::App app;
  app.require_subcommand(1);
  Result r;
  r.exit_code = 0;
  AddDraftCommand(app, &r.exit_code);
  args.insert(args.begin(), "specloop");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  std::ostringstream out, err;
  std::streambuf* old_out = std::cout.rdbuf(out.rdbuf());
  std::streambuf* old_err = std::cerr.rdbuf(err.rdbuf());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    r.exit_code = app.exit(e);
  }
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

std::string Model(const std::string& name) { return testing::SharedDir() + "/models/" + name; }
std::string Corpus(const std::string& file) { return testing::SharedDir() + "/corpus/" + file; }

std::string ReadText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::unique_ptr<LlamaModel> LoadTarget(const std::string& dir) {
  std::unique_ptr<LlamaModel> m;
  const Status s = LlamaModel::Load(dir, LoadOptions(), &m);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return m;
}

std::unique_ptr<Eagle3Head> LoadHead(const std::string& dir, const LlamaModel& target) {
  std::unique_ptr<Eagle3Head> head;
  const Status s = Eagle3Head::Load(dir, target, LoadOptions(), &head);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return head;
}

// A safetensors file's header as written: name -> {"dtype", "shape"} (no reader of ours).
json SafetensorsHeader(const std::string& path) {
  const std::string bytes = ReadText(path);
  uint64_t n = 0;
  if (bytes.size() < 8) return json();
  std::memcpy(&n, bytes.data(), 8);
  json h = json::parse(bytes.substr(8, n));
  h.erase("__metadata__");
  return h;
}

// Expects the NamedWeights of two heads equal tensor by tensor (names, dtypes, bits), `a`'s
// floats first rounded through `round` (kFloat: no rounding).
void ExpectSameWeights(const Eagle3Head& a, const Eagle3Head& b, at::ScalarType round) {
  const auto wa = a.NamedWeights(), wb = b.NamedWeights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_EQ(wa[i].first, wb[i].first);
    const at::Tensor want =
        wa[i].second.is_floating_point() ? wa[i].second.to(round).to(at::kFloat) : wa[i].second;
    EXPECT_EQ(want.scalar_type(), wb[i].second.scalar_type()) << wa[i].first;
    EXPECT_TRUE(at::equal(want, wb[i].second)) << wa[i].first;
  }
}

class DraftCommand : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { target_ = LoadTarget(Model("target-6m")).release(); }
  static void TearDownTestSuite() {
    delete target_;
    target_ = nullptr;
  }
  // `draft init` into DIR with extra arguments (no warm-up unless they ask for one: these
  // tests are about the layout); asserts success.
  static void Init(const std::string& dir, std::vector<std::string> extra = {},
                   const std::string& target = Model("target-6m")) {
    std::vector<std::string> args = {"draft", "init", "--target", target, "--out", dir};
    if (std::find(extra.begin(), extra.end(), "--warmup-tokens") == extra.end()) {
      args.insert(args.end(), {"--warmup-tokens", "0"});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    const Result r = Specloop(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static LlamaModel* target_;
  testing::TempDir tmp_{"draft-command"};
};
LlamaModel* DraftCommand::target_ = nullptr;

TEST_F(DraftCommand, InitWritesAHeadThatLoadsAsADraft) {
  c10::InferenceMode guard;
  const std::string dir = tmp_.Sub("head");
  const Result r = Specloop(
      {"draft", "init", "--target", Model("target-6m"), "--out", dir, "--warmup-tokens", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");  // the whole vocabulary (4096 <= 32000): nothing to warn about

  Draft draft;
  const Status s = LoadDraft(dir, *target_, LoadOptions(), &draft);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_NE(draft.head, nullptr);
  EXPECT_EQ(draft.model, nullptr);
  EXPECT_STREQ(draft.kind(), "eagle3");
  const Eagle3Head& head = *draft.head;
  EXPECT_EQ(head.config().aux_layers, DefaultAuxLayers(6));
  EXPECT_EQ(head.draft_vocab_size(), 4096);
  for (int d = 0; d < 4096; ++d) ASSERT_EQ(head.ToTarget(d), d);

  // The config round-trips: parsed and written again, the same text.
  const std::string text = ReadText(dir + "/config.json");
  Eagle3Config c;
  ASSERT_TRUE(Eagle3Config::FromJson(text, &c).ok());
  EXPECT_EQ(c.ToJson(), text);
  EXPECT_EQ(c.aux_layers, head.config().aux_layers);
  EXPECT_EQ(c.layer.torch_dtype, "float32");

  // What it printed is what it wrote.
  int64_t params = 0;
  for (const auto& [name, t] : head.NamedWeights()) {
    if (t.is_floating_point()) params += t.numel();
  }
  EXPECT_NE(r.out.find("aux layers: 1, 3, 5"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("draft vocabulary: 4096 of 4096"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("parameters: " + std::to_string(params) + " "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bytes: " + std::to_string(fs::file_size(dir + "/model.safetensors"))),
            std::string::npos)
      << r.out;
}

TEST_F(DraftCommand, DraftVocabularyIsTheMostFrequentIdsOfTheCorpus) {
  c10::InferenceMode guard;
  const std::string dir = tmp_.Sub("head");
  const std::string corpus = Corpus("python/valid.txt");
  const Result r = Specloop({"draft", "init", "--target", Model("target-6m"), "--out", dir,
                             "--draft-vocab", "2048", "--counts-from", corpus,
                             "--warmup-tokens", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto head = LoadHead(dir, *target_);

  // Counts of the file as the target's tokenizer encodes it.
  std::unique_ptr<Tokenizer> tok;
  ASSERT_TRUE(Tokenizer::Load(Model("target-6m"), &tok).ok());
  std::vector<int64_t> counts(4096, 0);
  const std::vector<int> ids = tok->Encode(ReadText(corpus));
  for (const int id : ids) counts[id]++;
  EXPECT_NE(r.out.find(std::to_string(ids.size()) + " tokens of 1 file"), std::string::npos)
      << r.out;

  const std::vector<int>& chosen = head->draft_to_target();
  ASSERT_EQ(chosen.size(), 2048u);
  std::vector<bool> in(4096, false);
  int64_t min_in = INT64_MAX, max_out = -1;
  for (size_t d = 0; d < chosen.size(); ++d) {
    if (d > 0) ASSERT_LT(chosen[d - 1], chosen[d]) << "ascending at " << d;
    in[chosen[d]] = true;
    min_in = std::min(min_in, counts[chosen[d]]);
  }
  for (int id = 0; id < 4096; ++id) {
    if (!in[id]) max_out = std::max(max_out, counts[id]);
  }
  EXPECT_GE(min_in, max_out) << "an id left out is more frequent than one chosen";
  EXPECT_GT(min_in, 0);
  EXPECT_NE(chosen.back(), 2047) << "not simply the lowest ids";
}

TEST_F(DraftCommand, DraftVocabularyFromABufferCountsOutputTokensOnly) {
  c10::InferenceMode guard;
  const std::string buffer_dir = tmp_.Sub("buffer");
  {
    std::unique_ptr<ReplayBuffer> buffer;
    ASSERT_TRUE(ReplayBuffer::Open(BufferOptions(), buffer_dir, &buffer).ok());
    std::vector<SequencedRecord> records;
    for (int i = 0; i < 5; ++i) {
      SequencedRecord s;
      s.seq = i + 1;
      s.record.time_us = 1000000 + i;
      s.record.domain = "python";
      s.record.request_id = "r" + std::to_string(i);
      s.record.prompt_len = 20;
      for (int j = 0; j < 20; ++j) s.record.tokens.push_back(3000 + j % 4);  // prompt: not counted
      for (int j = 0; j < 6; ++j) s.record.tokens.push_back(std::vector<int>{4001, 17, 4090}[j % 3]);
      records.push_back(s);
    }
    ASSERT_TRUE(buffer->Write(records, true).ok());
  }
  const std::string dir = tmp_.Sub("head");
  const Result r = Specloop({"draft", "init", "--target", Model("target-6m"), "--out", dir,
                             "--draft-vocab", "3", "--buffer", buffer_dir,
                             "--warmup-tokens", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("30 output tokens of 5 buffer record(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("covering 100.00%"), std::string::npos) << r.out;
  EXPECT_EQ(LoadHead(dir, *target_)->draft_to_target(), (std::vector<int>{17, 4001, 4090}));
}

TEST_F(DraftCommand, InitWithoutCountsTakesTheLowestIdsAndSaysSo) {
  c10::InferenceMode guard;
  const std::string dir = tmp_.Sub("head");
  const Result r = Specloop(
      {"draft", "init", "--target", Model("target-6m"), "--out", dir, "--draft-vocab", "100",
       "--warmup-tokens", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("warning"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("100 lowest ids"), std::string::npos) << r.err;
  const auto head = LoadHead(dir, *target_);
  ASSERT_EQ(head->draft_vocab_size(), 100);
  for (int d = 0; d < 100; ++d) EXPECT_EQ(head->ToTarget(d), d);
}

TEST_F(DraftCommand, InitRefusesNamingWhatIsWrong) {
  const std::string t = Model("target-6m"), out = tmp_.Sub("head");
  struct Case {
    std::vector<std::string> extra;
    std::string names;
  };
  fs::create_directories(tmp_.Sub("busy"));
  std::ofstream(tmp_.Sub("busy") + "/pytorch_model.bin") << "x";
  const std::vector<Case> cases = {
      {{"--kind", "medusa"}, "--kind medusa"},
      {{"--draft-vocab", "5000"}, "--draft-vocab 5000 outside 1..4096"},
      {{"--aux-layers", "1,3"}, "exactly 3"},
      {{"--aux-layers", "0,2,4"}, "layer 0 outside 1..5"},
      {{"--aux-layers", "1,3,6"}, "layer 6 outside 1..5"},
      {{"--aux-layers", "3,1,5"}, "ascending"},
      {{"--aux-layers", "1,x,5"}, "\"x\" is not a layer number"},
      {{"--counts-from", "/nonexistent/text.txt"}, "/nonexistent/text.txt"},
      {{"--counts-from", Corpus("c/valid.txt"), "--buffer", tmp_.Sub("b")}, "excludes"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"draft", "init", "--target", t, "--out", out};
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    const Result r = Specloop(args);
    EXPECT_NE(r.exit_code, 0) << c.names;
    EXPECT_NE((r.err + r.out).find(c.names), std::string::npos) << r.err << r.out;
    EXPECT_FALSE(fs::exists(out + "/model.safetensors")) << c.names;
  }
  const Result busy =
      Specloop({"draft", "init", "--target", t, "--out", tmp_.Sub("busy")});
  EXPECT_EQ(busy.exit_code, 1);
  EXPECT_NE(busy.err.find("busy/pytorch_model.bin"), std::string::npos) << busy.err;
  const Result not_a_model =
      Specloop({"draft", "init", "--target", tmp_.Sub("nothing"), "--out", out});
  EXPECT_EQ(not_a_model.exit_code, 1);
  EXPECT_NE(not_a_model.err.find("--target " + tmp_.Sub("nothing")), std::string::npos)
      << not_a_model.err;
}

// The exported layout against the published head's (the data file, not a copy): config keys,
// tensor names and dtypes, and each dimension the same expression of the config (h, 2h, 3h,
// H*D, KVH*D, F, V, Vd) as the published one. Two targets, so that h = H*D on one (target-6m)
// and H*D = 2h on the other (qwen3-target, 16 heads of 32 over 256) leave one reading.
TEST_F(DraftCommand, ExportMatchesThePublishedLayout) {
  c10::InferenceMode guard;
  const json data = json::parse(ReadText(SPECLOOP_EAGLE3_LAYOUT));
  const json& published = data["config"];
  Eagle3Config pub;
  ASSERT_TRUE(Eagle3Config::FromJson(published.dump(), &pub).ok());

  // Keys of the published config that an export leaves out, and why: none is read by vLLM's
  // or SGLang's EAGLE-3 loader or forward.
  const std::map<std::string, std::string> optional = {
      {"initializer_range", "the std of training's random init: no loader reads it"},
      {"pad_token_id", "no forward reads it; ModelConfig keeps none"},
      {"transformers_version", "the writer's metadata"},
      {"use_cache", "transformers' generate() flag; the servers keep their own caches"},
  };
  // Keys an export adds must be keys other published heads carry, or keys the data file notes
  // this head lacks (with the default the servers then take).
  std::set<std::string> other_keys;
  for (const json& o : data["others"]) {
    for (const auto& item : o["config"].items()) other_keys.insert(item.key());
  }
  const std::string source = data["source"];
  const size_t lacks = source.find("Note what it lacks:");
  ASSERT_NE(lacks, std::string::npos);
  const std::string lacking = source.substr(lacks, source.find("TENSORS:") - lacks);

  struct Exported {
    json config, tensors;
    Eagle3Config parsed;
  };
  std::vector<Exported> exports;
  for (const std::string& name : {std::string("target-6m"), std::string("zoo/qwen3-target")}) {
    const std::string head = tmp_.Sub(fs::path(name).filename().string() + "-head");
    const std::string out = tmp_.Sub(fs::path(name).filename().string() + "-export");
    Init(head, {"--draft-vocab", "1000", "--counts-from", Corpus("prose/valid.txt")}, Model(name));
    const Result r =
        Specloop({"draft", "export", "--draft", head, "--target", Model(name), "--out", out});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    Exported e;
    e.config = json::parse(ReadText(out + "/config.json"));
    e.tensors = SafetensorsHeader(out + "/model.safetensors");
    ASSERT_TRUE(Eagle3Config::FromJson(e.config.dump(), &e.parsed).ok());
    exports.push_back(e);
  }

  for (const Exported& e : exports) {
    for (const auto& item : published.items()) {
      EXPECT_TRUE(e.config.contains(item.key()) || optional.count(item.key()))
          << "published key " << item.key() << " missing from the export";
    }
    for (const auto& item : e.config.items()) {
      if (published.contains(item.key())) continue;
      EXPECT_TRUE(other_keys.count(item.key()) ||
                  lacking.find(item.key()) != std::string::npos)
          << "exported key " << item.key() << " is in no published config";
    }
    for (const char* key : {"architectures", "model_type", "num_hidden_layers",
                            "tie_word_embeddings", "torch_dtype", "hidden_act"}) {
      EXPECT_EQ(e.config[key], published[key]) << key;
    }
  }

  // Tensors: the same names and dtypes; shapes as the same expressions of the config.
  auto symbols = [](const Eagle3Config& c) {
    const int64_t h = c.layer.hidden_size;
    return std::map<std::string, int64_t>{
        {"h", h}, {"2h", 2 * h}, {"3h", 3 * h},
        {"H*D", int64_t{c.layer.num_attention_heads} * c.layer.head_dim},
        {"KVH*D", int64_t{c.layer.num_key_value_heads} * c.layer.head_dim},
        {"F", c.layer.intermediate_size}, {"V", c.layer.vocab_size},
        {"Vd", c.draft_vocab_size}};
  };
  const auto pub_symbols = symbols(pub);
  std::set<std::string> published_names;
  for (const json& t : data["tensors"]) {
    const std::string name = t["name"];
    published_names.insert(name);
    std::vector<std::set<std::string>> readings(t["shape"].size());
    for (size_t i = 0; i < readings.size(); ++i) {
      for (const auto& [sym, v] : pub_symbols) {
        if (v == t["shape"][i].get<int64_t>()) readings[i].insert(sym);
      }
    }
    for (const Exported& e : exports) {
      ASSERT_TRUE(e.tensors.contains(name)) << name << " missing from the export";
      const json& mine = e.tensors[name];
      EXPECT_EQ(mine["dtype"], t["dtype"]) << name;
      ASSERT_EQ(mine["shape"].size(), t["shape"].size()) << name;
      const auto my_symbols = symbols(e.parsed);
      for (size_t i = 0; i < readings.size(); ++i) {
        std::set<std::string> still;
        for (const std::string& sym : readings[i]) {
          if (my_symbols.at(sym) == mine["shape"][i].get<int64_t>()) still.insert(sym);
        }
        readings[i] = still;
      }
    }
    for (size_t i = 0; i < readings.size(); ++i) {
      EXPECT_FALSE(readings[i].empty())
          << name << " dimension " << i << ": no expression of the config fits both the "
          << "published head and the exports";
    }
  }
  for (const Exported& e : exports) {
    std::set<std::string> names;
    for (const auto& item : e.tensors.items()) names.insert(item.key());
    EXPECT_EQ(names, published_names);
  }
}

TEST_F(DraftCommand, ExportWithEmbeddingAddsTheTargetsEmbedding) {
  c10::InferenceMode guard;
  const std::string head = tmp_.Sub("head"), out = tmp_.Sub("export");
  Init(head);
  const Result r = Specloop({"draft", "export", "--draft", head, "--target", Model("target-6m"),
                             "--out", out, "--dtype", "bfloat16", "--with-embedding"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json header = SafetensorsHeader(out + "/model.safetensors");
  ASSERT_TRUE(header.contains("embed_tokens.weight"));
  EXPECT_EQ(header["embed_tokens.weight"]["dtype"], "BF16");
  EXPECT_EQ(header["embed_tokens.weight"]["shape"], json({4096, 256}));
  EXPECT_EQ(header["norm.weight"]["dtype"], "BF16");  // every float tensor, norms included
  EXPECT_EQ(json::parse(ReadText(out + "/config.json"))["torch_dtype"], "bfloat16");
  TensorMap w;
  ASSERT_TRUE(ReadSafetensors(out + "/model.safetensors", &w).ok());
  EXPECT_TRUE(at::equal(w["embed_tokens.weight"], target_->embedding().to(at::kBFloat16)));
}

// Greedy speculative decoding with `head` from two prompts per domain: the output equals plain
// greedy decoding; returns the tokens the head drafted and had accepted.
std::pair<int64_t, int64_t> DecodeGreedy(const LlamaModel& target, const Eagle3Head& head) {
  std::unique_ptr<Tokenizer> tok;
  EXPECT_TRUE(Tokenizer::Load(Model("target-6m"), &tok).ok());
  int64_t drafted = 0, accepted = 0;
  for (const char* domain : {"python", "prose"}) {
    std::ifstream f(testing::SharedDir() + "/prompts/" + domain + ".jsonl");
    std::string line;
    for (int i = 0; i < 2 && std::getline(f, line); ++i) {
      std::vector<int> prompt = {target.config().bos_token_id};
      for (const int id : tok->Encode(json::parse(line)["prompt"].get<std::string>())) {
        prompt.push_back(id);
      }
      SpeculativeOptions o;
      o.generate.max_tokens = 40;
      o.generate.sampling.temperature = 0;
      o.k = 4;
      FeatureDraftProposer proposer(&head, o.generate.sampling);
      SpeculativeStats stats;
      const GenerateResult spec = GenerateSpeculative(target, &proposer, prompt, o, &stats);
      EXPECT_EQ(spec.tokens, GeneratePlain(target, prompt, o.generate).tokens) << domain << i;
      drafted += stats.drafted;
      accepted += stats.accepted;
    }
  }
  return {drafted, accepted};
}

TEST_F(DraftCommand, ExportThenImportGivesTheSameHead) {
  c10::InferenceMode guard;
  const std::string t = Model("target-6m");
  const std::string head = tmp_.Sub("head");
  Init(head, {"--draft-vocab", "1024", "--counts-from", Corpus("prose/valid.txt")});
  for (const std::string dtype : {"float32", "float16"}) {
    const std::string e = tmp_.Sub("export-" + dtype), i = tmp_.Sub("import-" + dtype);
    Result r = Specloop({"draft", "export", "--draft", head, "--target", t, "--out", e,
                         "--dtype", dtype});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = Specloop({"draft", "import", "--from", e, "--target", t, "--out", i});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("weights " + dtype), std::string::npos) << r.out;
    EXPECT_EQ(json::parse(ReadText(i + "/config.json"))["torch_dtype"], "float32");
  }
  const auto original = LoadHead(head, *target_);
  const auto back32 = LoadHead(tmp_.Sub("import-float32"), *target_);
  const auto back16 = LoadHead(tmp_.Sub("import-float16"), *target_);
  ExpectSameWeights(*original, *back32, at::kFloat);
  ExpectSameWeights(*original, *back16, at::kHalf);
  EXPECT_EQ(back32->config().ToJson(), original->config().ToJson());

  const auto before = DecodeGreedy(*target_, *original);
  EXPECT_GT(before.second, 0) << "the initial head drafts nothing that is accepted";
  EXPECT_EQ(DecodeGreedy(*target_, *back32), before);  // the same drafts, token for token
  const auto after16 = DecodeGreedy(*target_, *back16);
  EXPECT_GT(after16.second, 0);
  std::cout << "greedy, initial head: " << before.second << " of " << before.first
            << " drafted accepted (float32 round trip the same); after float16: "
            << after16.second << " of " << after16.first << "\n";
}

// --warmup-tokens (trainer/head_warmup.h, tested there): the same flags write the same bytes,
// another seed or no warm-up other ones, and what it did is printed; bad values are refused.
TEST_F(DraftCommand, InitWarmsTheHeadUpDeterministically) {
  const std::string t = Model("target-6m");
  auto init = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> args = {"draft", "init", "--target", t, "--out", tmp_.Sub(name)};
    args.insert(args.end(), extra.begin(), extra.end());
    return Specloop(args);
  };
  const Result a = init("a", {"--warmup-tokens", "300"});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_NE(a.out.find("warm-up: 300 tokens in "), std::string::npos) << a.out;
  ASSERT_EQ(init("b", {"--warmup-tokens", "300"}).exit_code, 0);
  ASSERT_EQ(init("seed2", {"--warmup-tokens", "300", "--seed", "2"}).exit_code, 0);
  const Result bare = init("bare", {"--warmup-tokens", "0"});
  ASSERT_EQ(bare.exit_code, 0) << bare.err;
  EXPECT_EQ(bare.out.find("warm"), std::string::npos) << bare.out;
  const std::string weights = ReadText(tmp_.Sub("a") + "/model.safetensors");
  EXPECT_EQ(weights, ReadText(tmp_.Sub("b") + "/model.safetensors"));
  EXPECT_NE(weights, ReadText(tmp_.Sub("seed2") + "/model.safetensors"));
  EXPECT_NE(weights, ReadText(tmp_.Sub("bare") + "/model.safetensors"));
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--warmup-tokens", "-1"}, {"--threads", "0"}}) {
    const Result r = init("refused", {flag, value});
    EXPECT_EQ(r.exit_code, 1) << flag;
    EXPECT_NE(r.err.find(flag + " " + value), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(tmp_.Sub("refused") + "/model.safetensors"));
  }
}

// A head whose every float tensor is perturbed, so that no tensor equals its initial value.
std::unique_ptr<Eagle3Head> Noisy(const Eagle3Head& head, const LlamaModel& target) {
  at::manual_seed(5);
  TensorMap w;
  for (const auto& [name, t] : head.NamedWeights()) {
    w[name] = t.is_floating_point() ? t + at::randn(t.sizes()) * 0.05 : t;
  }
  std::unique_ptr<Eagle3Head> out;
  const Status s = Eagle3Head::FromTensors(head.config(), w, target, LoadOptions(), &out);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return out;
}

void WriteHead(const std::string& dir, const json& config,
               const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << config.dump(2);
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
}

TEST_F(DraftCommand, ImportsSGLangAndVllmForms) {
  c10::InferenceMode guard;
  const std::string t = Model("target-6m");
  Init(tmp_.Sub("init"), {"--draft-vocab", "1000", "--counts-from", Corpus("c/valid.txt")});
  const auto original = Noisy(*LoadHead(tmp_.Sub("init"), *target_), *target_);
  const json native = json::parse(original->config().ToJson());

  // SGLang / SpecForge: aux ids only in eagle_config, `model.`-prefixed names, the target's
  // embedding carried, bfloat16, and the keys published configs carry.
  json sglang = native;
  sglang.erase("eagle_aux_hidden_state_layer_ids");
  sglang["torch_dtype"] = "bfloat16";
  sglang["initializer_range"] = 0.02;
  sglang["use_cache"] = true;
  sglang["transformers_version"] = "4.57.0";
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, w] : original->NamedWeights()) {
    tensors.emplace_back(name == "lm_head.weight" ? name : "model." + name,
                         w.is_floating_point() ? w.to(at::kBFloat16) : w);
  }
  tensors.emplace_back("model.embed_tokens.weight", target_->embedding().to(at::kBFloat16));
  WriteHead(tmp_.Sub("sglang"), sglang, tensors);
  Result r = Specloop({"draft", "import", "--from", tmp_.Sub("sglang"), "--target", t, "--out",
                       tmp_.Sub("from-sglang")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("aux layer ids SGLang"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("embed_tokens equal to the target's (bfloat16)"), std::string::npos)
      << r.out;
  const auto from_sglang = LoadHead(tmp_.Sub("from-sglang"), *target_);
  ExpectSameWeights(*original, *from_sglang, at::kBFloat16);
  EXPECT_EQ(from_sglang->config().aux_layers, original->config().aux_layers);

  // vLLM's renamed form: its class name, aux ids only at the top level, `model.layers.0.`,
  // `model.fc`, `model.norm`, d2t as draft_id_to_target_id, no t2d; float32.
  json vllm = native;
  vllm.erase("eagle_config");
  vllm["architectures"] = {"Eagle3LlamaForCausalLM"};
  tensors.clear();
  for (const auto& [name, w] : original->NamedWeights()) {
    if (name == "t2d") continue;
    std::string n = name == "d2t" ? "draft_id_to_target_id" : name;
    if (n.rfind("midlayer.", 0) == 0) n = "layers.0." + n.substr(9);
    if (n != "lm_head.weight" && n != "draft_id_to_target_id") n = "model." + n;
    tensors.emplace_back(n, w);
  }
  WriteHead(tmp_.Sub("vllm"), vllm, tensors);
  r = Specloop({"draft", "import", "--from", tmp_.Sub("vllm"), "--target", t, "--out",
                tmp_.Sub("from-vllm")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("aux layer ids vLLM;"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("d2t (t2d rebuilt)"), std::string::npos) << r.out;
  ExpectSameWeights(*original, *LoadHead(tmp_.Sub("from-vllm"), *target_), at::kFloat);

  // Only t2d, bare names: d2t rebuilt.
  tensors.clear();
  for (const auto& [name, w] : original->NamedWeights()) {
    if (name != "d2t") tensors.emplace_back(name, w);
  }
  WriteHead(tmp_.Sub("t2d-only"), native, tensors);
  r = Specloop({"draft", "import", "--from", tmp_.Sub("t2d-only"), "--target", t, "--out",
                tmp_.Sub("from-t2d")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpectSameWeights(*original, *LoadHead(tmp_.Sub("from-t2d"), *target_), at::kFloat);
}

TEST_F(DraftCommand, ImportRefusesNamingWhatIsWrong) {
  c10::InferenceMode guard;
  const std::string t = Model("target-6m");
  Init(tmp_.Sub("init"));
  const auto head = LoadHead(tmp_.Sub("init"), *target_);
  const json config = json::parse(head->config().ToJson());
  std::vector<std::pair<std::string, at::Tensor>> base = head->NamedWeights();
  base.emplace_back("embed_tokens.weight", target_->embedding().clone());

  auto expect_refused = [&](const std::string& from, const std::string& target,
                            std::vector<std::string> names) {
    const std::string out = tmp_.Sub("out");
    const Result r = Specloop({"draft", "import", "--from", from, "--target", target, "--out", out});
    EXPECT_EQ(r.exit_code, 1) << from;
    for (const std::string& n : names) {
      EXPECT_NE(r.err.find(n), std::string::npos) << "no \"" << n << "\" in: " << r.err;
    }
    EXPECT_FALSE(fs::exists(out + "/model.safetensors")) << from;
  };

  auto with = [&](auto edit) {
    auto tensors = base;
    edit(&tensors);
    return tensors;
  };
  WriteHead(tmp_.Sub("embedding"), config, with([](auto* w) {
              at::Tensor e = w->back().second.clone();
              e[7][3] += 0.5;
              w->back().second = e;
            }));
  expect_refused(tmp_.Sub("embedding"), t,
                 {"embed_tokens.weight differs from the target's embedding", "1 of 4096 rows"});

  WriteHead(tmp_.Sub("missing"), config, with([](auto* w) {
              w->erase(std::remove_if(w->begin(), w->end(),
                                      [](auto& p) { return p.first == "midlayer.mlp.up_proj.weight"; }),
                       w->end());
            }));
  expect_refused(tmp_.Sub("missing"), t, {"missing tensor midlayer.mlp.up_proj.weight"});

  WriteHead(tmp_.Sub("shape"), config, with([](auto* w) {
              for (auto& [name, x] : *w) {
                if (name == "fc.weight") x = x.narrow(1, 0, 512).contiguous();
              }
            }));
  expect_refused(tmp_.Sub("shape"), t, {"fc.weight has shape [256, 512], expected [256, 768]"});

  WriteHead(tmp_.Sub("twice"), config, with([](auto* w) {
              w->emplace_back("model.fc.weight", w->front().second);
            }));
  expect_refused(tmp_.Sub("twice"), t, {"fc.weight and model.fc.weight are both fc.weight"});

  fs::create_directories(tmp_.Sub("pickle"));
  std::ofstream(tmp_.Sub("pickle") + "/config.json") << config.dump();
  std::ofstream(tmp_.Sub("pickle") + "/pytorch_model.bin") << "not read";
  expect_refused(tmp_.Sub("pickle"), t, {"pickle/pytorch_model.bin", "convert", "safetensors"});

  json plain = config;  // as EAGLE's own training code names the architecture
  plain["architectures"] = {"LlamaForCausalLM"};
  WriteHead(tmp_.Sub("plain"), plain, base);
  expect_refused(tmp_.Sub("plain"), t, {"LlamaForCausalLMEagle3", "set \"architectures\""});

  // A head carrying target-6m's embedding against another target of the same vocabulary and
  // width (without the embedding nothing tells the two apart: the head's layer shape is its
  // own), and a head against a narrower target.
  WriteHead(tmp_.Sub("other"), config, base);
  expect_refused(tmp_.Sub("other"), Model("zoo/qwen3-target"),
                 {"embed_tokens.weight differs from the target's embedding"});
  expect_refused(tmp_.Sub("other"), Model("draft-mix-1m"),
                 {"embed_tokens.weight has shape [4096, 256], the target's embedding [4096, 128]"});
  WriteHead(tmp_.Sub("bare"), config, head->NamedWeights());
  expect_refused(tmp_.Sub("bare"), Model("draft-mix-1m"),
                 {"width 3 x 256, its target has hidden_size 128"});

  expect_refused(tmp_.Sub("nowhere"), t, {"nowhere: not a directory"});
}

TEST_F(DraftCommand, ExportRefusesNamingWhatIsWrong) {
  const std::string t = Model("target-6m"), head = tmp_.Sub("head");
  Init(head);
  Result r = Specloop({"draft", "export", "--draft", head, "--target", t, "--out", tmp_.Sub("e"),
                       "--dtype", "int8"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("dtype \"int8\""), std::string::npos) << r.err;
  r = Specloop({"draft", "export", "--draft", t, "--target", t, "--out", tmp_.Sub("e")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("LlamaForCausalLMEagle3"), std::string::npos) << r.err;
  fs::create_directories(tmp_.Sub("busy"));
  std::ofstream(tmp_.Sub("busy") + "/model.safetensors.index.json") << "{}";
  r = Specloop({"draft", "export", "--draft", head, "--target", t, "--out", tmp_.Sub("busy")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("busy/model.safetensors.index.json"), std::string::npos) << r.err;
  r = Specloop({"draft", "export", "--draft", head, "--target", Model("draft-mix-1m"), "--out",
                tmp_.Sub("e")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--draft " + head), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("its target has hidden_size 128"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp_.Sub("e") + "/model.safetensors"));
}

}  // namespace
}  // namespace specloop
