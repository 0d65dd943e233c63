// The official `openai` npm client against `specloop serve` (the real binary) on a free
// loopback port. npm installs the client into the build tree at test time; if it cannot, the
// test fails (the client is a stated deliverable), naming the cause.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/serve/test_util.h"

namespace specloop {
namespace {

using json = nlohmann::json;

// `specloop serve` as a child process; SIGTERM and reaped in the destructor.
class ServeProcess {
 public:
  ServeProcess() {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 1);
      close(fds[0]);
      const std::string target = serve_test::TargetDir(), draft = serve_test::DraftDir();
      execl(SPECLOOP_BINARY, SPECLOOP_BINARY, "serve", "--target", target.c_str(), "--draft",
            draft.c_str(), "--port", "0", "--no-log", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    // Reads "listening on http://127.0.0.1:PORT" (60 s at most).
    std::string out;
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::smatch m;
    const std::regex re("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    while (std::chrono::steady_clock::now() < deadline) {
      char buf[256];
      const ssize_t n = read(fds[0], buf, sizeof(buf));
      if (n > 0) out.append(buf, n);
      if (n == 0) break;  // the child exited
      if (std::regex_search(out, m, re)) {
        port_ = std::stoi(m[1]);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    close(fds[0]);
  }
  ~ServeProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

TEST(OpenAiClient, CompletesAndStreamsTextAndChat) {
  const std::string node_dir = SPECLOOP_NODE_DIR;
  std::string log;
  const int npm = serve_test::RunCommand(
      "mkdir -p " + node_dir + " && cd " + node_dir +
          " && (test -f node_modules/openai/package.json || "
          "npm install --no-audit --no-fund --no-save --loglevel=error openai@4) 2>&1",
      &log);
  ASSERT_EQ(npm, 0) << "npm could not install the openai client into " << node_dir
                    << " (is the npm registry reachable?):\n" << log;

  ServeProcess serve;
  ASSERT_GT(serve.port(), 0) << "specloop serve did not start";
  std::string out;
  const std::string base = "http://127.0.0.1:" + std::to_string(serve.port()) + "/v1";
  const int rc = serve_test::RunCommand(
      "SPECLOOP_NODE_DIR=" + node_dir + "/node_modules/openai node " +
          std::string(SPECLOOP_CLIENT_SCRIPT) + " " + base + " target-6m 2>&1",
      &out);
  ASSERT_EQ(rc, 0) << out;
  const json j = json::parse(out.substr(out.find('{')));
  EXPECT_FALSE(j["text"].get<std::string>().empty());
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 24);
  EXPECT_TRUE(j["speculative"].contains("acceptance_rate"));
  EXPECT_EQ(j["stream_text"], j["text"]);
  EXPECT_GT(j["stream_chunks"].get<int>(), 2);
  EXPECT_EQ(j["stream_finish_reason"], "length");
  EXPECT_EQ(j["bad_model_status"], 404);
  EXPECT_EQ(j["models"], json::array({"target-6m"}));
  // The chat API: a message from the assistant, the same text streamed (role first) and through
  // the client's stream helper, and a 400 the client raises as an APIError.
  EXPECT_EQ(j["chat_object"], "chat.completion");
  EXPECT_EQ(j["chat_role"], "assistant");
  EXPECT_FALSE(j["chat_content"].get<std::string>().empty());
  EXPECT_EQ(j["chat_finish_reason"], "length");
  EXPECT_EQ(j["chat_usage"]["completion_tokens"], 24);
  EXPECT_GT(j["chat_usage"]["prompt_tokens"].get<int>(), 10);
  EXPECT_TRUE(j["chat_speculative"].contains("acceptance_rate"));
  EXPECT_EQ(j["chat_stream_first_role"], "assistant");
  EXPECT_EQ(j["chat_stream_content"], j["chat_content"]);
  EXPECT_GT(j["chat_stream_chunks"].get<int>(), 2);
  EXPECT_EQ(j["chat_stream_finish_reason"], "length");
  EXPECT_EQ(j["chat_helper_content"], j["chat_content"]);
  EXPECT_EQ(j["chat_bad_status"], 400);
  EXPECT_NE(j["chat_bad_message"].get<std::string>().find("messages"), std::string::npos)
      << j["chat_bad_message"];
  // Log-probs as the client reads them: the completions API's legacy lists (the tokens spell
  // the text, 3 alternatives each, the same tokens streamed), the chat API's entries (they
  // spell the message, 2 alternatives each, the same through the stream helper), 400 beyond 20.
  const json& lp = j["lp"];
  ASSERT_TRUE(lp.is_object()) << j.dump();
  ASSERT_EQ(lp["tokens"].size(), 8u);
  std::string spelled;
  for (size_t i = 0; i < 8; ++i) {
    spelled += lp["tokens"][i].get<std::string>();
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_EQ(lp["top_logprobs"][i].size(), 3u);
    // Greedy: the chosen token is the likeliest.
    double best = -1e9;
    for (const auto& [token, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    EXPECT_DOUBLE_EQ(lp["token_logprobs"][i].get<double>(), best) << i;
  }
  EXPECT_EQ(spelled, j["lp_text"]);
  EXPECT_EQ(j["lp_stream_tokens"], lp["tokens"]);
  const json& content = j["chat_lp_content"];
  ASSERT_EQ(content.size(), 8u);
  std::string message;
  for (const json& e : content) {
    message += e["token"].get<std::string>();
    EXPECT_EQ(e["top_logprobs"].size(), 2u);
    EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);  // greedy
  }
  EXPECT_EQ(message, j["chat_lp_message"]);
  EXPECT_EQ(j["chat_lp_helper_content"], content);
  EXPECT_EQ(j["lp_bad_status"], 400);
}

}  // namespace
}  // namespace specloop
