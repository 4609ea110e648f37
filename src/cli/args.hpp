// Flag parsing for the flashgqa tool: `--name value`, `--name=value` and `--name` switches, checked
// against a list of known flags, and strict number parsing (std::from_chars, whole text, in range).
// Every problem throws flashgqa::Error with a one-line message naming the flag and the value found.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "flashgqa/flashgqa.hpp"

namespace flashgqa::cli {

struct FlagSpec {
  std::string name;  // without the leading "--"
  bool takes_value = true;
};

class Args {
 public:
  // Parses `args` (the words after the command name). Throws Error for an unknown flag, a flag given
  // twice, a flag missing its value, a value given to a switch, or a word that is not a flag.
  Args(const std::string& command, const std::vector<std::string>& args,
       const std::vector<FlagSpec>& specs);

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  // The value of a flag that must be given; throws Error naming the flag when it is missing.
  const std::string& required(const std::string& name) const;
  std::optional<std::string> optional(const std::string& name) const;
  // A flag's integer value in [min, max], or `fallback` when the flag is absent.
  std::int64_t integer(const std::string& name, std::int64_t fallback, std::int64_t min,
                       std::int64_t max) const;
  // A flag's finite floating-point value, or `fallback` when the flag is absent.
  double real(const std::string& name, double fallback) const;

 private:
  std::string command_;
  std::map<std::string, std::string> values_;  // switches map to ""
};

// Parses all of `text` as a decimal integer in [min, max]; `flag` names it in the error message.
std::int64_t parse_integer(const std::string& flag, const std::string& text, std::int64_t min,
                           std::int64_t max);
// Parses all of `text` as a finite decimal floating-point number.
double parse_real(const std::string& flag, const std::string& text);
// Parses "a,b,c" as exactly `count` integers, each in [min, max].
std::vector<std::int64_t> parse_integer_list(const std::string& flag, const std::string& text,
                                             std::size_t count, std::int64_t min,
                                             std::int64_t max);

// The parts of "a,b,c" between commas, empty parts dropped ("a,,b," gives a, b).
std::vector<std::string> split_list(const std::string& text);

// Whether the words ask for help (--help or -h anywhere).
bool wants_help(const std::vector<std::string>& args);

}  // namespace flashgqa::cli
