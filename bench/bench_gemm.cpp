// Benchmarks of the gemm family (scaffold).
#include <benchmark/benchmark.h>

BENCHMARK_MAIN();
