// The flashgqa command-line tool: dispatches to a subcommand, prints help, and turns every error into
// a non-zero exit with exactly one line on stderr.
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "flashgqa/flashgqa.hpp"

namespace {

constexpr const char* kUsage =
    "flashgqa: exact grouped-query attention on the CPU, on .npy files.\n"
    "\n"
    "Usage:\n"
    "  flashgqa attention --q Q.npy --k K.npy --v V.npy --out O.npy [flags]\n"
    "  flashgqa random --shape B,K,G,T,S,H --dir DIR [flags]\n"
    "  flashgqa roofline [--shape B,K,G,T,S,H] [--threads N] [--remeasure]\n"
    "  flashgqa bench [--out DIR] [--shape ...] [--seq 256,512,...] [--algos ...] [flags]\n"
    "  flashgqa bench --decode [--shape B,K,G,T,S,H] [--kv-dtypes ...] [--page-sizes ...] [flags]\n"
    "  flashgqa tune --shape B,K,G,T,S,H [flags]\n"
    "  flashgqa --help | flashgqa COMMAND --help\n"
    "\n"
    "Shapes: B batch, K kv heads, G query heads per kv head, T queries, S keys, H head dim.\n"
    "Exit status 0 on success; on any error non-zero, with one line on stderr.\n"
    "\n";

// One line: newlines in a message become spaces.
std::string one_line(std::string message) {
  for (char& c : message)
    if (c == '\n' || c == '\r') c = ' ';
  return message;
}

int run(const std::vector<std::string>& args) {
  using namespace flashgqa::cli;
  if (args.empty())
    throw flashgqa::Error("missing command, expected attention, random, roofline, bench or tune (see flashgqa --help)");
  const std::string& command = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (command == "--help" || command == "-h" || command == "help") {
    std::printf("%s%s\n%s\n%s\n%s\n%s", kUsage, attention_help(), random_help(), roofline_help(),
                bench_help(), tune_help());
    return 0;
  }
  struct Command {
    const char* name;
    int (*run)(const std::vector<std::string>&);
    const char* (*help)();
  };
  for (const Command& c : {Command{"roofline", roofline_command, roofline_help},
                           Command{"bench", bench_command, bench_help}, Command{"tune", tune_command, tune_help}})
    if (command == c.name) {
      if (wants_help(rest)) return std::printf("%s", c.help()) < 0;
      return c.run(rest);
    }
  if (command == "attention") {
    if (wants_help(rest)) return std::printf("%s", attention_help()) < 0;
    return attention_command(rest);
  }
  if (command == "random") {
    if (wants_help(rest)) return std::printf("%s", random_help()) < 0;
    return random_command(rest);
  }
  throw flashgqa::Error("unknown command '" + command +
                        "', expected attention, random, roofline, bench or tune (see flashgqa --help)");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "flashgqa: error: out of memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashgqa: error: %s\n", one_line(e.what()).c_str());
  }
  return 1;
}
