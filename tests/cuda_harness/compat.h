// Host compatibility header: compiles a symgrad .cu file with a host C++ compiler so that its
// kernels run on the CPU.  A kernel becomes an ordinary function; the harness's launcher calls it
// once per (block, thread) of the launch grid, serially, setting blockIdx and threadIdx first.
// Only what the generated kernels use is mapped: the qualifiers, the four index variables and
// the three bit-cast intrinsics, and the one atomic the unpooling kernels use (atomicMax on
// unsigned long long, whose result does not depend on the order of the threads); <cmath> gives
// the math functions of expression kernels (expf, exp, tanhf, ...), which CUDA's device code and
// NVRTC have built in.  The kernels use no shared memory, no barriers and no warp intrinsics, so
// serial execution of the threads is a faithful schedule.
#pragma once

#include <cmath>
#include <cstring>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict

struct dim3 {
  unsigned int x, y, z;
};

// set by the launcher before every call of a kernel
static dim3 threadIdx, blockIdx, blockDim, gridDim;

static inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

static inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

static inline long long __double_as_longlong(double d) {
  long long u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

static inline unsigned long long atomicMax(unsigned long long* address, unsigned long long value) {
  const unsigned long long old = *address;
  if (value > old) *address = value;
  return old;
}
