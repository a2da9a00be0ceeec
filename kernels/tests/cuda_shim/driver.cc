// The CUDA kernels built for the host (`kernels/tests/cuda_host.rs`).
#define OX_HOST 1
#include "reduce.cu"

typedef void (*OxKernel)(OxArgs);

// Runs `kernel` as a launch of `grid` blocks of `block` threads would.
extern "C" void ox_host_launch(OxKernel kernel, const OxArgs* args, unsigned grid, unsigned block) {
    gridDim.x = grid;
    blockDim.x = block;
    for (unsigned b = 0; b < grid; b++) {
        for (unsigned t = 0; t < block; t++) {
            blockIdx.x = b;
            threadIdx.x = t;
            kernel(*args);
        }
    }
}
