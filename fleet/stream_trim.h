// TrimStream: keeps the fleet's Redis stream bounded (docs/operations.md, "The record stream").
//
// An entry is done once every consumer group of the stream has acknowledged it: for each group
// the oldest entry it still needs is its oldest pending entry (delivered, not acknowledged;
// XPENDING), or, with none pending, the first entry after its last-delivered id (XINFO GROUPS).
// TrimStream removes every entry older than the oldest of those (XTRIM MINID, exact): no
// group loses an entry it has not acknowledged. A stream without a consumer group is not
// trimmed this way (nothing has consumed it yet).
//
// Optionally it then caps the stream at `max_length` entries (XTRIM MAXLEN, exact): the
// operator's bound for when a consumer is down or slow. Entries the cap removes were not yet
// acknowledged by some group (or there is no group): they are lost to that group and counted
// in `dropped`. A group reading a dropped entry it had been delivered sees it without fields
// (StreamIngester counts it as missing).
//
// Races: other clients may add and acknowledge entries between the reads and the trims. New
// entries are newer than every id computed here, so they are never trimmed as acknowledged;
// an entry acknowledged after the reads may be counted as dropped by the cap. A consumer group
// created meanwhile from id 0 does not get the entries trimmed at that moment.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fleet/redis_client.h"
#include "common/base/status.h"

namespace specloop {

// A stream entry id "<ms>-<seq>".
struct StreamId {
  uint64_t ms = 0, seq = 0;
  bool operator<(const StreamId& o) const { return ms != o.ms ? ms < o.ms : seq < o.seq; }
  bool operator==(const StreamId& o) const { return ms == o.ms && seq == o.seq; }
  // The smallest id after this one.
  StreamId Next() const;
  std::string ToString() const;
};
// Parses "<ms>-<seq>" (or "<ms>", seq 0); false when malformed.
bool ParseStreamId(const std::string& text, StreamId* id);

// One consumer group as TrimStream read it, before trimming.
struct StreamGroupState {
  std::string name;
  uint64_t pending = 0;  // delivered, not acknowledged
  // Entries not yet delivered to the group (XINFO GROUPS "lag"); -1 when Redis cannot tell
  // (entries were removed after the group's last-delivered id, e.g. by the cap).
  int64_t undelivered = -1;
  StreamId oldest_needed;    // the oldest entry id the group still needs (see above)
  bool has_needed = false;   // pending entries, or undelivered ones (or Redis cannot tell)
};

struct StreamTrimResult {
  std::vector<StreamGroupState> groups;
  uint64_t acknowledged_trimmed = 0;  // removed: acknowledged by every group
  uint64_t dropped = 0;               // removed by the cap: not acknowledged by some group
  uint64_t length = 0;                // XLEN after trimming
  // Of the group named in TrimStream's `group` (when it exists): its pending plus undelivered
  // entries (when Redis cannot tell the undelivered ones: the stream's length after trimming,
  // an upper bound; at most that length), and the id of the oldest entry still in the stream
  // that it needs (group_has_needed false: none).
  uint64_t group_unacknowledged = 0;
  bool group_has_needed = false;
  StreamId group_oldest_needed;
};

// Trims `stream` as described above; `max_length` 0: no cap. A missing stream is OK (all
// zeros). IOError when Redis fails or answers unexpectedly; on error the stream may have been
// trimmed by the acknowledged rule but not yet capped. `group` (may be empty) names the group
// whose lag fills result->group_*.
Status TrimStream(RedisClient* redis, const std::string& stream, uint64_t max_length,
                  const std::string& group, StreamTrimResult* result);

}  // namespace specloop
