// portable — quantization family (scaffold: the family's helper replaces this file).
#include "backends/backends.h"

namespace tefl::backends {

tefl_status* RegisterPortableQuantization(const tefl_registrar&) { return nullptr; }

}  // namespace tefl::backends
