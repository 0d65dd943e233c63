// DomainReserve (trainer/domain_reserve.h): per domain, the newest records, encoded, bounded.
#include "trainer/domain_reserve.h"

#include <gtest/gtest.h>

#include <map>

#include "buffer/record_codec.h"

namespace specloop {
namespace trainer {
namespace {

Record Make(const std::string& domain, uint64_t time_us) {
  Record r;
  r.domain = domain;
  r.time_us = time_us;
  r.request_id = domain + "-" + std::to_string(time_us);
  r.tokens = {1, 2, 3, static_cast<int32_t>(time_us % 1000)};
  r.prompt_len = 2;
  return r;
}

std::string Key(const Record& r) { return r.request_id; }

TEST(DomainReserve, KeepsTheNewestOfEachDomainAndDropsTheOldest) {
  DomainReserve reserve(3);
  // Out of order, two domains; "docs" gets 6, "c" 2.
  for (uint64_t t : {5, 1, 9, 3, 7, 2}) ASSERT_TRUE(reserve.Add(Key(Make("docs", t)), Make("docs", t)).ok());
  for (uint64_t t : {4, 8}) ASSERT_TRUE(reserve.Add(Key(Make("c", t)), Make("c", t)).ok());
  EXPECT_EQ(reserve.size("docs"), 3u);
  EXPECT_EQ(reserve.size("c"), 2u);
  EXPECT_EQ(reserve.size("python"), 0u);
  EXPECT_EQ(reserve.Domains(), (std::vector<std::string>{"c", "docs"}));
  for (uint64_t t : {5, 7, 9}) EXPECT_TRUE(reserve.Contains(Key(Make("docs", t)))) << t;
  for (uint64_t t : {1, 2, 3}) EXPECT_FALSE(reserve.Contains(Key(Make("docs", t)))) << t;
  Record r;
  ASSERT_TRUE(reserve.Get(Key(Make("docs", 7)), &r).ok());
  EXPECT_EQ(r.domain, "docs");
  EXPECT_EQ(r.time_us, 7u);
  EXPECT_EQ(r.tokens, Make("docs", 7).tokens);
  EXPECT_TRUE(reserve.Get(Key(Make("docs", 1)), &r).IsNotFound());
  EXPECT_GT(reserve.bytes(), 0u);
}

TEST(DomainReserve, SamplesOnlyTheAskedDomainAndEveryRecordOfIt) {
  DomainReserve reserve(4);
  for (uint64_t t = 1; t <= 4; ++t) {
    ASSERT_TRUE(reserve.Add(Key(Make("docs", t)), Make("docs", t)).ok());
    ASSERT_TRUE(reserve.Add(Key(Make("c", 100 + t)), Make("c", 100 + t)).ok());
  }
  Rng rng;
  rng.Seed(3);
  std::map<uint64_t, int> drawn;
  for (int i = 0; i < 400; ++i) {
    Record r;
    ASSERT_TRUE(reserve.Sample("docs", &rng, &r).ok());
    ASSERT_EQ(r.domain, "docs");
    drawn[r.time_us]++;
  }
  EXPECT_EQ(drawn.size(), 4u);
  for (const auto& [t, n] : drawn) EXPECT_GT(n, 60) << t;  // ~100 each
  Record r;
  EXPECT_TRUE(reserve.Sample("python", &rng, &r).IsNotFound());
}

TEST(DomainReserve, ZeroHoldsNothingAndAKeyIsHeldOnce) {
  DomainReserve none(0);
  ASSERT_TRUE(none.Add("a", Make("docs", 1)).ok());
  EXPECT_FALSE(none.Contains("a"));
  EXPECT_TRUE(none.Domains().empty());
  DomainReserve one(2);
  ASSERT_TRUE(one.Add("a", Make("docs", 1)).ok());
  ASSERT_TRUE(one.Add("a", Make("docs", 2)).ok());  // same key: left as it is
  EXPECT_EQ(one.size("docs"), 1u);
  Record r;
  ASSERT_TRUE(one.Get("a", &r).ok());
  EXPECT_EQ(r.time_us, 1u);
}

TEST(DomainReserve, KeepsStoredBytesAsTheyAreUnderTheSameBound) {
  // AddEncoded keeps the bytes it is given (no re-encoding): Get decodes them, and the
  // newest-per-domain bound and the one-key rule are Add()'s.
  DomainReserve reserve(2);
  std::map<uint64_t, std::string> stored;
  for (uint64_t t : {3, 1, 5}) {
    ASSERT_TRUE(EncodeRecord(Make("docs", t), &stored[t]).ok());
    reserve.AddEncoded(Key(Make("docs", t)), "docs", t, stored[t]);
  }
  EXPECT_EQ(reserve.size("docs"), 2u);
  EXPECT_FALSE(reserve.Contains(Key(Make("docs", 1))));
  EXPECT_EQ(reserve.bytes(), stored[3].size() + stored[5].size());
  Record r;
  ASSERT_TRUE(reserve.Get(Key(Make("docs", 5)), &r).ok());
  EXPECT_EQ(r.tokens, Make("docs", 5).tokens);
  EXPECT_EQ(r.request_id, Make("docs", 5).request_id);
  // An older record than both held is not kept; a held key is left as it is.
  reserve.AddEncoded("older", "docs", 2, stored[1]);
  EXPECT_FALSE(reserve.Contains("older"));
  reserve.AddEncoded(Key(Make("docs", 5)), "docs", 9, stored[3]);
  ASSERT_TRUE(reserve.Get(Key(Make("docs", 5)), &r).ok());
  EXPECT_EQ(r.time_us, 5u);
}

}  // namespace
}  // namespace trainer
}  // namespace specloop
