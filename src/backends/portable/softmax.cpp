// SCAFFOLD (to be replaced by the softmax family): portable kernels.
#include "backends/backends.h"

namespace tefl::backends {

tefl_status* RegisterPortableSoftmax(const tefl_registrar&) { return nullptr; }

}  // namespace tefl::backends
