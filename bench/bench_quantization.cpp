// Benchmarks of the quantization family (scaffold).
#include <benchmark/benchmark.h>

BENCHMARK_MAIN();
