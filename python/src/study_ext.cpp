// The nanobind module `flashgqa._flashgqa_study`: this machine's bf16 matmul peak, measured by the
// study's own micro-benchmark (src/study/ceilings.hpp), for `python -m flashgqa.compare`'s "% of
// peak" column.
#include <nanobind/nanobind.h>

#include "study/ceilings.hpp"

namespace nb = nanobind;

NB_MODULE(_flashgqa_study, m) {
  m.doc() = "flashgqa's machine ceilings for flashgqa.compare.";
  m.def(
      "bf16_peak_flops",
      [](int threads, int repeats) {
        flashgqa::study::Ceiling c;
        {
          nb::gil_scoped_release release;
          c = flashgqa::study::measure_bf16_peak(threads, repeats);
        }
        return nb::make_tuple(c.median, c.min, c.max);
      },
      nb::arg("threads"), nb::arg("repeats") = 5,
      "(median, min, max) FLOP/s of the bf16 matmul instruction (AMX's tdpbf16ps, vdpbf16ps, or the "
      "fp32 FMA without them or where vdpbf16ps runs at half its rate) on `threads` threads, each run "
      "about 0.1 s.");
}
