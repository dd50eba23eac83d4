// The one place that lists the in-tree backends (explicit, ordered; no
// static registration objects).
#include "backends/backends.h"
#include "backends/portable/cpu_paths.h"

namespace tefl::backends {

tefl_status* RegisterCpuKernels(const tefl_registrar& registrar, const char* impl_id, int32_t kind,
                                std::span<const KernelEntry> entries) {
  for (const KernelEntry& e : entries) {
    tefl_impl_desc desc{};
    desc.struct_size = TEFL_IMPL_DESC_STRUCT_SIZE;
    desc.op_name = e.op;
    desc.impl_id = impl_id;
    desc.kind = kind;
    desc.priority = 0;
    desc.vendor = nullptr;
    desc.device_mask = TEFL_DEVICE_BIT(kDLCPU);
    desc.kernel = e.kernel;
    desc.supports = nullptr;
    desc.user_data = nullptr;
    if (tefl_status* s = registrar.register_impl(registrar.ctx, &desc)) return s;
  }
  return nullptr;
}

tefl_status* RegisterBuiltinBackends(const tefl_registrar& registrar) {
  using RegisterFn = tefl_status* (*)(const tefl_registrar&);
  static constexpr RegisterFn kFamilies[] = {
      RegisterReferenceNormalization, RegisterPortableNormalization, RegisterReferenceActivation,
      RegisterPortableActivation,     RegisterReferenceSoftmax,      RegisterPortableSoftmax,
      RegisterReferenceRope,          RegisterPortableRope,          RegisterReferenceDropout,
      RegisterPortableDropout,        RegisterReferenceAttention,    RegisterPortableAttention,
      RegisterReferenceQuantization,  RegisterPortableQuantization,  RegisterReferenceGemm,
      RegisterPortableGemm,
  };
  ApplyMaxCpuIsa();  // before any portable kernel can run
  for (RegisterFn fn : kFamilies) {
    if (tefl_status* s = fn(registrar)) return s;
  }
  return nullptr;
}

}  // namespace tefl::backends
