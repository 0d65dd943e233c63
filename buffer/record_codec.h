// The replay record's binary format (version 1). Everything is little-endian; "varint" is the
// LEB128 unsigned varint of leveldb/protobuf (at most 5 bytes for 32 bits, 10 for 64).
//
//   byte 0      magic 0xB5
//   byte 1      format version (1)
//   bytes 2..5  fixed32 CRC-32C of bytes 6..end (the payload)
//   payload:
//     varint64 time_us | str domain | str request_id | varint32 worker_id
//     varint64 draft_version | str target_id
//     fixed32 temperature (float bits) | varint32 sampling top_k | fixed32 top_p | varint64 seed
//     varint32 prompt_len | varint32 n_tokens | n_tokens x varint32 token
//     varint32 K | varint32 n_steps | n_steps x step
//   str  = varint32 length + bytes
//   step = varint32 start_pos | varint32 k | k x varint32 draft token | varint32 num_accepted
//          | (k+1)*K x varint32 top-K id | (k+1)*K x fixed16 fp16 log-prob
//          | (k+1) x fixed32 tail mass (float bits)
// Token ids are written as their uint32 bit pattern, so any int32 round-trips.
// Trailing bytes after the last step are corruption.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "buffer/record.h"
#include "common/base/status.h"

namespace specloop {

constexpr uint8_t kRecordMagic = 0xB5;
constexpr uint8_t kRecordFormatVersion = 1;
constexpr size_t kRecordHeaderSize = 6;

// Appends the encoding of `r` to *out. Returns InvalidArgument (and leaves *out as it was)
// when ValidateRecord(r) is not empty.
Status EncodeRecord(const Record& r, std::string* out);

// Parses `data` into *r. Returns Corruption when `data` is truncated, fails its checksum,
// has a wrong magic, or holds sizes or values that contradict each other; NotSupported for an
// unknown format version. Never reads outside `data`, whatever its contents; on failure *r is
// left in an unspecified but valid state.
Status DecodeRecord(std::string_view data, Record* r);

// Checks magic, version and checksum only (no parse); same error codes as DecodeRecord.
Status CheckRecordChecksum(std::string_view data);

}  // namespace specloop
