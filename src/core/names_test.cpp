// The enum name tables: every value has one name, names and parsers agree, and a parse error names
// the argument and lists every valid name.
#include "core/names.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace flashgqa {
namespace {

// Every code 0..N-1 of the enum has a distinct name that parses back to it; code N has none.
template <typename Enum, std::size_t N, typename NameFn, typename ParseFn>
void expect_round_trip(const std::array<EnumName<Enum>, N>& table, NameFn name_of, ParseFn parse) {
  std::set<std::string> names;
  for (std::size_t c = 0; c < N; ++c) {
    const auto value = static_cast<Enum>(c);
    ASSERT_NE(find_name(table, value), nullptr) << "code " << c << " has no name";
    EXPECT_STREQ(name_of(value), find_name(table, value));
    EXPECT_EQ(parse(std::string(name_of(value))), value);
    names.insert(name_of(value));
  }
  EXPECT_EQ(names.size(), N) << "two values share a name";
  EXPECT_STREQ(name_of(static_cast<Enum>(N)), "unknown");
}

// Expects `parse` to throw an Error with exactly `message`.
template <typename ParseFn>
void expect_parse_error(ParseFn parse, const std::string& message) {
  try {
    parse();
    ADD_FAILURE() << "no error; expected " << message;
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(Names, RoundTrip) {
  expect_round_trip(kDTypeNames, dtype_name, [](const std::string& s) { return parse_dtype(s); });
  expect_round_trip(kAlgorithmNames, algorithm_name,
                    [](const std::string& s) { return parse_algorithm(s); });
  expect_round_trip(kPrecisionNames, precision_name,
                    [](const std::string& s) { return parse_precision(s); });
  EXPECT_STREQ(dtype_name(DType::bf16), "bfloat16");
  EXPECT_STREQ(algorithm_name(Algorithm::chunked_unstable), "chunked-unstable");
  EXPECT_STREQ(precision_name(Precision::f32), "f32");
}

TEST(Names, ParseErrorsNameTheArgumentAndListTheNames) {
  expect_parse_error([] { parse_algorithm("fast"); },
                     "algorithm: unknown algorithm 'fast', expected naive, chunked-unstable, "
                     "chunked, kernel1 or flash");
  expect_parse_error([] { parse_algorithm("Flash", "--algo"); },
                     "--algo: unknown algorithm 'Flash', expected naive, chunked-unstable, chunked, "
                     "kernel1 or flash");
  expect_parse_error([] { parse_precision("fp8"); },
                     "precision: unknown precision 'fp8', expected bf16 or f32");
  expect_parse_error([] { parse_dtype("float64", "--dtype"); },
                     "--dtype: unknown dtype 'float64', expected float32, bfloat16, float16 or int8");
  expect_parse_error([] { parse_dtype(""); },
                     "dtype: unknown dtype '', expected float32, bfloat16, float16 or int8");
}

TEST(Names, JoinNames) {
  EXPECT_EQ(join_names(kPrecisionNames), "bf16 or f32");
  EXPECT_EQ(join_names(kFloatDTypeNames, " | ", " | "), "float32 | bfloat16 | float16");
  EXPECT_EQ(join_names(kDTypeNames), "float32, bfloat16, float16 or int8");
  EXPECT_EQ(join_names(kAlgorithmNames, ",", ","), "naive,chunked-unstable,chunked,kernel1,flash");
  constexpr std::array<EnumName<Precision>, 1> one{{{Precision::f32, "f32"}}};
  EXPECT_EQ(join_names(one), "f32");
}

}  // namespace
}  // namespace flashgqa
