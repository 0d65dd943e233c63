#include "buffer/record_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "buffer/crc32c.h"
#include "common/base/half.h"
#include "buffer/keys.h"
#include "tests/buffer/test_util.h"

namespace specloop {
namespace {

using testing::Below;
using testing::RandomRecord;

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c::Value("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c::Value("", 0), 0u);
  std::string zeros(32, '\0');
  EXPECT_EQ(crc32c::Value(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
  // Extend over chunks equals one pass.
  std::string s = "The quick brown fox jumps over the lazy dog, many times over.";
  for (size_t cut = 0; cut <= s.size(); cut++) {
    EXPECT_EQ(crc32c::Extend(crc32c::Value(s.data(), cut), s.data() + cut, s.size() - cut),
              crc32c::Value(s.data(), s.size()));
  }
}

TEST(Half, ExactValuesAndRounding) {
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // rounds up to inf
  EXPECT_EQ(FloatToHalf(1e9f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: 0
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even: down
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie to even: up
  // Every non-NaN half converts to float and back to itself.
  for (uint32_t h = 0; h < 0x10000; h++) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), h) << h;
  }
  // Conversion error of random floats is within half an ulp (relative 2^-11).
  Rng rng(3);
  for (int i = 0; i < 100000; i++) {
    const float f = static_cast<float>((rng.Uniform() - 0.5) * 60000);
    const float back = HalfToFloat(FloatToHalf(f));
    if (std::fabs(f) > 1e-4f) {
      ASSERT_LE(std::fabs(back - f), std::fabs(f) * std::ldexp(1.0f, -11) * 1.0001f) << f;
    }
  }
}

TEST(Keys, OrderAndParse) {
  const std::string a = RecordKey(100, 7, 5), b = RecordKey(100, 7, 6), c = RecordKey(101, 0, 0);
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
  EXPECT_LT(TimeKey(100), a);
  EXPECT_LT(a, TimeKey(101));
  uint64_t t, s;
  uint32_t w;
  ASSERT_TRUE(ParseRecordKey(b, &t, &w, &s));
  EXPECT_EQ(t, 100u);
  EXPECT_EQ(w, 7u);
  EXPECT_EQ(s, 6u);
  EXPECT_FALSE(ParseRecordKey("short", &t, &w, &s));
  std::string_view d, rk;
  const std::string ik = DomainIndexKey("py", a);
  ASSERT_TRUE(ParseDomainIndexKey(ik, &d, &rk));
  EXPECT_EQ(d, "py");
  EXPECT_EQ(rk, a);
  EXPECT_LT(DomainIndexKey("a", c), DomainIndexKey("ab", a));  // domains do not interleave
}

TEST(RecordCodec, RoundTripsRandomRecordsOfAllShapes) {
  Rng rng(42);
  testing::Shape big;
  big.max_tokens = 600;
  big.max_steps = 40;
  big.max_k = 9;
  big.max_top_k = 80;
  big.vocab = 1u << 31;
  for (int i = 0; i < 3000; i++) {
    const Record r = RandomRecord(&rng, i % 3 == 0 ? big : testing::Shape());
    std::string enc;
    ASSERT_TRUE(EncodeRecord(r, &enc).ok());
    Record back;
    Status s = DecodeRecord(enc, &back);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(back, r) << "record " << i;
  }
  // The empty record round-trips too.
  Record empty;
  std::string enc;
  ASSERT_TRUE(EncodeRecord(empty, &enc).ok());
  Record back;
  back.domain = "junk";
  ASSERT_TRUE(DecodeRecord(enc, &back).ok());
  EXPECT_EQ(back, empty);
}

TEST(RecordCodec, EncodeAppendsAndRejectsInvalidRecords) {
  Rng rng(1);
  Record r = RandomRecord(&rng);
  std::string out = "prefix";
  ASSERT_TRUE(EncodeRecord(r, &out).ok());
  Record back;
  ASSERT_TRUE(DecodeRecord(std::string_view(out).substr(6), &back).ok());
  EXPECT_EQ(back, r);

  Record bad = r;
  bad.prompt_len = static_cast<uint32_t>(bad.tokens.size() + 1);
  std::string o2 = "x";
  EXPECT_TRUE(EncodeRecord(bad, &o2).IsInvalidArgument());
  EXPECT_EQ(o2, "x");
  bad = r;
  bad.domain = std::string("a\0b", 3);
  EXPECT_TRUE(EncodeRecord(bad, &o2).IsInvalidArgument());
  bad = r;
  bad.steps.push_back(SpecStep());
  bad.steps.back().draft_tokens = {1, 2};
  bad.steps.back().num_accepted = 3;
  EXPECT_FALSE(ValidateRecord(bad).empty());
  bad.steps.back().num_accepted = 1;
  EXPECT_FALSE(ValidateRecord(bad).empty());  // top-K arrays missing
}

// Every truncation and every single-byte change of an encoding is rejected with a Status.
TEST(RecordCodec, CorruptOrTruncatedInputIsAnErrorNeverUB) {
  Rng rng(7);
  for (int i = 0; i < 20; i++) {
    const Record r = RandomRecord(&rng);
    std::string enc;
    ASSERT_TRUE(EncodeRecord(r, &enc).ok());
    Record out;
    for (size_t n = 0; n < enc.size(); n++) {
      Status s = DecodeRecord(std::string_view(enc.data(), n), &out);
      ASSERT_TRUE(s.IsCorruption()) << n << " " << s.ToString();
    }
    for (size_t pos = 0; pos < enc.size(); pos += 1 + enc.size() / 200) {
      std::string bad = enc;
      bad[pos] ^= static_cast<char>(1 + Below(&rng, 255));
      Status s = DecodeRecord(bad, &out);
      ASSERT_FALSE(s.ok()) << pos;
    }
    std::string longer = enc + "x";
    EXPECT_TRUE(DecodeRecord(longer, &out).IsCorruption());
  }
  std::string enc;
  ASSERT_TRUE(EncodeRecord(Record(), &enc).ok());
  enc[1] = 9;
  Record out;
  EXPECT_EQ(DecodeRecord(enc, &out).code(), Status::Code::kNotSupported);
}

// Payloads whose checksum is right but whose fields lie (huge counts, bad varints) are
// rejected by the bounds checks, not by the checksum. Built by re-checksumming mutations.
TEST(RecordCodec, ValidChecksumOverGarbageIsRejected) {
  Rng rng(11);
  Record out;
  auto seal = [](std::string payload) {
    std::string d;
    d.push_back(static_cast<char>(kRecordMagic));
    d.push_back(static_cast<char>(kRecordFormatVersion));
    const uint32_t c = crc32c::Value(payload.data(), payload.size());
    for (int i = 0; i < 4; i++) d.push_back(static_cast<char>(c >> (8 * i)));
    return d + payload;
  };
  int ok = 0;
  for (int i = 0; i < 20000; i++) {
    std::string payload(Below(&rng, 64), '\0');
    for (char& c : payload) c = static_cast<char>(rng.Next());
    if (i % 2 == 0) {  // mostly-valid prefix with mutated tail
      const Record r = RandomRecord(&rng);
      std::string enc;
      ASSERT_TRUE(EncodeRecord(r, &enc).ok());
      payload = enc.substr(kRecordHeaderSize);
      const size_t pos = Below(&rng, payload.size());
      payload[pos] = static_cast<char>(rng.Next());
      payload.resize(payload.size() - Below(&rng, 3));
    }
    if (DecodeRecord(seal(payload), &out).ok()) ok++;
  }
  // Some mutations (e.g. of a token id) still decode: fine, they are valid records.
  EXPECT_LT(ok, 20000);
  // Huge counts must not allocate: n_tokens = 2^32-1 with nothing after.
  std::string p = std::string("\x01\x00\x00\x00\x00\x00", 6);  // time=1, domain "", request "", worker 0,
                                                   // version 0, target ""
  p += std::string(4, '\0') + '\0' + std::string(4, '\0') + '\0' + '\0';  // sampling, prompt 0
  p += "\xff\xff\xff\xff\x0f";                                           // n_tokens
  EXPECT_TRUE(DecodeRecord(seal(p), &out).IsCorruption());
}

}  // namespace
}  // namespace specloop
