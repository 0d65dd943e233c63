// RedisClient: a blocking connection to a Redis server (hiredis), just enough for Redis Streams:
// one command at a time, or a pipeline of commands sent together (a MULTI ... EXEC transaction
// is a pipeline). Replies are copied out of hiredis into RedisReply values.
//
// Errors: a connection or protocol failure is an IOError and leaves the client unusable
// (reconnect with a new one); an error reply (-ERR ...) is a RedisReply of type kError, not a
// failed Status, so that callers can tell "the server said no" from "the server is gone".
//
// Not thread-safe: one owner.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"

struct redisContext;

namespace specloop {

struct RedisReply {
  enum class Type { kNil, kString, kStatus, kInteger, kArray, kError };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus, kError
  long long integer = 0;
  std::vector<RedisReply> elements;  // kArray
};

class RedisClient {
 public:
  // Connects to host:port, waiting at most `timeout_seconds` for the connection and for each
  // reply afterwards.
  static Status Connect(const std::string& host, int port, double timeout_seconds,
                        std::unique_ptr<RedisClient>* client);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Sends `argv` (binary-safe) and reads its reply.
  Status Command(const std::vector<std::string>& argv, RedisReply* reply);
  // Sends every command, then reads one reply each, in order.
  Status Pipeline(const std::vector<std::vector<std::string>>& commands,
                  std::vector<RedisReply>* replies);

 private:
  explicit RedisClient(redisContext* c) : c_(c) {}
  Status Append(const std::vector<std::string>& argv);
  Status Read(RedisReply* reply);
  redisContext* c_;
};

// Parses "HOST:PORT" (PORT alone means 127.0.0.1); false when malformed.
bool ParseRedisAddress(const std::string& address, std::string* host, int* port);

}  // namespace specloop
