// flashgqa random: writes DIR/q.npy [B,K,G,T,H] and DIR/k.npy, DIR/v.npy [B,K,S,H] filled with
// normal(0, 1) * X values, deterministic for a seed on every platform (std::mt19937_64 and our own
// Box-Muller transform, since std::normal_distribution differs between standard libraries).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "core/dtype.hpp"
#include "io/npy.hpp"

namespace flashgqa::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"shape"}, {"dtype"}, {"seed"}, {"scale-inputs"}, {"dir"},
};

std::string help_text() {
  return "flashgqa random --shape B,K,G,T,S,H --dir DIR [flags]\n"
    "  writes DIR/q.npy [B,K,G,T,H], DIR/k.npy and DIR/v.npy [B,K,S,H] (creating DIR if needed)\n"
    "  with normal(0,1) * X values, in that order from one generator\n"
    "\n"
    "  --shape B,K,G,T,S,H  the six dimensions, comma-separated\n"
    "  --dir DIR            output folder\n"
    "  --dtype D            " + join_names(kFloatDTypeNames, " | ", " | ") + " (default bfloat16)\n"
    "  --seed N             generator seed, an integer >= 0 (default 0); same seed, same files\n"
    "  --scale-inputs X     multiplies every value (default 1)\n"
    "  --help               this text\n";
}

constexpr double kTwoToMinus53 = 0x1p-53;

// Standard normal samples from a 64-bit Mersenne Twister by the Box-Muller transform.
class NormalSource {
 public:
  explicit NormalSource(std::uint64_t seed) : engine_(seed) {}
  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = static_cast<double>((engine_() >> 11) + 1) * kTwoToMinus53;  // (0, 1]
    const double u2 = static_cast<double>(engine_() >> 11) * kTwoToMinus53;        // [0, 1)
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    spare_ = r * std::sin(angle);
    has_spare_ = true;
    return r * std::cos(angle);
  }

 private:
  std::mt19937_64 engine_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// Element count of `shape`; throws Error when it, or its size as float32 bytes, overflows 64 bits.
std::int64_t checked_numel(const std::vector<std::int64_t>& shape, const char* tensor) {
  for (std::int64_t d : shape)
    if (d == 0) return 0;
  std::int64_t n = 1, bytes = 0;
  bool overflow = false;
  for (std::int64_t d : shape) overflow = overflow || __builtin_mul_overflow(n, d, &n);
  if (overflow || __builtin_mul_overflow(n, std::int64_t{sizeof(float)}, &bytes))
    throw Error(std::string("--shape: ") + tensor + " would have more bytes than fit in 64 bits, "
                "expected smaller dimensions");
  return n;
}

// Writes `path` with `shape` elements of normal(0,1) * scale, stored as `dtype`.
void write_random(const std::string& path, const std::vector<std::int64_t>& shape, DType dtype,
                  double scale, NormalSource& normal, const char* tensor) {
  const std::int64_t n = checked_numel(shape, tensor);
  std::vector<float> values(static_cast<std::size_t>(n));
  for (float& x : values) x = static_cast<float>(normal.next() * scale);
  std::vector<std::byte> stored(static_cast<std::size_t>(n) * dtype_size(dtype));
  if (n > 0) store_row(stored.data(), dtype, values.data(), n);
  write_npy(path, dtype, shape, stored.data());
}

}  // namespace

const char* random_help() {
  static const std::string help = help_text();
  return help.c_str();
}

int random_command(const std::vector<std::string>& words) {
  const Args args("random", words, kFlags);
  const std::vector<std::int64_t> dims =
      parse_integer_list("--shape", args.required("shape"), 6, 0, INT64_MAX);
  const std::int64_t B = dims[0], K = dims[1], G = dims[2], T = dims[3], S = dims[4], H = dims[5];
  const std::string dir = args.required("dir");
  const DType dtype = parse_dtype(args.optional("dtype").value_or("bfloat16"), "--dtype");
  if (!is_float_dtype(dtype))
    throw Error(std::string("--dtype: ") + dtype_name(dtype) + ", expected " + join_names(kFloatDTypeNames) +
                " (q, k and v are floats; an int8 cache comes from quantize_kv)");
  const auto seed = static_cast<std::uint64_t>(args.integer("seed", 0, 0, INT64_MAX));
  const double scale = args.real("scale-inputs", 1.0);
  const std::vector<std::int64_t> q_shape = {B, K, G, T, H}, kv_shape = {B, K, S, H};
  checked_numel(q_shape, "q");
  checked_numel(kv_shape, "k and v");

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw Error("--dir '" + dir + "': cannot create the folder" +
                (ec ? ": " + ec.message() : std::string()) + ", expected a writable folder path");
  const std::filesystem::path base(dir);
  NormalSource normal(seed);
  write_random((base / "q.npy").string(), q_shape, dtype, scale, normal, "q");
  write_random((base / "k.npy").string(), kv_shape, dtype, scale, normal, "k");
  write_random((base / "v.npy").string(), kv_shape, dtype, scale, normal, "v");
  return 0;
}

}  // namespace flashgqa::cli
