// The benchmarks' start-up (bench::initialize) and ceilings: the ceilings are the study module's measurements (src/study/ceilings.cpp), taken again
// right before each benchmark.
#include "peak.hpp"

#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "kernels/cpu_features.hpp"
#include "study/ceilings.hpp"

namespace flashgqa::bench {

double bf16_peak_flops(int threads, int repeats) { return study::measure_bf16_peak(threads, repeats).median; }

double dram_read_bandwidth(int threads, int repeats) { return study::measure_dram_read(threads, repeats).median; }

}  // namespace flashgqa::bench

bool flashgqa::bench::initialize(int argc, char** argv) {
  // Explicit flags win: they come later on the command line.
  static std::string reps = "--benchmark_repetitions=5", aggr = "--benchmark_report_aggregates_only=true";
  static std::vector<char*> args;
  args.assign(argv, argv + argc);
  args.insert(args.begin() + 1, {reps.data(), aggr.data()});
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return false;
  benchmark::AddCustomContext("isa", isa_name(active_isa()));
  return true;
}
