// Lookups in the enum name tables of flashgqa.hpp (kDTypeNames, kAlgorithmNames, kPrecisionNames),
// shared by the names and parsers (names.cpp) and validation (problem.cpp).
#pragma once

#include <array>
#include <cstddef>

#include "flashgqa/flashgqa.hpp"

namespace flashgqa {

// The name of `value` in `table`, or nullptr when the value (a code cast from an integer) has none.
template <typename Enum, std::size_t N>
constexpr const char* find_name(const std::array<EnumName<Enum>, N>& table, Enum value) {
  for (const EnumName<Enum>& e : table)
    if (e.value == value) return e.name;
  return nullptr;
}

}  // namespace flashgqa
