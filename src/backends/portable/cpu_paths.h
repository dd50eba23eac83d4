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
  kBf16ActTable,   // TEFL_PORTABLE_BF16_ACT_TABLE: gelu/qgelu/silu, their derivatives and dbias_ forms on all-bf16
                   // data read 64 Ki-entry tables of the fp32 results (AVX2 and SSE4 targets)
  kGemmAmx,        // TEFL_PORTABLE_GEMM_AMX: bf16 x bf16 GEMM tiles by AMX tdpbf16ps (AMX-TILE/BF16 and AVX512-BF16;
                   // off: the vdpbf16ps tiles)
  kGemmF32Avx512,  // TEFL_PORTABLE_GEMM_F32_AVX512: fp32 GEMM by tefl's own packing and 12 x 32 AVX-512 register
                   // tiles (AVX512-F/BW/VL/DQ; off: OpenBLAS's cblas_sgemm)
  kGemmF32AInPlace,  // TEFL_PORTABLE_GEMM_F32_A_IN_PLACE: the own fp32 tiles read an untransposed A where it is
                     // (not packed) for short K and narrow N on two or more threads (off: always packed)
  kAttnAmx,  // TEFL_PORTABLE_ATTN_AMX: the bf16 attention tiles of kAttnBf16Dot by AMX tdpbf16ps (AMX-TILE/BF16;
             // off: vdpbf16ps)
  kCount
};

// TEFL_MAX_CPU_ISA caps the instruction set default.portable uses, as
// ONEDNN_MAX_CPU_ISA does for oneDNN: `avx512` (the default: whatever the CPU
// has), `avx2`, `sse4`, or `baseline` (the build's baseline target). Read
// once, on the first call of ApplyMaxCpuIsa or CpuHasAvx512Bf16; it removes
// the better Highway targets from dynamic dispatch (hwy::DisableTargets) and,
// below avx512, turns off the own AVX-512 kernels (CpuHasAvx512Bf16 and
// CpuHasAvx512Bmi2 answer false). An unknown value logs
// a WARNING and is ignored. Lets a machine with AVX-512 test the code paths
// of one without it.
enum class CpuIsaCap : int { kBaseline, kSse4, kAvx2, kAvx512 };
CpuIsaCap ApplyMaxCpuIsa();  // idempotent; called before any kernel runs
// The Highway target that dynamic dispatch picks now (e.g. "AVX3_DL").
const char* PortableTargetName();

// AVX512-F/BW/VL/DQ (x86-64 with GCC or clang; else false), and
// TEFL_MAX_CPU_ISA allows AVX-512.
bool CpuHasAvx512();
// AVX512-F/BW/VL/DQ and AVX512-BF16 (x86-64 with GCC or clang; else false),
// and TEFL_MAX_CPU_ISA allows AVX-512.
bool CpuHasAvx512Bf16();
// AVX512-F/BW/VL/DQ and BMI2 (x86-64 with GCC or clang; else false).
bool CpuHasAvx512Bmi2();
// CpuHasAvx512Bf16() and AMX-TILE + AMX-BF16 (CPUID), with the kernel's
// permission to use the tile data state granted to this process
// (arch_prctl(ARCH_REQ_XCOMP_PERM), Linux 5.16+; asked once, on the first
// call). Without that permission a tile instruction raises SIGILL.
bool CpuHasAmxBf16();
bool PortablePathOn(PortablePath path);
void ReloadPortableSwitches();
// How many calls ran a path's kernel in this process (relaxed counters, for
// tests and diagnostics: a switch that is on says the path may run, this
// says it did). Counted for the GEMM paths, kGemmF32Avx512 (the own fp32
// tiles), kGemmF32AInPlace (those tiles with A in place) and kGemmAmx (the AMX
// tiles), once per GEMM that reaches the tiles, and for kAttnAmx, once per
// attention call (forward or backward) that takes the AMX path (its
// whole-tile products run on AMX, the rest on vdpbf16ps).
void CountPortablePathRun(PortablePath path);
unsigned long long PortablePathRuns(PortablePath path);

}  // namespace tefl::backends

#endif  // TEFL_SRC_BACKENDS_PORTABLE_CPU_PATHS_H_
