// Built-in conformance cases of the attention family (scaffold).
#include "check/cases.h"

namespace tefl::check::cases_internal {

std::vector<Case> AttentionCases(const std::string&, const GridOptions&) { return {}; }

}  // namespace tefl::check::cases_internal
