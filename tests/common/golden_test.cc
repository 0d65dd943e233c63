// Reference outputs from outside implementations:
// - stories260K (llama2.c format): `specloop convert llama2c`, then greedy decoding, must give
//   llama2.c run.c's own prompt ids and generated ids, token for token.
// - target-6m: the PyTorch training implementation's greedy ids and top-5 log-probs (1e-4).
// - target-wide-46m: a float64 reference forward's, in float32 and with float16 weights.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <fstream>

#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "common/engine/generate.h"
#include "common/model/llama2c_convert.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/common/test_models.h"

namespace specloop {
namespace {

using nlohmann::json;

std::vector<json> ReadJsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> rows;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) rows.push_back(json::parse(line));
  }
  return rows;
}

std::string Stories260K() { return testing::SharedDir() + "/models/stories260K"; }

// Converts once per test binary.
std::string ConvertedStories() {
  static const std::string out = [] {
    std::string dir = ::testing::TempDir() + "/stories260K-hf";
    Status s = ConvertLlama2c(Stories260K() + "/stories260K.bin", Stories260K() + "/tok512.bin", dir);
    if (!s.ok()) throw std::runtime_error(s.ToString());
    return dir;
  }();
  return out;
}

TEST(Golden, Stories260KMatchesLlama2c) {
  c10::InferenceMode guard;
  const std::string dir = ConvertedStories();
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tok;
  ASSERT_TRUE(LlamaModel::Load(dir, LoadOptions(), &model).ok());
  ASSERT_TRUE(Tokenizer::Load(dir, &tok).ok());
  auto rows = ReadJsonl(Stories260K() + "/golden-greedy.jsonl");
  ASSERT_GE(rows.size(), 3u);
  for (const json& g : rows) {
    const std::string prompt = g["prompt"];
    std::vector<int> ids = tok->Encode(prompt);
    EXPECT_EQ(ids, g["prompt_tokens"].get<std::vector<int>>()) << prompt;
    ids.insert(ids.begin(), model->config().bos_token_id);
    auto expected = g["generated"].get<std::vector<int>>();
    GenerateOptions opt;
    opt.sampling.temperature = 0;
    opt.max_tokens = expected.size();
    opt.stop_at_eos = false;  // run.c stops only on BOS
    GenerateResult r = GeneratePlain(*model, ids, opt);
    EXPECT_EQ(r.tokens, expected) << prompt;
    // run.c prints the prompt and continuation, decoding each id after its predecessor.
    std::vector<int> all(ids.begin() + 1, ids.end());
    all.insert(all.end(), r.tokens.begin(), r.tokens.end());
    // (The golden text was saved without its trailing newline.)
    std::string text = tok->Decode(all, model->config().bos_token_id);
    while (!text.empty() && text.back() == '\n') text.pop_back();
    EXPECT_EQ(text, g["text"].get<std::string>());
  }
}

TEST(Golden, Stories260KThroughTheCommandLine) {
  // The same check through the user's path: `specloop convert` then `specloop generate --json`.
  const std::string dir = ::testing::TempDir() + "/stories260K-cli";
  const std::string bin = SPECLOOP_BINARY;
  const std::string convert = bin + " convert llama2c " + Stories260K() + "/stories260K.bin " +
                              Stories260K() + "/tok512.bin " + dir + " 2>/dev/null";
  ASSERT_EQ(std::system(convert.c_str()), 0);
  const json g = ReadJsonl(Stories260K() + "/golden-greedy.jsonl").back();
  const auto expected = g["generated"].get<std::vector<int>>();
  const std::string cmd = bin + " generate --model " + dir + " --prompt '" +
                          g["prompt"].get<std::string>() + "' --temperature 0 --ignore-eos --json" +
                          " --max-tokens " + std::to_string(expected.size());
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << out;
  json r = json::parse(out);
  EXPECT_EQ(r["tokens"].get<std::vector<int>>(), expected);
  EXPECT_GT(r["tokens_per_second"].get<double>(), 0.0);
  EXPECT_TRUE(r["text"].is_string());
}

// Feeds each golden prompt and its golden continuation in one forward and compares the top-5
// log-probs (within `tolerance`) and the argmax, then decodes greedily from the prompt. Returns
// the log-probs of the forwards, one tensor per prompt. `rows`: the golden rows expected (at
// least), `encoded`: how many prompts under 200 tokens must encode to their ids (at least).
std::vector<at::Tensor> CheckGolden(const std::string& dir, const LoadOptions& options,
                                    double tolerance, size_t rows_expected = 10,
                                    int encoded = 5) {
  c10::InferenceMode guard;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tok;
  EXPECT_TRUE(LlamaModel::Load(dir, options, &model).ok());
  EXPECT_TRUE(Tokenizer::Load(dir, &tok).ok());
  if (!model || !tok) return {};
  auto rows = ReadJsonl(dir + "/golden-greedy.jsonl");
  EXPECT_GE(rows.size(), rows_expected) << dir;
  int encoded_checked = 0;
  std::vector<at::Tensor> all;
  for (const json& g : rows) {
    auto input = g["input_ids"].get<std::vector<int>>();
    auto expected = g["generated"].get<std::vector<int>>();
    // Prompts under 200 tokens were not cut: our sentencepiece encoding must give their ids.
    std::vector<int> enc = tok->Encode(g["prompt"].get<std::string>());
    if (enc.size() < 200) {
      enc.insert(enc.begin(), 1);
      EXPECT_EQ(enc, input) << g["prompt"];
      ++encoded_checked;
    }
    KVCache cache = model->NewCache();
    std::vector<int64_t> seq(input.begin(), input.end());
    seq.insert(seq.end(), expected.begin(), expected.end() - 1);
    at::Tensor logp = at::log_softmax(model->Forward({{&cache, seq, true}}), -1).cpu();
    for (size_t i = 0; i < expected.size(); ++i) {
      at::Tensor row = logp[input.size() - 1 + i];
      EXPECT_EQ(row.argmax().item<int64_t>(), expected[i])
          << dir << " " << g["domain"] << " position " << i;
      for (const auto& pair : g["top5_logprobs"][i]) {
        EXPECT_NEAR(row[pair[0].get<int>()].item<double>(), pair[1].get<double>(), tolerance)
            << dir << " " << g["domain"] << " position " << i;
      }
    }
    GenerateOptions opt;
    opt.sampling.temperature = 0;
    opt.max_tokens = expected.size();
    opt.stop_at_eos = false;
    EXPECT_EQ(GeneratePlain(*model, input, opt).tokens, expected) << dir << " " << g["domain"];
    all.push_back(logp);
  }
  EXPECT_GE(encoded_checked, encoded) << dir;
  return all;
}

// target-6m: the PyTorch training implementation's outputs.
TEST(Golden, Target6mMatchesPyTorchReference) {
  CheckGolden(testing::SharedDir() + "/models/target-6m", LoadOptions(), 1e-4);
}

// target-wide-46m (stored in float16): an independent float64 forward's outputs, with the
// weights loaded as float32 and kept in float16. Converting a float16 weight to float32 is
// exact and the kernels' arithmetic is the same, so both modes give the same bits.
TEST(Golden, TargetWide46mMatchesReferenceInFloat32AndFloat16) {
  const std::string dir = testing::SharedDir() + "/models/target-wide-46m";
  LoadOptions half;
  half.dtype = "float16";
  const std::vector<at::Tensor> f32 = CheckGolden(dir, LoadOptions(), 1e-4);
  const std::vector<at::Tensor> f16 = CheckGolden(dir, half, 1e-4);
  ASSERT_EQ(f32.size(), f16.size());
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_TRUE(at::equal(f32[i], f16[i])) << "prompt " << i;
}

// The ATen forward on a GPU (skipped without one), float32 weights and arithmetic: the same
// goldens and greedy decoding. TF32 stays off (LibTorch's default for matrix products), so
// only the order of float32 sums differs from the CPU's.
TEST(Golden, Target6mMatchesPyTorchReferenceOnCuda) {
  if (!testing::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  LoadOptions cuda;
  cuda.device = "cuda";
  cuda.dtype = "float32";
  CheckGolden(testing::SharedDir() + "/models/target-6m", cuda, 1e-4);
}

// The model-family zoo (../shared/models/zoo: Llama 3 with llama3 rope scaling, Qwen2 with q/k/v
// biases, Qwen3 with q/k norms and heads * head_dim != hidden, Mistral; bfloat16 or float16):
// an independent float64 reference's goldens, with the weights in float32 and in their stored
// dtype (the same bits: widening a 16-bit weight is exact).
const char* const kZooModels[] = {"llama3-target", "llama3-draft", "qwen2-target",
                                  "qwen2-draft",   "qwen3-target", "qwen3-draft",
                                  "mistral-target", "mistral-draft"};

TEST(Golden, ZooModelsOfEveryFamilyMatchTheReference) {
  for (const char* name : kZooModels) {
    const std::string dir = testing::SharedDir() + "/models/zoo/" + name;
    ModelConfig c;
    ASSERT_TRUE(ModelConfig::FromDir(dir, &c).ok()) << dir;
    LoadOptions stored;
    stored.dtype = c.torch_dtype;
    const std::vector<at::Tensor> f32 = CheckGolden(dir, LoadOptions(), 1e-4, 8, 4);
    const std::vector<at::Tensor> f16 = CheckGolden(dir, stored, 1e-4, 8, 4);
    ASSERT_EQ(f32.size(), f16.size()) << name;
    for (size_t i = 0; i < f32.size(); ++i) {
      EXPECT_TRUE(at::equal(f32[i], f16[i])) << name << " prompt " << i;
    }
  }
}

// The same goldens through the ATen forward on a GPU (skipped without one), float32: the
// families' biases, q/k norms and rope scaling on the device. Models missing from the shared
// folder (a GPU machine carries a few) are skipped by name; at least one must be there.
TEST(Golden, ZooModelsMatchTheReferenceOnCuda) {
  if (!testing::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  LoadOptions cuda;
  cuda.device = "cuda";
  cuda.dtype = "float32";
  int checked = 0;
  for (const char* name : kZooModels) {
    const std::string dir = testing::SharedDir() + "/models/zoo/" + name;
    std::ifstream config(dir + "/config.json");
    if (!config) {
      std::printf("[ skipped  ] %s: not in %s\n", name, testing::SharedDir().c_str());
      continue;
    }
    CheckGolden(dir, cuda, 1e-4, 8, 4);
    ++checked;
  }
  EXPECT_GE(checked, 1);
}

}  // namespace
}  // namespace specloop
