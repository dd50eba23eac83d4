// Conformance of every registered CPU implementation of fused_attn_fwd /
// fused_attn_bwd against the oracle, reference.cpp, with the attention
// tolerances of spec/ops.md (atol = rtol = 1e-3 for fp32/fp16, 1.5e-2 for
// bf16), over layouts x masks x windows x softmax types x GQA ratios x dtypes
// x (sq, sk); plus checks of the oracle itself (backward against central
// finite differences), fully masked rows, dropout masks and bad input.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/philox.h"
#include "backends/portable/cpu_paths.h"
#include "tefl/attention.hpp"
#include "test_support.h"

namespace {

using tefl::DType;
using tefl::Status;
using tefl::testing::Compare;
using tefl::testing::CompareResult;
using tefl::testing::CpuImplementations;
using tefl::testing::MustServe;
using tefl::testing::RunImplDL;
using tefl::testing::Tensor;
using tefl::testing::Tolerance;
using tefl::testing::WithPortableSwitch;

constexpr const char* kReference = tefl::testing::kReferenceImpl;
constexpr double kSentinel = -31337.0;

Tolerance AttnTol(DType t) { return t == DType::kBF16 ? Tolerance{1.5e-2, 1.5e-2} : Tolerance{1e-3, 1e-3}; }

// ---- One attention problem ------------------------------------------------------------
struct Spec {
  int32_t format = TEFL_QKV_BSHD;
  int32_t mask = TEFL_ATTN_MASK_NO_MASK;
  int32_t wl = -1, wr = -1;
  int32_t softmax = TEFL_ATTN_SOFTMAX_VANILLA;
  DType dtype = DType::kF32;
  int64_t b = 2, sq = 5, sk = 7, hq = 2, hkv = 1, dqk = 8, dv = 8;
  std::vector<int32_t> lens_q, lens_kv;  // thd / padding: per-sequence lengths
  float dropout = 0.0f;
  bool training = false;
  float scale = 0.0f;
  double lo = -2.0, hi = 1.0;  // input range

  bool thd() const { return format == TEFL_QKV_THD; }
  bool padding() const {
    return mask == TEFL_ATTN_MASK_PADDING || mask == TEFL_ATTN_MASK_PADDING_CAUSAL ||
           mask == TEFL_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  }
  bool cu() const { return thd() || padding(); }
  std::string Name() const {
    return fmt::format("fmt{} mask{} win({},{}) sm{} {} b{} sq{} sk{} h{}/{} d{}/{} p{}", format, mask, wl, wr, softmax,
                       tefl::DTypeName(dtype), b, sq, sk, hq, hkv, dqk, dv, training ? dropout : 0.0f);
  }
  int64_t TotalQ() const {
    int64_t t = 0;
    for (int32_t l : lens_q) t += l;
    return t;
  }
  int64_t TotalKv() const {
    int64_t t = 0;
    for (int32_t l : lens_kv) t += l;
    return t;
  }
  std::vector<int64_t> Layout(bool is_q, int64_t heads, int64_t d) const {
    const int64_t s = is_q ? sq : sk;
    if (thd()) return {is_q ? TotalQ() : TotalKv(), heads, d};
    if (format == TEFL_QKV_SBHD) return {s, b, heads, d};
    return {b, s, heads, d};
  }
  std::vector<int64_t> StatsShape() const {
    return thd() ? std::vector<int64_t>{hq, TotalQ()} : std::vector<int64_t>{b, hq, sq};
  }
  tefl_attention_attrs Attrs() const {
    tefl_attention_attrs a{};
    a.struct_size = TEFL_ATTENTION_ATTRS_STRUCT_SIZE;
    a.qkv_format = format;
    a.mask_type = mask;
    a.window_left = wl;
    a.window_right = wr;
    a.softmax_type = softmax;
    a.scale = scale;
    a.dropout = dropout;
    a.is_training = training ? 1 : 0;
    a.seed = 0x1234567890ull;
    a.offset = 77;
    return a;
  }
};

Tensor Cu(const std::vector<int32_t>& lens) {
  Tensor t(DType::kI32, {int64_t(lens.size()) + 1});
  int32_t c = 0;
  t.set(0, 0);
  for (size_t i = 0; i < lens.size(); ++i) {
    c += lens[i];
    t.set(int64_t(i) + 1, c);
  }
  return t;
}

// Forward and backward tensors of one spec.
struct Problem {
  Spec s;
  Tensor q, k, v, alpha, cu_q, cu_kv, d_o;
  Tensor o, stats;            // forward outputs
  Tensor dq, dk, dv, dalpha;  // backward outputs
  std::vector<Tensor*> Fin() { return {&q, &k, &v, s.cu() ? &cu_q : nullptr, s.cu() ? &cu_kv : nullptr, Alpha()}; }
  Tensor* Alpha() { return s.softmax == TEFL_ATTN_SOFTMAX_LEARNABLE ? &alpha : nullptr; }
};

Problem Make(const Spec& s) {
  Problem p;
  p.s = s;
  const std::string seed = s.Name();
  p.q = Tensor(s.dtype, s.Layout(true, s.hq, s.dqk));
  p.q.Uniform("q" + seed, s.lo, s.hi);
  p.k = Tensor(s.dtype, s.Layout(false, s.hkv, s.dqk));
  p.k.Uniform("k" + seed, s.lo, s.hi);
  p.v = Tensor(s.dtype, s.Layout(false, s.hkv, s.dv));
  p.v.Uniform("v" + seed, s.lo, s.hi);
  p.alpha = Tensor(DType::kF32, {s.hq});
  p.alpha.Uniform("alpha" + seed, -1.0, 2.0);
  if (s.cu()) {
    p.cu_q = Cu(s.lens_q);
    p.cu_kv = Cu(s.lens_kv);
  }
  p.d_o = Tensor(s.dtype, s.Layout(true, s.hq, s.dv));
  p.d_o.Uniform("do" + seed, s.lo, s.hi);
  p.o = Tensor(s.dtype, s.Layout(true, s.hq, s.dv));
  p.o.Fill(kSentinel);
  p.stats = Tensor(DType::kF32, s.StatsShape());
  p.stats.Fill(kSentinel);
  p.dq = Tensor(s.dtype, p.q.shape());
  p.dq.Fill(kSentinel);
  p.dk = Tensor(s.dtype, p.k.shape());
  p.dk.Fill(kSentinel);
  p.dv = Tensor(s.dtype, p.v.shape());
  p.dv.Fill(kSentinel);
  p.dalpha = Tensor(DType::kF32, {s.hq});
  p.dalpha.Fill(kSentinel);
  return p;
}

std::vector<const DLTensor*> Dl(const std::vector<Tensor*>& v) {
  std::vector<const DLTensor*> r;
  for (Tensor* t : v) r.push_back(t ? t->ptr() : nullptr);
  return r;
}
std::vector<DLTensor*> DlOut(const std::vector<Tensor*>& v) {
  std::vector<DLTensor*> r;
  for (Tensor* t : v) r.push_back(t ? t->ptr() : nullptr);
  return r;
}

Status RunFwd(Problem& p, const std::string& impl) {
  const tefl_attention_attrs a = p.s.Attrs();
  return RunImplDL("fused_attn_fwd", impl, Dl(p.Fin()), DlOut({&p.o, &p.stats}), &a);
}
// Backward from the problem's o and stats.
Status RunBwd(Problem& p, const std::string& impl) {
  const tefl_attention_attrs a = p.s.Attrs();
  const bool cu = p.s.cu();
  std::vector<Tensor*> in = {
      &p.q, &p.k, &p.v, &p.o, &p.d_o, &p.stats, cu ? &p.cu_q : nullptr, cu ? &p.cu_kv : nullptr, p.Alpha()};
  return RunImplDL("fused_attn_bwd", impl, Dl(in), DlOut({&p.dq, &p.dk, &p.dv, &p.dalpha}), &a);
}

std::string Cmp(const char* what, const Tensor& got, const Tensor& want, Tolerance tol) {
  const CompareResult r = Compare(got, want, tol);
  if (r.mismatches == 0) return "";
  return fmt::format("'{}': {} got {} want {}\n", what, r.ToString(), r.first_bad >= 0 ? got.at(r.first_bad) : 0.0,
                     r.first_bad >= 0 ? want.at(r.first_bad) : 0.0);
}

// Reference forward + backward, then every CPU implementation on the same
// inputs (its backward fed the reference's o and stats), compared.
void CheckSpec(const Spec& s) {
  SCOPED_TRACE(s.Name());
  Problem ref = Make(s);
  Status st = RunFwd(ref, kReference);
  ASSERT_TRUE(st.ok()) << st.ToString();
  st = RunBwd(ref, kReference);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const Tolerance tol = AttnTol(s.dtype);
  const Tolerance stat_tol{1e-3, 1e-3};
  const std::vector<std::string> impls = CpuImplementations("fused_attn_fwd");
  for (const char* must : tefl::testing::kMustServeImpls)
    EXPECT_NE(std::find(impls.begin(), impls.end(), must), impls.end()) << must << " is not registered";
  for (const std::string& impl : impls) {
    if (impl == kReference) continue;
    SCOPED_TRACE("impl " + impl);
    Problem run = Make(s);
    st = RunFwd(run, impl);
    if (!st.ok() && !MustServe(impl) && st.code() == TEFL_FAILED_PRECONDITION) continue;
    ASSERT_TRUE(st.ok()) << st.ToString();
    std::string msg = Cmp("o", run.o, ref.o, tol) + Cmp("stats", run.stats, ref.stats, stat_tol);
    EXPECT_TRUE(run.o.GuardsIntact() && run.stats.GuardsIntact());
    // Backward on the reference's saved tensors.
    Problem bwd = Make(s);
    bwd.o = ref.o;
    bwd.stats = ref.stats;
    st = RunBwd(bwd, impl);
    ASSERT_TRUE(st.ok()) << st.ToString();
    msg += Cmp("dq", bwd.dq, ref.dq, tol) + Cmp("dk", bwd.dk, ref.dk, tol) + Cmp("dv", bwd.dv, ref.dv, tol);
    msg += Cmp("d_softmax_offset", bwd.dalpha, ref.dalpha, Tolerance{2e-3, 2e-3});
    EXPECT_TRUE(bwd.dq.GuardsIntact() && bwd.dk.GuardsIntact() && bwd.dv.GuardsIntact());
    EXPECT_TRUE(msg.empty()) << msg;
  }
}

// Lengths for padding / thd: one empty sequence and unequal lengths.
void SetLens(Spec& s) {
  s.lens_q.clear();
  s.lens_kv.clear();
  for (int64_t i = 0; i < s.b; ++i) {
    const int64_t lq = i == 1 ? 0 : std::max<int64_t>(1, s.sq - i * 2);
    const int64_t lk = i == 1 ? 0 : std::max<int64_t>(1, s.sk - i);
    s.lens_q.push_back(int32_t(std::min(lq, s.sq)));
    s.lens_kv.push_back(int32_t(std::min(lk, s.sk)));
  }
}

const DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// ---- The grid ------------------------------------------------------------------------------
TEST(AttentionConformance, LayoutsMasksSoftmaxDtypes) {
  for (DType t : kDTypes) {
    for (int32_t format : {TEFL_QKV_SBHD, TEFL_QKV_BSHD, TEFL_QKV_THD}) {
      for (int32_t mask = 0; mask <= 5; ++mask) {
        for (int32_t sm = 0; sm <= 2; ++sm) {
          Spec s;
          s.dtype = t;
          s.format = format;
          s.mask = mask;
          s.softmax = sm;
          s.b = 3;
          s.sq = 5;
          s.sk = 7;
          s.hq = 4;
          s.hkv = 2;
          s.dqk = 12;
          s.dv = 8;
          SetLens(s);
          CheckSpec(s);
        }
      }
    }
  }
}

TEST(AttentionConformance, WindowsAndGqa) {
  struct W {
    int32_t mask, wl, wr;
  };
  const W windows[] = {{0, 2, 1},  {0, 0, 0}, {0, -1, 2}, {0, 3, -1}, {2, 2, 0},
                       {4, 1, -1}, {4, 4, 0}, {3, 2, 0},  {5, 0, 0},  {1, 2, 3}};
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (const W& w : windows) {
      for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{4, 4}, {4, 1}, {6, 2}}) {
        for (auto [sq, sk] : {std::pair<int64_t, int64_t>{6, 6}, {4, 9}, {9, 4}}) {
          Spec s;
          s.dtype = t;
          s.format = TEFL_QKV_BSHD;
          s.mask = w.mask;
          s.wl = w.wl;
          s.wr = w.wr;
          s.b = 2;
          s.sq = sq;
          s.sk = sk;
          s.hq = hq;
          s.hkv = hkv;
          s.dqk = 16;
          s.dv = 24;
          SetLens(s);
          CheckSpec(s);
        }
      }
    }
  }
}

TEST(AttentionConformance, SequenceLengthsIncludingOneAndTileEdges) {
  const std::pair<int64_t, int64_t> lens[] = {{1, 1}, {1, 9}, {9, 1}, {17, 33}, {65, 70}, {70, 65}};
  for (DType t : kDTypes) {
    for (auto [sq, sk] : lens) {
      for (int32_t mask : {0, 2, 4}) {
        Spec s;
        s.dtype = t;
        s.format = TEFL_QKV_SBHD;
        s.mask = mask;
        s.b = 1;
        s.sq = sq;
        s.sk = sk;
        s.hq = 2;
        s.hkv = 1;
        s.dqk = 20;
        s.dv = 12;
        CheckSpec(s);
      }
    }
  }
}

TEST(AttentionConformance, ThdUnequalAndEmptySequences) {
  for (DType t : kDTypes) {
    for (int32_t mask : {0, 2, 4, 5}) {
      Spec s;
      s.dtype = t;
      s.format = TEFL_QKV_THD;
      s.mask = mask;
      s.b = 4;
      s.lens_q = {9, 0, 33, 1};
      s.lens_kv = {20, 3, 33, 0};
      s.sq = 40;
      s.sk = 40;
      s.hq = 3;
      s.hkv = 3;
      s.dqk = 16;
      s.dv = 16;
      CheckSpec(s);
    }
  }
}

TEST(AttentionConformance, MidSizeHeadDims) {
  for (DType t : kDTypes) {
    for (auto [dqk, dv] : {std::pair<int64_t, int64_t>{64, 64}, {128, 128}, {256, 96}}) {
      Spec s;
      s.dtype = t;
      s.format = TEFL_QKV_BSHD;
      s.mask = dqk == 64 ? 0 : 2;
      s.b = 1;
      s.sq = 100;
      s.sk = 131;
      s.hq = 2;
      s.hkv = 1;
      s.dqk = dqk;
      s.dv = dv;
      s.lo = -1.0;
      s.hi = 1.0;
      CheckSpec(s);
    }
  }
}

TEST(AttentionConformance, DropoutMatchesReference) {
  for (DType t : kDTypes) {
    for (int32_t format : {TEFL_QKV_SBHD, TEFL_QKV_THD}) {
      Spec s;
      s.dtype = t;
      s.format = format;
      s.mask = format == TEFL_QKV_THD ? 2 : 0;
      s.b = 2;
      s.sq = 19;
      s.sk = 37;
      s.hq = 2;
      s.hkv = 1;
      s.dqk = 16;
      s.dv = 16;
      s.dropout = 0.25f;
      s.training = true;
      SetLens(s);
      CheckSpec(s);
    }
  }
}

// ---- Dropout: which elements are dropped --------------------------------------------------
// With v one-hot (v[j] = e_j, d_v = sk) o[i, j] = P'[i, j] exactly, so a
// zero in o marks a dropped (or masked) score; every implementation must drop
// exactly the elements the documented rule names: for e = ((b * h_q + h) *
// sq + i) * sk + j, the u16 at byte 2 (e % 8) of the little-endian words of
// Philox(seed, counter (e / 8, offset)) < ceil(p 2^16).
TEST(AttentionDropout, SameElementsDroppedAsTheDocumentedRule) {
  Spec s;
  s.format = TEFL_QKV_BSHD;
  s.b = 2;
  s.sq = 13;
  s.sk = 21;
  s.hq = 3;
  s.hkv = 1;
  s.dqk = 8;
  s.dv = s.sk;
  s.dropout = 0.4f;
  s.training = true;
  const tefl_attention_attrs a = s.Attrs();
  const double threshold16 = std::ceil(double(s.dropout) * 65536.0);
  for (const std::string& impl : CpuImplementations("fused_attn_fwd")) {
    SCOPED_TRACE(impl);
    Problem p = Make(s);
    p.v.Fill(0.0);
    for (int64_t bi = 0; bi < s.b; ++bi)
      for (int64_t j = 0; j < s.sk; ++j) p.v.set(((bi * s.sk + j) * 1 + 0) * s.dv + j, 1.0);
    const Status st = RunFwd(p, impl);
    ASSERT_TRUE(st.ok()) << st.ToString();
    int64_t dropped = 0, total = 0, wrong = 0;
    for (int64_t bi = 0; bi < s.b; ++bi) {
      for (int64_t h = 0; h < s.hq; ++h) {
        for (int64_t i = 0; i < s.sq; ++i) {
          for (int64_t j = 0; j < s.sk; ++j) {
            const uint64_t e = uint64_t(((bi * s.hq + h) * s.sq + i) * s.sk + j);
            const tefl::backends::Philox4 w = tefl::backends::DropoutWords(a.seed, a.offset, e / 8);
            uint8_t bytes[16];
            for (int k = 0; k < 16; ++k) bytes[k] = uint8_t(w.v[k / 4] >> (8 * (k % 4)));
            const bool kept = double(bytes[2 * (e % 8)] | bytes[2 * (e % 8) + 1] << 8) >= threshold16;
            const double got = p.o.at(((bi * s.sq + i) * s.hq + h) * s.dv + j);
            wrong += (got != 0.0) != kept;
            dropped += !kept;
            ++total;
          }
        }
      }
    }
    EXPECT_EQ(wrong, 0) << "of " << total;
    EXPECT_GT(dropped, total / 4);
    EXPECT_LT(dropped, total * 6 / 10);
  }
}

// Not training: no dropout, whatever p is.
TEST(AttentionDropout, InferenceIgnoresDropout) {
  Spec s;
  s.dropout = 0.5f;
  s.training = false;
  Problem a = Make(s);
  ASSERT_TRUE(RunFwd(a, "default.portable").ok());
  Spec s0 = s;
  s0.dropout = 0.0f;
  Problem b = Make(s0);
  b.q = a.q;
  b.k = a.k;
  b.v = a.v;
  ASSERT_TRUE(RunFwd(b, "default.portable").ok());
  EXPECT_TRUE(a.o.SameBytes(b.o));
}

// ---- Fully masked rows ------------------------------------------------------------------------
// A window entirely left of the keys: rows attend nothing -> o = 0, zero
// gradients, lse = -inf (vanilla) / 0 (off-by-one), never NaN.
TEST(AttentionMasking, FullyMaskedRowsGiveZerosNotNaN) {
  for (const std::string& impl : CpuImplementations("fused_attn_fwd")) {
    for (int32_t sm : {0, 1, 2, 3}) {  // 2, 3: bf16 (default.portable's vdpbf16ps path)
      SCOPED_TRACE(impl + " softmax " + std::to_string(sm % 2) + (sm >= 2 ? " bf16" : ""));
      Spec s;
      s.dtype = sm >= 2 ? DType::kBF16 : DType::kF32;
      s.mask = TEFL_ATTN_MASK_CAUSAL_BOTTOM_RIGHT;  // sk < sq: the first sq - sk rows see no key
      s.sq = 9;
      s.sk = 4;
      s.softmax = sm % 2;
      Problem p = Make(s);
      ASSERT_TRUE(RunFwd(p, impl).ok());
      ASSERT_TRUE(RunBwd(p, impl).ok());
      for (int64_t bi = 0; bi < s.b; ++bi) {
        for (int64_t h = 0; h < s.hq; ++h) {
          for (int64_t i = 0; i < s.sq; ++i) {
            const bool masked = i < s.sq - s.sk;
            const double lse = p.stats.at((bi * s.hq + h) * s.sq + i);
            if (masked) {
              EXPECT_EQ(lse, sm % 2 == 0 ? -INFINITY : 0.0) << i;
            }
            for (int64_t c = 0; c < s.dv; ++c) {
              const double o = p.o.at(((bi * s.sq + i) * s.hq + h) * s.dv + c);
              EXPECT_FALSE(std::isnan(o));
              if (masked) {
                EXPECT_EQ(o, 0.0);
              }
            }
            for (int64_t c = 0; c < s.dqk; ++c) {
              const double g = p.dq.at(((bi * s.sq + i) * s.hq + h) * s.dqk + c);
              EXPECT_FALSE(std::isnan(g));
              if (masked) {
                EXPECT_EQ(g, 0.0);
              }
            }
          }
        }
      }
      for (int64_t e = 0; e < p.dk.numel(); ++e) EXPECT_FALSE(std::isnan(p.dk.at(e)));
      for (int64_t e = 0; e < p.dv.numel(); ++e) EXPECT_FALSE(std::isnan(p.dv.at(e)));
    }
  }
}

// Padded rows (beyond a sequence's length, bshd with a padding mask) give o =
// 0, stats 0 and zero gradients; padded keys get dk = dv = 0.
TEST(AttentionMasking, PaddedRowsAndKeysAreZero) {
  for (const std::string& impl : CpuImplementations("fused_attn_fwd")) {
    SCOPED_TRACE(impl);
    Spec s;
    s.mask = TEFL_ATTN_MASK_PADDING;
    s.sq = 6;
    s.sk = 6;
    s.b = 1;
    s.lens_q = {4};
    s.lens_kv = {3};
    Problem p = Make(s);
    ASSERT_TRUE(RunFwd(p, impl).ok());
    ASSERT_TRUE(RunBwd(p, impl).ok());
    for (int64_t i = 4; i < 6; ++i)
      for (int64_t h = 0; h < s.hq; ++h) {
        EXPECT_EQ(p.stats.at(h * s.sq + i), 0.0);
        for (int64_t c = 0; c < s.dv; ++c) EXPECT_EQ(p.o.at((i * s.hq + h) * s.dv + c), 0.0);
        for (int64_t c = 0; c < s.dqk; ++c) EXPECT_EQ(p.dq.at((i * s.hq + h) * s.dqk + c), 0.0);
      }
    for (int64_t j = 3; j < 6; ++j)
      for (int64_t c = 0; c < s.dqk; ++c) {
        EXPECT_EQ(p.dk.at(j * s.dqk + c), 0.0);
        EXPECT_EQ(p.dv.at(j * s.dv + c), 0.0);
      }
  }
}

TEST(AttentionMasking, NanPropagates) {
  for (const std::string& impl : CpuImplementations("fused_attn_fwd")) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(impl + " " + tefl::DTypeName(t));
      Spec s;
      s.dtype = t;
      Problem p = Make(s);
      p.q.set(0, NAN);  // (b 0, i 0, h 0)
      ASSERT_TRUE(RunFwd(p, impl).ok());
      EXPECT_TRUE(std::isnan(p.o.at(0)));
      EXPECT_FALSE(std::isnan(p.o.at(s.dv)));  // head 1 is untouched
      ASSERT_TRUE(RunBwd(p, impl).ok());
      EXPECT_TRUE(std::isnan(p.dq.at(0)));
      EXPECT_FALSE(std::isnan(p.dq.at(s.dqk)));  // head 1
    }
  }
}

// ---- default.portable's bf16 products (vdpbf16ps, AMX) --------------------------------------
// One bf16 problem of the tests below: layout, mask, sizes, dropout.
struct Bf16Case {
  int32_t format, mask;
  int64_t sq, sk, hq, hkv, dqk, dv;
  float dropout;
};
Spec Bf16Spec(const Bf16Case& k) {
  Spec s;
  s.dtype = DType::kBF16;
  s.format = k.format;
  s.mask = k.mask;
  s.b = 2;
  s.sq = k.sq;
  s.sk = k.sk;
  s.hq = k.hq;
  s.hkv = k.hkv;
  s.dqk = k.dqk;
  s.dv = k.dv;
  s.lo = -1.0;
  s.hi = 1.0;
  s.dropout = k.dropout;
  s.training = k.dropout > 0.0f;
  if (s.thd()) {
    s.lens_q = {90, 37};
    s.lens_kv = {63, 90};
  }
  return s;
}
bool HasPortableAttention() {
  const std::vector<std::string> impls = CpuImplementations("fused_attn_bwd");
  return std::find(impls.begin(), impls.end(), "default.portable") != impls.end();
}
// default.portable's forward and backward of `got`; then, with the portable
// switch `env` set to 0, the forward of `want_fwd` and the backward of
// `want_bwd` from got's saved forward (o, stats).
void RunWithAndWithout(const char* env, Problem& got, Problem& want_fwd, Problem& want_bwd) {
  const char* kPortable = "default.portable";
  ASSERT_TRUE(RunFwd(got, kPortable).ok());
  ASSERT_TRUE(RunBwd(got, kPortable).ok());
  want_bwd.o = got.o;
  want_bwd.stats = got.stats;
  const Status st = WithPortableSwitch(env, "0", [&] {
    Status f = RunFwd(want_fwd, kPortable);
    return f.ok() ? RunBwd(want_bwd, kPortable) : f;
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
}

// default.portable's bf16 forward and backward run their tile products on
// vdpbf16ps when the CPU has avx512_bf16 (P, P' and dS rounded to bf16);
// TEFL_PORTABLE_ATTN_BF16DOT=0 forces the fp32 products. On the same bf16
// inputs both agree within the bf16 tolerance, over tile-edge sizes, GQA,
// causal masks, thd and dropout; with avx512_bf16 the results differ in some
// bits (the dot path really ran).
TEST(AttentionBf16Dot, MatchesTheFp32ProductsOnTheSameInputs) {
  const char* kPortable = "default.portable";
  if (!HasPortableAttention()) GTEST_SKIP() << "no default.portable";
  // The CPU has vdpbf16ps and TEFL_MAX_CPU_ISA allows it.
  const bool has_dot = tefl::backends::CpuHasAvx512Bf16();
  const Bf16Case cases[] = {{TEFL_QKV_BSHD, 0, 130, 197, 4, 2, 64, 64, 0.0f},
                            {TEFL_QKV_BSHD, 2, 130, 130, 4, 1, 128, 128, 0.0f},
                            {TEFL_QKV_SBHD, 4, 67, 150, 6, 2, 20, 36, 0.0f},
                            {TEFL_QKV_THD, 2, 90, 90, 2, 2, 64, 64, 0.0f},
                            {TEFL_QKV_BSHD, 2, 70, 65, 2, 1, 64, 64, 0.2f}};
  bool any_diff = false, any_fwd_diff = false;
  for (const Bf16Case& k : cases) {
    const Spec s = Bf16Spec(k);
    SCOPED_TRACE(s.Name());
    Problem dot = Make(s);
    ASSERT_TRUE(RunFwd(dot, kReference).ok());
    ASSERT_TRUE(RunBwd(dot, kPortable).ok());
    Problem f32 = Make(s);
    f32.o = dot.o;
    f32.stats = dot.stats;
    const Status st = WithPortableSwitch("TEFL_PORTABLE_ATTN_BF16DOT", "0", [&] { return RunBwd(f32, kPortable); });
    ASSERT_TRUE(st.ok()) << st.ToString();
    const Tolerance tol = AttnTol(DType::kBF16);
    std::string msg = Cmp("dq", dot.dq, f32.dq, tol) + Cmp("dk", dot.dk, f32.dk, tol) + Cmp("dv", dot.dv, f32.dv, tol);
    // The forward (S = Q K^T and O += P V on vdpbf16ps, P rounded to bf16).
    Problem fdot = Make(s), ff32 = Make(s);
    ASSERT_TRUE(RunFwd(fdot, kPortable).ok());
    const Status fst = WithPortableSwitch("TEFL_PORTABLE_ATTN_BF16DOT", "0", [&] { return RunFwd(ff32, kPortable); });
    ASSERT_TRUE(fst.ok()) << fst.ToString();
    msg += Cmp("o", fdot.o, ff32.o, tol) + Cmp("stats", fdot.stats, ff32.stats, Tolerance{1e-3, 1e-3});
    for (int64_t i = 0; i < fdot.o.numel() && !any_fwd_diff; ++i) any_fwd_diff |= fdot.o.at(i) != ff32.o.at(i);
    EXPECT_TRUE(msg.empty()) << msg;
    for (int64_t i = 0; i < dot.dq.numel() && !any_diff; ++i) any_diff |= dot.dq.at(i) != f32.dq.at(i);
    for (int64_t i = 0; i < dot.dk.numel() && !any_diff; ++i) any_diff |= dot.dk.at(i) != f32.dk.at(i);
  }
  if (has_dot) {
    EXPECT_TRUE(any_diff) << "the vdpbf16ps backward did not run";
    EXPECT_TRUE(any_fwd_diff) << "the vdpbf16ps forward did not run";
  }
}

// Where the CPU has AMX-BF16, the bf16 dot path runs its tile products on
// AMX tiles (whole 16-row tiles; the rest on vdpbf16ps);
// TEFL_PORTABLE_ATTN_AMX=0 keeps them all on vdpbf16ps. Both take the same
// bf16 operands and round P, P' and dS the same way, so they agree within
// the bf16 tolerance. The sizes give last query blocks of 46 rows (48: two
// row tiles then one), 14 rows (16: one row tile) and 32 rows (the
// backward's dK / dV products over 16 row pairs: one K step), head dims of
// 64, 128 and 20 / 36 (padded), GQA, masks and dropout. On such a CPU the
// AMX path must have run for every call (the run counter) and changed some
// bits.
TEST(AttentionBf16Amx, MatchesTheVdpbf16psProducts) {
  if (!HasPortableAttention()) GTEST_SKIP() << "no default.portable";
  using tefl::backends::PortablePath;
  const bool has_amx = tefl::backends::CpuHasAmxBf16() && tefl::backends::PortablePathOn(PortablePath::kAttnAmx);
  const Bf16Case cases[] = {{TEFL_QKV_BSHD, 0, 110, 197, 4, 2, 64, 64, 0.0f},
                            {TEFL_QKV_BSHD, 2, 78, 78, 2, 1, 128, 128, 0.0f},
                            {TEFL_QKV_SBHD, 4, 110, 150, 6, 2, 20, 36, 0.0f},
                            {TEFL_QKV_BSHD, 0, 96, 80, 2, 1, 64, 64, 0.0f},
                            {TEFL_QKV_BSHD, 2, 128, 128, 2, 2, 64, 64, 0.25f}};
  bool any_diff = false;
  for (const Bf16Case& k : cases) {
    const Spec s = Bf16Spec(k);
    SCOPED_TRACE(s.Name());
    const unsigned long long runs0 = tefl::backends::PortablePathRuns(PortablePath::kAttnAmx);
    Problem amx = Make(s), dot = Make(s), fwd_dot = Make(s);
    RunWithAndWithout("TEFL_PORTABLE_ATTN_AMX", amx, fwd_dot, dot);
    if (::testing::Test::HasFatalFailure()) return;
    // Two calls on AMX; none with TEFL_PORTABLE_ATTN_AMX=0.
    EXPECT_EQ(tefl::backends::PortablePathRuns(PortablePath::kAttnAmx) - runs0, has_amx ? 2u : 0u);
    const Tolerance tol = AttnTol(DType::kBF16);
    const std::string msg = Cmp("o", amx.o, fwd_dot.o, tol) +
                            Cmp("stats", amx.stats, fwd_dot.stats, Tolerance{1e-3, 1e-3}) +
                            Cmp("dq", amx.dq, dot.dq, tol) + Cmp("dk", amx.dk, dot.dk, tol) +
                            Cmp("dv", amx.dv, dot.dv, tol);
    EXPECT_TRUE(msg.empty()) << msg;
    for (int64_t i = 0; i < amx.o.numel() && !any_diff; ++i) any_diff |= amx.o.at(i) != fwd_dot.o.at(i);
    for (int64_t i = 0; i < amx.dk.numel() && !any_diff; ++i) any_diff |= amx.dk.at(i) != dot.dk.at(i);
  }
  if (has_amx) {
    EXPECT_TRUE(any_diff) << "the AMX products gave the vdpbf16ps results bit for bit: did they run?";
  }
}

// vdpbf16ps and tdpbf16ps read subnormal bf16 inputs as 0, so one subnormal
// value in q, k, v (or d_o for the backward) sends the whole call to the fp32
// products: the outputs are then bit for bit those of
// TEFL_PORTABLE_ATTN_BF16DOT=0. The tensors span two pieces of the parallel
// scan (65536 elements): the subnormal sits at the first or the last element.
TEST(AttentionBf16Dot, OneSubnormalInputTakesTheFp32Products) {
  if (!HasPortableAttention()) GTEST_SKIP() << "no default.portable";
  const Spec s = Bf16Spec({TEFL_QKV_BSHD, 0, 130, 130, 4, 4, 64, 64, 0.0f});
  const double kSubnormal = 1e-39;  // a bf16 subnormal (|x| < 2^-126)
  for (int which = 0; which < 4; ++which) {  // q, k, v, d_o
    for (bool last : {false, true}) {
      SCOPED_TRACE(fmt::format("subnormal in {} at its {} element", "qkvd"[which], last ? "last" : "first"));
      Problem base = Make(s);
      Tensor& t = which == 0 ? base.q : which == 1 ? base.k : which == 2 ? base.v : base.d_o;
      ASSERT_GT(t.numel(), 65536);
      t.set(last ? t.numel() - 1 : 0, kSubnormal);
      ASSERT_NE(t.at(last ? t.numel() - 1 : 0), 0.0);
      Problem got = base, want_fwd = base, want_bwd = base;
      RunWithAndWithout("TEFL_PORTABLE_ATTN_BF16DOT", got, want_fwd, want_bwd);
      if (::testing::Test::HasFatalFailure()) return;
      if (which < 3) {
        EXPECT_TRUE(got.o.SameBytes(want_fwd.o)) << "the forward used the bf16 dot products";
      }
      EXPECT_TRUE(got.dq.SameBytes(want_bwd.dq) && got.dk.SameBytes(want_bwd.dk) && got.dv.SameBytes(want_bwd.dv))
          << "the backward used the bf16 dot products";
    }
  }
}

TEST(AttentionConformance, ZeroSizedIsANoOp) {
  for (const std::string& impl : CpuImplementations("fused_attn_fwd")) {
    SCOPED_TRACE(impl);
    Spec s;
    s.b = 0;
    Problem p = Make(s);
    EXPECT_TRUE(RunFwd(p, impl).ok());
    EXPECT_TRUE(RunBwd(p, impl).ok());
    Spec t;
    t.sk = 0;  // no keys: every row attends nothing
    Problem r = Make(t);
    EXPECT_TRUE(RunFwd(r, impl).ok());
    for (int64_t e = 0; e < r.o.numel(); ++e) ASSERT_EQ(r.o.at(e), 0.0);
    EXPECT_TRUE(RunBwd(r, impl).ok());
    for (int64_t e = 0; e < r.dq.numel(); ++e) ASSERT_EQ(r.dq.at(e), 0.0);
  }
}

// ---- The oracle's backward against central finite differences --------------------------------
// Loss L = sum(o * W) in double from fp32 outputs; the reference's gradient
// with d_o = W must match (L(x + h) - L(x - h)) / (x+h - (x-h)) for h = 1e-2
// (the perturbed values rounded to fp32; the step used is the actual one).
// The truncation error is O(h^2) and fp32 rounding of o adds ~1e-5, so the
// tolerance is 2e-3 absolute + 2e-3 relative.
double Loss(Problem& p) {
  p.o.Fill(0.0);
  EXPECT_TRUE(RunFwd(p, kReference).ok());
  double l = 0;
  for (int64_t e = 0; e < p.o.numel(); ++e) l += p.o.at(e) * p.d_o.at(e);
  return l;
}

void FiniteDifferences(Spec s) {
  SCOPED_TRACE(s.Name());
  s.lo = -1.0;
  s.hi = 1.0;
  Problem p = Make(s);
  ASSERT_TRUE(RunFwd(p, kReference).ok());
  ASSERT_TRUE(RunBwd(p, kReference).ok());
  struct Target {
    const char* name;
    Tensor* x;
    Tensor* grad;
  };
  std::vector<Target> targets = {{"q", &p.q, &p.dq}, {"k", &p.k, &p.dk}, {"v", &p.v, &p.dv}};
  if (p.Alpha()) targets.push_back({"alpha", &p.alpha, &p.dalpha});
  for (const Target& t : targets) {
    for (int64_t e = 0; e < t.x->numel(); ++e) {
      Problem w = p;
      const double x0 = t.x->at(e);
      Tensor* x = t.x == &p.q ? &w.q : t.x == &p.k ? &w.k : t.x == &p.v ? &w.v : &w.alpha;
      x->set(e, x0 + 1e-2);
      const double xp = x->at(e);
      const double lp = Loss(w);
      x->set(e, x0 - 1e-2);
      const double xm = x->at(e);
      const double lm = Loss(w);
      const double fd = (lp - lm) / (xp - xm);
      const double an = t.grad->at(e);
      EXPECT_NEAR(an, fd, 2e-3 + 2e-3 * std::fabs(fd)) << t.name << "[" << e << "]";
    }
  }
}

TEST(AttentionOracle, BackwardMatchesFiniteDifferences) {
  for (int32_t sm = 0; sm <= 2; ++sm) {
    for (int32_t mask : {0, 2, 4}) {
      Spec s;
      s.format = TEFL_QKV_BSHD;
      s.mask = mask;
      s.wl = mask == 4 ? 2 : -1;
      s.softmax = sm;
      s.b = 1;
      s.sq = 3;
      s.sk = 4;
      s.hq = 2;
      s.hkv = 1;
      s.dqk = 3;
      s.dv = 2;
      s.scale = 0.7f;
      FiniteDifferences(s);
    }
  }
  Spec d;  // dropout: the mask is fixed by (seed, offset), so L is smooth
  d.b = 1;
  d.sq = 3;
  d.sk = 5;
  d.hq = 2;
  d.hkv = 2;
  d.dqk = 2;
  d.dv = 3;
  d.dropout = 0.3f;
  d.training = true;
  FiniteDifferences(d);
}

// ---- Bad input: a clear error, outputs untouched ----------------------------------------------
void ExpectError(Problem& p, const std::string& needle, bool bwd = false) {
  for (const std::string& impl : CpuImplementations("fused_attn_fwd")) {
    Problem r = p;
    const Status st = bwd ? RunBwd(r, impl) : RunFwd(r, impl);
    EXPECT_FALSE(st.ok()) << impl << " " << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    for (const Tensor* t : {&r.o, &r.stats, &r.dq, &r.dk, &r.dv})
      if (!bwd || t != &r.o) {
        for (int64_t e = 0; e < t->numel(); ++e) ASSERT_EQ(t->at(e), bwd && t == &r.stats ? p.stats.at(e) : kSentinel);
      }
  }
}

TEST(AttentionValidation, BadInputIsAClearErrorAndWritesNothing) {
  {  // heads that do not divide
    Spec s;
    s.hq = 3;
    s.hkv = 2;
    Problem p = Make(s);
    ExpectError(p, "fused_attn_fwd: argument 'k'");
    ExpectError(p, "dividing h_q = 3");
  }
  {  // head dim > 256
    Spec s;
    s.dqk = 257;
    Problem p = Make(s);
    ExpectError(p, "expected head dim d_qk in [1, 256]");
  }
  {  // thd without cu_seqlens
    Spec s;
    s.format = TEFL_QKV_THD;
    s.lens_q = {2, 3};
    s.lens_kv = {2, 3};
    Problem p = Make(s);
    const tefl_attention_attrs a = s.Attrs();
    const Status st = RunImplDL("fused_attn_fwd", kReference, Dl({&p.q, &p.k, &p.v, nullptr, nullptr, nullptr}),
                                DlOut({&p.o, &p.stats}), &a);
    EXPECT_NE(st.message().find("'cu_seqlens_q'"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("is required for qkv_format thd"), std::string::npos) << st.message();
  }
  {  // cu_seqlens not monotone / last != total / too long
    Spec s;
    s.format = TEFL_QKV_THD;
    s.lens_q = {2, 3};
    s.lens_kv = {2, 3};
    Problem p = Make(s);
    p.cu_q.set(1, 6);
    ExpectError(p, "non-decreasing");
    Problem p2 = Make(s);
    p2.cu_kv.set(2, 4);
    ExpectError(p2, "'cu_seqlens_kv'");
    ExpectError(p2, "to equal t_kv = 5");
    Spec b;
    b.mask = TEFL_ATTN_MASK_PADDING;
    b.lens_q = {5, 6};
    b.lens_kv = {7, 7};
    Problem p3 = Make(b);
    ExpectError(p3, "sequence 1 has length 6 > sq = 5");
  }
  {  // window_right with a causal mask
    Spec s;
    s.mask = TEFL_ATTN_MASK_CAUSAL;
    s.wr = 2;
    Problem p = Make(s);
    ExpectError(p, "'window_right' must be -1 or 0 with mask_type causal");
  }
  {  // learnable softmax without alpha; stats of the wrong shape; dtype mix
    Spec s;
    s.softmax = TEFL_ATTN_SOFTMAX_LEARNABLE;
    Problem p = Make(s);
    const tefl_attention_attrs a = s.Attrs();
    Status st = RunImplDL("fused_attn_fwd", kReference, Dl({&p.q, &p.k, &p.v, nullptr, nullptr, nullptr}),
                          DlOut({&p.o, &p.stats}), &a);
    EXPECT_NE(st.message().find("'softmax_offset'"), std::string::npos) << st.message();
    Spec t;
    Problem r = Make(t);
    r.stats = Tensor(DType::kF32, {t.b, t.sq, t.hq});
    r.stats.Fill(kSentinel);
    ExpectError(r, "argument 'stats'");
    Problem u = Make(t);
    u.v = Tensor(DType::kBF16, u.v.shape());
    ExpectError(u, "expected dtype float32");
  }
  {  // backward: d_o of the wrong shape
    Spec s;
    Problem p = Make(s);
    p.d_o = Tensor(s.dtype, {s.b, s.sq, s.hq, s.dv + 1});
    ExpectError(p, "fused_attn_bwd: argument 'd_o'", true);
  }
}

}  // namespace

// ---- The C++ entry points (include/tefl/attention.hpp) -----------------------------------------
TEST(AttentionApi, GetAttentionBackendNamesTheServingImplAndRejections) {
  tefl::AttentionParams p;
  p.batch = 2;
  p.seqlen_q = 128;
  p.seqlen_kv = 256;
  p.num_heads_q = 8;
  p.num_heads_kv = 2;
  p.head_dim_qk = 64;
  p.head_dim_v = 64;
  p.mask_type = TEFL_ATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  tefl::AttentionBackend b = tefl::GetAttentionBackend(p);
  EXPECT_TRUE(b.available) << b.ToString();
  EXPECT_FALSE(b.impl_id.empty());
  EXPECT_EQ(b.resolution.op_name, "fused_attn_fwd");
  bool has_reference = false;
  for (const tefl::CandidateReport& c : b.resolution.candidates) has_reference |= c.impl_id == kReference;
  EXPECT_TRUE(has_reference);
  p.backward = true;
  p.qkv_format = TEFL_QKV_THD;
  p.seqlen_q = 256;  // 2 sequences of 128 tokens
  p.cu_seqlens_kv = {0, 100, 256};
  b = tefl::GetAttentionBackend(p);
  EXPECT_TRUE(b.available) << b.ToString();
  EXPECT_EQ(b.resolution.op_name, "fused_attn_bwd");
  p.num_heads_kv = 3;  // does not divide 8
  b = tefl::GetAttentionBackend(p);
  EXPECT_FALSE(b.available);
  EXPECT_NE(b.error.find("argument 'k'"), std::string::npos) << b.error;
  // thd without cu_seqlens: the even lengths it synthesizes must fit int32
  // (they wrapped into negative values the caller never passed).
  tefl::AttentionParams big;
  big.qkv_format = TEFL_QKV_THD;
  big.mask_type = TEFL_ATTN_MASK_PADDING;
  big.batch = 100000;
  big.seqlen_q = big.seqlen_kv = int64_t(100000) * 100000;
  b = tefl::GetAttentionBackend(big);
  EXPECT_FALSE(b.available);
  EXPECT_EQ(b.resolution.op_name, "fused_attn_fwd");
  EXPECT_EQ(b.error,
            "100000 sequences of 100000 q tokens (10000000000 in all) exceed what int32 cu_seqlens can hold "
            "(2147483647 tokens)");
  big.seqlen_q = 100000;  // 1 token per sequence; kv still too many
  b = tefl::GetAttentionBackend(big);
  EXPECT_NE(b.error.find("100000 kv tokens"), std::string::npos) << b.error;
}

TEST(AttentionApi, FlashAttentionAllocatesOrUsesCallerOutputs) {
  Spec s;
  s.mask = TEFL_ATTN_MASK_CAUSAL;
  s.softmax = TEFL_ATTN_SOFTMAX_LEARNABLE;
  Problem ref = Make(s);
  ASSERT_TRUE(RunFwd(ref, kReference).ok());
  ASSERT_TRUE(RunBwd(ref, kReference).ok());
  const tefl_attention_attrs a = s.Attrs();
  Problem p = Make(s);
  tefl::AttentionInputs in{p.q.ptr(), p.k.ptr(), p.v.ptr(), nullptr, nullptr, p.alpha.ptr()};
  tefl::FlashAttentionOutputs out;  // allocated
  tefl::Status st = tefl::FlashAttention(in, a, &out);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(out.impl_id.empty());
  ASSERT_EQ(out.o_storage.shape(), p.o.shape());
  ASSERT_EQ(out.stats_storage.shape(), p.stats.shape());
  std::memcpy(p.o.bytes(), out.o->data, p.o.nbytes());
  std::memcpy(p.stats.bytes(), out.stats->data, p.stats.nbytes());
  EXPECT_EQ(Cmp("o", p.o, ref.o, AttnTol(s.dtype)) + Cmp("stats", p.stats, ref.stats, {1e-3, 1e-3}), "");
  tefl::FlashAttentionGrads g;  // allocated, d_softmax_offset included
  st = tefl::FlashAttentionBackward(in, ref.o.ptr(), p.d_o.ptr(), ref.stats.ptr(), a, &g);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_NE(g.d_softmax_offset, nullptr);
  std::memcpy(p.dq.bytes(), g.dq->data, p.dq.nbytes());
  std::memcpy(p.dalpha.bytes(), g.d_softmax_offset->data, p.dalpha.nbytes());
  EXPECT_EQ(Cmp("dq", p.dq, ref.dq, AttnTol(s.dtype)) + Cmp("dalpha", p.dalpha, ref.dalpha, {2e-3, 2e-3}), "");
  // Caller-provided outputs are written in place.
  Problem c = Make(s);
  tefl::FlashAttentionOutputs given;
  given.o = c.o.ptr();
  given.stats = c.stats.ptr();
  ASSERT_TRUE(tefl::FlashAttention(in, a, &given).ok());
  EXPECT_EQ(given.o_storage.shape().size(), 0u);
  EXPECT_EQ(Cmp("o", c.o, ref.o, AttnTol(s.dtype)), "");
}

// The outputs structs are kept per layer in containers: a move takes the
// allocated outputs along (o, stats, dq, ... point at the new object's own
// storage, with the values computed), copies a caller-provided pointer as it
// is, and leaves the source ready for another call.
TEST(AttentionApi, OutputsStructsStayValidWhenMoved) {
  Spec s;
  s.softmax = TEFL_ATTN_SOFTMAX_LEARNABLE;
  Problem ref = Make(s);
  ASSERT_TRUE(RunFwd(ref, kReference).ok());
  ASSERT_TRUE(RunBwd(ref, kReference).ok());
  const tefl_attention_attrs a = s.Attrs();
  Problem p = Make(s);
  tefl::AttentionInputs in{p.q.ptr(), p.k.ptr(), p.v.ptr(), nullptr, nullptr, p.alpha.ptr()};
  std::vector<tefl::FlashAttentionOutputs> layers;  // grows: every element is moved again
  std::vector<tefl::FlashAttentionGrads> grads;
  for (int layer = 0; layer < 5; ++layer) {
    tefl::FlashAttentionOutputs out;
    ASSERT_TRUE(tefl::FlashAttention(in, a, &out).ok());
    layers.push_back(std::move(out));
    EXPECT_EQ(out.o, nullptr);  // the source lost its allocated outputs
    EXPECT_EQ(out.stats, nullptr);
    EXPECT_EQ(out.o_storage.dl(), nullptr);
    tefl::FlashAttentionGrads g;
    ASSERT_TRUE(tefl::FlashAttentionBackward(in, ref.o.ptr(), p.d_o.ptr(), ref.stats.ptr(), a, &g).ok());
    grads.push_back(std::move(g));
    EXPECT_EQ(g.dq, nullptr);
  }
  auto check = [&](tefl::FlashAttentionOutputs& out, tefl::FlashAttentionGrads& g) {
    ASSERT_EQ(out.o, out.o_storage.dl());
    ASSERT_EQ(out.stats, out.stats_storage.dl());
    ASSERT_NE(out.o, nullptr);
    ASSERT_EQ(out.o->ndim, p.o.dl().ndim);
    std::memcpy(p.o.bytes(), out.o->data, p.o.nbytes());
    std::memcpy(p.stats.bytes(), out.stats->data, p.stats.nbytes());
    EXPECT_EQ(Cmp("o", p.o, ref.o, AttnTol(s.dtype)) + Cmp("stats", p.stats, ref.stats, {1e-3, 1e-3}), "");
    ASSERT_EQ(g.dq, g.dq_storage.dl());
    ASSERT_EQ(g.dk, g.dk_storage.dl());
    ASSERT_EQ(g.dv, g.dv_storage.dl());
    ASSERT_EQ(g.d_softmax_offset, g.d_softmax_offset_storage.dl());
    ASSERT_NE(g.dq, nullptr);
    std::memcpy(p.dq.bytes(), g.dq->data, p.dq.nbytes());
    std::memcpy(p.dv.bytes(), g.dv->data, p.dv.nbytes());
    std::memcpy(p.dalpha.bytes(), g.d_softmax_offset->data, p.dalpha.nbytes());
    EXPECT_EQ(Cmp("dq", p.dq, ref.dq, AttnTol(s.dtype)) + Cmp("dv", p.dv, ref.dv, AttnTol(s.dtype)) +
                  Cmp("dalpha", p.dalpha, ref.dalpha, {2e-3, 2e-3}),
              "");
  };
  for (size_t i = 0; i < layers.size(); ++i) {
    SCOPED_TRACE(i);
    check(layers[i], grads[i]);
  }
  // Move assignment, over a struct holding outputs of its own; self-move.
  tefl::FlashAttentionOutputs kept;
  ASSERT_TRUE(tefl::FlashAttention(in, a, &kept).ok());
  tefl::FlashAttentionGrads kept_g;
  kept = std::move(layers[0]);
  kept_g = std::move(grads[0]);
  auto& self = kept;
  kept = std::move(self);
  check(kept, kept_g);
  // The moved-from struct allocates again on its next call.
  ASSERT_TRUE(tefl::FlashAttention(in, a, &layers[0]).ok());
  ASSERT_TRUE(tefl::FlashAttentionBackward(in, ref.o.ptr(), p.d_o.ptr(), ref.stats.ptr(), a, &grads[0]).ok());
  check(layers[0], grads[0]);
  // A caller-provided output is copied, not re-pointed.
  Problem c = Make(s);
  tefl::FlashAttentionOutputs given;
  given.o = c.o.ptr();
  ASSERT_TRUE(tefl::FlashAttention(in, a, &given).ok());
  tefl::FlashAttentionOutputs moved(std::move(given));
  EXPECT_EQ(moved.o, c.o.ptr());
  EXPECT_EQ(moved.stats, moved.stats_storage.dl());
  EXPECT_EQ(Cmp("o", c.o, ref.o, AttnTol(s.dtype)), "");
  static_assert(!std::is_copy_constructible_v<tefl::FlashAttentionOutputs>);
  static_assert(std::is_nothrow_move_constructible_v<tefl::FlashAttentionGrads>);
}

// HostTensor refuses a shape it cannot allocate exactly: a negative
// dimension, or a byte count past int64 (2^31 * 2^31 * 4 floats wrapped to
// 1 byte). The constructor throws std::invalid_argument, Create returns
// INVALID_ARGUMENT with the same message, and FlashAttention returns it.
TEST(AttentionApi, HostTensorRefusesShapesItCannotAllocate) {
  const DLDataType f32{kDLFloat, 32, 1};
  const std::vector<int64_t> negative = {-4, 8};
  const std::vector<int64_t> huge = {int64_t(1) << 31, int64_t(1) << 31, 4};
  const std::string negative_msg = "HostTensor: dimension 0 of shape [-4, 8] is negative (-4)";
  const std::string huge_msg =
      "HostTensor: shape [2147483648, 2147483648, 4] of 4-byte elements is too large (its byte count does not fit "
      "in int64)";
  for (const auto& [shape, msg] : {std::pair{negative, negative_msg}, std::pair{huge, huge_msg}}) {
    SCOPED_TRACE(msg);
    try {
      tefl::HostTensor t(f32, shape);
      ADD_FAILURE() << "constructed";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), msg);
    }
    tefl::HostTensor kept;
    ASSERT_TRUE(tefl::HostTensor::Create(f32, {2, 3}, &kept).ok());
    DLTensor* before = kept.dl();
    tefl::Status st = tefl::HostTensor::Create(f32, shape, &kept);
    EXPECT_EQ(st.code(), TEFL_INVALID_ARGUMENT);
    EXPECT_EQ(st.message(), msg);
    EXPECT_EQ(kept.dl(), before);  // left as it was
    EXPECT_EQ(kept.shape(), (std::vector<int64_t>{2, 3}));
  }
  // Just below and at the int64 limit (bytes + the 1 HostTensor adds).
  const DLDataType u8{kDLUInt, 8, 1};
  tefl::HostTensor t;
  EXPECT_EQ(tefl::HostTensor::Create(u8, {INT64_MAX}, &t).code(), TEFL_INVALID_ARGUMENT);
  EXPECT_EQ(tefl::HostTensor::Create(f32, {int64_t(1) << 61}, &t).code(), TEFL_INVALID_ARGUMENT);
  // A zero dimension: empty, whatever the others multiply to.
  tefl::HostTensor empty(f32, {int64_t(1) << 62, 4, 0});
  ASSERT_NE(empty.dl(), nullptr);
  EXPECT_NE(empty.dl()->data, nullptr);
  EXPECT_EQ(empty.dl()->ndim, 3);
  EXPECT_EQ(empty.shape(), (std::vector<int64_t>{int64_t(1) << 62, 4, 0}));
  ASSERT_TRUE(tefl::HostTensor::Create(f32, {0}, &t).ok());
  // FlashAttention reports an output it cannot allocate as a Status.
  Spec s;
  Problem p = Make(s);
  DLTensor q = p.q.dl();
  std::vector<int64_t> bad_shape(q.shape, q.shape + q.ndim);
  bad_shape[1] = -1;
  q.shape = bad_shape.data();
  tefl::AttentionInputs in{&q, p.k.ptr(), p.v.ptr(), nullptr, nullptr, nullptr};
  tefl::FlashAttentionOutputs out;
  tefl::Status st = tefl::FlashAttention(in, s.Attrs(), &out);
  EXPECT_EQ(st.code(), TEFL_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("flash_attention: output 'o': HostTensor: dimension 1 of shape"), std::string::npos)
      << st.message();
}

// A plugin-style implementation (here registered in-process into a private
// registry) ranked first by the policy serves both entry points, and
// GetAttentionBackend reports it: the NVTE_PLUGIN override contract.
TEST(AttentionApi, AHigherRankedImplementationOverridesBoth) {
  tefl::OpRegistry registry;
  tefl::OpManager manager(&registry);
  manager.EnsureInitialized();
  int calls = 0;
  tefl::OpImpl impl = tefl::OpImpl::FromFunction("fused_attn_fwd", "vendor.acme_attn", tefl::BackendImplKind::VENDOR,
                                                 "acme", 0, [&calls](const tefl_call_frame& frame) {
                                                   ++calls;
                                                   DLTensor* o = frame.outputs[0];
                                                   std::memset(tefl::DataPtr(o), 0, size_t(tefl::NumElements(o)) * 4);
                                                   return tefl::Status::OK();
                                                 });
  ASSERT_TRUE(registry.RegisterImpl(impl).ok());
  tefl::PolicyContext scoped(tefl::GetPolicy().WithPrefer("vendor"));
  tefl::AttentionParams p;
  p.seqlen_q = p.seqlen_kv = 16;
  p.num_heads_q = p.num_heads_kv = 2;
  p.head_dim_qk = p.head_dim_v = 8;
  const tefl::AttentionBackend b = tefl::GetAttentionBackend(p, manager);
  ASSERT_TRUE(b.available) << b.ToString();
  EXPECT_EQ(b.impl_id, "vendor.acme_attn");
  EXPECT_FALSE(b.fallbacks.empty());  // the built-ins stay behind it
  Spec s;
  Problem q = Make(s);
  const tefl_attention_attrs a = s.Attrs();
  tefl::AttentionInputs in{q.q.ptr(), q.k.ptr(), q.v.ptr(), nullptr, nullptr, nullptr};
  tefl::FlashAttentionOutputs out;
  ASSERT_TRUE(tefl::FlashAttention(in, a, &out, manager).ok());
  EXPECT_EQ(out.impl_id, "vendor.acme_attn");
  EXPECT_EQ(calls, 1);
}
