// CPU stand-in for the CUDA features the ksm device code uses, so its kernels run under a plain
// C++20 compiler and can be checked without a GPU. A block's threads are std::threads;
// __syncthreads is a barrier of the block; a warp shuffle is an exchange through the warp's
// slots between two barriers of the lanes in its mask (so lanes that left the kernel, as a whole
// group, are never waited for). __shared__ becomes `static`, which is right because blocks run
// one after the other. Timing means nothing here, only results.
#pragma once

#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#define KSM_EMULATION 1
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __shared__ static

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
};
struct float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }

typedef _Float16 __half;
struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __half2float(__half x) { return static_cast<float>(x); }
inline __half __float2half_rn(float x) { return static_cast<__half>(x); }
inline float __bfloat162float(__nv_bfloat16 x) {
  uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (finite inputs)
  return __nv_bfloat16{static_cast<uint16_t>(u >> 16)};
}

namespace emu {

struct Warp {
  float slots[32];
  std::mutex m;
  std::map<unsigned int, std::unique_ptr<std::barrier<>>> barriers;
  std::barrier<>& barrier(unsigned int mask) {
    std::lock_guard<std::mutex> g(m);
    auto& b = barriers[mask];
    if (!b) b = std::make_unique<std::barrier<>>(std::popcount(mask));
    return *b;
  }
};

inline thread_local std::barrier<>* block_barrier = nullptr;
inline thread_local Warp* warp = nullptr;
inline thread_local int lane = 0;

inline float exchange(unsigned int mask, float v, int src) {
  std::barrier<>& b = warp->barrier(mask);
  warp->slots[lane] = v;
  b.arrive_and_wait();
  const float r = warp->slots[src];
  b.arrive_and_wait();
  return r;
}

}  // namespace emu

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }

inline float __shfl_up_sync(unsigned int mask, float v, unsigned int delta, int width = 32) {
  const int in_seg = emu::lane % width;
  const int src = in_seg >= static_cast<int>(delta) ? emu::lane - static_cast<int>(delta) : emu::lane;
  return emu::exchange(mask, v, src);
}

inline float __shfl_xor_sync(unsigned int mask, float v, int lane_mask, int width = 32) {
  int src = emu::lane ^ lane_mask;
  if (src / width != emu::lane / width) src = emu::lane;
  return emu::exchange(mask, v, src);
}

namespace emu {

// Runs `body` as a grid of blocks (one block at a time), each block's threads concurrently.
template <typename F>
void launch(dim3 grid, unsigned int block, F body) {
  for (unsigned int by = 0; by < grid.y; ++by) {
    for (unsigned int bx = 0; bx < grid.x; ++bx) {
      std::barrier<> bar(block);
      std::vector<Warp> warps((block + 31) / 32);
      std::vector<std::thread> threads;
      threads.reserve(block);
      for (unsigned int t = 0; t < block; ++t) {
        threads.emplace_back([&, t] {
          threadIdx = dim3{t, 0, 0};
          blockIdx = dim3{bx, by, 0};
          blockDim = dim3{block, 1, 1};
          gridDim = grid;
          block_barrier = &bar;
          warp = &warps[t / 32];
          lane = static_cast<int>(t % 32);
          body();
          // A thread that has finished no longer holds the block's barriers up.
          bar.arrive_and_drop();
        });
      }
      for (auto& th : threads) th.join();
    }
  }
}

}  // namespace emu
