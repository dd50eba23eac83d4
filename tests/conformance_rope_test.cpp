// SCAFFOLD (to be replaced by the rope family): conformance of the rope ops.
#include <gtest/gtest.h>
