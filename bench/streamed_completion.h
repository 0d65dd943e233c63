// One streamed POST /v1/completions as the traffic benches send it (day0_bench,
// faster_over_time): the request body, the times of the first text chunk and of the end, and
// the last data event, which carries `usage` and `speculative`. Each bench reads the counts it
// reports from that event into its own result type. Header-only; needs cpp-httplib.
#pragma once

#include <chrono>
#include <string>
#include <utility>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tests/e2e/e2e_util.h"

namespace specloop::bench {

// Seconds on std::chrono::steady_clock since its epoch: the benches' clock (only differences
// mean anything).
inline double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct StreamedCompletion {
  // Empty when the stream completed with HTTP 200 and its last data event (before [DONE]) has
  // `usage` and `speculative`; else what went wrong ("transport: ...", "HTTP 503",
  // "malformed stream, ...").
  std::string error;
  nlohmann::json last;  // the last data event; meaningful only when error is empty
  // Seconds since the caller's t0: request sent, first non-empty text chunk (the first
  // token; the end when no text came, e.g. EOS at once), end of the stream.
  double start_s = 0, first_token_s = 0, end_s = 0;
  bool ok() const { return error.empty(); }
};

// Posts `body` (its "stream" set to true here) to /v1/completions on `cli` and reads the
// server-sent events to the end. `t0_s` is a SteadySeconds() value; the returned times count
// from it. Never throws on a bad server answer: that is `error`.
inline StreamedCompletion PostStreamedCompletion(httplib::Client* cli, nlohmann::json body,
                                                 double t0_s) {
  using nlohmann::json;
  StreamedCompletion out;
  body["stream"] = true;
  out.start_s = SteadySeconds() - t0_s;
  bool malformed = false;
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = e2e::PostStreaming(
      cli, "/v1/completions", body.dump(),
      [&](const std::string& data) {
        if (data == "[DONE]") return;
        json j = json::parse(data, nullptr, false);
        if (j.is_discarded()) {
          malformed = true;
          return;
        }
        if (out.first_token_s == 0 && j.contains("choices") &&
            !j["choices"][0]["text"].get<std::string>().empty()) {
          out.first_token_s = SteadySeconds() - t0_s;
        }
        out.last = std::move(j);
      },
      &res, &error);
  out.end_s = SteadySeconds() - t0_s;
  if (!sent) {
    out.error = "transport: " + httplib::to_string(error);
  } else if (res.status != 200) {
    out.error = "HTTP " + std::to_string(res.status);
  } else if (malformed || !out.last.contains("speculative") || !out.last.contains("usage")) {
    out.error = "malformed stream, last event: " + out.last.dump().substr(0, 200);
  } else if (out.first_token_s == 0) {
    out.first_token_s = out.end_s;
  }
  return out;
}

}  // namespace specloop::bench
