// Conformance of every registered CPU implementation of the RoPE ops
// (fused_rope_forward/backward, fused_qkv_rope_forward/backward) against the
// oracle, reference.cpp, with TransformerEngine's tolerances; plus checks of
// the oracle itself: backward is the transpose of forward (adjoint identity
// and a central difference), context-parallel chunks, start_positions and
// thd sequences agree with plain runs on the full sequence.
//
// Tensors may be strided views (slices of a packed qkv tensor, a channel
// stride of 2): every impl gets the same views over the same backing
// buffers, outputs start as a sentinel, and whole backing buffers are
// compared, so a write outside a view is a mismatch too.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

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
using tefl::testing::ToleranceFor;

constexpr const char* kReference = tefl::testing::kReferenceImpl;
constexpr double kSentinel = -31337.0;

// ---- Strided views over backing buffers -------------------------------------------------
struct Arg {
  std::string name;
  Tensor store;                  // backing storage (compact)
  std::vector<int64_t> shape;    // the view
  std::vector<int64_t> strides;  // empty: compact
  int64_t offset = 0;            // elements into store
  DLTensor view{};
  DLTensor* dl() {
    view = store.dl();
    view.ndim = int32_t(shape.size());
    view.shape = shape.data();
    view.strides = strides.empty() ? nullptr : strides.data();
    view.byte_offset = uint64_t(offset) * (store.dl().dtype.bits / 8);
    return &view;
  }
  int64_t Stride(size_t dim) const {
    if (!strides.empty()) return strides[dim];
    int64_t s = 1;
    for (size_t k = dim + 1; k < shape.size(); ++k) s *= shape[k];
    return s;
  }
};

int64_t Numel(const std::vector<int64_t>& s) {
  return std::accumulate(s.begin(), s.end(), int64_t(1), std::multiplies<>());
}

// A compact tensor of `shape`.
Arg Compact(const std::string& name, DType dt, std::vector<int64_t> shape) {
  Arg a{name, Tensor(dt, shape), shape, {}, 0, {}};
  return a;
}

// A view of `shape` inside a bigger buffer: dim `dim` of the buffer is
// `extra` larger and the view starts `at` into it; with channel_stride 2 the
// last dim is interleaved with unused elements.
Arg Slice(const std::string& name, DType dt, std::vector<int64_t> shape, size_t dim, int64_t extra, int64_t at,
          int64_t channel_stride = 1) {
  std::vector<int64_t> full = shape;
  full[dim] += extra;
  full.back() *= channel_stride;
  Arg a{name, Tensor(dt, full), shape, {}, 0, {}};
  a.strides.resize(shape.size());
  int64_t s = 1;
  for (size_t k = full.size(); k-- > 0;) {
    a.strides[k] = s;
    s *= full[k];
  }
  a.strides.back() = channel_stride;
  a.offset = at * a.strides[dim];
  return a;
}

// Element multi-index -> offset into the store.
int64_t OffsetOf(const Arg& a, const std::vector<int64_t>& idx) {
  int64_t off = a.offset;
  for (size_t k = 0; k < idx.size(); ++k) off += idx[k] * a.Stride(k);
  return off;
}

// Calls f(idx) for every element index of the view, row-major.
template <class F>
void ForEachIndex(const std::vector<int64_t>& shape, F f) {
  const int64_t n = Numel(shape);
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t rem = e;
    for (size_t k = shape.size(); k-- > 0;) {
      idx[k] = rem % shape[k];
      rem /= shape[k];
    }
    f(idx);
  }
}

// The view's elements as a compact tensor.
Tensor Gather(const Arg& a) {
  Tensor t(a.store.dtype(), a.shape);
  int64_t e = 0;
  ForEachIndex(a.shape, [&](const std::vector<int64_t>& idx) { t.set(e++, a.store.at(OffsetOf(a, idx))); });
  return t;
}
// Writes a compact tensor's elements into the view.
void Scatter(const Tensor& src, Arg& a) {
  int64_t e = 0;
  ForEachIndex(a.shape, [&](const std::vector<int64_t>& idx) { a.store.set(OffsetOf(a, idx), src.at(e++)); });
}

// ---- One call -----------------------------------------------------------------------------
struct Problem {
  std::string op;
  std::vector<Arg> in, out;  // an absent optional input has an empty name
  tefl_rope_attrs rope{TEFL_ROPE_ATTRS_STRUCT_SIZE, TEFL_QKV_SBHD, 0, 1, 0};
  tefl_qkv_rope_attrs qkv{TEFL_QKV_ROPE_ATTRS_STRUCT_SIZE, TEFL_QKV_SBHD, 0, 1, 0, 0, 0, 0};
  bool is_qkv = false;
  const void* attrs() const { return is_qkv ? static_cast<const void*>(&qkv) : static_cast<const void*>(&rope); }
  Status Run(const std::string& impl) {
    std::vector<const DLTensor*> ins;
    std::vector<DLTensor*> outs;
    for (Arg& a : in) ins.push_back(a.name.empty() ? nullptr : a.dl());
    for (Arg& a : out) outs.push_back(a.dl());
    return RunImplDL(op, impl, ins, outs, attrs());
  }
};

std::string CompareMsg(const Arg& got, const Arg& want, Tolerance tol) {
  const CompareResult r = Compare(got.store, want.store, tol);
  if (r.mismatches == 0) return "";
  return fmt::format("'{}' ({}): {}{}", got.name, tefl::DTypeName(got.store.dtype()), r.ToString(),
                     r.first_bad >= 0
                         ? fmt::format(" got {} want {}", got.store.at(r.first_bad), want.store.at(r.first_bad))
                         : std::string());
}

// Runs the reference, then every CPU implementation, on fresh copies of `p`;
// compares every output buffer with the reference's. Returns the reference's
// result.
Problem CheckAllImplementations(const Problem& p) {
  Problem ref = p;
  {
    const Status s = ref.Run(kReference);
    EXPECT_TRUE(s.ok()) << "reference: " << s.ToString();
    if (!s.ok()) return ref;
  }
  const std::vector<std::string> impls = CpuImplementations(p.op);
  for (const char* must : tefl::testing::kMustServeImpls)
    EXPECT_NE(std::find(impls.begin(), impls.end(), must), impls.end()) << must << " is not registered";
  for (const std::string& impl : impls) {
    SCOPED_TRACE("impl " + impl);
    Problem run = p;
    const Status s = run.Run(impl);
    if (!s.ok() && !MustServe(impl) && s.code() == TEFL_FAILED_PRECONDITION) {
      std::printf("[  NOTE    ] %s declined %s: %s\n", impl.c_str(), p.op.c_str(), s.message().c_str());
      continue;
    }
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) continue;
    for (size_t i = 0; i < run.in.size(); ++i) {
      if (run.in[i].name.empty()) continue;
      EXPECT_TRUE(run.in[i].store.SameBytes(p.in[i].store)) << "input '" << run.in[i].name << "' was modified";
      EXPECT_TRUE(run.in[i].store.GuardsIntact()) << "input '" << run.in[i].name << "' guards";
    }
    for (size_t i = 0; i < run.out.size(); ++i) {
      EXPECT_TRUE(run.out[i].store.GuardsIntact()) << "wrote outside '" << run.out[i].name << "'";
      const Tolerance tol = ToleranceFor(run.out[i].store.dtype());
      const std::string msg = CompareMsg(run.out[i], ref.out[i], tol);
      EXPECT_TRUE(msg.empty()) << msg;
    }
  }
  return ref;
}

// ---- Case description ----------------------------------------------------------------------
enum Format { kSbhd, kBshd, kBshdSlice, kSbhdChannelStride, kThd, kThdSlice };
const char* const kFormatNames[] = {"sbhd", "bshd", "bshdslice", "sbhdchstride", "thd", "thdslice"};
int32_t QkvFormatOf(Format f) {
  return f == kSbhd || f == kSbhdChannelStride ? TEFL_QKV_SBHD
         : f == kThd || f == kThdSlice         ? TEFL_QKV_THD
                                               : TEFL_QKV_BSHD;
}

struct Shape {
  int64_t s, b, h, d;
};
// Odd sizes (h = 3, d = 6 / 10 / 130) and one vector-friendly shape.
const Shape kShapes[] = {{6, 2, 3, 6}, {4, 3, 2, 10}, {2, 2, 3, 130}, {4, 2, 4, 128}};

// d2: 0 (everything copied), the largest even <= d / 2, d (no tail).
int64_t D2Of(int sel, int64_t d) { return sel == 0 ? 0 : sel == 1 ? (d / 2) / 2 * 2 : d; }

// Positional modes.
struct Mode {
  const char* name;
  bool start;
  int32_t cp_size, cp_rank;
};
const Mode kModes[] = {{"plain", false, 1, 0},
                       {"start", true, 1, 0},
                       {"cp2r0", false, 2, 0},
                       {"cp2r1", false, 2, 1},
                       {"startcp2r1", true, 2, 1}};

const DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
const char* DName(DType t) { return t == DType::kF32 ? "f32" : t == DType::kBF16 ? "bf16" : "f16"; }

// thd sequences (global lengths): unequal, one empty; with cp 2 multiples of 4.
std::vector<int64_t> ThdLengths(int32_t cp) {
  return cp == 1 ? std::vector<int64_t>{5, 0, 3, 7} : std::vector<int64_t>{8, 0, 4, 12};
}
const int64_t kStarts[] = {3, 0, 1, 5};

Arg Freqs(const std::string& name, int64_t rows, int64_t d2, bool realistic, bool interleaved) {
  Arg f = Compact(name, DType::kF32, {rows, 1, 1, d2});
  if (!realistic || d2 == 0) {
    // Arbitrary angles: distinct per channel, so sin f[i] != sin f[partner].
    f.store.Uniform(name, -6.0, 6.0);
    return f;
  }
  // TE's RotaryPositionEmbedding: inv_freq = 1 / 10000^(2k / d2), emb =
  // cat(freqs, freqs) (interleaved: each angle repeated pairwise).
  for (int64_t p = 0; p < rows; ++p) {
    for (int64_t i = 0; i < d2; ++i) {
      const int64_t k = interleaved ? i / 2 : i % (d2 / 2);
      f.store.set(p * d2 + i, double(float(p) * float(1.0 / std::pow(10000.0, double(2 * k) / double(d2)))));
    }
  }
  return f;
}

Arg Int32(const std::string& name, const std::vector<int64_t>& v) {
  Arg a = Compact(name, DType::kI32, {int64_t(v.size())});
  for (size_t i = 0; i < v.size(); ++i) a.store.set(int64_t(i), double(v[i]));
  return a;
}
Arg Absent() { return Arg{}; }

// fused_rope_forward / backward.
struct RopeCase {
  bool backward;
  Format format;
  bool interleaved;
  int d2sel;
  DType dt;
  Shape shape;
  Mode mode;
  bool realistic_freqs = false;
  std::string seed;
};

Problem MakeRope(const RopeCase& c) {
  Problem p;
  p.op = c.backward ? "fused_rope_backward" : "fused_rope_forward";
  const auto [s, b, h, d] = c.shape;
  const int64_t d2 = D2Of(c.d2sel, d);
  const bool thd = c.format == kThd || c.format == kThdSlice;
  std::vector<int64_t> xs;
  int64_t batches = b, rows_needed = s * c.mode.cp_size;
  std::vector<int64_t> cu;
  if (thd) {
    const std::vector<int64_t> lens = ThdLengths(c.mode.cp_size);
    cu.push_back(0);
    for (int64_t l : lens) cu.push_back(cu.back() + l);
    batches = int64_t(lens.size());
    xs = {cu.back() / c.mode.cp_size, h, d};
    rows_needed = *std::max_element(lens.begin(), lens.end());
  } else if (c.format == kSbhd || c.format == kSbhdChannelStride) {
    xs = {s, b, h, d};
  } else {
    xs = {b, s, h, d};
  }
  const std::string xname = c.backward ? "output_grads" : "input";
  Arg x;
  switch (c.format) {
    case kBshdSlice:
      x = Slice(xname, c.dt, xs, 2, 2 * h, h);  // the k heads of a packed [b, s, 3h, d]
      break;
    case kThdSlice:
      x = Slice(xname, c.dt, xs, 1, h + 1, 1);
      break;
    case kSbhdChannelStride:
      x = Slice(xname, c.dt, xs, 0, 0, 0, 2);
      break;
    default:
      x = Compact(xname, c.dt, xs);
  }
  x.store.Uniform(xname + "/" + c.seed);
  const int64_t start_max = c.mode.start ? 5 : 0;
  p.in.push_back(x);
  p.in.push_back(Freqs("freqs", rows_needed + start_max + 2, d2, c.realistic_freqs, c.interleaved));
  if (!c.realistic_freqs) p.in[1].store.Uniform("freqs/" + c.seed, -6.0, 6.0);
  if (c.format == kSbhdChannelStride) {  // strided freqs too: every other channel, from row 1
    p.in[1] = Slice("freqs", DType::kF32, {rows_needed + start_max + 2, 1, 1, d2}, 0, 1, 1, 2);
    p.in[1].store.Uniform("freqs/" + c.seed, -6.0, 6.0);
  }
  if (c.mode.start) {
    std::vector<int64_t> st;
    for (int64_t i = 0; i < batches; ++i) st.push_back(kStarts[i % 4]);
    p.in.push_back(Int32("start_positions", st));
  } else {
    p.in.push_back(Absent());
  }
  p.in.push_back(thd ? Int32("cu_seqlens", cu) : Absent());
  // Outputs: compact, except the slice formats write into a slice too.
  const std::string yname = c.backward ? "input_grads" : "output";
  Arg y = c.format == kBshdSlice  ? Slice(yname, c.dt, xs, 2, 1, 1)
          : c.format == kThdSlice ? Slice(yname, c.dt, xs, 0, 2, 1)
                                  : Compact(yname, c.dt, xs);
  y.store.Fill(kSentinel);
  p.out.push_back(y);
  p.rope.qkv_format = QkvFormatOf(c.format);
  p.rope.interleaved = c.interleaved;
  p.rope.cp_size = c.mode.cp_size;
  p.rope.cp_rank = c.mode.cp_rank;
  return p;
}

// fused_qkv_rope_forward / backward: h groups of (q_heads q, k_heads k, 1 v) heads.
struct QkvCase {
  bool backward;
  bool bshd;
  bool strided;  // qkv is a slice of a wider buffer (padded head groups)
  bool interleaved;
  int d2sel;
  DType dt;
  Shape shape;
  int64_t q_heads, k_heads;
  Mode mode;
  std::string seed;
};

Problem MakeQkv(const QkvCase& c) {
  Problem p;
  p.is_qkv = true;
  p.op = c.backward ? "fused_qkv_rope_backward" : "fused_qkv_rope_forward";
  const auto [s, b, h, d] = c.shape;
  const int64_t d2 = D2Of(c.d2sel, d);
  const int64_t splits[3] = {c.q_heads * d, c.k_heads * d, d};
  const int64_t total = splits[0] + splits[1] + splits[2];
  auto dims = [&](int64_t heads, int64_t last) {
    return c.bshd ? std::vector<int64_t>{b, s, heads, last} : std::vector<int64_t>{s, b, heads, last};
  };
  Arg packed = c.strided ? Slice(c.backward ? "qkv_grads" : "qkv", c.dt, dims(h, total), 3, d, 0)
                         : Compact(c.backward ? "qkv_grads" : "qkv", c.dt, dims(h, total));
  const char* part_names[2][3] = {{"q", "k", "v"}, {"q_grads", "k_grads", "v_grads"}};
  std::vector<Arg> parts;
  for (int k = 0; k < 3; ++k) parts.push_back(Compact(part_names[c.backward][k], c.dt, dims(h * (splits[k] / d), d)));
  const int64_t start_max = c.mode.start ? 5 : 0;
  const int64_t rows = s * c.mode.cp_size + start_max + 2;
  Arg qf = Freqs("q_freqs", rows, d2, false, c.interleaved);
  qf.store.Uniform("q_freqs/" + c.seed, -6.0, 6.0);
  Arg kf = Freqs("k_freqs", rows + 1, d2, false, c.interleaved);
  kf.store.Uniform("k_freqs/" + c.seed, -6.0, 6.0);
  Arg start = Absent();
  if (c.mode.start) {
    std::vector<int64_t> st;
    for (int64_t i = 0; i < b; ++i) st.push_back(kStarts[i % 4]);
    start = Int32("start_positions", st);
  }
  if (!c.backward) {
    packed.store.Uniform("qkv/" + c.seed);
    p.in = {packed, qf, kf, start};
    for (Arg& a : parts) a.store.Fill(kSentinel);
    p.out = parts;
  } else {
    for (Arg& a : parts) a.store.Uniform(a.name + "/" + c.seed);
    packed.store.Fill(kSentinel);
    p.in = {parts[0], parts[1], parts[2], qf, kf, start};
    p.out = {packed};
  }
  p.qkv.qkv_format = c.bshd ? TEFL_QKV_BSHD : TEFL_QKV_SBHD;
  p.qkv.interleaved = c.interleaved;
  p.qkv.cp_size = c.mode.cp_size;
  p.qkv.cp_rank = c.mode.cp_rank;
  p.qkv.q_split = int32_t(splits[0]);
  p.qkv.k_split = int32_t(splits[1]);
  p.qkv.v_split = int32_t(splits[2]);
  return p;
}

// ---- The grids ------------------------------------------------------------------------------
// One test per (op, format, dtype); inside it every interleaved x d2 x shape
// x positional mode (120 cases), each named in the failure trace.
using GridParam = std::tuple<bool, int, int>;  // backward, format (qkv: layout), dtype

std::string RopeGridName(const ::testing::TestParamInfo<GridParam>& param_info) {
  const auto& [bwd, format, dt] = param_info.param;
  return fmt::format("{}_{}_{}", bwd ? "bwd" : "fwd", kFormatNames[format], DName(kDTypes[dt]));
}

class RopeConformance : public ::testing::TestWithParam<GridParam> {};

TEST_P(RopeConformance, MatchesReference) {
  const auto& [bwd, format, dt] = GetParam();
  for (bool il : {false, true}) {
    for (int d2sel = 0; d2sel < 3; ++d2sel) {
      for (const Shape& sh : kShapes) {
        for (const Mode& mode : kModes) {
          const std::string name =
              fmt::format("{}_{}_{}_d2sel{}_{}_{}x{}x{}x{}_{}", bwd ? "bwd" : "fwd", kFormatNames[format],
                          il ? "il" : "half", d2sel, DName(kDTypes[dt]), sh.s, sh.b, sh.h, sh.d, mode.name);
          SCOPED_TRACE(name);
          // TE's cat(freqs, freqs) angles in two of the modes (the portable
          // kernel computes equal halves' cos/sin once), arbitrary ones otherwise.
          const bool realistic = std::string(mode.name) == "start" || std::string(mode.name) == "cp2r1";
          const RopeCase c{bwd, Format(format), il, d2sel, kDTypes[dt], sh, mode, realistic, name};
          CheckAllImplementations(MakeRope(c));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, RopeConformance,
                         ::testing::Combine(::testing::Bool(), ::testing::Range(0, 6), ::testing::Range(0, 3)),
                         RopeGridName);

// qkv layouts: sbhd, bshd, sbhd with padded head groups (strided qkv), bshd
// with 2 k heads per group; always 2 q heads per group.
const char* const kQkvLayouts[] = {"sbhd", "bshd", "sbhdpadded", "bshdgqa2"};

std::string QkvGridName(const ::testing::TestParamInfo<GridParam>& param_info) {
  const auto& [bwd, layout, dt] = param_info.param;
  return fmt::format("{}_{}_{}", bwd ? "bwd" : "fwd", kQkvLayouts[layout], DName(kDTypes[dt]));
}

class QkvRopeConformance : public ::testing::TestWithParam<GridParam> {};

TEST_P(QkvRopeConformance, MatchesReference) {
  const auto& [bwd, layout, dt] = GetParam();
  for (bool il : {false, true}) {
    for (int d2sel = 0; d2sel < 3; ++d2sel) {
      for (const Shape& sh : kShapes) {
        for (const Mode& mode : kModes) {
          const std::string name =
              fmt::format("{}_{}_{}_d2sel{}_{}_{}x{}x{}x{}_{}", bwd ? "bwd" : "fwd", kQkvLayouts[layout],
                          il ? "il" : "half", d2sel, DName(kDTypes[dt]), sh.s, sh.b, sh.h, sh.d, mode.name);
          SCOPED_TRACE(name);
          const QkvCase c{bwd, layout == 1 || layout == 3, layout == 2, il,  d2sel, kDTypes[dt], sh,
                          2,   layout == 3 ? 2 : 1,        mode,        name};
          CheckAllImplementations(MakeQkv(c));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, QkvRopeConformance,
                         ::testing::Combine(::testing::Bool(), ::testing::Range(0, 4), ::testing::Range(0, 3)),
                         QkvGridName);

// Large enough for the portable kernel's streaming stores (>= 32 MiB out),
// with TE's realistic frequencies: sbhd [1024 | 2048, 2, 32, 128] fp32 | bf16.
TEST(RopeConformanceLarge, StreamingSizes) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (bool bwd : {false, true}) {
      SCOPED_TRACE(fmt::format("{} {}", DName(dt), bwd ? "bwd" : "fwd"));
      RopeCase c{bwd, kSbhd, false, 2, dt, {dt == DType::kF32 ? 1024 : 2048, 2, 32, 128}, kModes[0], true, "large"};
      Problem p = MakeRope(c);
      CheckAllImplementations(p);
    }
  }
}

// ---- The oracle: backward is the transpose of forward ---------------------------------------
double Dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.at(i) * b.at(i);
  return s;
}

// <fwd(x), dy> == <x, bwd(dy)> (fp32, double sums), and one central
// difference: d<fwd(x), dy>/dx_k == bwd(dy)_k.
TEST(RopeOracle, BackwardIsTheTransposeOfForward) {
  for (int format : {kSbhd, kBshdSlice, kThd}) {
    for (bool il : {false, true}) {
      for (int mode : {0, 1, 3, 4}) {
        SCOPED_TRACE(fmt::format("{} {} {}", kFormatNames[format], il ? "il" : "half", kModes[mode].name));
        RopeCase c{false, Format(format), il, 1, DType::kF32, {4, 2, 3, 10}, kModes[mode], false, "adjoint"};
        Problem fwd = MakeRope(c);
        c.backward = true;
        c.seed = "adjoint-dy";
        Problem bwd = MakeRope(c);
        bwd.in[1] = fwd.in[1];  // same freqs
        ASSERT_TRUE(fwd.Run(kReference).ok());
        ASSERT_TRUE(bwd.Run(kReference).ok());
        const Tensor x = Gather(fwd.in[0]), y = Gather(fwd.out[0]);
        const Tensor dy = Gather(bwd.in[0]), dx = Gather(bwd.out[0]);
        const double lhs = Dot(y, dy), rhs = Dot(x, dx);
        EXPECT_NEAR(lhs, rhs, 1e-5 * (1 + std::fabs(lhs)));
        // Central difference on element k of x (the op is linear: exact up to rounding).
        const int64_t k = x.numel() / 2 + 1;
        const double eps = 1e-2;
        auto objective = [&](double delta) {
          Problem q = fwd;
          Tensor xk = x;
          xk.set(k, x.at(k) + delta);
          Scatter(xk, q.in[0]);
          EXPECT_TRUE(q.Run(kReference).ok());
          return Dot(Gather(q.out[0]), dy);
        };
        const double fd = (objective(eps) - objective(-eps)) / (2 * eps);
        EXPECT_NEAR(fd, dx.at(k), 1e-3 * (1 + std::fabs(dx.at(k))));
      }
    }
  }
}

// Same for the qkv ops.
TEST(RopeOracle, QkvBackwardIsTheTransposeOfForward) {
  for (bool il : {false, true}) {
    for (int mode : {0, 1, 3}) {
      SCOPED_TRACE(fmt::format("{} {}", il ? "il" : "half", kModes[mode].name));
      QkvCase c{false, true, false, il, 1, DType::kF32, {4, 2, 2, 10}, 2, 1, kModes[mode], "adjoint"};
      Problem fwd = MakeQkv(c);
      c.backward = true;
      Problem bwd = MakeQkv(c);
      ASSERT_TRUE(fwd.Run(kReference).ok());
      ASSERT_TRUE(bwd.Run(kReference).ok());
      double lhs = 0;
      for (int k = 0; k < 3; ++k) lhs += Dot(Gather(fwd.out[size_t(k)]), Gather(bwd.in[size_t(k)]));
      const double rhs = Dot(Gather(fwd.in[0]), Gather(bwd.out[0]));
      EXPECT_NEAR(lhs, rhs, 1e-5 * (1 + std::fabs(lhs)));
    }
  }
}

// ---- The oracle: positions -------------------------------------------------------------------
// Context parallel: with the full sequence split into 2 cp chunks, rank r's
// output (local chunks r and 2 cp - 1 - r) equals those chunks of a cp_size
// 1 run on the full sequence. Every implementation.
TEST(RopeOracle, ContextParallelChunksMatchTheFullSequence) {
  const int32_t cp = 2;
  const int64_t chunk = 3, b = 2, h = 2, d = 8;
  for (const std::string& impl : CpuImplementations("fused_rope_forward")) {
    for (int32_t rank = 0; rank < cp; ++rank) {
      SCOPED_TRACE(fmt::format("{} rank {}", impl, rank));
      RopeCase full{false, kSbhd, false, 2, DType::kF32, {2 * cp * chunk, b, h, d}, kModes[0], false, "cp"};
      Problem pf = MakeRope(full);
      ASSERT_TRUE(pf.Run(impl).ok());
      RopeCase local = full;
      local.shape.s = 2 * chunk;
      local.mode = Mode{"cp", false, cp, rank};
      Problem pl = MakeRope(local);
      pl.in[1] = pf.in[1];
      const Tensor fx = Gather(pf.in[0]), fy = Gather(pf.out[0]);
      // Local x = chunks rank and 2cp-1-rank of the full x.
      Tensor lx = Gather(pl.in[0]);
      const int64_t row = b * h * d;
      const int64_t chunks[2] = {rank, 2 * cp - 1 - rank};
      for (int half = 0; half < 2; ++half)
        for (int64_t e = 0; e < chunk * row; ++e) lx.set(half * chunk * row + e, fx.at(chunks[half] * chunk * row + e));
      Scatter(lx, pl.in[0]);
      const Status s = pl.Run(impl);
      ASSERT_TRUE(s.ok()) << s.ToString();
      const Tensor ly = Gather(pl.out[0]);
      for (int half = 0; half < 2; ++half)
        for (int64_t e = 0; e < chunk * row; ++e)
          ASSERT_EQ(ly.at(half * chunk * row + e), fy.at(chunks[half] * chunk * row + e)) << "element " << e;
    }
  }
}

// start_positions[b] = p: batch b's output equals rows p.. of a run without
// offsets on a sequence that has the same x at rows p..; thd: each sequence
// equals an sbhd run on it alone. Every implementation.
TEST(RopeOracle, StartPositionsAndThdSequencesMatchPlainRuns) {
  const int64_t h = 2, d = 6;
  for (const std::string& impl : CpuImplementations("fused_rope_forward")) {
    SCOPED_TRACE(impl);
    RopeCase c{false, kThd, true, 2, DType::kF32, {0, 0, h, d}, kModes[1], false, "thdstart"};
    Problem thd = MakeRope(c);
    ASSERT_TRUE(thd.Run(impl).ok());
    const Tensor x = Gather(thd.in[0]), y = Gather(thd.out[0]);
    const std::vector<int64_t> lens = ThdLengths(1);
    int64_t first = 0;
    for (size_t j = 0; j < lens.size(); ++j) {
      const int64_t len = lens[j], off = kStarts[j % 4];
      if (len == 0) continue;
      // A plain sbhd run over off + len positions, batch 1, x placed at rows off..
      RopeCase plain{false, kSbhd, true, 2, DType::kF32, {off + len, 1, h, d}, kModes[0], false, "plain"};
      Problem p = MakeRope(plain);
      p.in[1] = thd.in[1];
      Tensor px = Gather(p.in[0]);
      for (int64_t e = 0; e < len * h * d; ++e) px.set(off * h * d + e, x.at(first * h * d + e));
      Scatter(px, p.in[0]);
      ASSERT_TRUE(p.Run(impl).ok());
      const Tensor py = Gather(p.out[0]);
      for (int64_t e = 0; e < len * h * d; ++e)
        ASSERT_EQ(y.at(first * h * d + e), py.at(off * h * d + e)) << "sequence " << j << " element " << e;
      first += len;
    }
  }
}

// ---- NaN / Inf ---------------------------------------------------------------------------------
TEST(RopeSpecialValues, NanAndInfPropagate) {
  for (DType dt : kDTypes) {
    for (bool il : {false, true}) {
      SCOPED_TRACE(fmt::format("{} {}", DName(dt), il ? "il" : "half"));
      RopeCase c{false, kSbhd, il, 1, dt, {4, 2, 3, 130}, kModes[0], false, "special"};
      Problem p = MakeRope(c);
      const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
      Tensor& x = p.in[0].store;
      x.set(0, nan);     // rotated channel 0 (and its partner)
      x.set(7, inf);     // rotated
      x.set(129, -inf);  // copied tail channel
      x.set(130 + 100, nan);
      p.in[1].store.set(5, nan);  // an angle: NaN in that channel of position 0
      p.in[1].store.set(70, inf);
      Problem ref = CheckAllImplementations(p);
      const Tensor y = Gather(ref.out[0]);
      EXPECT_TRUE(std::isnan(y.at(0)));
      EXPECT_TRUE(std::isinf(y.at(129)) && y.at(129) < 0);
      EXPECT_TRUE(std::isnan(y.at(5)));
    }
  }
}

// ---- Empty tensors ---------------------------------------------------------------------------
TEST(RopeEdges, ZeroSizedTensorsAreNoOps) {
  for (const Shape& sh : {Shape{0, 2, 3, 8}, Shape{4, 0, 3, 8}, Shape{4, 2, 0, 8}}) {
    for (bool bwd : {false, true}) {
      RopeCase c{bwd, kBshd, false, 2, DType::kBF16, sh, kModes[1], false, "empty"};
      Problem p = MakeRope(c);
      CheckAllImplementations(p);
    }
  }
  // thd with no tokens at all (every sequence empty).
  for (const std::string& impl : CpuImplementations("fused_rope_forward")) {
    Problem p;
    p.op = "fused_rope_forward";
    p.in = {Compact("input", DType::kF32, {0, 2, 8}), Compact("freqs", DType::kF32, {4, 1, 1, 8}), Absent(),
            Int32("cu_seqlens", {0, 0, 0})};
    p.out = {Compact("output", DType::kF32, {0, 2, 8})};
    p.rope.qkv_format = TEFL_QKV_THD;
    const Status s = p.Run(impl);
    EXPECT_TRUE(s.ok()) << impl << ": " << s.ToString();
  }
}

// ---- Bad inputs: an error naming the argument, outputs untouched (every impl) -----------------
void ExpectRejected(Problem p, const std::string& needle) {
  for (const std::string& impl : CpuImplementations(p.op)) {
    Problem run = p;
    const Status s = run.Run(impl);
    EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << impl << ": " << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << impl << ": " << s.message();
    for (size_t i = 0; i < run.out.size(); ++i)
      EXPECT_TRUE(run.out[i].store.SameBytes(p.out[i].store)) << impl << " wrote '" << run.out[i].name << "'";
  }
}

Problem ThdProblem(std::vector<int64_t> cu, int64_t t, int64_t rows = 32, int32_t cp = 1, int32_t rank = 0) {
  RopeCase c{false, kThd, false, 2, DType::kF32, {0, 0, 2, 8}, Mode{"x", false, cp, rank}, false, "bad"};
  Problem p = MakeRope(c);
  p.in[0] = Compact("input", DType::kF32, {t, 2, 8});
  p.in[0].store.Uniform("bad");
  p.in[1] = Compact("freqs", DType::kF32, {rows, 1, 1, 4});
  p.in[3] = Int32("cu_seqlens", cu);
  p.out[0] = Compact("output", DType::kF32, {t, 2, 8});
  p.out[0].store.Fill(kSentinel);
  return p;
}

TEST(RopeBadInputs, CuSeqlensContents) {
  ExpectRejected(ThdProblem({1, 4, 9}, 9), "argument 'cu_seqlens' (input 3): expected cu_seqlens[0] == 0, got 1");
  ExpectRejected(ThdProblem({0, 6, 4, 9}, 9),
                 "argument 'cu_seqlens' (input 3): expected non-decreasing values, got cu_seqlens[2] = 4 < "
                 "cu_seqlens[1] = 6");
  ExpectRejected(ThdProblem({0, 4, 12}, 9), "expected cu_seqlens[2] = 12 to equal t = 9 (tokens of 'input')");
  ExpectRejected(ThdProblem({0, 4, 8}, 9), "expected cu_seqlens[2] = 8 to equal t = 9");
  // Odd local length with cp: global 6 -> 3 tokens on each of 2 ranks.
  ExpectRejected(ThdProblem({0, 4, 10}, 5, 32, 2, 1),
                 "argument 'cu_seqlens' (input 3): expected even local sequence lengths with cp_size 2");
  // A sequence longer than freqs.
  ExpectRejected(ThdProblem({0, 4, 9}, 9, 4),
                 "argument 'freqs' (input 1): expected at least 5 rows (sequence 1 of 5 tokens reaches position 4), "
                 "got 4");
}

TEST(RopeBadInputs, ShapesAttributesAndPositions) {
  const RopeCase base{false, kSbhd, false, 2, DType::kF32, {4, 2, 2, 8}, kModes[1], false, "bad"};
  auto fresh = [&] {
    Problem p = MakeRope(base);
    p.out[0].store.Fill(kSentinel);
    return p;
  };
  {
    Problem p = fresh();
    p.in[1] = Compact("freqs", DType::kF32, {16, 1, 1, 3});  // odd d2
    ExpectRejected(p, "argument 'freqs' (input 1): expected an even last dim d2 <= d = 8");
  }
  {
    Problem p = fresh();
    p.in[1] = Compact("freqs", DType::kF32, {16, 1, 1, 10});  // d2 > d
    ExpectRejected(p, "expected an even last dim d2 <= d = 8 (head dim of input), got 10");
  }
  {
    Problem p = fresh();
    p.in[2] = Int32("start_positions", {0, 1, 2});  // length 3 for batch 2
    ExpectRejected(p, "argument 'start_positions' (input 2): expected shape [2] (the batch size), got [3]");
  }
  {
    Problem p = fresh();  // freqs has 4 + 5 + 2 = 11 rows; start 9 reaches position 12
    p.in[2] = Int32("start_positions", {0, 9});
    ExpectRejected(p,
                   "argument 'start_positions' (input 2): start_positions[1] = 9 puts sequence 1 at positions up "
                   "to 12, past the 11 rows of 'freqs'");
  }
  {
    Problem p = fresh();
    p.in[2] = Int32("start_positions", {-1, 0});
    ExpectRejected(p, "argument 'start_positions' (input 2): start_positions[0] = -1 is negative");
  }
  {
    Problem p = fresh();
    p.rope.cp_size = 2;
    p.rope.cp_rank = 2;
    ExpectRejected(p, "fused_rope_forward: attribute 'cp_rank' must be < cp_size (2), got 2");
  }
  {
    RopeCase c = base;
    c.shape.s = 3;  // odd local length with cp
    c.mode = kModes[3];
    Problem p = MakeRope(c);
    ExpectRejected(p, "argument 'input' (input 0): expected an even sequence length with cp_size 2");
  }
  {
    Problem p = fresh();
    p.out[0] = Compact("output", DType::kBF16, {4, 2, 2, 8});
    ExpectRejected(p, "argument 'output' (output 0): expected dtype float32 (that of 'input'), got bfloat16");
  }
  {
    Problem p = fresh();  // an output whose heads overlap
    p.out[0].strides = {16, 8, 0, 1};
    ExpectRejected(p,
                   "argument 'output' (output 0): strides [16, 8, 0, 1] of shape [4, 2, 2, 8] make distinct "
                   "elements share memory");
  }
}

TEST(RopeBadInputs, QkvShapesAndAttributes) {
  const QkvCase base{false, false, false, false, 2, DType::kF32, {4, 2, 2, 8}, 2, 1, kModes[1], "bad"};
  {
    Problem p = MakeQkv(base);
    p.qkv.q_split = 0;
    ExpectRejected(p, "attribute 'q_split' must be in [1, 2147483647], got 0");
  }
  {
    Problem p = MakeQkv(base);
    p.qkv.k_split = 12;  // not a multiple of d = 8 (and the sum no longer matches)
    ExpectRejected(p, "argument 'qkv' (input 0): expected last dim q_split + k_split + v_split = 16 + 12 + 8 = 36");
  }
  {
    Problem p = MakeQkv(base);
    p.out[1] = Compact("k", DType::kF32, {4, 2, 4, 8});
    ExpectRejected(p, "argument 'k' (output 1): expected shape [4, 2, 2, 8]");
  }
  {
    Problem p = MakeQkv(base);
    p.in[2] = Compact("k_freqs", DType::kF32, {16, 1, 1, 4});
    ExpectRejected(p, "argument 'k_freqs' (input 2): expected d2 = 8 (that of 'q_freqs')");
  }
  {
    Problem p = MakeQkv(base);
    p.in[3] = Int32("start_positions", {0, 40});
    ExpectRejected(p, "argument 'start_positions' (input 3): start_positions[1] = 40");
  }
  {
    Problem p = MakeQkv(base);
    p.qkv.qkv_format = TEFL_QKV_THD;
    ExpectRejected(p, "attribute 'qkv_format' must be in [0, 1], got 2");
  }
}

}  // namespace
