// Raw HTTP requests through cpp-httplib's request parser (request line, headers, chunked and
// Content-Length bodies) into a server whose /v1/completions route does what serve/
// http_server.cc does with a request before it reaches the scheduler: X-Domain header and body
// into ParseCompletionRequest, then the JSON error or the accepted params. The server reads
// the input as one connection (keep-alive requests included) and writes into a sink.
#include <algorithm>
#include <cstring>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "serve/completion_params.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/served_model.h"

using namespace specloop;

namespace {

// One connection's bytes: reads come from the input, writes are dropped.
class InputStream : public httplib::Stream {
 public:
  InputStream(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool is_readable() const override { return true; }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, size_ - pos_);
    std::memcpy(ptr, data_ + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override { return static_cast<ssize_t>(size); }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 40000;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 8000;
  }
  socket_t socket() const override { return 0; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

class FuzzServer : public httplib::Server {
 public:
  explicit FuzzServer(const fuzz::ServedModel* served) {
    set_payload_max_length(1 << 20);
    Post("/v1/completions", [served](const httplib::Request& req, httplib::Response& res) {
      CompletionParams p;
      ApiError error;
      if (!ParseCompletionRequest(req.body, req.get_header_value("X-Domain"), served->limits,
                                  /*default_seed=*/7, &p, &error)) {
        res.status = error.status;
        res.set_content(error.ToJson().dump(), "application/json");
        return;
      }
      FUZZ_CHECK(!p.prompt.empty());
      res.set_content(nlohmann::json{{"prompt_tokens", p.prompt.size()}}.dump(),
                      "application/json");
    });
    Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok", "text/plain");
    });
  }

  void Serve(httplib::Stream& stream) {
    bool closed = false;
    // As httplib's keep-alive loop: requests until the connection closes or a request fails.
    for (int i = 0; i < 8 && !closed; ++i) {
      if (!process_request(stream, /*close_connection=*/i == 7, closed, nullptr)) break;
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::ServedModel served;
  static FuzzServer server(&served);
  InputStream stream(data, size);
  server.Serve(stream);
  return 0;
}
