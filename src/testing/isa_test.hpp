// The fixture of the tests that run on every instruction-set path (the flash paths, the backward): a
// test is skipped, with the reason, where this machine lacks its path. Instantiate with
//   INSTANTIATE_TEST_SUITE_P(AllIsas, Suite, ::testing::ValuesIn(testing::kAllIsas), testing::isa_test_name);
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <string>

#include "kernels/cpu_features.hpp"

namespace flashgqa::testing {

// Every path of every architecture: on x86-64 the aarch64 ones skip, and under aarch64 the x86 ones.
inline constexpr std::array<Isa, 7> kAllIsas = {Isa::portable, Isa::avx2,      Isa::avx512f, Isa::avx512bf16,
                                                Isa::amx,      Isa::neon,      Isa::neon_bf16};

class IsaTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam())) GTEST_SKIP() << isa_name(GetParam()) << " not supported here";
  }
  Isa isa() const { return GetParam(); }
};

// The path's name as a test name ('-' is not allowed there: neon-bf16 becomes neon_bf16).
inline std::string isa_test_name(const ::testing::TestParamInfo<Isa>& info) {
  std::string name = isa_name(info.param);
  for (char& c : name)
    if (c == '-') c = '_';
  return name;
}

}  // namespace flashgqa::testing
