// CPU stand-in for the CUDA features the ksm device code uses, so its kernels run under a plain
// C++20 compiler and can be checked without a GPU. A block's threads are fibers (ucontext) that
// one OS thread runs in turn: a fiber runs until it reaches a barrier, then the next one runs.
// __syncthreads is a barrier of the block; a warp shuffle is an exchange through the warp's
// slots between two barriers of the lanes in its mask (lanes that left the kernel, which the
// device code only allows for whole groups, are never waited for). __shared__ becomes `static`,
// which is right because blocks run one after the other. Timing means nothing here, only
// results; a deadlock (a barrier that can never complete) aborts with a message.
#pragma once

#include <ucontext.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
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

inline dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace emu {

struct Fiber {
  ucontext_t ctx;
  std::unique_ptr<char[]> stack;
  bool done = false;
  bool waiting = false;
};

struct Block {
  ucontext_t main;
  std::vector<Fiber> fibers;
  int current = 0;
  std::function<void()> body;
};

inline Block* block = nullptr;

inline void yield() { swapcontext(&block->fibers[block->current].ctx, &block->main); }

struct Barrier {
  int expected;
  int arrived = 0;
  std::vector<int> waiters;
  explicit Barrier(int n) : expected(n) {}
  void release() {
    for (int w : waiters) block->fibers[w].waiting = false;
    waiters.clear();
    arrived = 0;
  }
  void arrive_and_wait() {
    if (++arrived == expected) {
      release();
      return;
    }
    waiters.push_back(block->current);
    block->fibers[block->current].waiting = true;
    yield();
  }
  // A fiber that finished no longer holds the barrier up.
  void drop() {
    --expected;
    if (arrived > 0 && arrived == expected) release();
  }
};

struct Warp {
  float slots[32];
  std::map<unsigned int, std::unique_ptr<Barrier>> barriers;
  Barrier& barrier(unsigned int mask) {
    auto& b = barriers[mask];
    if (!b) b = std::make_unique<Barrier>(std::popcount(mask));
    return *b;
  }
};

inline Barrier* block_barrier = nullptr;
inline std::vector<Warp>* warps = nullptr;

inline int lane() { return static_cast<int>(threadIdx.x % 32); }

inline float exchange(unsigned int mask, float v, int src) {
  Warp& w = (*warps)[threadIdx.x / 32];
  Barrier& b = w.barrier(mask);
  w.slots[lane()] = v;
  b.arrive_and_wait();
  const float r = w.slots[src];
  b.arrive_and_wait();
  return r;
}

inline void trampoline() {
  block->body();
  Fiber& f = block->fibers[block->current];
  f.done = true;
  block_barrier->drop();
  // Masks a finished lane belonged to lose it too.
  for (auto& [mask, b] : (*warps)[threadIdx.x / 32].barriers) {
    if (mask & (1u << lane())) b->drop();
  }
  swapcontext(&f.ctx, &block->main);
}

// Runs `body` as a grid of blocks (one block at a time), each block's threads as fibers.
template <typename F>
void launch(dim3 grid, unsigned int threads, F body) {
  constexpr size_t kStack = 64 * 1024;
  for (unsigned int by = 0; by < grid.y; ++by) {
    for (unsigned int bx = 0; bx < grid.x; ++bx) {
      Block b;
      b.body = body;
      b.fibers.resize(threads);
      Barrier bar(static_cast<int>(threads));
      std::vector<Warp> ws((threads + 31) / 32);
      block = &b;
      block_barrier = &bar;
      warps = &ws;
      blockIdx = dim3{bx, by, 0};
      blockDim = dim3{threads, 1, 1};
      gridDim = grid;
      for (unsigned int t = 0; t < threads; ++t) {
        Fiber& f = b.fibers[t];
        f.stack.reset(new char[kStack]);
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.get();
        f.ctx.uc_stack.ss_size = kStack;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, trampoline, 0);
      }
      for (;;) {
        bool progress = false, running = false;
        for (unsigned int t = 0; t < threads; ++t) {
          Fiber& f = b.fibers[t];
          if (f.done) continue;
          running = true;
          if (f.waiting) continue;
          b.current = static_cast<int>(t);
          threadIdx = dim3{t, 0, 0};
          swapcontext(&b.main, &f.ctx);
          progress = true;
        }
        if (!running) break;
        if (!progress) {
          std::fprintf(stderr, "emu: deadlock in block (%u, %u): every thread waits\n", bx, by);
          std::abort();
        }
      }
      block = nullptr;
    }
  }
}

}  // namespace emu

// CUDA's reciprocal square root (the device has it as one instruction).
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }

inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }

inline float __shfl_up_sync(unsigned int mask, float v, unsigned int delta, int width = 32) {
  const int lane = emu::lane();
  const int src = lane % width >= static_cast<int>(delta) ? lane - static_cast<int>(delta) : lane;
  return emu::exchange(mask, v, src);
}

inline float __shfl_xor_sync(unsigned int mask, float v, int lane_mask, int width = 32) {
  const int lane = emu::lane();
  int src = lane ^ lane_mask;
  if (src / width != lane / width) src = lane;
  return emu::exchange(mask, v, src);
}
