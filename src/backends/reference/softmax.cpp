// SCAFFOLD (to be replaced by the softmax family): reference kernels.
#include "backends/backends.h"

namespace tefl::backends {

tefl_status* RegisterReferenceSoftmax(const tefl_registrar&) { return nullptr; }

}  // namespace tefl::backends
