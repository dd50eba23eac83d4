// SCAFFOLD (to be replaced by the rope family): reference kernels.
#include "backends/backends.h"

namespace tefl::backends {

tefl_status* RegisterReferenceRope(const tefl_registrar&) { return nullptr; }

}  // namespace tefl::backends
