// DraftFetcher: the worker's side of the draft channel (protocol in draft_channel.h).
#include <zmq.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/base/remove_tree.h"
#include "common/channel/draft_channel.h"
#include "common/tokenizer/model_config.h"

namespace specloop {

namespace fs = std::filesystem;

// libzmq ends a connection whose handshake failed (a peer without the trainer's CURVE key, or
// without CURVE) for good: the socket never reconnects, not even when the real trainer comes
// back on the endpoint. So the fetcher watches both sockets' handshake failures through
// socket monitors and, at most once per FetcherOptions::reopen_interval_ms, closes and
// reopens them.
constexpr int kHandshakeFailed = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                 ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                 ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;

struct DraftFetcher::Impl {
  zmq::context_t* context = nullptr;
  FetcherOptions options;
  std::string public_key, secret_key;  // this worker's CURVE pair (when curve_server_key)
  zmq::socket_t sub, dealer;
  zmq::socket_t sub_monitor, dealer_monitor;  // PAIRs receiving handshake-failure events
  bool reopen_due = false;
  std::chrono::steady_clock::time_point last_open;
  uint64_t opens = 0;  // the first Open() included

  ~Impl() { Close(); }

  // Stops the monitors, then closes the sockets. The order matters: libzmq sends monitor
  // events from its I/O thread with blocking sends, so an event for a monitor whose PAIR is
  // already closed blocks that thread for good, and with it every socket of the context
  // (libzmq issue 3575: the worker then never reconnected to the trainer, > 90 s).
  void Close() {
    for (zmq::socket_t* s : {&sub, &dealer}) {
      if (s->handle() != nullptr) zmq_socket_monitor(s->handle(), nullptr, 0);
    }
    for (zmq::socket_t* s : {&sub_monitor, &dealer_monitor, &sub, &dealer}) {
      if (s->handle() != nullptr) s->close();
    }
  }

  // (Re)creates both sockets and their monitors and connects them.
  void Open() {
    Close();
    sub = zmq::socket_t(*context, zmq::socket_type::sub);
    dealer = zmq::socket_t(*context, zmq::socket_type::dealer);
    for (zmq::socket_t* s : {&sub, &dealer}) {
      s->set(zmq::sockopt::linger, 0);
      if (!options.curve_server_key.empty()) {
        s->set(zmq::sockopt::curve_serverkey, options.curve_server_key);
        s->set(zmq::sockopt::curve_publickey, public_key);
        s->set(zmq::sockopt::curve_secretkey, secret_key);
      }
    }
    sub_monitor = Monitor(&sub, "sub");
    dealer_monitor = Monitor(&dealer, "dealer");
    sub.set(zmq::sockopt::subscribe, "draft");
    sub.connect(options.pub_endpoint);
    dealer.connect(options.router_endpoint);
    reopen_due = false;
    last_open = std::chrono::steady_clock::now();
    ++opens;
  }

  // A PAIR socket receiving `socket`'s handshake-failure events.
  zmq::socket_t Monitor(zmq::socket_t* socket, const char* name) {
    static std::atomic<uint64_t> next_monitor{0};
    const std::string endpoint = "inproc://specloop-fetcher-monitor-" +
                                 std::to_string(next_monitor.fetch_add(1)) + "-" + name;
    if (zmq_socket_monitor(socket->handle(), endpoint.c_str(), kHandshakeFailed) != 0) {
      throw zmq::error_t();
    }
    zmq::socket_t pair(*context, zmq::socket_type::pair);
    pair.set(zmq::sockopt::linger, 0);
    pair.connect(endpoint);
    return pair;
  }

  // Drains the monitors; reopens the sockets when a handshake failed and the last reopen is
  // old enough (a later call does it otherwise).
  void ReopenAfterFailedHandshake() {
    for (zmq::socket_t* m : {&sub_monitor, &dealer_monitor}) {
      zmq::message_t event;
      while (m->recv(event, zmq::recv_flags::dontwait)) {
        if (!event.more()) continue;  // the second frame (the endpoint)
        reopen_due = true;
      }
    }
    if (reopen_due && std::chrono::steady_clock::now() - last_open >=
                          std::chrono::milliseconds(options.reopen_interval_ms)) {
      Open();
    }
  }

  // Sends `request` and waits for its reply (replies to earlier requests are dropped). Sends
  // never block: a DEALER whose only connection ended in a failed handshake has no peer, and
  // a blocking send would then wait forever instead of reopening (a fetch hung so, > 60 s).
  Status Request(const std::string& request, nlohmann::json* header, std::string* body) {
    using Clock = std::chrono::steady_clock;
    try {
      const auto send = [&] {
        return dealer.send(zmq::buffer(request), zmq::send_flags::dontwait).has_value();
      };
      bool sent = send();
      const auto deadline = Clock::now() + std::chrono::milliseconds(options.request_timeout_ms);
      while (true) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - Clock::now());
        if (left.count() <= 0) {
          return Status::IOError(std::string("draft fetcher: ") +
                                 (sent ? "no reply to " : "could not send ") + request);
        }
        if (!sent) {  // no peer yet: reopen if a handshake failed, then try again shortly
          ReopenAfterFailedHandshake();
          sent = send();
          if (!sent) std::this_thread::sleep_for(std::min(left, std::chrono::milliseconds(10)));
          continue;
        }
        zmq::pollitem_t item = {dealer.handle(), 0, ZMQ_POLLIN, 0};
        zmq::poll(&item, 1, std::min(left, std::chrono::milliseconds(
                                                  std::max(1, options.reopen_interval_ms))));
        if (!(item.revents & ZMQ_POLLIN)) {
          const uint64_t before = opens;
          ReopenAfterFailedHandshake();
          if (opens != before) sent = send();
          continue;
        }
        zmq::multipart_t reply;
        if (!reply.recv(dealer, ZMQ_DONTWAIT)) continue;
        if (reply.size() != 2) return Status::Corruption("draft fetcher: malformed reply");
        nlohmann::json h = nlohmann::json::parse(reply.at(0).to_string(), nullptr, false);
        if (!h.is_object() || !h.contains("ok") || !h["ok"].is_boolean()) {
          return Status::Corruption("draft fetcher: malformed reply header");
        }
        if (!h.contains("request") || h["request"] != request) continue;  // a late reply
        *header = std::move(h);
        *body = reply.at(1).to_string();
        return Status::OK();
      }
    } catch (const zmq::error_t& e) {
      return Status::IOError(std::string("draft fetcher: ") + e.what());
    }
  }

  static Status ErrorOf(const nlohmann::json& h) {
    const std::string code = h.value("code", "");
    const std::string msg = "draft publisher: " + h.value("error", std::string("error"));
    if (code == "not_found") return Status::NotFound(msg);
    if (code == "invalid_argument") return Status::InvalidArgument(msg);
    return Status::IOError(msg);
  }
};

DraftFetcher::DraftFetcher() : impl_(std::make_unique<Impl>()) {}
DraftFetcher::~DraftFetcher() = default;

Status DraftFetcher::Open(zmq::context_t* context, const FetcherOptions& options,
                          std::unique_ptr<DraftFetcher>* out) {
  std::unique_ptr<DraftFetcher> f(new DraftFetcher());
  Impl& m = *f->impl_;
  m.context = context;
  m.options = options;
  m.public_key = options.curve_public_key;
  m.secret_key = options.curve_secret_key;
  if (!options.curve_server_key.empty() && (m.public_key.empty() || m.secret_key.empty())) {
    SPECLOOP_RETURN_IF_ERROR(GenerateCurveKeyPair(&m.public_key, &m.secret_key));
  }
  try {
    m.Open();
  } catch (const zmq::error_t& e) {
    return Status::IOError(std::string("draft fetcher: ") + e.what());
  }
  *out = std::move(f);
  return Status::OK();
}

uint64_t DraftFetcher::reopens() const { return impl_->opens - 1; }

Status DraftFetcher::WaitAnnouncement(int timeout_ms, DraftAnnouncement* out) {
  try {
    impl_->ReopenAfterFailedHandshake();
    zmq::pollitem_t item = {impl_->sub.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms));
    if (!(item.revents & ZMQ_POLLIN)) return Status::NotFound("no announcement");
    zmq::multipart_t msg;
    if (!msg.recv(impl_->sub, ZMQ_DONTWAIT)) return Status::NotFound("no announcement");
    if (msg.size() != 2 || msg.at(0).to_string() != "draft") {
      return Status::Corruption("draft fetcher: malformed announcement");
    }
    Status s = DraftAnnouncement::FromJson(msg.at(1).to_string(), out);
    return s.ok() ? s : Status::Corruption(s.message());
  } catch (const zmq::error_t& e) {
    return Status::IOError(std::string("draft fetcher: ") + e.what());
  }
}

Status DraftFetcher::Latest(DraftAnnouncement* out) {
  nlohmann::json h;
  std::string body;
  SPECLOOP_RETURN_IF_ERROR(impl_->Request("latest", &h, &body));
  if (!h["ok"].get<bool>()) return Impl::ErrorOf(h);
  Status s = DraftAnnouncement::FromJson(h.dump(), out);
  return s.ok() ? s : Status::Corruption(s.message());
}

Status DraftFetcher::Fetch(const DraftAnnouncement& a, const std::string& staging_root,
                           std::string* dir) {
  const FetcherOptions& o = impl_->options;
  if (a.version == 0 || a.bytes > o.max_bundle_bytes) {
    return Status::InvalidArgument("draft fetcher: bad announcement " + a.ToJson());
  }
  // Download.
  std::string bundle;
  bundle.reserve(a.bytes);
  const uint64_t chunk = std::max<uint64_t>(1, o.chunk_bytes);
  while (bundle.size() < a.bytes) {
    const uint64_t off = bundle.size();
    const uint64_t want = std::min(chunk, a.bytes - off);
    const std::string req = "get " + std::to_string(a.version) + " " + std::to_string(off) + " " +
                            std::to_string(want);
    nlohmann::json h;
    std::string body;
    SPECLOOP_RETURN_IF_ERROR(impl_->Request(req, &h, &body));
    if (!h["ok"].get<bool>()) return Impl::ErrorOf(h);
    if (body.size() < want) {
      return Status::Corruption("draft fetcher: truncated transfer: " +
                                std::to_string(off + body.size()) + " of " +
                                std::to_string(a.bytes) + " bytes");
    }
    if (body.size() > want) return Status::Corruption("draft fetcher: oversized chunk");
    bundle += body;
  }
  const std::string sha = Sha256Hex(bundle.data(), bundle.size());
  if (sha != a.sha256) {
    return Status::Corruption("draft fetcher: sha256 mismatch: got " + sha + ", announced " +
                              a.sha256);
  }
  // Unpack into a temporary directory, check, rename into place.
  std::error_code ec;
  fs::create_directories(staging_root, ec);
  const std::string name = VersionDirName(a.version);
  const std::string final_dir = staging_root + "/" + name;
  const std::string tmp =
      staging_root + "/." + name + ".tmp" + std::to_string(std::random_device()());
  auto fail = [&](Status s) {
    (void)RemoveTree(tmp);  // best effort: the error that matters is s
    return s;
  };
  Status s = UnpackCheckpointBundle(bundle, tmp);
  if (!s.ok()) return fail(s);
  std::string meta_text, model_sha;
  s = ReadFileToString(tmp + "/meta.json", &meta_text);
  if (s.ok()) s = Sha256File(tmp + "/model.safetensors", &model_sha);
  if (!s.ok()) return fail(s);
  nlohmann::json meta = nlohmann::json::parse(meta_text, nullptr, false);
  if (!meta.is_object() || meta.value("sha256", std::string()) != model_sha ||
      !meta.contains("version") || meta["version"] != a.version) {
    return fail(Status::Corruption("draft fetcher: meta.json does not match the checkpoint"));
  }
  (void)RemoveTree(final_dir);  // an earlier fetch of this version; rename reports a failure
  fs::rename(tmp, final_dir, ec);
  if (ec) return fail(Status::IOError("draft fetcher: rename to " + final_dir + ": " + ec.message()));
  *dir = final_dir;
  return Status::OK();
}

}  // namespace specloop
