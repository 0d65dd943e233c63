#include "fleet/redis_client.h"

#include <sys/time.h>

#include <hiredis/hiredis.h>

namespace specloop {

namespace {

void Copy(const redisReply* r, RedisReply* out) {
  *out = RedisReply();
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out->type = RedisReply::Type::kString;
      out->str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out->type = RedisReply::Type::kStatus;
      out->str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out->type = RedisReply::Type::kError;
      out->str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out->type = RedisReply::Type::kInteger;
      out->integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out->type = RedisReply::Type::kArray;
      out->elements.resize(r->elements);
      for (size_t i = 0; i < r->elements; ++i) Copy(r->element[i], &out->elements[i]);
      break;
    default:  // REDIS_REPLY_NIL
      break;
  }
}

timeval Timeval(double seconds) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - tv.tv_sec) * 1e6);
  return tv;
}

}  // namespace

Status RedisClient::Connect(const std::string& host, int port, double timeout_seconds,
                            std::unique_ptr<RedisClient>* client) {
  redisContext* c = redisConnectWithTimeout(host.c_str(), port, Timeval(timeout_seconds));
  if (c == nullptr) return Status::IOError("redis: cannot allocate a connection");
  if (c->err) {
    Status s = Status::IOError("redis " + host + ":" + std::to_string(port) + ": " + c->errstr);
    redisFree(c);
    return s;
  }
  if (redisSetTimeout(c, Timeval(timeout_seconds)) != REDIS_OK) {
    redisFree(c);
    return Status::IOError("redis: cannot set the reply timeout");
  }
  client->reset(new RedisClient(c));
  return Status::OK();
}

RedisClient::~RedisClient() { redisFree(c_); }

Status RedisClient::Append(const std::vector<std::string>& argv) {
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  if (redisAppendCommandArgv(c_, static_cast<int>(argv.size()), args.data(), lens.data()) !=
      REDIS_OK) {
    return Status::IOError(std::string("redis: ") + c_->errstr);
  }
  return Status::OK();
}

Status RedisClient::Read(RedisReply* reply) {
  void* r = nullptr;
  if (redisGetReply(c_, &r) != REDIS_OK || r == nullptr) {
    return Status::IOError(std::string("redis: ") + (c_->err ? c_->errstr : "no reply"));
  }
  Copy(static_cast<redisReply*>(r), reply);
  freeReplyObject(r);
  return Status::OK();
}

Status RedisClient::Command(const std::vector<std::string>& argv, RedisReply* reply) {
  Status s = Append(argv);
  return s.ok() ? Read(reply) : s;
}

Status RedisClient::Pipeline(const std::vector<std::vector<std::string>>& commands,
                             std::vector<RedisReply>* replies) {
  for (const auto& argv : commands) {
    Status s = Append(argv);
    if (!s.ok()) return s;
  }
  replies->resize(commands.size());
  for (RedisReply& r : *replies) {
    Status s = Read(&r);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

bool ParseRedisAddress(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  const std::string port_text = colon == std::string::npos ? address : address.substr(colon + 1);
  *host = colon == std::string::npos ? "127.0.0.1" : address.substr(0, colon);
  try {
    size_t used = 0;
    *port = std::stoi(port_text, &used);
    return used == port_text.size() && *port > 0 && *port < 65536 && !host->empty();
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace specloop
