// reference.cpp — dropout: dropout_fwd / dropout_bwd (spec/ops.md,
// "Dropout"; the keep rule in include/tefl/ops.h and backends/philox.h).
//
// The oracle: one element at a time, the scalar Philox-4x32-10 (one call per 8
// elements), the output
// x * m / (1 - p) computed in double and rounded once (m = 1 kept, 0
// dropped; IEEE: a dropped NaN or inf gives NaN, as x * 0 does). The backward
// treats any nonzero mask byte as kept.
#include <cstdint>

#include "backends/backends.h"
#include "backends/philox.h"
#include "core/dtype.h"
#include "tefl/ops.h"

namespace tefl::backends {
namespace {

const tefl_dropout_attrs& Attrs(const tefl_call_frame* f) { return *static_cast<const tefl_dropout_attrs*>(f->attrs); }

tefl_status* Fwd(const tefl_call_frame* f, void*) {
  const tefl_dropout_attrs& a = Attrs(f);
  const DLTensor* x = f->inputs[0];
  const DType tx = DTypeOf(x->dtype), ty = DTypeOf(f->outputs[0]->dtype);
  const void* xp = DataPtr(x);
  void* yp = DataPtr(f->outputs[0]);
  auto* mask = static_cast<uint8_t*>(DataPtr(f->outputs[1]));
  const int64_t n = NumElements(x);
  const uint32_t threshold16 = DropoutThreshold16(a.p);
  const double inv_keep = 1.0 / (1.0 - double(a.p));
  Philox4 words{};
  for (int64_t i = 0; i < n; ++i) {
    if (i % 8 == 0) words = DropoutWords(a.seed, a.offset, uint64_t(i) / 8);
    const uint8_t keep = DropoutKept(words, uint64_t(i) % 8, threshold16) ? 1 : 0;
    mask[i] = keep;
    StoreFromDouble(yp, i, ty, double(LoadAsFloat(xp, i, tx)) * double(keep) * inv_keep);
  }
  return nullptr;
}

tefl_status* Bwd(const tefl_call_frame* f, void*) {
  const tefl_dropout_attrs& a = Attrs(f);
  const DLTensor* dy = f->inputs[0];
  const DType tdy = DTypeOf(dy->dtype), tdx = DTypeOf(f->outputs[0]->dtype);
  const void* dyp = DataPtr(dy);
  const auto* mask = static_cast<const uint8_t*>(DataPtr(f->inputs[1]));
  void* dxp = DataPtr(f->outputs[0]);
  const int64_t n = NumElements(dy);
  const double inv_keep = 1.0 / (1.0 - double(a.p));
  for (int64_t i = 0; i < n; ++i) {
    const double keep = mask[i] != 0 ? 1.0 : 0.0;
    StoreFromDouble(dxp, i, tdx, double(LoadAsFloat(dyp, i, tdy)) * keep * inv_keep);
  }
  return nullptr;
}

}  // namespace

tefl_status* RegisterReferenceDropout(const tefl_registrar& registrar) {
  static constexpr KernelEntry kEntries[] = {{"dropout_fwd", Fwd}, {"dropout_bwd", Bwd}};
  return RegisterCpuKernels(registrar, "reference.cpp", TEFL_KIND_REFERENCE, kEntries);
}

}  // namespace tefl::backends
