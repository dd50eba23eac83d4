// SCAFFOLD (to be replaced by the activation family): conformance of the activation ops.
#include <gtest/gtest.h>
