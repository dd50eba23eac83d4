// SCAFFOLD (to be replaced by the softmax family): conformance of the softmax ops.
#include <gtest/gtest.h>
