// The one place that lists the in-tree backends (explicit, ordered; no
// static registration objects).
#include "backends/backends.h"

namespace tefl::backends {

tefl_status* RegisterBuiltinBackends(const tefl_registrar& registrar) {
  using RegisterFn = tefl_status* (*)(const tefl_registrar&);
  static constexpr RegisterFn kFamilies[] = {
      RegisterReferenceNormalization, RegisterPortableNormalization, RegisterReferenceActivation,
      RegisterPortableActivation,     RegisterReferenceSoftmax,      RegisterPortableSoftmax,
      RegisterReferenceRope,          RegisterPortableRope,          RegisterReferenceDropout,
      RegisterPortableDropout,
  };
  for (RegisterFn fn : kFamilies) {
    if (tefl_status* s = fn(registrar)) return s;
  }
  return nullptr;
}

}  // namespace tefl::backends
