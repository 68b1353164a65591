// Host side of the CPU emulation (see cuda_emu.h). emu.py writes one translation unit in which
// every variant's rendered ksm device code and this file are included inside a namespace of
// their own; these entry points launch the variant's kernels the way the cuda entry points
// (scan.cu.j2) and the mlx module (scan_mlx.py.j2) do: same ScanArgs, layouts, launch plan,
// NMAX dispatch and epilogue pass. KSM_TAG names the variant's exported functions, KSM_FUSED
// says whether it fuses the epilogue, KSM_DECODE whether it was rendered for mlx-cuda (with the
// decode kernel). dtype: 0 = f16, 2 = f32 (the f32 instantiation allows tight checks); bf16
// differs from f16 only in the two conversions, which the emulation cannot check anyway.

#define KSM_CAT(a, b) a##b
#define KSM_NAME(a, b) KSM_CAT(a, b)

template <typename T>
static void fill(ksm::ScanArgs<T>& p, const void* u, const void* delta, const void* A,
                 const void* B, const void* C, const void* D, const void* z,
                 const void* delta_bias, void* y, const float* h0, float* h_last,
                 long long batch, long long dim, long long L, long long N, int has_z,
                 int softplus) {
  p.u = static_cast<const T*>(u);
  p.delta = static_cast<const T*>(delta);
  p.A = static_cast<const float*>(A);
  p.B = static_cast<const T*>(B);
  p.C = static_cast<const T*>(C);
  p.D = static_cast<const float*>(D);
  p.z = static_cast<const T*>(z);
  p.delta_bias = static_cast<const float*>(delta_bias);
  p.y = static_cast<T*>(y);
  p.h0 = h0;
  p.h_last = h_last;
  p.batch = batch; p.dim = dim; p.L = L; p.N = N;
  p.has_z = has_z;
  p.softplus = softplus;
}

template <typename T>
static int scan(const void* u, const void* delta, const void* A, const void* B, const void* C,
                const void* D, const void* z, const void* delta_bias, void* y, const float* h0,
                float* h_last, long long batch, long long dim, long long L, long long N,
                int has_z, int softplus, int channel_last) {
  if (N < 1 || N > 64) return 1;
  ksm::ScanArgs<T> p;
  fill(p, u, delta, A, B, C, D, z, delta_bias, y, h0, h_last, batch, dim, L, N, has_z, softplus);
  ksm::set_layout(p, channel_last != 0);
  const ksm::Launch l = ksm::scan_launch(batch, dim);
  const dim3 grid{l.grid_x, l.grid_y, 1};
  if (N <= 16) {
    emu::launch(grid, l.block, [&] { ksm::scan_body<T, 16>(p); });
  } else {
    emu::launch(grid, l.block, [&] { ksm::scan_body<T, 64>(p); });
  }
#if !KSM_FUSED
  const long long total = batch * dim * L;
  emu::launch(dim3{static_cast<unsigned int>((total + 255) / 256), 1, 1}, 256,
              [&] { ksm::epilogue_body<T>(p, p.y); });
#endif
  return 0;
}

extern "C" int KSM_NAME(emu_scan_, KSM_TAG)(int dtype, const void* u, const void* delta, const void* A,
                        const void* B, const void* C, const void* D, const void* z,
                        const void* delta_bias, void* y, const float* h0, float* h_last,
                        long long batch, long long dim, long long L, long long N, int has_z,
                        int softplus, int channel_last) {
  switch (dtype) {
    case 0:
      return scan<__half>(u, delta, A, B, C, D, z, delta_bias, y, h0, h_last, batch, dim, L, N,
                          has_z, softplus, channel_last);
    case 2:
      return scan<float>(u, delta, A, B, C, D, z, delta_bias, y, h0, h_last, batch, dim, L, N,
                         has_z, softplus, channel_last);
  }
  return 2;
}

extern "C" int KSM_NAME(emu_threads_, KSM_TAG)() { return ksm::THREADS; }

#if KSM_DECODE
template <typename T, int NS>
static int decode_ns(const void* u, const void* delta, const void* A, const void* B,
                     const void* C, const void* D, const void* z, const void* delta_bias,
                     void* y, const float* h0, float* h_last, long long batch, long long dim,
                     int has_z, int softplus) {
  ksm::ScanArgs<T> p;
  fill(p, u, delta, A, B, C, D, z, delta_bias, y, h0, h_last, batch, dim, 1, NS, has_z,
       softplus);
  const long long threads = batch * dim * NS;
  // As the mlx module launches it: 128-thread blocks, whole blocks.
  emu::launch(dim3{static_cast<unsigned int>((threads + 127) / 128), 1, 1}, 128,
              [&] { ksm::decode_body<T, NS>(p); });
  return 0;
}

extern "C" int KSM_NAME(emu_decode_, KSM_TAG)(int dtype, const void* u, const void* delta, const void* A,
                          const void* B, const void* C, const void* D, const void* z,
                          const void* delta_bias, void* y, const float* h0, float* h_last,
                          long long batch, long long dim, long long N, int has_z, int softplus) {
#define KSM_DECODE_CASE(NS)                                                                    \
  case NS:                                                                                     \
    return dtype == 0 ? decode_ns<__half, NS>(u, delta, A, B, C, D, z, delta_bias, y, h0,     \
                                              h_last, batch, dim, has_z, softplus)             \
                      : decode_ns<float, NS>(u, delta, A, B, C, D, z, delta_bias, y, h0,      \
                                             h_last, batch, dim, has_z, softplus);
  switch (N) {
    KSM_DECODE_CASE(4)
    KSM_DECODE_CASE(8)
    KSM_DECODE_CASE(16)
    KSM_DECODE_CASE(32)
  }
#undef KSM_DECODE_CASE
  return 1;
}
#endif
#undef KSM_CAT
#undef KSM_NAME
