// The floors of a backward that writes grad_x (n floats) and reads grad_output (m floats) and the
// 1-byte saved index (m bytes): what memory traffic alone costs, with no arithmetic.
// benchmarks/cpu_pool.py --floors compiles it with the cpu backend's compiler and flags and times
// it beside the kernels.
#include <stdint.h>
#include <string.h>

// what the reads cost: every byte of grad_output and of the index, folded so none is skipped
static uint32_t sg_reads(const uint32_t* restrict g, const uint8_t* restrict index, const int64_t m) {
  uint32_t acc = 0;
  for (int64_t i = 0; i < m; ++i) acc ^= g[i];
  for (int64_t i = 0; i < m; ++i) acc |= index[i];
  return acc;
}

// ordinary stores, as the cpu backend's kernels write: each line of grad_x is read before it is
// written (read for ownership)
uint32_t floor_stores(float* restrict grad_x, const int64_t n, const uint32_t* restrict g,
                      const uint8_t* restrict index, const int64_t m, const float zero) {
  for (int64_t i = 0; i < n; ++i) grad_x[i] = zero;  // zero from the caller: not folded into memset
  return sg_reads(g, index, m);
}

// memset: the C library's fill of whole lines (string stores or streaming), no read for ownership
uint32_t floor_memset(float* restrict grad_x, const int64_t n, const uint32_t* restrict g,
                      const uint8_t* restrict index, const int64_t m) {
  memset(grad_x, 0, sizeof(float) * (size_t)n);
  return sg_reads(g, index, m);
}
