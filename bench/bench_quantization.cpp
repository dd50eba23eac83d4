// FP8 quantization kernels next to this machine's copy bandwidth measured in
// the same run with the same threads:
//   BM_Copy/<label>                   a parallel memcpy (the baseline of the lines after it)
//   BM_Q/<op>/<dtypes>/<size>/<impl>  the op through OpManager on warm, preallocated
//                                     outputs, pinned to one implementation (strict impl:ID)
// Sizes: 64M elements (8192 x 8192: DRAM-bound, beyond L3) and 128K elements (fits in L2), fp32 and
// bf16; fp8_transpose of a [4096, 4096] FP8 matrix; the fused rmsnorm_fwd_fp8
// and swiglu_fp8 next to their base ops (bf16 in, bf16 out) at [8192, 4096].
// Counters: bytes_per_second = (bytes read + bytes written) / time;
// pct_of_copy = that as a percentage of the preceding BM_Copy's in this run.
// Reproduce: build/release/bench/bench_quantization --benchmark_repetitions=3
//            --benchmark_report_aggregates_only=true
#include <string>
#include <vector>

#include "bench_support.h"

namespace {

using tefl::DType;
using tefl::bench::Buffer;

struct Arg {
  DType dt;
  std::vector<int64_t> shape;
  float fill;  // < 0: a ramp in [-2, 1); else this constant
};
struct Case {
  std::string op;
  std::string label;
  std::vector<Arg> in, out;
  const void* attrs;
};

const tefl_norm_fwd_attrs kNormAttrs{TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, 1e-5f, 0, 0};

void BM_Q(benchmark::State& state, const Case& c, const std::string& impl) {
  std::vector<Buffer> bufs;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<DLTensor> tensors;
  const size_t n_args = c.in.size() + c.out.size();
  bufs.reserve(n_args);
  shapes.reserve(n_args);
  tensors.reserve(n_args);
  double bytes = 0;
  for (size_t k = 0; k < n_args; ++k) {
    const Arg& a = k < c.in.size() ? c.in[k] : c.out[k - c.in.size()];
    int64_t n = 1;
    for (int64_t d : a.shape) n *= d;
    const size_t eb = tefl::bench::ElemBytes(a.dt);
    bufs.emplace_back(size_t(n) * eb);
    shapes.push_back(a.shape);
    if (k < c.in.size()) {
      for (int64_t i = 0; i < n; ++i)
        tefl::StoreFromFloat(bufs.back().data.get(), i, a.dt, a.fill < 0 ? float(i % 97) * 0.03f - 2.0f : a.fill);
    }
    tensors.push_back(tefl::bench::View(bufs.back(), a.dt, shapes.back().data(), int(a.shape.size())));
    bytes += double(n) * double(eb);
  }
  std::vector<const DLTensor*> in;
  std::vector<DLTensor*> out;
  for (size_t k = 0; k < n_args; ++k) {
    if (k < c.in.size()) {
      in.push_back(&tensors[k]);
    } else {
      out.push_back(&tensors[k]);
    }
  }
  const auto pinned = tefl::bench::PinnedPolicy(c.op, impl);
  if (!pinned) {
    state.SkipWithError("policy");
    return;
  }
  tefl::PolicyContext ctx(*pinned);
  tefl::OpManager& mgr = tefl::GetDefaultManager();
  const int32_t id = tefl_op_id(c.op.c_str());
  auto run = [&] { return mgr.Call(id, in, out, c.attrs); };
  if (tefl::Status s = run(); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(run());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(double(state.iterations()) * bytes));
}

const char* DName(DType t) {
  switch (t) {
    case DType::kF32:
      return "fp32";
    case DType::kBF16:
      return "bf16";
    case DType::kE4M3:
      return "e4m3";
    default:
      return "e5m2";
  }
}

std::vector<Case>* g_cases = new std::vector<Case>();  // alive for the run

void Register(const Case& c) {
  g_cases->push_back(c);
  const Case& kept = g_cases->back();
  for (const std::string& impl : tefl::bench::CpuImpls(c.op)) {
    if (impl == "reference.cpp") continue;  // the oracle is ~50x slower; not a speed target
    const std::string name = "BM_Q/" + c.op + "/" + c.label + "/" + impl;
    benchmark::RegisterBenchmark(name.c_str(), BM_Q, kept, impl)->UseRealTime()->MinTime(1.0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  tefl::GetDefaultManager().EnsureInitialized();
  g_cases->reserve(64);  // Register keeps references into it
  const Arg one{DType::kF32, {1}, 1.0f}, scale{DType::kF32, {1}, 64.0f};
  for (int64_t n : {int64_t(1) << 26, int64_t(1) << 17}) {
    const std::string size = n == (int64_t(1) << 26) ? "64M" : "128K";
    for (DType dt : {DType::kF32, DType::kBF16}) {
      tefl::bench::RegisterCopy(std::string(DName(dt)) + "_" + size, size_t(n) * tefl::bench::ElemBytes(dt));
      for (DType f : {DType::kE4M3, DType::kE5M2}) {
        const std::string l = std::string(DName(dt)) + "->" + DName(f) + "/" + size;
        Register({"quantize", l, {{dt, {n}, -1}, scale}, {{f, {n}, 0}, one, one}, nullptr});
      }
      for (DType f : {DType::kE4M3, DType::kE5M2})
        Register({"dequantize",
                  std::string(DName(f)) + "->" + DName(dt) + "/" + size,
                  {{f, {n}, 1.5f}, one},
                  {{dt, {n}, 0}},
                  nullptr});
      Register({"compute_amax", std::string(DName(dt)) + "/" + size, {{dt, {n}, -1}}, {one}, nullptr});
    }
  }
  tefl::bench::RegisterCopy("fp8_16M", size_t(1) << 24);
  Register({"fp8_transpose",
            "e4m3/4096x4096",
            {{DType::kE4M3, {4096, 4096}, 1.5f}},
            {{DType::kE4M3, {4096, 4096}, 0}},
            nullptr});
  // Fused vs base, bf16 in: the copy of the bf16 [8192, 4096] x.
  const int64_t rows = 8192, h = 4096;
  tefl::bench::RegisterCopy("bf16_8192x4096", size_t(rows * h) * 2);
  const Arg x{DType::kBF16, {rows, h}, -1}, gamma{DType::kBF16, {h}, 1.0f}, rs{DType::kF32, {rows}, 0};
  Register({"rmsnorm_fwd", "bf16->bf16/8192x4096", {x, gamma}, {{DType::kBF16, {rows, h}, 0}, rs}, &kNormAttrs});
  Register({"rmsnorm_fwd_fp8",
            "bf16->e4m3/8192x4096",
            {x, gamma, scale},
            {{DType::kE4M3, {rows, h}, 0}, rs, one, one},
            &kNormAttrs});
  const Arg xg{DType::kBF16, {rows, 2 * h}, -1};
  Register({"swiglu", "bf16->bf16/8192x8192", {xg}, {{DType::kBF16, {rows, h}, 0}}, nullptr});
  Register({"swiglu_fp8", "bf16->e4m3/8192x8192", {xg, scale}, {{DType::kE4M3, {rows, h}, 0}, one, one}, nullptr});
  return tefl::bench::RunBenchmarks(argc, argv);
}
