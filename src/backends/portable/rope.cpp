// SCAFFOLD (to be replaced by the rope family): portable kernels.
#include "backends/backends.h"

namespace tefl::backends {

tefl_status* RegisterPortableRope(const tefl_registrar&) { return nullptr; }

}  // namespace tefl::backends
