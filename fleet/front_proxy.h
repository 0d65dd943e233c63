// FrontProxy: one port in front of several serving workers (`specloop proxy`, and `specloop up
// --workers N`'s front). Every route but its own GET /health and GET /metrics is relayed to
// one worker: the one with the fewest requests in flight through this proxy (ties in turn).
//
// Retries. A request is committed to a worker at the first byte of its response body that
// reaches the client: an event stream (`"stream": true`) at its first event, any other
// response once it has been read whole. Until then, a worker that refuses the connection,
// drops it (killed mid-generation) or answers 503 (shutting down) costs the client nothing:
// the request goes to the next worker, each worker tried at most once. Only a stream cut
// after its first event reaches the client as a cut stream. A completion is safe to send
// again: nothing was answered, and the dead worker's unanswered request leaves no trace but
// its buffer's record. When every worker failed: 502, or the last worker's 503.
// A worker that refused a connection is tried last for down_seconds.
//
// Metrics (GET /metrics, its own registry):
//   specloop_proxy_responses_total{upstream,code}       responses relayed, by worker and status
//   specloop_proxy_upstream_errors_total{upstream,kind}  kind: connect (refused or timed out),
//                                                        lost (dropped before the commit),
//                                                        unavailable (503), cut (dropped after)
//   specloop_proxy_retries_total                         requests sent again to another worker
//   specloop_proxy_failed_total{reason}                  no_upstream (answered 502), cut
//   specloop_proxy_upstream_in_flight{upstream}          requests in flight per worker
//   specloop_proxy_upstream_up{upstream}                 0 while a worker is tried last
// GET /health: 200 while some worker's /health answers 200, else 503.
//
// Thread safety: Bind, Run and Stop as HttpServer's (Run blocks; Stop from any thread).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace specloop {

struct FrontProxyOptions {
  std::string host = "127.0.0.1";  // bind address. Default: loopback.
  int port = 8000;                 // 0: a free port (see Bind). Default: 8000.
  std::vector<std::string> upstreams;  // the workers, "HOST:PORT" each; at least one
  // Handler threads (a request waiting on a worker holds one). Default: 96, as a worker's.
  int threads = 96;
  double connect_timeout_seconds = 2;  // Default: 2.
  // Longest wait for one read from a worker: a non-streamed completion answers only when it
  // is done. Default: 600.
  double upstream_read_timeout_seconds = 600;
  double down_seconds = 1;  // a worker that refused a connection is tried last this long
  size_t max_body_bytes = 1 << 20;  // larger bodies: 413 (as a worker's default)
};

class FrontProxy {
 public:
  explicit FrontProxy(FrontProxyOptions options);
  ~FrontProxy();
  FrontProxy(const FrontProxy&) = delete;
  FrontProxy& operator=(const FrontProxy&) = delete;

  // InvalidArgument for no upstream or one that is not HOST:PORT; IOError when the port
  // cannot be bound. On success *port is the bound port.
  Status Bind(int* port);
  // Serves until Stop(); requests in flight are finished first.
  Status Run();
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specloop
