// Conformance of the gemm family (scaffold).
#include <gtest/gtest.h>

#include "test_support.h"
