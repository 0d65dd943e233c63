// Compute threads: one knob for LibTorch's intra-op pool and the BLAS library's own pool.
#pragma once

namespace specloop {

// Sets LibTorch's intra-op threads (the CPU forward splits its matrix products over them) and,
// when the process runs on OpenBLAS (Debian's libopenblas0-pthread keeps a thread pool of its
// own that at::set_num_threads does not reach), OpenBLAS's threads too. n <= 0: OMP_NUM_THREADS
// when set, else every core this process may run on (AvailableCores()).
void SetComputeThreads(int n);

// The cores this process may run on (its CPU affinity), at least 1.
int AvailableCores();

}  // namespace specloop
