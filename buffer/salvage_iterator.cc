#include "buffer/salvage_iterator.h"

#include <algorithm>

namespace specloop {

namespace {

// Byte strings of one width as big-endian unsigned integers.
std::string Pad(const std::string& s, size_t width) {
  std::string r = s;
  if (r.size() < width) r.resize(width, '\0');
  return r;
}

// *a += 2^bit; false (and *a unspecified) on overflow.
bool AddPow2(std::string* a, size_t bit) {
  if (bit / 8 >= a->size()) return false;
  unsigned carry = 1u << (bit % 8);
  for (size_t i = a->size() - 1 - bit / 8; carry != 0; --i) {
    const unsigned v = static_cast<unsigned char>((*a)[i]) + carry;
    (*a)[i] = static_cast<char>(v & 0xff);
    carry = v >> 8;
    if (i == 0) break;
  }
  return carry == 0;
}

// floor((a + b) / 2), a and b of one width.
std::string Mid(const std::string& a, const std::string& b) {
  std::string r(a.size(), '\0');
  unsigned carry = 0;
  for (size_t i = a.size(); i-- > 0;) {
    const unsigned v =
        static_cast<unsigned char>(a[i]) + static_cast<unsigned char>(b[i]) + carry;
    r[i] = static_cast<char>(v & 0xff);
    carry = v >> 8;
  }
  for (size_t i = 0; i < r.size(); ++i) {
    const unsigned v = static_cast<unsigned char>(r[i]);
    r[i] = static_cast<char>((v >> 1) | (carry << 7));
    carry = v & 1;
  }
  return r;
}

}  // namespace

SalvagingIterator::SalvagingIterator(std::function<rocksdb::Iterator*()> make, size_t key_width)
    : make_(std::move(make)), key_width_(std::max<size_t>(1, key_width)) {}

SalvagingIterator::Probe SalvagingIterator::SeekFresh(const std::string& target) {
  it_.reset(make_());
  it_->Seek(target);
  if (it_->Valid()) return Probe::kOk;
  const rocksdb::Status s = it_->status();
  if (s.ok()) return Probe::kOk;
  if (s.IsCorruption()) return Probe::kCorrupt;
  status_ = Status::IOError(s.ToString());
  return Probe::kError;
}

void SalvagingIterator::SeekToFirst() {
  it_.reset(make_());
  it_->SeekToFirst();
  if (it_->Valid() || it_->status().ok()) return;
  if (!it_->status().IsCorruption()) {
    status_ = Status::IOError(it_->status().ToString());
    return;
  }
  StepOver("", it_->status().ToString());
}

void SalvagingIterator::Seek(const rocksdb::Slice& target) {
  const std::string t = target.ToString();
  switch (SeekFresh(t)) {
    case Probe::kOk:
    case Probe::kError:
      return;
    case Probe::kCorrupt:
      StepOver(t, it_->status().ToString());
  }
}

void SalvagingIterator::Next() {
  last_.assign(it_->key().data(), it_->key().size());  // reuses its capacity: no allocation
  it_->Next();
  if (it_->Valid() || it_->status().ok()) return;
  if (!it_->status().IsCorruption()) {
    status_ = Status::IOError(it_->status().ToString());
    return;
  }
  const std::string last = last_;
  StepOver(last, it_->status().ToString());
}

void SalvagingIterator::StepOver(const std::string& after, const std::string& error) {
  DamagedRange range;
  range.after = after;
  range.error = error;
  const size_t width = std::max(key_width_, after.size());
  std::string lo = Pad(after, width);  // seeking here (or just past `after`) fails
  std::string hi;                      // seeking here reads cleanly
  for (size_t bit = 0; bit < 8 * width && hi.empty(); ++bit) {
    std::string probe = lo;
    if (!AddPow2(&probe, bit)) break;
    switch (SeekFresh(probe)) {
      case Probe::kOk:
        hi = probe;
        break;
      case Probe::kCorrupt:
        lo = probe;
        break;
      case Probe::kError:
        return;
    }
  }
  if (hi.empty()) {
    const std::string top(width, '\xff');
    const Probe p = top > lo ? SeekFresh(top) : Probe::kCorrupt;
    if (p == Probe::kError) return;
    if (p == Probe::kCorrupt) {  // the damage runs to the end of the range
      it_.reset();
      range.to_end = true;
      damaged_.push_back(std::move(range));
      return;
    }
    hi = top;
  }
  for (;;) {
    std::string next = lo;
    if (!AddPow2(&next, 0) || next == hi) break;
    const std::string mid = Mid(lo, hi);
    const Probe p = SeekFresh(mid);
    if (p == Probe::kError) return;
    (p == Probe::kOk ? hi : lo) = mid;
  }
  if (SeekFresh(hi) != Probe::kOk) {  // read cleanly a moment ago: the file changed
    if (status_.ok()) it_.reset();
    range.to_end = true;
  } else if (it_->Valid()) {
    range.resume = it_->key().ToString();
  }
  damaged_.push_back(std::move(range));
}

}  // namespace specloop
