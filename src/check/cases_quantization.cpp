// Built-in conformance cases of the quantization family (scaffold).
#include "check/cases.h"

namespace tefl::check::cases_internal {

std::vector<Case> QuantizationCases(const std::string&, const GridOptions&) { return {}; }

}  // namespace tefl::check::cases_internal
