// Conformance of the quantization family (scaffold).
#include <gtest/gtest.h>

#include "test_support.h"
