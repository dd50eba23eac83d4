// Conformance of the attention family (scaffold).
#include <gtest/gtest.h>

#include "test_support.h"
