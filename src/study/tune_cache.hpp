// The block-size cache written by `flashgqa tune`. The library never reads it (a library call reads no
// files): the tools opt in, looking blocks up here and passing them through Options::block_q/block_kv
// when the caller left both at 0 (`flashgqa attention`, `flashgqa bench`: with_tuned_blocks below).
// One text file, tab-separated, first line a magic header:
//   # flashgqa tune cache v1
//   cpu  isa  G  H  causal  precision  t_class  s_class  threads  block_q  block_kv  ms
// A shape's class is (G, H, causal, precision, ceil(log2 T), ceil(log2 S)) on one CPU model and
// instruction set: blocks tuned for T = S = 4096 serve 2049..4096. The thread count the blocks were
// measured on is recorded but is not part of the class: block sizes change the rounding, and flash's
// result must not depend on the thread count. A file that is foreign (wrong
// header) or corrupt (a malformed line) is ignored as a whole, with one warning, and never crashes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "flashgqa/flashgqa.hpp"
#include "study/roofline.hpp"

namespace flashgqa::study {

struct TuneKey {
  std::string cpu, isa;
  std::int64_t G = 0, H = 0;
  bool causal = false;
  Precision precision = Precision::bf16;
  int t_class = 0, s_class = 0;  // ceil(log2(max(T, 1)))
  bool operator==(const TuneKey&) const = default;
};

struct TuneEntry {
  TuneKey key;
  std::int64_t block_q = 0, block_kv = 0;
  int threads = 0;  // the threads they were measured on
  double ms = 0;    // the median time measured for the blocks
};

// ceil(log2(max(n, 1))).
int size_class(std::int64_t n);
// The key of a problem on this machine: this CPU's model name and `isa`.
TuneKey make_tune_key(const std::string& isa, std::int64_t G, std::int64_t H, std::int64_t T,
                      std::int64_t S, bool causal, Precision precision);
// This CPU's model name (from /proc/cpuinfo; "unknown-cpu" elsewhere), without tabs or newlines.
std::string cpu_model();

// The user's cache folder for flashgqa: $XDG_CACHE_HOME/flashgqa, else $HOME/.cache/flashgqa, else
// .flashgqa-cache in the current folder.
std::string user_cache_dir();
// $FLASHGQA_TUNE_CACHE, else user_cache_dir()/tune.tsv.
std::string tune_cache_path();

// Entries of the file at `path`; a missing file gives none silently, a foreign or corrupt one gives
// none and sets *warning to what was wrong.
std::vector<TuneEntry> read_tune_cache(const std::string& path, std::string* warning);
// Replaces the entry with the same key (or adds it) and rewrites the file atomically (temporary file
// and rename), creating its folder. Throws Error if the file cannot be written.
void store_tune_entry(const std::string& path, const TuneEntry& entry);

// The tuned blocks for `key` from the default cache file, loaded once per process (a warning about a
// bad file goes to stderr once). reload_tune_cache() forgets the loaded copy (after `tune` or in tests).
std::optional<TuneEntry> lookup_tuned_blocks(const TuneKey& key);
void reload_tune_cache();

// Where the warning about a bad cache file goes: by default one line on stderr. The CLI sends it to
// stdout, whose stderr may carry only the lines its contract allows. Null restores the default.
void set_tune_warning_sink(void (*sink)(const std::string& message));

// For flash with both block sizes automatic (0): sets p.block_q and p.block_kv to the tuned pair of
// the problem's class on instruction set `isa`, if the cache has one. Returns whether it did.
bool apply_tuned_blocks(Problem& p, const std::string& isa);

// The tools' opt-in: `options` for a problem of `shape` with the tuned pair of its class on the active
// instruction set (active_isa()) when they ask for flash with both block sizes automatic and the
// cache has one (apply_tuned_blocks); `options` unchanged otherwise.
Options with_tuned_blocks(Options options, const Shape& shape);

}  // namespace flashgqa::study
