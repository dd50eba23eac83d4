// SCAFFOLD (to be replaced by the activation family): schemas of the activation family.
#include "core/catalogue.h"

namespace tefl {

std::span<const OpSchema> ActivationSchemas() { return {}; }

}  // namespace tefl
