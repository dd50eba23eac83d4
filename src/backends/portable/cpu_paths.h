// default.portable's CPU-specific fast paths and their switches. Which x86
// extensions the CPU has is asked once; a path is on when the CPU has what it
// needs and TEFL_PORTABLE_<NAME>=0 is not set in the environment. The
// environment is read once, at the first kernel call that asks (kernels never
// call getenv); a test that compares both paths calls ReloadPortableSwitches()
// after changing the environment.
#ifndef TEFL_SRC_BACKENDS_PORTABLE_CPU_PATHS_H_
#define TEFL_SRC_BACKENDS_PORTABLE_CPU_PATHS_H_

namespace tefl::backends {

enum class PortablePath : int {
  kBf16Cvt,        // TEFL_PORTABLE_BF16_CVT: bf16 stores by vcvtne2ps2bf16 (AVX512-BF16)
  kBf16FastAct,    // TEFL_PORTABLE_BF16_FAST_ACT: shorter exp/sigmoid for bf16 outputs of activations and softmax (any
                   // CPU)
  kAttnBf16Dot,    // TEFL_PORTABLE_ATTN_BF16DOT: bf16 attention tiles by vdpbf16ps (AVX512-BF16)
  kDropoutAvx512,  // TEFL_PORTABLE_DROPOUT_AVX512: dropout_fwd's fused Philox + mask + output pass (AVX512-F/BW/DQ/VL,
                   // BMI2)
  kCount
};

// AVX512-F/BW/VL/DQ and AVX512-BF16 (x86-64 with GCC or clang; else false).
bool CpuHasAvx512Bf16();
// AVX512-F/BW/VL/DQ and BMI2 (x86-64 with GCC or clang; else false).
bool CpuHasAvx512Bmi2();
bool PortablePathOn(PortablePath path);
void ReloadPortableSwitches();

}  // namespace tefl::backends

#endif  // TEFL_SRC_BACKENDS_PORTABLE_CPU_PATHS_H_
