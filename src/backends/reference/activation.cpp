// SCAFFOLD (to be replaced by the activation family): reference kernels.
#include "backends/backends.h"

namespace tefl::backends {

tefl_status* RegisterReferenceActivation(const tefl_registrar&) { return nullptr; }

}  // namespace tefl::backends
