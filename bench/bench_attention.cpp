// Benchmarks of the attention family (scaffold).
#include <benchmark/benchmark.h>

BENCHMARK_MAIN();
