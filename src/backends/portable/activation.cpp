// SCAFFOLD (to be replaced by the activation family): portable kernels.
#include "backends/backends.h"

namespace tefl::backends {

tefl_status* RegisterPortableActivation(const tefl_registrar&) { return nullptr; }

}  // namespace tefl::backends
