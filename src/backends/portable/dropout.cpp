// SCAFFOLD (to be replaced by the dropout family): portable kernels.
#include "backends/backends.h"

namespace tefl::backends {

tefl_status* RegisterPortableDropout(const tefl_registrar&) { return nullptr; }

}  // namespace tefl::backends
