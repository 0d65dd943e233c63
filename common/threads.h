// Compute threads: one knob for LibTorch's intra-op pool and the BLAS library's own pool.
#pragma once

namespace specloop {

// Sets LibTorch's intra-op threads and, when the process runs on OpenBLAS (Debian's
// libopenblas0-pthread keeps a thread pool of its own that at::set_num_threads does not reach),
// OpenBLAS's threads too. Small models decode fastest on 1.
void SetComputeThreads(int n);

}  // namespace specloop
