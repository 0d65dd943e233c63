#include "fleet/stream_trim.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>

namespace specloop {

StreamId StreamId::Next() const {
  if (seq == std::numeric_limits<uint64_t>::max()) return {ms + 1, 0};
  return {ms, seq + 1};
}

std::string StreamId::ToString() const {
  return std::to_string(ms) + "-" + std::to_string(seq);
}

namespace {

bool ParseU64(const std::string& text, uint64_t* v) {
  if (text.empty() || text.size() > 20) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  errno = 0;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return false;
  *v = x;
  return true;
}

Status Unexpected(const std::string& what, const RedisReply& r) {
  return Status::IOError("stream trim: " + what + ": " +
                         (r.type == RedisReply::Type::kError ? r.str : "unexpected reply"));
}

// An integer reply field (RESP2: kInteger), or -1 for nil.
int64_t IntegerOrMinusOne(const RedisReply& r) {
  return r.type == RedisReply::Type::kInteger ? static_cast<int64_t>(r.integer) : -1;
}

// XINFO GROUPS: one flat array "name" v "pending" v ... per group.
Status ReadGroups(RedisClient* redis, const std::string& stream,
                  std::vector<StreamGroupState>* groups, std::vector<StreamId>* last_delivered,
                  bool* missing) {
  RedisReply r;
  Status s = redis->Command({"XINFO", "GROUPS", stream}, &r);
  if (!s.ok()) return s;
  *missing = false;
  if (r.type == RedisReply::Type::kError && r.str.find("no such key") != std::string::npos) {
    *missing = true;
    return Status::OK();
  }
  if (r.type != RedisReply::Type::kArray) return Unexpected("XINFO GROUPS", r);
  for (const RedisReply& g : r.elements) {
    StreamGroupState st;
    StreamId last;
    bool have_name = false, have_last = false;
    for (size_t i = 0; i + 1 < g.elements.size(); i += 2) {
      const std::string& field = g.elements[i].str;
      const RedisReply& v = g.elements[i + 1];
      if (field == "name") {
        st.name = v.str;
        have_name = true;
      } else if (field == "pending") {
        st.pending = static_cast<uint64_t>(std::max<long long>(0, v.integer));
      } else if (field == "last-delivered-id") {
        have_last = ParseStreamId(v.str, &last);
      } else if (field == "lag") {
        st.undelivered = IntegerOrMinusOne(v);
      }
    }
    if (!have_name || !have_last) return Unexpected("XINFO GROUPS (a group without name or id)", r);
    groups->push_back(std::move(st));
    last_delivered->push_back(last);
  }
  return Status::OK();
}

}  // namespace

bool ParseStreamId(const std::string& text, StreamId* id) {
  const size_t dash = text.find('-');
  StreamId out;
  if (!ParseU64(text.substr(0, dash), &out.ms)) return false;
  if (dash != std::string::npos && !ParseU64(text.substr(dash + 1), &out.seq)) return false;
  *id = out;
  return true;
}

Status TrimStream(RedisClient* redis, const std::string& stream, uint64_t max_length,
                  const std::string& group, StreamTrimResult* result) {
  *result = StreamTrimResult();
  std::vector<StreamId> last_delivered;
  bool missing = false;
  Status s = ReadGroups(redis, stream, &result->groups, &last_delivered, &missing);
  if (!s.ok() || missing) return s;

  // Each group's oldest needed entry: its oldest pending one, else the one after its last
  // delivered (which may not exist yet: then it needs nothing the stream holds).
  bool any_needed = false;
  StreamId oldest;
  for (size_t i = 0; i < result->groups.size(); ++i) {
    StreamGroupState& g = result->groups[i];
    g.oldest_needed = last_delivered[i].Next();
    if (g.pending > 0) {
      RedisReply r;
      s = redis->Command({"XPENDING", stream, g.name}, &r);
      if (!s.ok()) return s;
      // [count, smallest id, greatest id, [[consumer, count], ...]]
      if (r.type != RedisReply::Type::kArray || r.elements.size() < 2) {
        return Unexpected("XPENDING", r);
      }
      StreamId first;
      if (r.elements[1].type == RedisReply::Type::kString &&
          ParseStreamId(r.elements[1].str, &first)) {
        g.oldest_needed = first;
      }
    }
    g.has_needed = g.pending > 0 || g.undelivered != 0;
    if (i == 0 || g.oldest_needed < oldest) oldest = g.oldest_needed;
    any_needed = true;
  }

  RedisReply r;
  if (any_needed) {
    s = redis->Command({"XTRIM", stream, "MINID", "=", oldest.ToString()}, &r);
    if (!s.ok()) return s;
    if (r.type != RedisReply::Type::kInteger) return Unexpected("XTRIM MINID", r);
    result->acknowledged_trimmed = static_cast<uint64_t>(r.integer);
  }
  if (max_length > 0) {
    s = redis->Command({"XTRIM", stream, "MAXLEN", "=", std::to_string(max_length)}, &r);
    if (!s.ok()) return s;
    if (r.type != RedisReply::Type::kInteger) return Unexpected("XTRIM MAXLEN", r);
    result->dropped = static_cast<uint64_t>(r.integer);
  }
  s = redis->Command({"XLEN", stream}, &r);
  if (!s.ok()) return s;
  if (r.type != RedisReply::Type::kInteger) return Unexpected("XLEN", r);
  result->length = static_cast<uint64_t>(r.integer);

  for (const StreamGroupState& g : result->groups) {
    if (g.name != group) continue;
    const uint64_t known = g.undelivered >= 0 ? g.pending + static_cast<uint64_t>(g.undelivered)
                                              : result->length;
    result->group_unacknowledged = std::min(known, result->length);
    // The oldest entry still in the stream at or after the group's oldest needed id (its first
    // undelivered entry may be much newer than the id after its last delivered one).
    s = redis->Command({"XRANGE", stream, g.oldest_needed.ToString(), "+", "COUNT", "1"}, &r);
    if (!s.ok()) return s;
    if (r.type != RedisReply::Type::kArray) return Unexpected("XRANGE", r);
    if (!r.elements.empty() && !r.elements[0].elements.empty() &&
        ParseStreamId(r.elements[0].elements[0].str, &result->group_oldest_needed)) {
      result->group_has_needed = result->group_unacknowledged > 0;
    }
  }
  return Status::OK();
}

}  // namespace specloop
