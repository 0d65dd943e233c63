// The built-in status page (serve/status_page.h) of a real `specloop serve`: after traffic in
// two domains, headless Chromium (Debian chromium) renders it with a non-empty alpha chart,
// and a screenshot is written (SPECLOOP_E2E_OUT_DIR/status_page.png).
#include <gtest/gtest.h>

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
  const int port = FreePort();
  // A fixed speculation length, so the alpha chart gets points (adaptive k may turn drafting
  // off on a loaded machine).
  Child serve({SPECLOOP_BINARY, "serve", "--target", TargetDir(), "--draft", DraftDir(),
               "--port", std::to_string(port), "--no-log", "--max-batch", "4",
               "--http-threads", "16", "--k", "4"});
  ASSERT_FALSE(serve.WaitForLine("listening on", 60).empty()) << serve.Output();

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
  std::string status;
  ASSERT_EQ(HttpGet(port, "/status.json", &status), 200);
  const nlohmann::json s = nlohmann::json::parse(status);
  ASSERT_FALSE(s["samples"].empty());
  const nlohmann::json& last = s["samples"].back();
  EXPECT_TRUE(last["alpha"].contains("prose")) << status;
  EXPECT_TRUE(last["alpha"].contains("python")) << status;
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
  const int st = serve.Wait(30);
  EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) << serve.Output();
}

}  // namespace
}  // namespace e2e
}  // namespace specloop
