// The built-in status page (serve/status_page.h) of a real `specloop up`: after traffic in
// two domains and the trainer's first evaluation, headless Chromium (Debian chromium) renders
// it with non-empty alpha and speed-over-plain charts, the domains' table and the trainer's
// state (its gate's last decision), and a screenshot is written
// (SPECLOOP_E2E_OUT_DIR/status_page.png).
#include <gtest/gtest.h>

#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "tests/e2e/e2e_util.h"

namespace specloop {
namespace e2e {
namespace {

// Headless Chromium with no network beyond the page itself and a fresh profile; `args` are
// the action (--dump-dom or --screenshot=...). Returns stdout.
std::string Chromium(const TempDir& tmp, const std::string& args, const std::string& url) {
  const std::string cmd = std::string("timeout 90 ") + SPECLOOP_CHROMIUM +
                          " --headless --no-sandbox --disable-gpu --disable-background-networking"
                          " --disable-component-update --disable-sync --no-first-run"
                          " --disable-extensions --user-data-dir=" + tmp.Sub("chromium-profile") +
                          " --window-size=1200,1150 --virtual-time-budget=4000 " + args + " " +
                          url + " 2>" + tmp.Sub("chromium.log");
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  pclose(f);
  return out;
}

int Attr(const std::string& dom, const std::string& canvas, const std::string& attr) {
  const std::regex r("<canvas id=\"" + canvas + "\"[^>]*" + attr + "=\"(\\d+)\"");
  std::smatch m;
  return std::regex_search(dom, m, r) ? std::stoi(m[1].str()) : -1;
}

TEST(StatusPageTest, RendersAlphaChartInHeadlessChromium) {
  TempDir tmp("specloop-status");
  const int port = FreePort(), trainer_port = FreePort();
  // A fixed speculation length, so the alpha chart gets points (adaptive k may turn drafting
  // off on a loaded machine); the trainer evaluates after every step, so the page has a gate
  // decision to show soon after traffic.
  Child serve({SPECLOOP_BINARY, "up", "--target", TargetDir(), "--draft", DraftDir(), "--data",
               tmp.Sub("data"), "--port", std::to_string(port), "--trainer-metrics-port",
               std::to_string(trainer_port), "--serve-arg=--max-batch=4",
               "--serve-arg=--http-threads=16", "--serve-arg=--k=4",
               "--train-arg=--eval-every=1"});
  ASSERT_FALSE(serve.WaitForLine("specloop up: serve is ready", 60).empty()) << serve.Output();
  ASSERT_FALSE(serve.WaitForLine("specloop up: train is ready", 60).empty()) << serve.Output();

  // Before traffic: the page is served, self-contained (Chart.js embedded, nothing remote).
  std::string html;
  ASSERT_EQ(HttpGet(port, "/", &html), 200);
  EXPECT_NE(html.find("<canvas id=\"alpha\""), std::string::npos);
  EXPECT_NE(html.find("Chart.js v"), std::string::npos) << "chart library not embedded";
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);

  double completion_tokens = 0;  // as the responses report them (sampling may stop early)
  for (const std::string domain : {"prose", "python"}) {
    for (const std::string& p : PromptsJson(domain, 2)) {
      const std::string req = "{\"prompt\":" + p + ",\"max_tokens\":24,\"domain\":\"" + domain +
                              "\"}";
      std::string body;
      ASSERT_EQ(HttpPost(port, "/v1/completions", req, &body), 200) << body;
      completion_tokens += nlohmann::json::parse(body)["usage"]["completion_tokens"].get<double>();
    }
  }
  // Wait for the trainer's first evaluation (its own /status.json), then read the page's data.
  nlohmann::json trainer;
  for (int i = 0; i < 240; ++i) {
    std::string body;
    if (HttpGet(trainer_port, "/status.json", &body) == 200) {
      trainer = nlohmann::json::parse(body);
      if (trainer.value("evaluations", 0) > 0) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  ASSERT_GT(trainer.value("evaluations", 0), 0) << trainer.dump() << "\n" << serve.Output();
  std::string status;
  ASSERT_EQ(HttpGet(port, "/status.json", &status), 200);
  const nlohmann::json s = nlohmann::json::parse(status);
  ASSERT_FALSE(s["samples"].empty());
  const nlohmann::json& last = s["samples"].back();
  EXPECT_TRUE(last["alpha"].contains("prose")) << status;
  EXPECT_TRUE(last["alpha"].contains("python")) << status;
  // Per domain over the samples: speed over plain decoding and the mean acceptance length.
  std::map<std::string, int> over_plain, acceptance_length;
  for (const nlohmann::json& sample : s["samples"]) {
    for (const auto& [d, x] : sample["over_plain"].items()) {
      EXPECT_GT(x.get<double>(), 0.0) << d;
      over_plain[d]++;
    }
    for (const auto& [d, l] : sample["mean_acceptance_length"].items()) {
      EXPECT_GE(l.get<double>(), 1.0) << d;
      EXPECT_LE(l.get<double>(), 5.0) << d;  // k = 4
      acceptance_length[d]++;
    }
  }
  EXPECT_TRUE(over_plain.count("prose") && over_plain.count("python")) << status;
  EXPECT_TRUE(acceptance_length.count("prose") && acceptance_length.count("python")) << status;
  // The trainer's state, through the server: objective, steps, the gate's last decision.
  const nlohmann::json& t = s["trainer"];
  ASSERT_TRUE(t.is_object()) << status;
  EXPECT_FALSE(t.contains("error")) << status;
  EXPECT_EQ(t["objective"], trainer["objective"]);
  EXPECT_GT(t["steps"].get<int>(), 0) << status;
  ASSERT_TRUE(t.contains("last_evaluation")) << status;
  EXPECT_FALSE(t["last_evaluation"]["reason"].get<std::string>().empty()) << status;
  EXPECT_GT(completion_tokens, 0.0);
  EXPECT_EQ(s["generated_tokens"].get<double>(), completion_tokens) << status;
  EXPECT_EQ(s["versions"].size(), 1u);
  EXPECT_TRUE(s["chart_library"].get<bool>());

  // Chromium runs the page's script against the live server.
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/";
  const std::string dom = Chromium(tmp, "--dump-dom", url);
  ASSERT_NE(dom.find("data-ready=\"1\""), std::string::npos)
      << "page script did not finish\n" << dom.substr(0, 2000);
  EXPECT_GE(Attr(dom, "alpha", "data-points"), 2);
  EXPECT_GT(Attr(dom, "alpha", "data-painted"), 50) << "the alpha chart drew no line";
  EXPECT_GT(Attr(dom, "throughput", "data-points"), 0);
  EXPECT_NE(dom.find("data-domains=\"prose,python\""), std::string::npos);
  EXPECT_GE(Attr(dom, "speedup", "data-points"), 2);
  EXPECT_GT(Attr(dom, "speedup", "data-painted"), 50) << "the speed chart drew no line";
  EXPECT_NE(dom.find("<td>python</td>"), std::string::npos) << "no domains table";
  const std::regex trainer_state("id=\"trainer\" data-state=\"(published|refused)\"");
  EXPECT_TRUE(std::regex_search(dom, trainer_state)) << "the trainer panel shows no decision";

  const std::string png = std::string(SPECLOOP_E2E_OUT_DIR) + "/status_page.png";
  std::filesystem::remove(png);
  Chromium(tmp, "--screenshot=" + png, url);
  ASSERT_TRUE(std::filesystem::exists(png)) << "no screenshot";
  std::ifstream in(png, std::ios::binary);
  std::string magic(8, '\0');
  in.read(magic.data(), 8);
  EXPECT_EQ(magic, std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_GT(std::filesystem::file_size(png), 20000u);
  std::fprintf(stderr, "screenshot: %s\n", png.c_str());

  serve.Signal(SIGTERM);
  const int st = serve.Wait(60);
  EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) << serve.Output();
}

}  // namespace
}  // namespace e2e
}  // namespace specloop
