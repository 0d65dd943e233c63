// Bad weight files give clear errors naming the file and tensor, never a crash.
#include "common/model/safetensors.h"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "common/model/llama_model.h"
#include "tests/common/test_models.h"

namespace specloop {
namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/st_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    mkdir(dir_.c_str(), 0755);
    config_ = testing::TinyConfig();
    weights_ = testing::RandomLlamaWeights(config_, 1);
    std::ofstream(dir_ + "/config.json") << config_.ToJson();
  }
  void Write(const TensorMap& w) {
    std::vector<std::pair<std::string, at::Tensor>> v(w.begin(), w.end());
    ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", v).ok());
  }
  Status Load() {
    std::unique_ptr<LlamaModel> m;
    return LlamaModel::Load(dir_, LoadOptions(), &m);
  }
  std::string dir_;
  ModelConfig config_;
  TensorMap weights_;
};

TEST_F(SafetensorsTest, WellFormedLoads) {
  Write(weights_);
  Status s = Load();
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST_F(SafetensorsTest, TruncatedFile) {
  Write(weights_);
  const std::string path = dir_ + "/model.safetensors";
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  for (off_t keep : {off_t(3), off_t(100), st.st_size / 2, st.st_size - 1}) {
    ASSERT_EQ(truncate(path.c_str(), keep), 0);
    Status s = Load();
    EXPECT_TRUE(s.IsCorruption()) << keep << ": " << s.ToString();
    EXPECT_NE(s.message().find("model.safetensors"), std::string::npos) << s.ToString();
  }
}

TEST_F(SafetensorsTest, MissingTensor) {
  weights_.erase("model.layers.1.mlp.up_proj.weight");
  Write(weights_);
  Status s = Load();
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("missing tensor model.layers.1.mlp.up_proj.weight"),
            std::string::npos)
      << s.ToString();
}

TEST_F(SafetensorsTest, ShapeMismatch) {
  weights_["model.layers.0.self_attn.k_proj.weight"] = at::zeros({8, 32});
  Write(weights_);
  Status s = Load();
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("model.layers.0.self_attn.k_proj.weight has shape [8, 32]"),
            std::string::npos)
      << s.ToString();
}

TEST_F(SafetensorsTest, WrongDtype) {
  // An integer tensor where weights belong, and a dtype the reader does not know.
  weights_["model.norm.weight"] = at::ones({32}, at::kInt);
  Write(weights_);
  Status s = Load();
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("model.norm.weight is not floating point"), std::string::npos);

  const std::string header = R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})";
  std::ofstream f(dir_ + "/model.safetensors", std::ios::binary | std::ios::trunc);
  uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header << std::string(8, '\0');
  f.close();
  s = Load();
  EXPECT_EQ(s.code(), Status::Code::kNotSupported) << s.ToString();
  EXPECT_NE(s.message().find("unsupported dtype F64"), std::string::npos) << s.ToString();
}

TEST_F(SafetensorsTest, InconsistentHeader) {
  auto write_raw = [&](const std::string& header, size_t data_bytes) {
    std::ofstream f(dir_ + "/model.safetensors", std::ios::binary | std::ios::trunc);
    uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header << std::string(data_bytes, '\0');
  };
  write_raw(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}})", 16);
  EXPECT_TRUE(Load().IsCorruption());  // size disagrees with the shape
  write_raw(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", 16);
  EXPECT_TRUE(Load().IsCorruption());  // runs past the data
  write_raw(R"({"w": not json)", 16);
  EXPECT_TRUE(Load().IsCorruption());
  write_raw(R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", 16);
  EXPECT_TRUE(Load().IsCorruption());
}

TEST_F(SafetensorsTest, ShardedIndex) {
  std::vector<std::pair<std::string, at::Tensor>> a, b;
  std::string map;
  int i = 0;
  for (auto& [name, t] : weights_) {
    const bool first = i++ % 2 == 0;
    (first ? a : b).emplace_back(name, t);
    map += (map.empty() ? "" : ",") + ("\"" + name + "\":\"") + (first ? "a" : "b") +
           ".safetensors\"";
  }
  ASSERT_TRUE(WriteSafetensors(dir_ + "/a.safetensors", a).ok());
  ASSERT_TRUE(WriteSafetensors(dir_ + "/b.safetensors", b).ok());
  std::ofstream(dir_ + "/model.safetensors.index.json") << "{\"weight_map\":{" << map << "}}";
  Status s = Load();
  EXPECT_TRUE(s.ok()) << s.ToString();

  unlink((dir_ + "/b.safetensors").c_str());
  EXPECT_TRUE(Load().IsNotFound());
}

TEST(ModelConfig, RefusesWhatTheForwardDoesNotImplement) {
  ModelConfig c;
  const std::string base = testing::TinyConfig().ToJson();
  ASSERT_TRUE(ModelConfig::FromJson(base, &c).ok());
  auto with = [&](const std::string& extra) {
    nlohmann::json j = nlohmann::json::parse(base);
    j.update(nlohmann::json::parse("{" + extra + "}"));
    return ModelConfig::FromJson(j.dump(), &c);
  };
  EXPECT_EQ(with(R"("rope_scaling":{"type":"yarn","factor":2})").code(),
            Status::Code::kNotSupported);
  EXPECT_TRUE(with(R"("rope_scaling":{"type":"linear","factor":2})").ok());
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_EQ(with(R"("attention_bias":true)").code(), Status::Code::kNotSupported);
  EXPECT_TRUE(with(R"("num_key_value_heads":3)").IsInvalidArgument());  // 4 heads over 3
  EXPECT_TRUE(ModelConfig::FromJson("[1,2]", &c).IsInvalidArgument());
  EXPECT_TRUE(ModelConfig::FromJson(R"({"vocab_size":"many"})", &c).IsInvalidArgument());
  EXPECT_TRUE(with(R"("eos_token_id":[2,7])").ok());
  EXPECT_TRUE(c.IsEos(7));
}

}  // namespace
}  // namespace specloop
