// The benchmark's ceilings are the study module's measurements (src/study/ceilings.cpp), taken again
// right before each benchmark.
#include "peak.hpp"

#include "study/ceilings.hpp"

namespace flashgqa::bench {

double bf16_peak_flops(int threads, int repeats) { return study::measure_bf16_peak(threads, repeats).median; }

double dram_read_bandwidth(int threads, int repeats) { return study::measure_dram_read(threads, repeats).median; }

}  // namespace flashgqa::bench
