// What CUDA provides to `kernels/src/cuda/reduce.cu`, for a host build:
// the launch coordinates as globals (a launch runs every thread of every
// block in turn: valid for kernels without shared memory or barriers, as
// these are) and the 16-byte vector type.
#pragma once

struct OxDim {
    unsigned int x, y, z;
};
// Per thread: tests launch from several threads at once.
static thread_local OxDim threadIdx, blockIdx, blockDim, gridDim;

struct uint4 {
    unsigned int x, y, z, w;
};

#define OX_DEV inline
#define OX_GLOBAL extern "C" void
