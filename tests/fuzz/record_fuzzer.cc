// Replay record decoding (buffer/record_codec.h): the bytes a reader gets from a buffer that a
// crashed writer, a bad disk or another program may have left. DecodeRecord runs twice: on the
// input as given (the checksum rejects almost every mutation) and on a copy whose CRC-32C is
// made right, so the payload parser sees the mutations. A record that decodes must be valid,
// re-encode, and decode back to itself.
#include <cstring>
#include <string>
#include <string_view>

#include "buffer/crc32c.h"
#include "buffer/record.h"
#include "buffer/record_codec.h"
#include "tests/fuzz/fuzz_util.h"

using namespace specloop;

namespace {

void CheckDecoded(std::string_view bytes) {
  Record r;
  if (!DecodeRecord(bytes, &r).ok()) return;
  FUZZ_CHECK(ValidateRecord(r).empty());
  std::string again;
  FUZZ_CHECK(EncodeRecord(r, &again).ok());
  Record back;
  FUZZ_CHECK(DecodeRecord(again, &back).ok());
  FUZZ_CHECK(back == r);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view raw(reinterpret_cast<const char*>(data), size);
  CheckDecoded(raw);
  (void)CheckRecordChecksum(raw);
  if (size < kRecordHeaderSize) return 0;
  std::string fixed(raw);
  const uint32_t crc =
      crc32c::Value(fixed.data() + kRecordHeaderSize, fixed.size() - kRecordHeaderSize);
  for (int i = 0; i < 4; ++i) fixed[2 + i] = static_cast<char>(crc >> (8 * i));
  CheckDecoded(fixed);
  return 0;
}
