// The enums' names and parsers, all read from the one table per enum in flashgqa.hpp.
#include "core/names.hpp"

#include <string>

namespace flashgqa {
namespace {

const char* name_or_unknown(const char* name) { return name != nullptr ? name : "unknown"; }

// The value named `name` in `table`; otherwise throws
// "<argument>: unknown <kind> '<name>', expected <every name in the table>".
template <typename Enum, std::size_t N>
Enum parse_name(const std::array<EnumName<Enum>, N>& table, const std::string& name,
                const std::string& argument, const char* kind) {
  for (const EnumName<Enum>& e : table)
    if (name == e.name) return e.value;
  throw Error(argument + ": unknown " + kind + " '" + name + "', expected " + join_names(table));
}

}  // namespace

const char* dtype_name(DType dtype) { return name_or_unknown(find_name(kDTypeNames, dtype)); }

DType parse_dtype(const std::string& name, const std::string& argument) {
  return parse_name(kDTypeNames, name, argument, "dtype");
}

const char* algorithm_name(Algorithm algorithm) {
  return name_or_unknown(find_name(kAlgorithmNames, algorithm));
}

Algorithm parse_algorithm(const std::string& name, const std::string& argument) {
  return parse_name(kAlgorithmNames, name, argument, "algorithm");
}

const char* precision_name(Precision precision) {
  return name_or_unknown(find_name(kPrecisionNames, precision));
}

Precision parse_precision(const std::string& name, const std::string& argument) {
  return parse_name(kPrecisionNames, name, argument, "precision");
}

}  // namespace flashgqa
