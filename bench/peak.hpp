// The ceilings the benchmark divides by, measured right before each benchmark on the same number of
// threads (so a busy machine lowers both, and the ratio stays meaningful). The measuring loops are the
// study module's (src/study/ceilings_<isa>.cpp): 16 independent vdpbf16ps chains per thread, and a
// streaming read of 128 MiB per thread.
#pragma once

namespace flashgqa::bench {

// Peak FLOP/s of the bf16 matmul instruction (vdpbf16ps, or the fp32 FMA on CPUs without it) on
// `threads` threads: the median of `repeats` runs of about 0.1 s.
double bf16_peak_flops(int threads, int repeats = 5);

// DRAM read bandwidth in bytes/s on `threads` threads, each streaming its own 128 MiB: the median of
// `repeats` runs.
double dram_read_bandwidth(int threads, int repeats = 5);

// benchmark::Initialize with this project's defaults (5 repetitions, aggregates only; flags given on
// the command line win) and the instruction set in the context. False: unrecognised arguments.
bool initialize(int argc, char** argv);

}  // namespace flashgqa::bench
