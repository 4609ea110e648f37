// The instruction-set names and the run-time choice of a set (cpu_features.hpp): every name parses
// back to its set, an unknown name is an error, every supported set can be made active, and asking
// for one this CPU lacks is an error that leaves the active set as it was.
#include "kernels/cpu_features.hpp"

#include <gtest/gtest.h>

#include "flashgqa/flashgqa.hpp"

namespace flashgqa {
namespace {

TEST(CpuFeatures, NamesRoundTripAndUnsupportedPathsAreErrors) {
  for (Isa isa : {Isa::portable, Isa::avx2, Isa::avx512f, Isa::avx512bf16, Isa::amx, Isa::neon, Isa::neon_bf16})
    EXPECT_EQ(parse_isa(isa_name(isa)), isa);
  EXPECT_THROW(parse_isa("sse9"), Error);
  EXPECT_TRUE(isa_supported(Isa::portable));
  EXPECT_EQ(supported_isas().front(), Isa::portable);
  const Isa before = active_isa();
  for (Isa isa : supported_isas()) {
    set_isa(isa);
    EXPECT_EQ(active_isa(), isa);
  }
  set_isa(Isa::portable);
  for (Isa isa : {Isa::avx2, Isa::avx512f, Isa::avx512bf16, Isa::amx, Isa::neon, Isa::neon_bf16})
    if (!isa_supported(isa)) {
      EXPECT_THROW(set_isa(isa), Error);
      EXPECT_EQ(active_isa(), Isa::portable) << isa_name(isa);
    }
  set_isa(before);
}

}  // namespace
}  // namespace flashgqa
