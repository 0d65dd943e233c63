// BoundedMpscQueue: a fixed-capacity lock-free queue for many producers and one consumer
// (Dmitry Vyukov's bounded MPMC ring, used with a single consumer). TryPush never blocks and
// never allocates: it fails when the ring is full. Each accepted element gets a position, its
// 0-based rank in push order, and the consumer pops in position order.
//
// Thread safety: TryPush from any number of threads; TryPop from one thread at a time.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace specloop {

template <typename T>
class BoundedMpscQueue {
 public:
  // REQUIRES: capacity >= 2. Rounded up to a power of two.
  explicit BoundedMpscQueue(size_t capacity) {
    size_t c = 2;
    while (c < capacity) c <<= 1;
    mask_ = c - 1;
    cells_.reset(new Cell[c]);
    for (size_t i = 0; i < c; i++) cells_[i].seq.store(i, std::memory_order_relaxed);
  }

  size_t capacity() const { return mask_ + 1; }

  // Moves *v into the queue and returns true, setting *pos; false (v untouched) when full.
  bool TryPush(T* v, uint64_t* pos) {
    Cell* cell;
    uint64_t p = enqueue_pos_.load(std::memory_order_relaxed);
    for (;;) {
      cell = &cells_[p & mask_];
      const uint64_t s = cell->seq.load(std::memory_order_acquire);
      const int64_t dif = static_cast<int64_t>(s) - static_cast<int64_t>(p);
      if (dif == 0) {
        if (enqueue_pos_.compare_exchange_weak(p, p + 1, std::memory_order_relaxed)) break;
      } else if (dif < 0) {
        return false;
      } else {
        p = enqueue_pos_.load(std::memory_order_relaxed);
      }
    }
    cell->data = std::move(*v);
    cell->seq.store(p + 1, std::memory_order_release);
    if (pos) *pos = p;
    return true;
  }

  // Moves the oldest element into *v and returns true; false when empty (or when the next
  // element's producer has not finished its push yet).
  bool TryPop(T* v) {
    Cell* cell = &cells_[dequeue_pos_ & mask_];
    const uint64_t s = cell->seq.load(std::memory_order_acquire);
    if (s != dequeue_pos_ + 1) return false;
    *v = std::move(cell->data);
    cell->seq.store(dequeue_pos_ + mask_ + 1, std::memory_order_release);
    dequeue_pos_++;
    popped_.store(dequeue_pos_, std::memory_order_release);
    return true;
  }

  // Positions handed out so far (accepted pushes), and elements popped so far.
  uint64_t pushed() const { return enqueue_pos_.load(std::memory_order_acquire); }
  uint64_t popped() const { return popped_.load(std::memory_order_acquire); }

 private:
  struct Cell {
    std::atomic<uint64_t> seq;
    T data;
  };
  std::unique_ptr<Cell[]> cells_;
  size_t mask_;
  alignas(64) std::atomic<uint64_t> enqueue_pos_{0};
  alignas(64) uint64_t dequeue_pos_ = 0;
  std::atomic<uint64_t> popped_{0};
};

}  // namespace specloop
