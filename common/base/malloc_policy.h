// MallocPolicy: how a long-running specloop process asks glibc's malloc to hold memory.
//
// Contract of ApplyMallocPolicy(): from the call on, the heap never grows for a block of
// kMallocMmapThreshold bytes or more: such a block comes out of free heap space already there,
// or else is its own mmap, which goes back to the kernel when freed; and the heap's free top is
// returned once it passes kMallocTrimThreshold. Both thresholds are fixed:
// glibc's default raises the mmap threshold to the size of the largest mmapped block freed so
// far (up to 32 MiB on 64-bit), after which tensors of a few MiB (a batch's logits, a prefill
// chunk's, an activation) come from the heap. Freed there, in another order than allocated and
// among small long-lived objects (suffix index nodes, metric series, RocksDB's blocks), they
// leave holes that the heap can neither trim nor fill with the next, differently sized tensor,
// so the resident size of a serving process climbs faster than its live allocations.
// With the thresholds fixed the heap grows only for blocks smaller than kMallocMmapThreshold,
// and the resident size follows the live allocations. The cost: an mmap, a munmap and the page
// faults of first touch for each large block (tests/serve/malloc_policy_test.cc checks the
// policy; bench/RESULTS.md "soak_bench" weighs it in a serving run).
//
// Call it once, early in main(), before threads start (mallopt is not meant to race with
// allocation in other threads). glibc only: elsewhere it does nothing and returns false.
// The environment still wins for the operator who sets MALLOC_MMAP_THRESHOLD_ or
// MALLOC_TRIM_THRESHOLD_ (or GLIBC_TUNABLES glibc.malloc.mmap_threshold / trim_threshold):
// then that setting is left as the operator gave it.
#pragma once

#include <cstddef>

namespace specloop {

// glibc's own initial values, kept fixed instead of adjusted.
inline constexpr size_t kMallocMmapThreshold = size_t{128} << 10;
inline constexpr size_t kMallocTrimThreshold = size_t{128} << 10;

// Applies the policy above; true when malloc accepted both settings (or the environment
// already set them). Idempotent.
bool ApplyMallocPolicy();

}  // namespace specloop
