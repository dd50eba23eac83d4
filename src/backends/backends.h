// Explicit registration entry points of the in-tree backends (no static
// initialisers): the manager calls RegisterBuiltinBackends() once at
// initialisation. Each function registers one op family of one backend
// through the registrar and returns the first error (NULL on success).
#ifndef TEFL_SRC_BACKENDS_BACKENDS_H_
#define TEFL_SRC_BACKENDS_BACKENDS_H_

#include <span>

#include "tefl/tefl.h"

namespace tefl::backends {

// One kernel of a family's backend: the op it serves and its entry point.
struct KernelEntry {
  const char* op;
  tefl_kernel_fn kernel;
};
// Registers each entry as implementation `impl_id` of `kind` on the CPU
// (priority 0, no vendor, no supports(): a built-in serves every valid call
// or declines from its kernel); returns the first error.
tefl_status* RegisterCpuKernels(const tefl_registrar& registrar, const char* impl_id, int32_t kind,
                                std::span<const KernelEntry> entries);

// reference.cpp: scalar C++, double accumulation; the oracle.
tefl_status* RegisterReferenceNormalization(const tefl_registrar& registrar);
tefl_status* RegisterReferenceActivation(const tefl_registrar& registrar);
tefl_status* RegisterReferenceSoftmax(const tefl_registrar& registrar);
tefl_status* RegisterReferenceRope(const tefl_registrar& registrar);
tefl_status* RegisterReferenceDropout(const tefl_registrar& registrar);
tefl_status* RegisterReferenceAttention(const tefl_registrar& registrar);
tefl_status* RegisterReferenceQuantization(const tefl_registrar& registrar);
tefl_status* RegisterReferenceGemm(const tefl_registrar& registrar);

// default.portable: Highway (runtime ISA dispatch) + the host thread pool.
tefl_status* RegisterPortableNormalization(const tefl_registrar& registrar);
tefl_status* RegisterPortableActivation(const tefl_registrar& registrar);
tefl_status* RegisterPortableSoftmax(const tefl_registrar& registrar);
tefl_status* RegisterPortableRope(const tefl_registrar& registrar);
tefl_status* RegisterPortableDropout(const tefl_registrar& registrar);
tefl_status* RegisterPortableAttention(const tefl_registrar& registrar);
tefl_status* RegisterPortableQuantization(const tefl_registrar& registrar);
tefl_status* RegisterPortableGemm(const tefl_registrar& registrar);

// Every in-tree backend, in a fixed order.
tefl_status* RegisterBuiltinBackends(const tefl_registrar& registrar);

}  // namespace tefl::backends

#endif  // TEFL_SRC_BACKENDS_BACKENDS_H_
