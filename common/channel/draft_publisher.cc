// DraftPublisher: the trainer's side of the draft channel (protocol in draft_channel.h). One
// thread owns the XPUB and ROUTER sockets; Publish() hands it announcements through a queue
// and the thread polls both sockets with a short timeout so it sees them promptly.
#include <chrono>
#include <deque>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/channel/draft_channel.h"
#include "common/tokenizer/model_config.h"

namespace specloop {

namespace {

constexpr int kPollMs = 20;
constexpr size_t kOldBundlesCached = 2;

struct Bundle {
  DraftAnnouncement announcement;
  std::shared_ptr<const std::string> bytes;
};

// Strict decimal (digits only, no sign, at most 19 digits).
bool ParseDecimal(const std::string& s, uint64_t* v) {
  if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  *v = std::stoull(s);
  return true;
}

}  // namespace

struct DraftPublisher::Impl {
  PublisherOptions options;
  std::string root;
  std::string pub_endpoint, router_endpoint;
  zmq::socket_t pub, router;
  std::thread thread;
  std::atomic<bool> stop{false};

  std::mutex mu;
  std::optional<Bundle> latest;              // GUARDED_BY(mu)
  std::deque<DraftAnnouncement> pending;     // GUARDED_BY(mu)
  std::list<Bundle> old_bundles;             // server thread only

  // Packs version `v` (from the cache when possible).
  Status GetBundle(uint64_t v, Bundle* out) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (latest && latest->announcement.version == v) {
        *out = *latest;
        return Status::OK();
      }
    }
    for (auto it = old_bundles.begin(); it != old_bundles.end(); ++it) {
      if (it->announcement.version == v) {
        *out = *it;
        return Status::OK();
      }
    }
    Bundle b;
    SPECLOOP_RETURN_IF_ERROR(Pack(v, &b));
    old_bundles.push_front(b);
    if (old_bundles.size() > kOldBundlesCached) old_bundles.pop_back();
    *out = b;
    return Status::OK();
  }

  Status Pack(uint64_t v, Bundle* out) {
    const std::string dir = root + "/" + VersionDirName(v);
    auto bytes = std::make_shared<std::string>();
    SPECLOOP_RETURN_IF_ERROR(PackCheckpointBundle(dir, bytes.get()));
    std::string config;
    SPECLOOP_RETURN_IF_ERROR(ReadFileToString(dir + "/config.json", &config));
    out->announcement.version = v;
    out->announcement.bytes = bytes->size();
    out->announcement.sha256 = Sha256Hex(bytes->data(), bytes->size());
    out->announcement.config_sha256 = Sha256Hex(config.data(), config.size());
    out->bytes = std::move(bytes);
    return Status::OK();
  }

  void Announce(const DraftAnnouncement& a) {
    zmq::multipart_t msg;
    msg.addstr("draft");
    msg.addstr(a.ToJson());
    msg.send(pub);
  }

  // Answers one request; `request` is its text.
  void Answer(const std::string& request, nlohmann::json* header, std::string* body) {
    (*header)["request"] = request;
    auto fail = [&](const char* code, const std::string& msg) {
      (*header)["ok"] = false;
      (*header)["code"] = code;
      (*header)["error"] = msg;
    };
    if (request == "latest") {
      std::lock_guard<std::mutex> lock(mu);
      if (!latest) return fail("not_found", "no checkpoint published yet");
      const DraftAnnouncement& a = latest->announcement;
      (*header)["ok"] = true;
      (*header)["version"] = a.version;
      (*header)["sha256"] = a.sha256;
      (*header)["bytes"] = a.bytes;
      (*header)["config_sha256"] = a.config_sha256;
      return;
    }
    std::vector<std::string> parts;
    size_t start = 0;
    while (start <= request.size() && parts.size() < 5) {
      const size_t sp = request.find(' ', start);
      parts.push_back(request.substr(start, sp == std::string::npos ? sp : sp - start));
      if (sp == std::string::npos) break;
      start = sp + 1;
    }
    uint64_t v = 0, off = 0, len = 0;
    if (parts.size() != 4 || parts[0] != "get" || !ParseDecimal(parts[1], &v) || v == 0 ||
        v > kMaxDraftVersion ||
        !ParseDecimal(parts[2], &off) || !ParseDecimal(parts[3], &len)) {
      return fail("invalid_argument", "expected 'latest' or 'get <version> <offset> <len>'");
    }
    if (len > options.max_chunk_bytes) {
      return fail("invalid_argument",
                  "len above max_chunk_bytes " + std::to_string(options.max_chunk_bytes));
    }
    Bundle b;
    Status s = GetBundle(v, &b);
    if (!s.ok()) return fail(s.IsNotFound() ? "not_found" : "io_error", s.message());
    const uint64_t size = b.bytes->size();
    const uint64_t from = std::min(off, size);
    const uint64_t n = std::min(len, size - from);
    body->assign(*b.bytes, from, n);
    (*header)["ok"] = true;
    (*header)["version"] = v;
    (*header)["offset"] = off;
    (*header)["len"] = n;
  }

  void Loop(DraftPublisher* self) {
    while (!stop.load()) {
      zmq::pollitem_t items[] = {{pub.handle(), 0, ZMQ_POLLIN, 0},
                                 {router.handle(), 0, ZMQ_POLLIN, 0}};
      try {
        zmq::poll(items, 2, std::chrono::milliseconds(kPollMs));
        std::deque<DraftAnnouncement> to_send;
        {
          std::lock_guard<std::mutex> lock(mu);
          to_send.swap(pending);
        }
        for (const auto& a : to_send) Announce(a);
        if (items[0].revents & ZMQ_POLLIN) {
          zmq::message_t m;
          if (pub.recv(m, zmq::recv_flags::dontwait) && m.size() > 0 &&
              static_cast<const char*>(m.data())[0] == 1) {
            self->subscriptions_.fetch_add(1);
            std::optional<DraftAnnouncement> a;
            {
              std::lock_guard<std::mutex> lock(mu);
              if (latest) a = latest->announcement;
            }
            if (a) Announce(*a);
          }
        }
        if (items[1].revents & ZMQ_POLLIN) {
          zmq::multipart_t req;
          if (!req.recv(router, ZMQ_DONTWAIT) || req.size() < 2) continue;
          // Envelope: every frame but the last (identity, and an empty delimiter from REQ).
          const std::string text = req.back().to_string();
          zmq::multipart_t reply;
          for (size_t i = 0; i + 1 < req.size(); ++i) reply.addstr(req.at(i).to_string());
          nlohmann::json header;
          std::string body;
          Answer(text, &header, &body);
          reply.addstr(header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
          reply.addstr(std::move(body));
          // Counted before the send, so a peer holding the reply always sees it counted.
          self->requests_.fetch_add(1);
          reply.send(router, ZMQ_DONTWAIT);
        }
      } catch (const zmq::error_t&) {
        // A peer that vanished mid-reply (EHOSTUNREACH) or a context being torn down: keep
        // serving unless asked to stop.
        if (stop.load()) break;
      }
    }
  }
};

DraftPublisher::DraftPublisher() : impl_(std::make_unique<Impl>()) {}

DraftPublisher::~DraftPublisher() { Stop(); }

Status DraftPublisher::Start(zmq::context_t* context, const PublisherOptions& options,
                             const std::string& checkpoint_root,
                             std::unique_ptr<DraftPublisher>* out) {
  std::unique_ptr<DraftPublisher> p(new DraftPublisher());
  Impl& m = *p->impl_;
  m.options = options;
  m.root = checkpoint_root;
  try {
    m.pub = zmq::socket_t(*context, zmq::socket_type::xpub);
    m.router = zmq::socket_t(*context, zmq::socket_type::router);
    for (zmq::socket_t* s : {&m.pub, &m.router}) {
      s->set(zmq::sockopt::linger, 0);
      if (!options.curve_secret_key.empty()) {
        s->set(zmq::sockopt::curve_server, 1);
        s->set(zmq::sockopt::curve_secretkey, options.curve_secret_key);
      }
    }
    m.pub.set(zmq::sockopt::xpub_verbose, 1);
    m.router.set(zmq::sockopt::router_mandatory, 1);
    m.pub.bind(options.pub_endpoint);
    m.router.bind(options.router_endpoint);
    m.pub_endpoint = m.pub.get(zmq::sockopt::last_endpoint);
    m.router_endpoint = m.router.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return Status::IOError(std::string("draft publisher: ") + e.what());
  }
  DraftPublisher* raw = p.get();
  m.thread = std::thread([raw] { raw->impl_->Loop(raw); });
  *out = std::move(p);
  return Status::OK();
}

Status DraftPublisher::Publish(uint64_t version, DraftAnnouncement* announced) {
  Bundle b;
  SPECLOOP_RETURN_IF_ERROR(impl_->Pack(version, &b).Annotate("publish"));
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->latest = b;
  impl_->pending.push_back(b.announcement);
  if (announced) *announced = b.announcement;
  return Status::OK();
}

std::string DraftPublisher::pub_endpoint() const { return impl_->pub_endpoint; }
std::string DraftPublisher::router_endpoint() const { return impl_->router_endpoint; }

void DraftPublisher::Stop() {
  if (!impl_->thread.joinable()) return;
  impl_->stop.store(true);
  impl_->thread.join();
  impl_->pub.close();
  impl_->router.close();
}

}  // namespace specloop
