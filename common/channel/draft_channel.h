// DraftChannel: how a trainer hands new draft checkpoints to serving workers over ZeroMQ
// (DESIGN.md section 7). Both sides live here: DraftPublisher (trainer) and DraftFetcher
// (worker). The worker checks architecture and vocabulary itself after Fetch() (ModelConfig::
// FromDir + CheckDraftCompatible), loads off its decoding thread and swaps.
//
// Wire protocol, version 1
// ------------------------
// Bundle. A checkpoint travels as one byte string, the concatenation of the files of its
// directory vNNNNNN/ in a fixed order:
//     "SPECLOOP-CKPT 1\n"
//     then for each of config.json, meta.json, model.safetensors:  "<name> <size>\n" <size bytes>
// The same directory always packs to the same bytes. sha256 and bytes below are the SHA-256
// (64 lowercase hex digits) and length of the bundle; meta.json's own "sha256" key is that of
// model.safetensors alone (a file cannot hold its own hash), and Fetch() checks it too.
//
// Announcement (PUB, trainer binds; workers SUB): a two-frame message
//     frame 0: "draft"  (the topic; subscribe to it)
//     frame 1: JSON {"version": N, "sha256": "<hex>", "bytes": B, "config_sha256": "<hex>"}
// sent when a version is published, and again (the latest) whenever a new subscription
// arrives, so a late subscriber learns the latest version without asking.
//
// Requests (ROUTER, trainer binds; workers connect a DEALER). A request is one frame of text:
//     "latest"               the latest published version
//     "get <N> <off> <len>"  bytes [off, off + len) of version N's bundle; N, off, len are
//                            decimal digits only (so a request can never name a path);
//                            len <= the publisher's max_chunk_bytes, and a range past the end
//                            is cut at the end (an empty chunk at or past the end)
// The reply is two frames: a JSON header and a body.
//     ok:     {"ok": true, "request": "<the request>", ...}
//             "latest": header adds version, sha256, bytes, config_sha256; body empty
//             "get":    header adds version, offset, len; body = the bytes
//     error:  {"ok": false, "request": "<the request>", "code": "not_found" |
//              "invalid_argument" | "io_error", "error": "<message>"}; body empty
//             ("latest" before any publication answers code "not_found").
// The header echoes the request so a client can drop a late reply to an earlier request.
//
// CURVE (optional): the trainer is the CURVE server on both sockets (its secret key in
// PublisherOptions); a worker needs the trainer's public key and a key pair of its own
// (generated when not given). Keys are 40-character Z85 strings (zmq_curve_keypair). Without
// keys the sockets are plain TCP: bind them to loopback.
//
// Threads: one zmq::context_t per process, passed in and outliving these objects.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/base/status.h"

namespace zmq {
class context_t;
}

namespace specloop {

// Versions are 1 .. kMaxDraftVersion (12 decimal digits), so a version name is at most
// "v" + 12 digits and a counter can never wrap; larger numbers from the network or from disk
// are refused like malformed ones.
constexpr uint64_t kMaxDraftVersion = 999999999999ull;

struct DraftAnnouncement {
  uint64_t version = 0;
  std::string sha256;         // of the bundle, 64 lowercase hex digits
  uint64_t bytes = 0;         // bundle length
  std::string config_sha256;  // of config.json; empty when not given

  std::string ToJson() const;
  // InvalidArgument unless `json` holds version (integer in 1 .. kMaxDraftVersion), sha256
  // (64 hex digits) and bytes (integer); config_sha256 is optional.
  static Status FromJson(const std::string& json, DraftAnnouncement* out);
};

// "v000042" for 42 (at least six digits). The only way a version becomes a path.
std::string VersionDirName(uint64_t version);
// Parses "v" + digits (as VersionDirName writes them, or longer) into *version in
// 1 .. kMaxDraftVersion; false for anything else ("v0", "v12/..", "latest", "v-1", more than
// 12 digits of value).
bool ParseVersionDirName(const std::string& name, uint64_t* version);

// SHA-256 in lowercase hex.
std::string Sha256Hex(const void* data, size_t size);
Status Sha256File(const std::string& path, std::string* hex);

// Packs DIR's config.json, meta.json and model.safetensors into a bundle (format above).
Status PackCheckpointBundle(const std::string& dir, std::string* bundle);
// Writes the files of `bundle` into `dir` (created if needed). Corruption when the bundle is
// malformed (bad magic, unknown or repeated file name, size past the end, trailing bytes).
Status UnpackCheckpointBundle(const std::string& bundle, const std::string& dir);

// A fresh CURVE key pair, Z85. NotSupported when libzmq has no CURVE.
Status GenerateCurveKeyPair(std::string* public_key, std::string* secret_key);

struct PublisherOptions {
  // Where the PUB and ROUTER sockets bind. "tcp://127.0.0.1:*" picks a free port (read the
  // bound endpoint back with pub_endpoint()/router_endpoint()).
  // Default: tcp://127.0.0.1:5557 and tcp://127.0.0.1:5558.
  std::string pub_endpoint = "tcp://127.0.0.1:5557";
  std::string router_endpoint = "tcp://127.0.0.1:5558";
  // The trainer's CURVE secret key (Z85); empty: no CURVE. Default: empty.
  std::string curve_secret_key;
  // Longest chunk one "get" returns. Default: 4 MiB.
  uint64_t max_chunk_bytes = 4u << 20;
};

// Serves checkpoints from `checkpoint_root`/vNNNNNN and announces new ones. One background
// thread owns both sockets. Publish() and the accessors are thread-safe.
class DraftPublisher {
 public:
  // Binds both sockets and starts the serving thread. IOError when a bind fails.
  static Status Start(zmq::context_t* context, const PublisherOptions& options,
                      const std::string& checkpoint_root, std::unique_ptr<DraftPublisher>* out);
  // Stop().
  ~DraftPublisher();
  DraftPublisher(const DraftPublisher&) = delete;
  DraftPublisher& operator=(const DraftPublisher&) = delete;

  // Packs checkpoint_root/vNNNNNN, makes it the latest version (served to "latest" and to new
  // subscribers) and announces it. The packed bundle of the latest version is kept in memory;
  // older versions are packed again from disk on request while their directory exists.
  // NotFound/IOError when the directory cannot be packed.
  Status Publish(uint64_t version, DraftAnnouncement* announced = nullptr);

  // The bound endpoints, as tcp://127.0.0.1:PORT.
  std::string pub_endpoint() const;
  std::string router_endpoint() const;
  // Subscriptions seen on the PUB socket so far. A test waits on this (a handshake, not a
  // sleep) before it expects an announcement to arrive.
  uint64_t subscriptions() const { return subscriptions_.load(); }
  // Requests answered so far, counted before each reply leaves: once a peer has a reply, its
  // request is in this count.
  uint64_t requests() const { return requests_.load(); }

  // Stops the thread and closes the sockets. Idempotent.
  void Stop();

 private:
  struct Impl;
  DraftPublisher();
  std::unique_ptr<Impl> impl_;
  std::atomic<uint64_t> subscriptions_{0};
  std::atomic<uint64_t> requests_{0};
};

struct FetcherOptions {
  // The trainer's endpoints. Default: those of PublisherOptions.
  std::string pub_endpoint = "tcp://127.0.0.1:5557";
  std::string router_endpoint = "tcp://127.0.0.1:5558";
  // The trainer's CURVE public key (Z85); empty: no CURVE. Default: empty.
  std::string curve_server_key;
  // This worker's key pair; generated when empty and curve_server_key is set. Default: empty.
  std::string curve_public_key, curve_secret_key;
  // Bytes asked per "get". Default: 1 MiB.
  uint64_t chunk_bytes = 1u << 20;
  // How long one request waits for its reply. Default: 5000.
  int request_timeout_ms = 5000;
  // Largest bundle Fetch() accepts (guards against a bogus announcement). Default: 4 GiB.
  uint64_t max_bundle_bytes = 4ull << 30;
  // Least time between two reopens after failed handshakes. Default: 1000.
  int reopen_interval_ms = 1000;
};

// The worker's side: a SUB socket for announcements and a DEALER for requests. Both reconnect
// by themselves when the trainer restarts; after a failed handshake (a peer without the
// trainer's CURVE key, or without CURVE), which libzmq never retries, the fetcher reopens them
// (at most every reopen_interval_ms, from WaitAnnouncement and from requests waiting for a
// reply). Not thread-safe: use one fetcher from one thread (e.g. the worker's swap thread).
class DraftFetcher {
 public:
  static Status Open(zmq::context_t* context, const FetcherOptions& options,
                     std::unique_ptr<DraftFetcher>* out);
  ~DraftFetcher();
  DraftFetcher(const DraftFetcher&) = delete;
  DraftFetcher& operator=(const DraftFetcher&) = delete;

  // Waits up to timeout_ms (0: just polls) for the next announcement. NotFound when none came,
  // Corruption when one did but does not parse.
  Status WaitAnnouncement(int timeout_ms, DraftAnnouncement* out);
  // Asks for the latest version. NotFound when nothing is published yet, IOError on timeout.
  Status Latest(DraftAnnouncement* out);
  // Downloads `a`'s bundle in chunks, checks its size and sha256 against `a`, unpacks it into
  // staging_root/vNNNNNN (built in a temporary directory, then renamed over any old one),
  // checks that meta.json's sha256 and version match, and sets *dir to the directory.
  // Corruption for a short, long, malformed or altered transfer (nothing is left in
  // staging_root then); IOError on timeouts or file errors.
  Status Fetch(const DraftAnnouncement& a, const std::string& staging_root, std::string* dir);
  // How many times the sockets were reopened after failed handshakes.
  uint64_t reopens() const;

 private:
  struct Impl;
  DraftFetcher();
  std::unique_ptr<Impl> impl_;
};

}  // namespace specloop
