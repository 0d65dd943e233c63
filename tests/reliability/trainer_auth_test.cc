// The worker's side of the trainer link against hostile peers, with a real `specloop serve`:
//   - CURVE: a worker started with --trainer-public-key does not swap to a draft announced by
//     a publisher without the trainer's secret key (another key, or no CURVE at all), and does
//     swap once the real trainer comes up on the same endpoints (it reconnects by itself);
//   - hostile announcements and transfers (no CURVE): versions that are not small positive
//     integers, path-like names in a bundle, and an oversized announcement are refused and
//     counted, nothing is written outside the staging directory, and serving goes on.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <zmq.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "tests/reliability/reliability_util.h"

namespace specloop {
namespace reliability {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// Arguments that make `specloop serve` follow a trainer on `pub`/`router`, staging in `staging`.
std::vector<std::string> FollowArgs(const std::string& pub, const std::string& router,
                                    const std::string& staging) {
  return {"--trainer-endpoint", pub, "--trainer-router", router, "--draft-staging", staging,
          "--k", "2"};
}

// DraftPublisher::Start on endpoints a stopped publisher just released (libzmq closes a
// listener asynchronously, so the first bind may still find the port taken).
Status StartPublisher(zmq::context_t* ctx, const PublisherOptions& po, const std::string& root,
                      std::unique_ptr<DraftPublisher>* out) {
  Status s;
  for (int i = 0; i < 100; ++i) {
    s = DraftPublisher::Start(ctx, po, root, out);
    if (s.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return s;
}

TEST(TrainerAuth, WorkerSwapsOnlyToTheTrainerHoldingTheSecretKey) {
  if (!zmq_has("curve")) GTEST_SKIP() << "libzmq without CURVE";
  TempDir tmp("specloop-curve");
  std::string trainer_public, trainer_secret, other_public, other_secret;
  ASSERT_TRUE(GenerateCurveKeyPair(&trainer_public, &trainer_secret).ok());
  ASSERT_TRUE(GenerateCurveKeyPair(&other_public, &other_secret).ok());
  const std::string checkpoints = tmp.Sub("checkpoints");
  ASSERT_TRUE(WriteCheckpoint(Shared() + "/models/draft-prose-1m", checkpoints, 1));
  PublisherOptions po;
  po.pub_endpoint = "tcp://127.0.0.1:" + std::to_string(FreePort());
  po.router_endpoint = "tcp://127.0.0.1:" + std::to_string(FreePort());

  std::vector<std::string> args = FollowArgs(po.pub_endpoint, po.router_endpoint,
                                             tmp.Sub("staging"));
  args.insert(args.end(), {"--trainer-public-key", trainer_public});
  ServeProcess serve(args);
  ASSERT_TRUE(serve.Start()) << serve.Output();
  const int port = serve.port();
  ClientLoop clients(port, 1);

  zmq::context_t ctx;
  // Impostors on the trainer's endpoints: one with another secret key, one without CURVE.
  for (const std::string& key : {other_secret, std::string()}) {
    PublisherOptions io = po;
    io.curve_secret_key = key;
    std::unique_ptr<DraftPublisher> impostor;
    ASSERT_TRUE(StartPublisher(&ctx, io, checkpoints, &impostor).ok());
    ASSERT_TRUE(impostor->Publish(1).ok());
    // The worker retries its connection every 100 ms; give it many chances to get through.
    ASSERT_TRUE(clients.WaitMore(3, 60));
    std::this_thread::sleep_for(std::chrono::seconds(2));
    EXPECT_EQ(impostor->subscriptions(), 0u) << (key.empty() ? "plain" : "other key");
    EXPECT_EQ(impostor->requests(), 0u) << (key.empty() ? "plain" : "other key");
    EXPECT_EQ(DraftVersion(port), 0);
    impostor->Stop();
  }
  EXPECT_TRUE(Entries(tmp.Sub("staging")).empty());
  EXPECT_EQ(serve.Output().find("fetching draft"), std::string::npos) << serve.Output();

  // The real trainer on the same endpoints: the worker reconnects, fetches and swaps.
  po.curve_secret_key = trainer_secret;
  std::unique_ptr<DraftPublisher> trainer;
  ASSERT_TRUE(StartPublisher(&ctx, po, checkpoints, &trainer).ok());
  ASSERT_TRUE(trainer->Publish(1).ok());
  EXPECT_TRUE(WaitFor([&] { return DraftVersion(port) == 1; }, 60)) << serve.Output();
  // The worker may have fetched through its request for the latest version before its
  // subscriber socket (reopened after the impostors' failed handshakes) is back.
  EXPECT_TRUE(WaitFor([&] { return trainer->subscriptions() >= 1; }, 30));
  EXPECT_TRUE(clients.WaitMore(2, 60));
  clients.Stop();
  EXPECT_EQ(clients.failed(), 0) << clients.first_failure();
  trainer->Stop();
}

TEST(TrainerAuth, KeygenKeysAuthenticateTheRealTrainerUnderUp) {
  if (!zmq_has("curve")) GTEST_SKIP() << "libzmq without CURVE";
  TempDir tmp("specloop-keygen");
  std::string out;
  ASSERT_EQ(RunCommand(std::string(SPECLOOP_BINARY) + " keygen " + ShellQuote(tmp.Sub("keys")),
                       &out),
            0);
  std::string public_key;
  ASSERT_TRUE(ReadFileToString(tmp.Sub("keys/trainer.pub"), &public_key).ok());
  while (!public_key.empty() && public_key.back() == '\n') public_key.pop_back();
  EXPECT_EQ(out, public_key + "\n");
  ASSERT_EQ(public_key.size(), 40u);
  struct stat st;
  ASSERT_EQ(stat(tmp.Sub("keys/trainer.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // A second keygen into the same place refuses to overwrite the key.
  EXPECT_NE(RunCommand(std::string(SPECLOOP_BINARY) + " keygen " + ShellQuote(tmp.Sub("keys")) +
                           " 2>/dev/null",
                       &out),
            0);

  UpSetup u;
  u.data = tmp.Sub("data");
  ASSERT_TRUE(u.Seed());
  Child up(u.Command({"--train-arg=--curve-secret-key-file=" + tmp.Sub("keys/trainer.key"),
                      "--serve-arg=--trainer-public-key=" + public_key}));
  ASSERT_FALSE(up.WaitForLine("serve is ready", 60).empty()) << up.Output();
  EXPECT_TRUE(WaitFor([&] { return DraftVersion(u.port) == 1; }, 60)) << up.Output();
  up.Signal(SIGINT);
  EXPECT_NE(up.Wait(60), -1);
}

// A hand-driven trainer: an XPUB for announcements and a ROUTER answering "latest" with
// not_found and every "get" with `bundle`'s bytes.
class FakeTrainer {
 public:
  FakeTrainer(zmq::context_t* ctx, std::string bundle) : bundle_(std::move(bundle)) {
    pub_ = zmq::socket_t(*ctx, zmq::socket_type::xpub);
    router_ = zmq::socket_t(*ctx, zmq::socket_type::router);
    for (zmq::socket_t* s : {&pub_, &router_}) s->set(zmq::sockopt::linger, 0);
    pub_.bind("tcp://127.0.0.1:*");
    router_.bind("tcp://127.0.0.1:*");
    pub_endpoint_ = pub_.get(zmq::sockopt::last_endpoint);
    router_endpoint_ = router_.get(zmq::sockopt::last_endpoint);
  }
  const std::string& pub_endpoint() const { return pub_endpoint_; }
  const std::string& router_endpoint() const { return router_endpoint_; }

  // Serves requests and announces `announcements` once a subscriber has arrived, then keeps
  // serving until `stop`.
  void Run(const std::vector<std::string>& announcements, const std::atomic<bool>& stop) {
    bool announced = false;
    while (!stop.load()) {
      zmq::pollitem_t items[] = {{pub_.handle(), 0, ZMQ_POLLIN, 0},
                                 {router_.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 2, std::chrono::milliseconds(20));
      if (items[0].revents & ZMQ_POLLIN) {
        zmq::message_t m;
        if (pub_.recv(m, zmq::recv_flags::dontwait) && m.size() > 0 &&
            static_cast<const char*>(m.data())[0] == 1 && !announced) {
          for (const std::string& a : announcements) {
            zmq::multipart_t msg;
            msg.addstr("draft");
            msg.addstr(a);
            msg.send(pub_);
          }
          announced = true;
        }
      }
      if (items[1].revents & ZMQ_POLLIN) {
        zmq::multipart_t req;
        if (!req.recv(router_, ZMQ_DONTWAIT) || req.size() < 2) continue;
        const std::string text = req.back().to_string();
        nlohmann::json h = {{"request", text}};
        std::string body;
        if (text.rfind("get ", 0) == 0) {
          std::istringstream in(text.substr(4));
          uint64_t v, off, len;
          in >> v >> off >> len;
          off = std::min<uint64_t>(off, bundle_.size());
          body = bundle_.substr(off, len);
          h.update({{"ok", true}, {"version", v}, {"offset", off}, {"len", body.size()}});
          gets_.fetch_add(1);
        } else {
          h.update({{"ok", false}, {"code", "not_found"}, {"error", "nothing published"}});
        }
        zmq::multipart_t reply;
        reply.addstr(req.at(0).to_string());
        reply.addstr(h.dump());
        reply.addstr(body);
        reply.send(router_, ZMQ_DONTWAIT);
      }
    }
  }
  uint64_t gets() const { return gets_.load(); }

 private:
  std::string bundle_;
  zmq::socket_t pub_, router_;
  std::string pub_endpoint_, router_endpoint_;
  std::atomic<uint64_t> gets_{0};
};

TEST(TrainerAuth, HostileAnnouncementsAndBundlesCannotEscapeTheStagingDir) {
  TempDir tmp("specloop-hostile");
  // A bundle whose meta.json is renamed to climb out of the staging directory.
  const std::string checkpoints = tmp.Sub("checkpoints");
  ASSERT_TRUE(WriteCheckpoint(Shared() + "/models/draft-prose-1m", checkpoints, 1));
  std::string bundle;
  ASSERT_TRUE(PackCheckpointBundle(checkpoints + "/v000001", &bundle).ok());
  bundle.replace(bundle.find("meta.json"), 9, "../a.json");
  const std::string sha = Sha256Hex(bundle.data(), bundle.size());
  const std::string hex(64, 'a');
  auto ann = [&](const std::string& version, uint64_t bytes, const std::string& sha256) {
    return "{\"version\": " + version + ", \"sha256\": \"" + sha256 +
           "\", \"bytes\": " + std::to_string(bytes) + "}";
  };
  const std::vector<std::string> bad_announcements = {
      ann("\"../../x\"", 10, hex),            // a path for a version
      ann("\"/etc\"", 10, hex),               // an absolute path
      ann("-1", 10, hex),                     // negative
      ann("1.5", 10, hex),                    // not an integer
      ann("1e300", 10, hex),                  // huge float
      ann("18446744073709551615", 10, hex),   // 2^64 - 1
      ann("1000000000000", 10, hex),          // past kMaxDraftVersion
      ann("2", 10, "../../../../etc/passwd"), // a path for a sha256
      "not json",
  };
  std::vector<std::string> all = bad_announcements;
  all.push_back(ann("3", uint64_t{1} << 40, hex));  // 1 TiB: over the fetcher's bundle limit
  all.push_back(ann("4", bundle.size(), sha));      // fetched; its file name climbs out

  zmq::context_t ctx;
  FakeTrainer trainer(&ctx, bundle);
  std::atomic<bool> stop{false};
  std::thread trainer_thread([&] { trainer.Run(all, stop); });
  const std::string staging = tmp.Sub("work/staging");
  fs::create_directories(staging);
  ServeProcess serve(FollowArgs(trainer.pub_endpoint(), trainer.router_endpoint(), staging));
  ASSERT_TRUE(serve.Start()) << serve.Output();
  const int port = serve.port();
  ClientLoop clients(port, 1);
  const std::string failures = "specloop_draft_swap_failures_total{reason=\"announcement\"}";
  EXPECT_TRUE(WaitFor([&] { return ScrapeMetric(port, failures) >= bad_announcements.size(); },
                      60))
      << serve.Output();
  EXPECT_TRUE(WaitFor([&] {
    return ScrapeMetric(port, "specloop_draft_swap_failures_total{reason=\"transfer\"}") >= 1;
  }, 60)) << serve.Output();
  EXPECT_GE(trainer.gets(), 1u);  // the last one was downloaded before it was refused
  EXPECT_GE(ScrapeMetric(port, "specloop_draft_swap_failures_total{reason=\"fetch\"}"), 1);
  EXPECT_TRUE(clients.WaitMore(2, 60));
  clients.Stop();
  stop.store(true);
  trainer_thread.join();

  EXPECT_EQ(ScrapeMetric(port, failures), bad_announcements.size());
  EXPECT_EQ(DraftVersion(port), 0);
  EXPECT_EQ(clients.failed(), 0) << clients.first_failure();
  // Nothing was left in staging, nor written beside it.
  EXPECT_TRUE(Entries(staging).empty());
  EXPECT_EQ(Entries(tmp.Sub("work")), std::vector<std::string>{"staging"});
  EXPECT_FALSE(fs::exists(tmp.Sub("a.json")));
  EXPECT_FALSE(fs::exists(tmp.Sub("work/a.json")));
}

}  // namespace
}  // namespace reliability
}  // namespace specloop
