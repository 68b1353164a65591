// CPU stand-in for the CUDA features the ksm device code uses, so its kernels run under a plain
// C++20 compiler and can be checked without a GPU. A block's threads are fibers (ucontext) that
// one OS thread runs in turn: a fiber runs until it reaches a barrier, then the next one runs.
// __syncthreads is a barrier of the block; a warp shuffle is an exchange through the warp's
// slots between two barriers of the lanes in its mask (lanes that left the kernel, which the
// device code only allows for whole groups, are never waited for). __shared__ becomes `static`,
// which is right because a block's shared memory is only used between grid barriers (below).
// Timing means nothing here, only results; a deadlock (a barrier that can never complete)
// aborts with a message.
//
// Grid barriers. Blocks run one at a time. A kernel that waits for other blocks (a software
// grid barrier: thread 0 polls a flag in global memory while the block's other threads wait at
// __syncthreads) calls emu::poll() in its polling loop; the block is then suspended, its fibers
// kept, and the next block starts, or a suspended one resumes. So blocks run phase by phase in
// an order that changes from barrier to barrier, and the barrier's own code (atomics, counts,
// generations) runs unchanged. Since `__shared__` is one static array for all blocks, a kernel
// must never read shared memory across a grid barrier that it wrote before it: each phase
// rewrites what it reads (the device needs nothing of the sort, so a kernel that broke this
// rule would pass on the GPU and fail here, not the other way round). A grid in which nothing
// but polling happens for a whole round (a block never arrives) is stalled: emu::poll() then
// reports a spin count beyond any limit, as the device would after its time-out, and a kernel
// that still only polls aborts with "deadlock". emu::max_resident caps the blocks started and
// not finished (0: no cap), which models a grid larger than what the GPU holds at once. Blocks
// that never poll keep the old behaviour: each runs to its end and is freed before the next.
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
  bool polling = false;    // in emu::poll(): not run again until its block is resumed
  bool from_poll = false;  // resumed from emu::poll() (a fiber that only polls again made no progress)
};

struct Barrier;
struct Warp;

struct Block {
  ucontext_t main;
  std::vector<Fiber> fibers;
  int current = 0;
  std::function<void()> body;
  dim3 idx;
  std::unique_ptr<Barrier> bar;
  std::vector<Warp> warps;
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
// Grid state of the launch in progress (see the top of this file).
inline unsigned int max_resident = 0;
inline bool stalled = false;
inline bool progress = false;

// Called by a kernel's polling loop: suspends the block until the scheduler comes back to it;
// returns how many polls this stands for (1, or a count beyond any spin limit when the whole
// grid only polls).
inline unsigned long long poll() {
  Fiber& f = block->fibers[block->current];
  f.polling = true;
  yield();
  return stalled ? (1ull << 62) : 1ull;
}

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

// Runs the block's fibers until they all finished (true) or every fiber left waits, at least
// one of them in poll() (false: the block is suspended at a grid barrier and resumes later).
inline bool run_block(Block& b, dim3 grid) {
  block = &b;
  block_barrier = b.bar.get();
  warps = &b.warps;
  blockIdx = b.idx;
  blockDim = dim3{static_cast<unsigned int>(b.fibers.size()), 1, 1};
  gridDim = grid;
  for (Fiber& f : b.fibers) {
    if (f.polling) {
      f.polling = false;
      f.from_poll = true;
    }
  }
  for (;;) {
    bool ran = false, running = false, polling = false;
    for (unsigned int t = 0; t < b.fibers.size(); ++t) {
      Fiber& f = b.fibers[t];
      if (f.done) continue;
      running = true;
      if (f.polling) polling = true;
      if (f.waiting || f.polling) continue;
      b.current = static_cast<int>(t);
      threadIdx = dim3{t, 0, 0};
      swapcontext(&b.main, &f.ctx);
      if (!(f.from_poll && f.polling)) progress = true;
      f.from_poll = false;
      ran = true;
    }
    if (!running) {
      block = nullptr;
      return true;
    }
    if (!ran) {
      if (polling) {
        block = nullptr;
        return false;
      }
      std::fprintf(stderr, "emu: deadlock in block (%u, %u): every thread waits\n", b.idx.x,
                   b.idx.y);
      std::abort();
    }
  }
}

// Runs `body` as a grid of blocks (one block at a time), each block's threads as fibers.
template <typename F>
void launch(dim3 grid, unsigned int threads, F body) {
  constexpr size_t kStack = 64 * 1024;
  const unsigned int total = grid.x * grid.y;
  unsigned int next = 0;
  std::vector<std::unique_ptr<Block>> suspended;
  stalled = false;
  auto start = [&](unsigned int n) {
    auto b = std::make_unique<Block>();
    b->body = body;
    b->idx = dim3{n % grid.x, n / grid.x, 0};
    b->fibers.resize(threads);
    b->bar = std::make_unique<Barrier>(static_cast<int>(threads));
    b->warps = std::vector<Warp>((threads + 31) / 32);
    block = b.get();
    for (unsigned int t = 0; t < threads; ++t) {
      Fiber& f = b->fibers[t];
      f.stack.reset(new char[kStack]);
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.get();
      f.ctx.uc_stack.ss_size = kStack;
      f.ctx.uc_link = nullptr;
      makecontext(&f.ctx, trampoline, 0);
    }
    return b;
  };
  while (next < total || !suspended.empty()) {
    progress = false;
    // New blocks start while the residency cap allows; one that finishes is freed at once.
    while (next < total && (max_resident == 0 || suspended.size() < max_resident)) {
      auto b = start(next++);
      progress = true;
      if (!run_block(*b, grid)) suspended.push_back(std::move(b));
    }
    // One round over the suspended blocks, in the order they stopped.
    std::vector<std::unique_ptr<Block>> round;
    round.swap(suspended);
    for (auto& b : round) {
      if (!run_block(*b, grid)) suspended.push_back(std::move(b));
    }
    if (progress) {
      stalled = false;
    } else if (!stalled) {
      stalled = true;  // the next round's polls report a spin count beyond any limit
    } else {
      std::fprintf(stderr, "emu: deadlock: %zu blocks poll and none of them gives up\n",
                   suspended.size());
      std::abort();
    }
  }
  stalled = false;
}

}  // namespace emu

// A load that bypasses L1 on the device; memory has one level here.
template <typename T>
inline T __ldcg(const T* p) { return *p; }

// CUDA's 16-byte vector type, for the kernels' 16-byte loads.
struct alignas(16) int4 {
  int x, y, z, w;
};

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
