#include "study/tune_cache.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "kernels/cpu_features.hpp"

namespace flashgqa::study {
namespace {

constexpr const char* kHeader = "# flashgqa tune cache v1";

std::string clean(std::string s) {
  for (char& c : s)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return s;
}

bool parse_int(const std::string& text, std::int64_t& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  out = v;
  return true;
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> fields;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, '\t')) fields.push_back(field);
  return fields;
}

// Parses one entry line; false if malformed.
bool parse_entry(const std::string& line, TuneEntry& e) {
  // cpu isa G H causal precision t_class s_class threads block_q block_kv ms
  const std::vector<std::string> f = split_tabs(line);
  if (f.size() != 12) return false;
  std::int64_t G, H, t_class, s_class, threads, block_q, block_kv;
  if (!parse_int(f[2], G) || !parse_int(f[3], H) || !parse_int(f[6], t_class) ||
      !parse_int(f[7], s_class) || !parse_int(f[8], threads) || !parse_int(f[9], block_q) ||
      !parse_int(f[10], block_kv))
    return false;
  if (f[4] != "0" && f[4] != "1") return false;
  if (f[5] != "bf16" && f[5] != "f32") return false;
  char* end = nullptr;
  e.ms = std::strtod(f[11].c_str(), &end);
  if (f[11].empty() || *end != '\0') return false;
  constexpr std::int64_t kMaxBlock = std::int64_t{1} << 24;
  if (G < 1 || H < 1 || threads < 0 || threads > 4096 || t_class < 0 || t_class > 62 || s_class < 0 ||
      s_class > 62 || block_q < 1 || block_q > kMaxBlock || block_kv < 1 || block_kv > kMaxBlock)
    return false;
  e.key.cpu = f[0];
  e.key.isa = f[1];
  e.key.G = G;
  e.key.H = H;
  e.key.causal = f[4] == "1";
  e.key.precision = f[5] == "bf16" ? Precision::bf16 : Precision::f32;
  e.key.t_class = static_cast<int>(t_class);
  e.key.s_class = static_cast<int>(s_class);
  e.threads = static_cast<int>(threads);
  e.block_q = block_q;
  e.block_kv = block_kv;
  return true;
}

std::mutex g_mutex;
bool g_loaded = false;
void (*g_warning_sink)(const std::string&) = nullptr;
std::vector<TuneEntry> g_entries;

}  // namespace

int size_class(std::int64_t n) {
  int c = 0;
  while ((std::int64_t{1} << c) < n && c < 62) ++c;
  return c;
}

std::string cpu_model() {
  static const std::string model = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("model name", 0) == 0) {
        const auto colon = line.find(':');
        if (colon != std::string::npos) {
          std::string name = line.substr(colon + 1);
          name.erase(0, name.find_first_not_of(' '));
          return clean(name);
        }
      }
    return std::string("unknown-cpu");
  }();
  return model;
}

TuneKey make_tune_key(const std::string& isa, std::int64_t G, std::int64_t H, std::int64_t T,
                      std::int64_t S, bool causal, Precision precision) {
  TuneKey k;
  k.cpu = cpu_model();
  k.isa = clean(isa);
  k.G = G;
  k.H = H;
  k.causal = causal;
  k.precision = precision;
  k.t_class = size_class(T);
  k.s_class = size_class(S);
  return k;
}

std::string user_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/flashgqa";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/flashgqa";
  return ".flashgqa-cache";
}

std::string tune_cache_path() {
  if (const char* p = std::getenv("FLASHGQA_TUNE_CACHE"); p && *p) return p;
  return user_cache_dir() + "/tune.tsv";
}

std::vector<TuneEntry> read_tune_cache(const std::string& path, std::string* warning) {
  std::ifstream in(path);
  if (!in) return {};
  std::string line;
  if (!std::getline(in, line) || line != kHeader) {
    if (warning) *warning = "tune cache " + path + " is not a flashgqa tune cache (bad first line); ignored";
    return {};
  }
  std::vector<TuneEntry> entries;
  int number = 1;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    TuneEntry e;
    if (!parse_entry(line, e)) {
      if (warning)
        *warning = "tune cache " + path + " is corrupt (line " + std::to_string(number) + "); ignored";
      return {};
    }
    entries.push_back(e);
  }
  return entries;
}

void store_tune_entry(const std::string& path, const TuneEntry& entry) {
  std::string warning;
  std::vector<TuneEntry> entries = read_tune_cache(path, &warning);
  bool replaced = false;
  for (TuneEntry& e : entries)
    if (e.key == entry.key) e = entry, replaced = true;
  if (!replaced) entries.push_back(entry);
  const std::filesystem::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path(), ec);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kHeader << '\n';
    for (const TuneEntry& e : entries)
      out << e.key.cpu << '\t' << e.key.isa << '\t' << e.key.G << '\t' << e.key.H << '\t'
          << (e.key.causal ? 1 : 0) << '\t' << precision_name(e.key.precision) << '\t' << e.key.t_class
          << '\t' << e.key.s_class << '\t' << e.threads << '\t' << e.block_q << '\t' << e.block_kv
          << '\t' << e.ms << '\n';
    if (!out) throw Error("tune cache: cannot write " + tmp);
  }
  std::filesystem::rename(tmp, target, ec);
  if (ec) throw Error("tune cache: cannot replace " + path + ": " + ec.message());
}

std::optional<TuneEntry> lookup_tuned_blocks(const TuneKey& key) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_loaded) {
    std::string warning;
    g_entries = read_tune_cache(tune_cache_path(), &warning);
    if (!warning.empty()) {
      if (g_warning_sink) g_warning_sink(warning);
      else std::fprintf(stderr, "flashgqa: warning: %s\n", warning.c_str());
    }
    g_loaded = true;
  }
  for (const TuneEntry& e : g_entries)
    if (e.key == key) return e;
  return std::nullopt;
}

bool apply_tuned_blocks(Problem& p, const std::string& isa) {
  if (p.block_q != 0 || p.block_kv != 0) return false;  // explicit blocks win
  const auto tuned =
      lookup_tuned_blocks(make_tune_key(isa, p.G, p.H, p.T, p.S, p.causal, p.precision));
  if (!tuned) return false;
  p.block_q = tuned->block_q;
  p.block_kv = tuned->block_kv;
  return true;
}

Options with_tuned_blocks(Options options, const Shape& shape) {
  if (options.algorithm != Algorithm::flash) return options;
  if (shape.B * shape.K * shape.G * shape.T == 0) return options;  // nothing is computed
  Problem p;
  p.G = shape.G, p.H = shape.H, p.T = shape.T, p.S = shape.S;
  p.causal = options.causal;
  p.precision = options.precision;
  p.block_q = options.block_q;
  p.block_kv = options.block_kv;
  if (apply_tuned_blocks(p, isa_name(active_isa()))) {
    options.block_q = p.block_q;
    options.block_kv = p.block_kv;
  }
  return options;
}

void set_tune_warning_sink(void (*sink)(const std::string& message)) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_warning_sink = sink;
}

void reload_tune_cache() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_loaded = false;
  g_entries.clear();
}

}  // namespace flashgqa::study
