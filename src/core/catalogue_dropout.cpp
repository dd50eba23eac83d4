// SCAFFOLD (to be replaced by the dropout family): schemas of the dropout family.
#include "core/catalogue.h"

namespace tefl {

std::span<const OpSchema> DropoutSchemas() { return {}; }

}  // namespace tefl
