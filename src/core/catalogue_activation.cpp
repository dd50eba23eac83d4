// Schemas of the activation family (ids 7..35): forward, backward, gated
// forward/backward and dbias+backward of gelu, qgelu, relu, srelu, silu, glu
// and clamped SwiGLU (TransformerEngine's maths, spec/ops.md "Activations").
//
// The 29 schemas are generated from one compact table (name, id, kind, doc):
// a kind fixes the arguments, the shape relations and whether the op takes
// tefl_clamped_swiglu_attrs.
#include <algorithm>
#include <array>
#include <cfloat>
#include <limits>

#include "core/catalogue.h"
#include "core/validate.h"

namespace tefl {
namespace {

enum class Kind { kFwd, kBwd, kGatedFwd, kGatedBwd, kDbias };

struct Row {
  int32_t id;
  const char* name;
  Kind kind;
  bool clamped;  // takes tefl_clamped_swiglu_attrs
  const char* doc;
};

constexpr Row kRows[] = {
    {TEFL_OP_GELU, "gelu", Kind::kFwd, false, "GELU, tanh form: x * (0.5 + 0.5 tanh(x (0.79788456 + 0.03567741 x^2)))"},
    {TEFL_OP_QGELU, "qgelu", Kind::kFwd, false, "Quick GELU: x * sigmoid(1.702 x)"},
    {TEFL_OP_RELU, "relu", Kind::kFwd, false, "ReLU: max(x, 0) (NaN stays NaN)"},
    {TEFL_OP_SRELU, "srelu", Kind::kFwd, false, "Squared ReLU: x^2 for x > 0, else 0"},
    {TEFL_OP_SILU, "silu", Kind::kFwd, false, "SiLU (swish): x * sigmoid(x)"},
    {TEFL_OP_DGELU, "dgelu", Kind::kBwd, false, "GELU backward: dinput = grad * gelu'(fwd_input)"},
    {TEFL_OP_DQGELU, "dqgelu", Kind::kBwd, false, "Quick GELU backward: dinput = grad * qgelu'(fwd_input)"},
    {TEFL_OP_DRELU, "drelu", Kind::kBwd, false, "ReLU backward: dinput = grad * (fwd_input > 0 ? 1 : 0)"},
    {TEFL_OP_DSRELU, "dsrelu", Kind::kBwd, false, "Squared ReLU backward: dinput = grad * max(2 fwd_input, 0)"},
    {TEFL_OP_DSILU, "dsilu", Kind::kBwd, false, "SiLU backward: dinput = grad * (x s (1 - s) + s), s = sigmoid(x)"},
    {TEFL_OP_GLU, "glu", Kind::kGatedFwd, false, "GLU: sigmoid(a) * b, a = input[.., :H], b = input[.., H:]"},
    {TEFL_OP_GEGLU, "geglu", Kind::kGatedFwd, false, "GeGLU: gelu(a) * b"},
    {TEFL_OP_QGEGLU, "qgeglu", Kind::kGatedFwd, false, "Quick GeGLU: qgelu(a) * b"},
    {TEFL_OP_REGLU, "reglu", Kind::kGatedFwd, false, "ReGLU: relu(a) * b"},
    {TEFL_OP_SREGLU, "sreglu", Kind::kGatedFwd, false, "Squared ReGLU: srelu(a) * b"},
    {TEFL_OP_SWIGLU, "swiglu", Kind::kGatedFwd, false, "SwiGLU: silu(a) * b"},
    {TEFL_OP_CLAMPED_SWIGLU, "clamped_swiglu", Kind::kGatedFwd, true,
     "Clamped SwiGLU (GPT-OSS): a' = min(a, limit), b' = clamp(b, -limit, limit) + 1, a' sigmoid(alpha a') b'"},
    {TEFL_OP_DGLU, "dglu", Kind::kGatedBwd, false, "GLU backward: [grad s (1 - s) b, grad s], s = sigmoid(a)"},
    {TEFL_OP_DGEGLU, "dgeglu", Kind::kGatedBwd, false, "GeGLU backward: [grad gelu'(a) b, grad gelu(a)]"},
    {TEFL_OP_DQGEGLU, "dqgeglu", Kind::kGatedBwd, false, "Quick GeGLU backward: [grad qgelu'(a) b, grad qgelu(a)]"},
    {TEFL_OP_DREGLU, "dreglu", Kind::kGatedBwd, false, "ReGLU backward: [grad relu'(a) b, grad relu(a)]"},
    {TEFL_OP_DSREGLU, "dsreglu", Kind::kGatedBwd, false, "Squared ReGLU backward: [grad srelu'(a) b, grad srelu(a)]"},
    {TEFL_OP_DSWIGLU, "dswiglu", Kind::kGatedBwd, false, "SwiGLU backward: [grad silu'(a) b, grad silu(a)]"},
    {TEFL_OP_CLAMPED_DSWIGLU, "clamped_dswiglu", Kind::kGatedBwd, true,
     "Clamped SwiGLU backward; no gradient through an active clamp (a > limit; b < -limit or b > limit)"},
    {TEFL_OP_DBIAS_DGELU, "dbias_dgelu", Kind::kDbias, false, "dgelu, and dbias = column sums of dinput"},
    {TEFL_OP_DBIAS_DSILU, "dbias_dsilu", Kind::kDbias, false, "dsilu, and dbias = column sums of dinput"},
    {TEFL_OP_DBIAS_DRELU, "dbias_drelu", Kind::kDbias, false, "drelu, and dbias = column sums of dinput"},
    {TEFL_OP_DBIAS_DQGELU, "dbias_dqgelu", Kind::kDbias, false, "dqgelu, and dbias = column sums of dinput"},
    {TEFL_OP_DBIAS_DSRELU, "dbias_dsrelu", Kind::kDbias, false, "dsrelu, and dbias = column sums of dinput"},
};
constexpr size_t kNumOps = std::size(kRows);
static_assert(kNumOps == TEFL_OP_DBIAS_DSRELU - TEFL_OP_GELU + 1, "one row per activation op id");

constexpr DTypeSet kF = kFloatTypes;

constexpr ArgSchema kFwdIn[] = {{"input", kF, false, "[N..., H]"}};
constexpr ArgSchema kFwdOut[] = {{"output", kF, false, "like input"}};
constexpr ArgSchema kBwdIn[] = {{"grad", kF, false, "like fwd_input"}, {"fwd_input", kF, false, "[N..., H]"}};
constexpr ArgSchema kBwdOut[] = {{"dinput", kF, false, "like fwd_input"}};
constexpr ArgSchema kGatedFwdIn[] = {{"input", kF, false, "[N..., 2H]"}};
constexpr ArgSchema kGatedFwdOut[] = {{"output", kF, false, "[N..., H]"}};
constexpr ArgSchema kGatedBwdIn[] = {{"grad", kF, false, "[N..., H]"}, {"fwd_input", kF, false, "[N..., 2H]"}};
constexpr ArgSchema kGatedBwdOut[] = {{"dinput", kF, false, "like fwd_input, [N..., 2H]"}};
constexpr ArgSchema kDbiasOut[] = {{"dinput", kF, false, "like fwd_input"}, {"dbias", kF, false, "[H]"}};

constexpr AttrSchema kClampedAttrs[] = {
    {"limit", AttrType::kF32, offsetof(tefl_clamped_swiglu_attrs, limit), 7.0,
     double(std::numeric_limits<float>::denorm_min()), std::numeric_limits<double>::infinity(), 0,
     "clamp bound (> 0): a = min(a, limit), b = clamp(b, -limit, limit) + 1"},
    {"alpha", AttrType::kF32, offsetof(tefl_clamped_swiglu_attrs, alpha), double(1.702f), -double(FLT_MAX),
     double(FLT_MAX), 0, "sigmoid slope (finite): a * sigmoid(alpha * a)"},
};
constexpr tefl_clamped_swiglu_attrs kClampedDefaults = {TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE, 7.0f, 1.702f};

// ---- shape relations ---------------------------------------------------------
// Argument indices: inputs first, then outputs.
//   fwd:       input0 -> output1
//   bwd:       grad0 fwd_input1 -> dinput2
//   gated fwd: input0 [N.., 2H] -> output1 [N.., H]
//   gated bwd: grad0 [N.., H] fwd_input1 [N.., 2H] -> dinput2 [N.., 2H]
//   dbias:     grad0 fwd_input1 -> dinput2 dbias3 [H]

// Whether t has x's shape, with the last dim replaced by `last` (-1: x's own).
bool ShapeLike(const DLTensor* t, const DLTensor* x, int64_t last) {
  if (t->ndim != x->ndim) return false;
  for (int d = 0; d + 1 < x->ndim; ++d)
    if (t->shape[d] != x->shape[d]) return false;
  return t->shape[x->ndim - 1] == (last < 0 ? x->shape[x->ndim - 1] : last);
}

// x.shape with the last dim replaced, as text.
std::string ShapeWithLast(const DLTensor* x, int64_t last) {
  std::string s = "[";
  for (int d = 0; d + 1 < x->ndim; ++d) s += std::to_string(x->shape[d]) + ", ";
  return s + std::to_string(last) + "]";
}

tefl_status* ExpectLike(const OpSchema& op, const CallArgs& a, int index, int x_index, int64_t last,
                        const char* relation) {
  const DLTensor* t = TensorAt(a, index);
  const DLTensor* x = TensorAt(a, x_index);
  if (ShapeLike(t, x, last)) return nullptr;
  const std::string want = last < 0 ? ShapeString(x) : ShapeWithLast(x, last);
  return ArgError(op, index,
                  fmt::format("expected shape {} ({} '{}' {}), got {}", want, relation, ArgAt(op, x_index).name,
                              ShapeString(x), ShapeString(t)));
}

template <Kind kKind>
tefl_status* CheckShapes(const OpSchema& op, const CallArgs& a) {
  constexpr bool kGated = kKind == Kind::kGatedFwd || kKind == Kind::kGatedBwd;
  const int xi = kKind == Kind::kFwd || kKind == Kind::kGatedFwd ? 0 : 1;  // the forward input
  const DLTensor* x = TensorAt(a, xi);
  if (x->ndim < 1) {
    return ArgError(op, xi, fmt::format("expected rank >= 1 ({}), got a scalar", kGated ? "[N..., 2H]" : "[N..., H]"));
  }
  const int64_t last = x->shape[x->ndim - 1];
  if (kGated && last % 2 != 0) {
    return ArgError(op, xi,
                    fmt::format("expected an even last dim (2H: the activation half then the gate half), got shape {}",
                                ShapeString(x)));
  }
  switch (kKind) {
    case Kind::kFwd:
      return ExpectLike(op, a, 1, 0, -1, "that of");
    case Kind::kBwd:
      if (tefl_status* e = ExpectLike(op, a, 0, 1, -1, "that of")) return e;
      return ExpectLike(op, a, 2, 1, -1, "that of");
    case Kind::kGatedFwd:
      return ExpectLike(op, a, 1, 0, last / 2, "H = half the last dim of");
    case Kind::kGatedBwd:
      if (tefl_status* e = ExpectLike(op, a, 0, 1, last / 2, "H = half the last dim of")) return e;
      return ExpectLike(op, a, 2, 1, -1, "that of");
    case Kind::kDbias: {
      if (tefl_status* e = ExpectLike(op, a, 0, 1, -1, "that of")) return e;
      if (tefl_status* e = ExpectLike(op, a, 2, 1, -1, "that of")) return e;
      const DLTensor* dbias = TensorAt(a, 3);
      if (dbias->ndim != 1 || dbias->shape[0] != last) {
        return ArgError(op, 3,
                        fmt::format("expected shape [{}] (H = last dim of 'fwd_input' {}), got {}", last,
                                    ShapeString(x), ShapeString(dbias)));
      }
      return nullptr;
    }
  }
  return nullptr;
}

constexpr OpSchema MakeSchema(const Row& r) {
  OpSchema s{};
  s.id = r.id;
  s.name = r.name;
  s.family = "activation";
  s.doc = r.doc;
  switch (r.kind) {
    case Kind::kFwd:
      s.inputs = kFwdIn;
      s.outputs = kFwdOut;
      s.check_shapes = CheckShapes<Kind::kFwd>;
      break;
    case Kind::kBwd:
      s.inputs = kBwdIn;
      s.outputs = kBwdOut;
      s.check_shapes = CheckShapes<Kind::kBwd>;
      break;
    case Kind::kGatedFwd:
      s.inputs = kGatedFwdIn;
      s.outputs = kGatedFwdOut;
      s.check_shapes = CheckShapes<Kind::kGatedFwd>;
      break;
    case Kind::kGatedBwd:
      s.inputs = kGatedBwdIn;
      s.outputs = kGatedBwdOut;
      s.check_shapes = CheckShapes<Kind::kGatedBwd>;
      break;
    case Kind::kDbias:
      s.inputs = kBwdIn;
      s.outputs = kDbiasOut;
      s.check_shapes = CheckShapes<Kind::kDbias>;
      break;
  }
  if (r.clamped) {
    s.attrs = kClampedAttrs;
    s.attrs_size = TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE;
    s.attrs_defaults = &kClampedDefaults;
  } else {
    s.attrs = {};
    s.attrs_size = 0;
    s.attrs_defaults = nullptr;
  }
  s.flags = kOpNoAlias | kOpContiguous;
  s.aliases = {};
  return s;
}

constexpr std::array<OpSchema, kNumOps> kSchemas = [] {
  std::array<OpSchema, kNumOps> out{};
  for (size_t i = 0; i < kNumOps; ++i) out[i] = MakeSchema(kRows[i]);
  return out;
}();

}  // namespace

std::span<const OpSchema> ActivationSchemas() { return kSchemas; }

}  // namespace tefl
