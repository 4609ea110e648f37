// Flag parsing and strict number parsing for the flashgqa tool (see args.hpp).
#include "cli/args.hpp"

#include <charconv>
#include <cmath>
#include <system_error>

namespace flashgqa::cli {
namespace {

[[noreturn]] void fail(const std::string& message) { throw Error(message); }

std::string range_string(std::int64_t min, std::int64_t max) {
  return "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
}

const FlagSpec* find_spec(const std::vector<FlagSpec>& specs, const std::string& name) {
  for (const FlagSpec& s : specs)
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace

Args::Args(const std::string& command, const std::vector<std::string>& args,
           const std::vector<FlagSpec>& specs)
    : command_(command) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& word = args[i];
    if (word.size() < 3 || word.compare(0, 2, "--") != 0)
      fail(command_ + ": unexpected argument '" + word + "', expected a flag such as --" +
           specs.front().name + " (see flashgqa " + command_ + " --help)");
    const std::size_t eq = word.find('=');
    const std::string name = word.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const FlagSpec* spec = find_spec(specs, name);
    if (spec == nullptr)
      fail(command_ + ": unknown flag '--" + name + "' (see flashgqa " + command_ + " --help)");
    if (values_.count(name)) fail(command_ + ": flag --" + name + " given twice, expected once");
    std::string value;
    if (!spec->takes_value) {
      if (eq != std::string::npos)
        fail(command_ + ": flag --" + name + " takes no value, found '" + word + "'");
    } else if (eq != std::string::npos) {
      value = word.substr(eq + 1);
    } else {
      // A following word that is itself a flag means the value is missing ("-3" is a value).
      if (i + 1 >= args.size() || args[i + 1].compare(0, 2, "--") == 0)
        fail(command_ + ": flag --" + name + " is missing its value");
      value = args[++i];
    }
    if (spec->takes_value && value.empty())
      fail(command_ + ": flag --" + name + " has an empty value");
    values_[name] = value;
  }
}

const std::string& Args::required(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end())
    fail(command_ + ": missing required flag --" + name + " (see flashgqa " + command_ + " --help)");
  return it->second;
}

std::optional<std::string> Args::optional(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::int64_t Args::integer(const std::string& name, std::int64_t fallback, std::int64_t min,
                           std::int64_t max) const {
  const auto it = values_.find(name);
  return it == values_.end() ? fallback : parse_integer("--" + name, it->second, min, max);
}

double Args::real(const std::string& name, double fallback) const {
  const auto it = values_.find(name);
  return it == values_.end() ? fallback : parse_real("--" + name, it->second);
}

std::int64_t parse_integer(const std::string& flag, const std::string& text, std::int64_t min,
                           std::int64_t max) {
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range)
    fail(flag + ": '" + text + "' is out of range, expected " + range_string(min, max));
  if (ec != std::errc() || ptr != end || text.empty())
    fail(flag + ": '" + text + "' is not an integer, expected " + range_string(min, max));
  if (value < min || value > max)
    fail(flag + ": " + text + " is out of range, expected " + range_string(min, max));
  return value;
}

double parse_real(const std::string& flag, const std::string& text) {
  double value = 0.0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range)
    fail(flag + ": '" + text + "' is out of range, expected a finite number");
  if (ec != std::errc() || ptr != end || text.empty())
    fail(flag + ": '" + text + "' is not a number, expected a finite number such as 0.125");
  if (!std::isfinite(value)) fail(flag + ": '" + text + "', expected a finite number");
  return value;
}

std::vector<std::int64_t> parse_integer_list(const std::string& flag, const std::string& text,
                                             std::size_t count, std::int64_t min,
                                             std::int64_t max) {
  std::vector<std::int64_t> values;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    values.push_back(parse_integer(flag, item, min, max));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (values.size() != count)
    fail(flag + ": '" + text + "' has " + std::to_string(values.size()) + " numbers, expected " +
         std::to_string(count) + " separated by commas");
  return values;
}

bool wants_help(const std::vector<std::string>& args) {
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> parts;
  std::string part;
  for (char c : text + ",") {
    if (c != ',') {
      part += c;
    } else if (!part.empty()) {
      parts.push_back(part);
      part.clear();
    }
  }
  return parts;
}

}  // namespace flashgqa::cli
