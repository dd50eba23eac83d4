// SCAFFOLD (to be replaced by the dropout family): reference kernels.
#include "backends/backends.h"

namespace tefl::backends {

tefl_status* RegisterReferenceDropout(const tefl_registrar&) { return nullptr; }

}  // namespace tefl::backends
