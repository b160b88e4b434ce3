// The instructions a kernel body needs, checked before any of it runs: the CPU path is chosen in
// Python, and a call with avx512=true on a CPU without AVX-512 VNNI (or on an AVX2 body without AVX2)
// must be an error, never SIGILL. __builtin_cpu_supports also asks whether the OS saves the registers.

#pragma once

#include <c10/util/Exception.h>

inline void require_cpu(bool avx512) {
  static const bool wide = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                           __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma");
  static const bool narrow = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                             __builtin_cpu_supports("f16c");
  TORCH_CHECK(avx512 ? wide : narrow, "specdec's kernels: this CPU has no ",
              avx512 ? "AVX-512 VNNI (call them with avx512=False)" : "AVX2, FMA and F16C");
}
