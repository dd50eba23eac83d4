// SCAFFOLD (to be replaced by the dropout family): conformance of the dropout ops.
#include <gtest/gtest.h>
