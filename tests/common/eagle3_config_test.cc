// An EAGLE-3 head's config.json (common/model/eagle3_config.h): published heads' configs parse
// to the values they state (tests/common/data/eagle3_published_layout.json, whose "source"
// fields say where each came from), the tensor layout a parsed config implies is the published
// one, ToJson round-trips and writes the aux layers in both servers' forms, each refusal names
// its cause, DefaultAuxLayers, IsEagle3Dir and FromDir.
#include "common/model/eagle3_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/testing/temp_dir.h"

namespace specloop {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

const ordered_json& Layout() {
  static const ordered_json layout = [] {
    std::ifstream in(SPECLOOP_EAGLE3_LAYOUT);
    std::stringstream ss;
    ss << in.rdbuf();
    return ordered_json::parse(ss.str());
  }();
  return layout;
}

const ordered_json& Other(const std::string& name) {
  for (const ordered_json& o : Layout()["others"]) {
    if (o["name"] == name) return o["config"];
  }
  ADD_FAILURE() << "no published config " << name;
  static const ordered_json none;
  return none;
}

Eagle3Config Parse(const std::string& text) {
  Eagle3Config c;
  const Status s = Eagle3Config::FromJson(text, &c);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return c;
}

// The Llama 3.1 8B head's config with `edit` applied (keys set, or erased when null).
std::string Llama31With(const ordered_json& edit) {
  ordered_json j = Layout()["config"];
  for (const auto& item : edit.items()) {
    if (item.value().is_null()) {
      j.erase(item.key());
    } else {
      j[item.key()] = item.value();
    }
  }
  return j.dump();
}

// Expects FromJson to refuse `text` with `code`, its message naming `cause`.
void ExpectRefused(const std::string& text, Status::Code code, const std::string& cause) {
  Eagle3Config c;
  const Status s = Eagle3Config::FromJson(text, &c);
  ASSERT_FALSE(s.ok()) << "accepted: " << text;
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(cause), std::string::npos) << s.ToString() << " lacks " << cause;
}

TEST(Eagle3ConfigTest, PublishedLlama31HeadParses) {
  const Eagle3Config c = Parse(Layout()["config"].dump());
  EXPECT_EQ(c.layer.model_type, "llama");
  EXPECT_EQ(c.layer.num_hidden_layers, 1);
  EXPECT_EQ(c.layer.hidden_size, 4096);
  EXPECT_EQ(c.layer.intermediate_size, 14336);
  EXPECT_EQ(c.layer.num_attention_heads, 32);
  EXPECT_EQ(c.layer.num_key_value_heads, 8);
  EXPECT_EQ(c.layer.head_dim, 128);
  EXPECT_EQ(c.layer.vocab_size, 128256);
  EXPECT_EQ(c.layer.max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(c.layer.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.layer.rope_theta, 10000.0);  // absent: EAGLE's rotary base
  EXPECT_EQ(c.layer.rope_scaling.type, "");
  EXPECT_EQ(c.layer.bos_token_id, 128000);
  EXPECT_EQ(c.layer.eos_token_ids, std::vector<int>({128001}));
  EXPECT_EQ(c.layer.torch_dtype, "float16");
  EXPECT_FALSE(c.layer.tie_word_embeddings);
  EXPECT_EQ(c.draft_vocab_size, 32000);
  EXPECT_EQ(c.target_hidden_size, 4096);  // absent: hidden_size
  EXPECT_TRUE(c.aux_layers.empty());      // absent: the loader's DefaultAuxLayers(32)
  EXPECT_FALSE(c.norm_before_residual);
}

TEST(Eagle3ConfigTest, PublishedSpecForgeHeadReadsEagleConfigIdsAsOutputsOfLayers) {
  // eagle_config [2, 30, 58] in SGLang's form: the outputs of those layers, the inputs of
  // layers 3, 31, 59.
  const Eagle3Config c = Parse(Other("Kimi-K2-Instruct-eagle3").dump());
  EXPECT_EQ(c.aux_layers, std::vector<int>({3, 31, 59}));
  EXPECT_EQ(c.layer.hidden_size, 7168);
  EXPECT_EQ(c.layer.head_dim, 128);  // given: 64 heads x 128 = 8192, not hidden_size
  EXPECT_EQ(c.layer.num_key_value_heads, 64);
  EXPECT_EQ(c.layer.torch_dtype, "bfloat16");  // from "dtype"
  EXPECT_DOUBLE_EQ(c.layer.rope_theta, 1e6);
  EXPECT_EQ(c.layer.max_position_embeddings, 131072);
  EXPECT_EQ(c.layer.sliding_window, 0);
  EXPECT_EQ(c.draft_vocab_size, 32000);
  EXPECT_EQ(c.layer.vocab_size, 163840);
}

TEST(Eagle3ConfigTest, PublishedReducedVocabularyHeadParses) {
  const Eagle3Config c = Parse(Other("eagle3_for_MiniCPM4").dump());
  EXPECT_EQ(c.draft_vocab_size, 15000);
  EXPECT_EQ(c.layer.vocab_size, 73448);
  EXPECT_EQ(c.layer.num_key_value_heads, 2);
  EXPECT_TRUE(c.aux_layers.empty());
}

TEST(Eagle3ConfigTest, PublishedManyLayerHeadIsRefusedAsSGLangRefusesIt) {
  ExpectRefused(Other("avibe-eagle").dump(), Status::Code::kNotSupported, "num_hidden_layers 36");
}

// The tensors a checkpoint of config `c` holds under their LlamaForCausalLMEagle3 names
// (embed_tokens aside: the target's, absent from EAGLE's own checkpoints): name -> (shape,
// safetensors dtype).
std::map<std::string, std::pair<std::vector<int64_t>, std::string>> HeadTensors(
    const Eagle3Config& c) {
  const ModelConfig& l = c.layer;
  const int64_t h = l.hidden_size, q = int64_t{l.num_attention_heads} * l.head_dim,
                kv = int64_t{l.num_key_value_heads} * l.head_dim, f = l.intermediate_size;
  const std::string t = l.torch_dtype == "float16"    ? "F16"
                        : l.torch_dtype == "bfloat16" ? "BF16"
                                                      : "F32";
  return {
      {"fc.weight", {{h, 3 * int64_t{c.target_hidden_size}}, t}},
      {"midlayer.self_attn.q_proj.weight", {{q, 2 * h}, t}},
      {"midlayer.self_attn.k_proj.weight", {{kv, 2 * h}, t}},
      {"midlayer.self_attn.v_proj.weight", {{kv, 2 * h}, t}},
      {"midlayer.self_attn.o_proj.weight", {{h, q}, t}},
      {"midlayer.mlp.gate_proj.weight", {{f, h}, t}},
      {"midlayer.mlp.up_proj.weight", {{f, h}, t}},
      {"midlayer.mlp.down_proj.weight", {{h, f}, t}},
      {"midlayer.input_layernorm.weight", {{h}, t}},
      {"midlayer.hidden_norm.weight", {{h}, t}},
      {"midlayer.post_attention_layernorm.weight", {{h}, t}},
      {"norm.weight", {{h}, t}},
      {"lm_head.weight", {{c.draft_vocab_size, h}, t}},
      {"d2t", {{c.draft_vocab_size}, "I64"}},
      {"t2d", {{l.vocab_size}, "BOOL"}},
  };
}

TEST(Eagle3ConfigTest, PublishedTensorLayoutIsTheOneItsConfigImplies) {
  const Eagle3Config c = Parse(Layout()["config"].dump());
  std::map<std::string, std::pair<std::vector<int64_t>, std::string>> published;
  for (const ordered_json& t : Layout()["tensors"]) {
    const bool fresh = published
                           .emplace(t["name"].get<std::string>(),
                                    std::make_pair(t["shape"].get<std::vector<int64_t>>(),
                                                   t["dtype"].get<std::string>()))
                           .second;
    EXPECT_TRUE(fresh) << t["name"] << " listed twice";
  }
  EXPECT_EQ(published, HeadTensors(c));
  // The numbers themselves, for a reader: fc fuses 3 x 4096, attention reads 2 x 4096.
  EXPECT_EQ(published["fc.weight"].first, std::vector<int64_t>({4096, 12288}));
  EXPECT_EQ(published["midlayer.self_attn.q_proj.weight"].first,
            std::vector<int64_t>({4096, 8192}));
  EXPECT_EQ(published["lm_head.weight"].first, std::vector<int64_t>({32000, 4096}));
  EXPECT_EQ(published["t2d"].first, std::vector<int64_t>({128256}));
}

void ExpectSame(const Eagle3Config& a, const Eagle3Config& b) {
  EXPECT_EQ(a.layer.vocab_size, b.layer.vocab_size);
  EXPECT_EQ(a.layer.hidden_size, b.layer.hidden_size);
  EXPECT_EQ(a.layer.intermediate_size, b.layer.intermediate_size);
  EXPECT_EQ(a.layer.num_hidden_layers, b.layer.num_hidden_layers);
  EXPECT_EQ(a.layer.num_attention_heads, b.layer.num_attention_heads);
  EXPECT_EQ(a.layer.num_key_value_heads, b.layer.num_key_value_heads);
  EXPECT_EQ(a.layer.head_dim, b.layer.head_dim);
  EXPECT_EQ(a.layer.max_position_embeddings, b.layer.max_position_embeddings);
  EXPECT_EQ(a.layer.max_model_len, b.layer.max_model_len);
  EXPECT_EQ(a.layer.rms_norm_eps, b.layer.rms_norm_eps);
  EXPECT_EQ(a.layer.rope_theta, b.layer.rope_theta);
  EXPECT_EQ(a.layer.rope_scaling.type, b.layer.rope_scaling.type);
  EXPECT_EQ(a.layer.rope_scaling.factor, b.layer.rope_scaling.factor);
  EXPECT_EQ(a.layer.bos_token_id, b.layer.bos_token_id);
  EXPECT_EQ(a.layer.eos_token_ids, b.layer.eos_token_ids);
  EXPECT_EQ(a.layer.torch_dtype, b.layer.torch_dtype);
  EXPECT_EQ(a.draft_vocab_size, b.draft_vocab_size);
  EXPECT_EQ(a.target_hidden_size, b.target_hidden_size);
  EXPECT_EQ(a.aux_layers, b.aux_layers);
  EXPECT_EQ(a.norm_before_residual, b.norm_before_residual);
}

TEST(Eagle3ConfigTest, ToJsonRoundTripsAndWritesBothServersForms) {
  Eagle3Config c = Parse(Llama31With({{"rope_theta", 500000.0},
                                      {"rope_scaling",
                                       {{"rope_type", "llama3"},
                                        {"factor", 8.0},
                                        {"low_freq_factor", 1.0},
                                        {"high_freq_factor", 4.0},
                                        {"original_max_position_embeddings", 8192}}},
                                      {"eos_token_id", {128001, 128008, 128009}},
                                      {"norm_before_residual", true}}));
  c.aux_layers = DefaultAuxLayers(32);
  const std::string text = c.ToJson();
  ExpectSame(Parse(text), c);

  const json j = json::parse(text);
  EXPECT_EQ(j["architectures"], json({"LlamaForCausalLMEagle3"}));
  EXPECT_EQ(j["num_hidden_layers"], 1);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["draft_vocab_size"], 32000);
  EXPECT_EQ(j["target_hidden_size"], 4096);
  EXPECT_EQ(j["norm_before_residual"], true);
  // vLLM: the inputs of layers 2, 16, 29; SGLang: the outputs of layers 1, 15, 28.
  EXPECT_EQ(j["eagle_aux_hidden_state_layer_ids"], json({2, 16, 29}));
  EXPECT_EQ(j["eagle_config"]["eagle_aux_hidden_state_layer_ids"], json({1, 15, 28}));
  EXPECT_EQ(j["eagle_config"]["use_aux_hidden_state"], true);

  // The published configs round-trip too, and a head without aux ids writes none.
  for (const ordered_json& o :
       {Layout()["config"], Other("Kimi-K2-Instruct-eagle3"), Other("eagle3_for_MiniCPM4")}) {
    const Eagle3Config p = Parse(o.dump());
    ExpectSame(Parse(p.ToJson()), p);
  }
  const json bare = json::parse(Parse(Layout()["config"].dump()).ToJson());
  EXPECT_FALSE(bare.contains("eagle_aux_hidden_state_layer_ids"));
  EXPECT_FALSE(bare["eagle_config"].contains("eagle_aux_hidden_state_layer_ids"));
}

TEST(Eagle3ConfigTest, ReadsEitherFormAndBothWhenTheyAgree) {
  EXPECT_EQ(Parse(Llama31With({{"eagle_aux_hidden_state_layer_ids", {2, 16, 29}}})).aux_layers,
            std::vector<int>({2, 16, 29}));
  EXPECT_EQ(
      Parse(Llama31With({{"eagle_config", {{"eagle_aux_hidden_state_layer_ids", {1, 15, 28}}}}}))
          .aux_layers,
      std::vector<int>({2, 16, 29}));
  EXPECT_EQ(Parse(Llama31With({{"eagle_aux_hidden_state_layer_ids", {2, 16, 29}},
                               {"eagle_config",
                                {{"eagle_aux_hidden_state_layer_ids", {1, 15, 28}},
                                 {"use_aux_hidden_state", true}}}}))
                .aux_layers,
            std::vector<int>({2, 16, 29}));
  // An SGLang id 0 is the output of layer 0: the input of layer 1.
  EXPECT_EQ(
      Parse(Llama31With({{"eagle_config", {{"eagle_aux_hidden_state_layer_ids", {0, 2, 4}}}}}))
          .aux_layers,
      std::vector<int>({1, 3, 5}));
}

TEST(Eagle3ConfigTest, AcceptsVllmsArchitectureSpellingAndNullDefaults) {
  EXPECT_EQ(Parse(Llama31With({{"architectures", {"Eagle3LlamaForCausalLM"}}})).draft_vocab_size,
            32000);
  const Eagle3Config c = Parse(Llama31With({{"draft_vocab_size", nullptr}}));
  EXPECT_EQ(c.draft_vocab_size, 128256);  // absent: the target's vocabulary
  const std::string explicit_nulls = [] {
    ordered_json j = Layout()["config"];
    j["draft_vocab_size"] = nullptr;
    j["target_hidden_size"] = nullptr;
    j["sliding_window"] = nullptr;
    return j.dump();
  }();
  const Eagle3Config n = Parse(explicit_nulls);
  EXPECT_EQ(n.draft_vocab_size, 128256);
  EXPECT_EQ(n.target_hidden_size, 4096);
}

TEST(Eagle3ConfigTest, EachRefusalNamesItsCause) {
  using C = Status::Code;
  ExpectRefused("not json", C::kInvalidArgument, "not a JSON object");
  ExpectRefused(Llama31With({{"fc_norm", true}}), C::kNotSupported, "\"fc_norm\"");
  ExpectRefused(Llama31With({{"num_hidden_layers", 2}}), C::kNotSupported, "num_hidden_layers 2");
  ExpectRefused(Llama31With({{"tie_word_embeddings", true}}), C::kNotSupported,
                "tie_word_embeddings");
  ExpectRefused(Llama31With({{"draft_vocab_size", 128257}}), C::kInvalidArgument,
                "draft_vocab_size 128257");
  ExpectRefused(Llama31With({{"draft_vocab_size", 0}}), C::kInvalidArgument, "draft_vocab_size 0");
  ExpectRefused(Llama31With({{"eagle_aux_hidden_state_layer_ids", {2, 16}}}), C::kNotSupported,
                "lists 2 layers");
  ExpectRefused(Llama31With({{"eagle_aux_hidden_state_layer_ids", {2, 8, 16, 29}}}),
                C::kNotSupported, "lists 4 layers");
  ExpectRefused(Llama31With({{"eagle_aux_hidden_state_layer_ids", {2, 16, 16}}}),
                C::kInvalidArgument, "layer 16 twice");
  ExpectRefused(Llama31With({{"eagle_aux_hidden_state_layer_ids", {-1, 16, 29}}}),
                C::kInvalidArgument, "layer -1 is negative");
  ExpectRefused(
      Llama31With({{"eagle_config", {{"eagle_aux_hidden_state_layer_ids", {-1, 15, 28}}}}}),
      C::kInvalidArgument, "layer -1 is negative");
  ExpectRefused(
      Llama31With({{"eagle_config", {{"eagle_aux_hidden_state_layer_ids", {1, 2, 2147483647}}}}}),
      C::kInvalidArgument, "layer 2147483647 is out of range");  // + 1 would overflow
  ExpectRefused(Llama31With({{"eagle_aux_hidden_state_layer_ids", {0, 16, 29}}}),
                C::kInvalidArgument, "layer 0 would be the embedding");
  ExpectRefused(Llama31With({{"eagle_aux_hidden_state_layer_ids", {29, 2, 16}}}),
                C::kInvalidArgument, "ascending");
  ExpectRefused(Llama31With({{"eagle_aux_hidden_state_layer_ids", {2, "16", 29}}}),
                C::kInvalidArgument, "non-integer");
  ExpectRefused(
      Llama31With({{"eagle_aux_hidden_state_layer_ids", {2, 16, 29}},
                   {"eagle_config", {{"eagle_aux_hidden_state_layer_ids", {2, 16, 29}}}}}),
      C::kInvalidArgument, "name different layers");
  ExpectRefused(Llama31With({{"eagle_config", {{"use_aux_hidden_state", false}}}}),
                C::kNotSupported, "use_aux_hidden_state false");
  ExpectRefused(Llama31With({{"eagle_config", {{"num_aux", 3}}}}), C::kNotSupported,
                "eagle_config key \"num_aux\"");
  ExpectRefused(Llama31With({{"architectures", {"LlamaForCausalLM"}}}), C::kNotSupported,
                "LlamaForCausalLMEagle3");
  ExpectRefused(Llama31With({{"architectures", nullptr}}), C::kNotSupported, "absent");
  ExpectRefused(Llama31With({{"model_type", "qwen3"}}), C::kNotSupported, "model_type \"qwen3\"");
  ExpectRefused(Llama31With({{"target_hidden_size", 8192}}), C::kNotSupported,
                "target_hidden_size 8192");
  ExpectRefused(Llama31With({{"sliding_window", 4096}}), C::kNotSupported, "sliding_window 4096");
  ExpectRefused(Llama31With({{"use_sliding_window", true}}), C::kNotSupported,
                "use_sliding_window");
  ExpectRefused(Llama31With({{"norm_before_residual", "yes"}}), C::kInvalidArgument,
                "norm_before_residual");
  ExpectRefused(Llama31With({{"attention_bias", true}}), C::kNotSupported, "attention_bias");
  ExpectRefused(Llama31With({{"hidden_size", nullptr}}), C::kInvalidArgument, "hidden_size");
}

TEST(Eagle3ConfigTest, DefaultAuxLayers) {
  EXPECT_EQ(DefaultAuxLayers(32), std::vector<int>({2, 16, 29}));  // EAGLE's, vLLM's, SGLang's
  EXPECT_EQ(DefaultAuxLayers(80), std::vector<int>({2, 40, 77}));
  EXPECT_EQ(DefaultAuxLayers(7), std::vector<int>({2, 3, 4}));
  EXPECT_EQ(DefaultAuxLayers(6), std::vector<int>({1, 3, 5}));  // (2, 3, 3) would repeat
  EXPECT_EQ(DefaultAuxLayers(4), std::vector<int>({1, 2, 3}));
  EXPECT_TRUE(DefaultAuxLayers(3).empty());
  EXPECT_TRUE(DefaultAuxLayers(0).empty());
  for (int layers = 4; layers <= 200; ++layers) {  // each default is one FromJson accepts
    Eagle3Config c = Parse(Layout()["config"].dump());
    c.aux_layers = DefaultAuxLayers(layers);
    ASSERT_EQ(c.aux_layers.size(), 3u) << layers;
    EXPECT_LT(c.aux_layers.back(), layers);
    ExpectSame(Parse(c.ToJson()), c);
  }
}

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(Eagle3ConfigTest, IsEagle3DirAndFromDir) {
  testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  EXPECT_FALSE(IsEagle3Dir(tmp.path()));  // no config.json

  WriteFile(tmp.Sub("config.json"), Layout()["config"].dump());
  EXPECT_TRUE(IsEagle3Dir(tmp.path()));
  Eagle3Config c;
  ASSERT_TRUE(Eagle3Config::FromDir(tmp.path(), &c).ok());
  EXPECT_EQ(c.draft_vocab_size, 32000);

  WriteFile(tmp.Sub("config.json"), Llama31With({{"architectures", {"Eagle3LlamaForCausalLM"}}}));
  EXPECT_TRUE(IsEagle3Dir(tmp.path()));

  // A plain model (the original yuhuili file says LlamaForCausalLM too) is not a head.
  WriteFile(tmp.Sub("config.json"), Llama31With({{"architectures", {"LlamaForCausalLM"}}}));
  EXPECT_FALSE(IsEagle3Dir(tmp.path()));
  const Status s = Eagle3Config::FromDir(tmp.path(), &c);
  EXPECT_EQ(s.code(), Status::Code::kNotSupported) << s.ToString();
  EXPECT_NE(s.message().find(tmp.Sub("config.json")), std::string::npos) << s.ToString();

  WriteFile(tmp.Sub("config.json"), "{\"architectures\": [\"LlamaForCausalLMEagle3\"");
  EXPECT_FALSE(IsEagle3Dir(tmp.path()));
  WriteFile(tmp.Sub("config.json"), "[\"LlamaForCausalLMEagle3\"]");
  EXPECT_FALSE(IsEagle3Dir(tmp.path()));

  const Status missing = Eagle3Config::FromDir(tmp.Sub("absent"), &c);
  EXPECT_TRUE(missing.IsNotFound()) << missing.ToString();
}

}  // namespace
}  // namespace specloop
