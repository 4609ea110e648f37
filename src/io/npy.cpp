// .npy reading and writing (see npy.hpp). The file is a preamble (magic "\x93NUMPY", version, header
// length), a Python-literal header dict {'descr': ..., 'fortran_order': ..., 'shape': (...), } padded
// with spaces to a multiple of 64 bytes and ending in '\n', then the elements. The header is parsed
// here by a small hand-written scanner that accepts exactly that literal grammar and nothing else.
#include "io/npy.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <sys/stat.h>
#include <unistd.h>

namespace flashgqa {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicSize = 6;
constexpr std::size_t kAlign = 64;  // numpy pads the preamble + header to a multiple of this
constexpr std::size_t kMaxV1HeaderLen = 65535;
constexpr std::size_t kMaxShownHeader = 200;
constexpr const char* kSupportedDtypes =
    "'<f4' (float32), '<f2' (float16), '<V2' (bfloat16 as ml_dtypes writes it) or '|i1' (int8)";

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("npy file '" + path + "': " + what);
}

// Shape as Python prints a tuple: (), (3,), (3, 4).
std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// Text safe to put in a one-line message: non-printable bytes become \xNN, long text is cut.
std::string printable(const std::string& text) {
  std::string s;
  for (std::size_t i = 0; i < text.size() && i < kMaxShownHeader; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      s += static_cast<char>(c);
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      s += "\\x";
      s += kHex[c >> 4];
      s += kHex[c & 15];
    }
  }
  if (text.size() > kMaxShownHeader) s += "...";
  return s;
}

const char* descr_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return "<f4";
    case DType::f16: return "<f2";
    case DType::bf16: return "<V2";
    case DType::i8: return "|i1";
  }
  return "?";
}

std::optional<DType> dtype_of_descr(const std::string& descr) {
  if (descr == "<f4") return DType::f32;
  if (descr == "<f2") return DType::f16;
  if (descr == "<V2" || descr == "|V2" || descr == "bfloat16") return DType::bf16;
  if (descr == "|i1") return DType::i8;
  return std::nullopt;
}

// Element count of `shape`, or nullopt when it does not fit in int64. Dimensions must be >= 0.
std::optional<std::int64_t> checked_numel(const std::vector<std::int64_t>& shape) {
  for (std::int64_t d : shape)
    if (d == 0) return 0;  // empty, however large the other dimensions
  std::int64_t n = 1;
  for (std::int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  return n;
}

// The fields of a .npy header dict.
struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
};

// Scanner for the header dict. Throws std::string (a description) on any syntax error.
class HeaderParser {
 public:
  explicit HeaderParser(const std::string& text) : text_(text) {}

  Header parse() {
    Header h;
    bool has_descr = false, has_fortran = false, has_shape = false;
    skip_space();
    expect('{');
    for (;;) {
      skip_space();
      if (peek() == '}') break;
      const std::size_t key_at = pos_;
      const std::string key = parse_string();
      skip_space();
      expect(':');
      skip_space();
      bool* seen = nullptr;
      if (key == "descr") {
        if (peek() != '\'' && peek() != '"')
          error("descr is not a string (structured dtypes are not supported)");
        h.descr = parse_string();
        seen = &has_descr;
      } else if (key == "fortran_order") {
        h.fortran_order = parse_bool();
        seen = &has_fortran;
      } else if (key == "shape") {
        h.shape = parse_shape();
        seen = &has_shape;
      } else {
        pos_ = key_at;
        error("unexpected key '" + key + "', expected only 'descr', 'fortran_order' and 'shape'");
      }
      if (*seen) {
        pos_ = key_at;
        error("key '" + key + "' appears twice");
      }
      *seen = true;
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') error("expected ',' or '}' after the value of '" + key + "'");
    }
    ++pos_;  // '}'
    skip_space();
    if (pos_ != text_.size()) error("unexpected text after the closing '}'");
    if (!has_descr) throw std::string("missing key 'descr'");
    if (!has_fortran) throw std::string("missing key 'fortran_order'");
    if (!has_shape) throw std::string("missing key 'shape'");
    return h;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    throw what + " at byte " + std::to_string(pos_) + " of the header";
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  void expect(char c) {
    if (peek() != c) error(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool consume_word(const char* word) {
    const std::size_t n = std::strlen(word);
    if (text_.compare(pos_, n, word) != 0) return false;
    pos_ += n;
    return true;
  }
  // A Python string literal without escapes: '...' or "...".
  std::string parse_string() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') error("expected a quoted string");
    const std::size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string::npos) error("unterminated string");
    std::string s = text_.substr(pos_ + 1, end - pos_ - 1);
    if (s.find('\\') != std::string::npos) error("escape sequences in strings are not supported");
    pos_ = end + 1;
    return s;
  }
  bool parse_bool() {
    if (consume_word("True")) return true;
    if (consume_word("False")) return false;
    error("expected True or False for 'fortran_order'");
  }
  // A non-negative decimal integer, optionally with Python 2's 'L' suffix.
  std::int64_t parse_dim() {
    if (peek() == '-') error("negative dimension in 'shape'");
    if (peek() < '0' || peek() > '9') error("expected a dimension (an integer) in 'shape'");
    std::int64_t d = 0;
    while (peek() >= '0' && peek() <= '9') {
      if (__builtin_mul_overflow(d, 10, &d) || __builtin_add_overflow(d, peek() - '0', &d))
        error("dimension in 'shape' does not fit in 64 bits");
      ++pos_;
    }
    if (peek() == 'L') ++pos_;
    return d;
  }
  // (), (3,), (3, 4), (3, 4,)
  std::vector<std::int64_t> parse_shape() {
    std::vector<std::int64_t> shape;
    expect('(');
    for (;;) {
      skip_space();
      if (peek() == ')') break;
      shape.push_back(parse_dim());
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != ')') error("expected ',' or ')' in 'shape'");
    }
    ++pos_;  // ')'
    return shape;
  }

  const std::string& text_;
  std::size_t pos_ = 0;
};

std::uint32_t little_endian(const unsigned char* p, std::size_t n) {
  std::uint32_t v = 0;
  for (std::size_t i = n; i-- > 0;) v = (v << 8) | p[i];
  return v;
}

}  // namespace

std::int64_t NpyArray::numel() const { return checked_numel(shape).value_or(0); }

TensorView NpyArray::view() {
  if (shape.size() > static_cast<std::size_t>(TensorView::kMaxRank))
    throw Error("npy array: rank " + std::to_string(shape.size()) + " shape " +
                shape_string(shape) + ", expected rank at most " +
                std::to_string(TensorView::kMaxRank));
  TensorView t;
  t.data = data.data();
  t.dtype = dtype;
  t.rank = static_cast<int>(shape.size());
  std::uint64_t stride = 1;  // unsigned: may wrap only for empty arrays, whose strides are unused
  for (int d = t.rank - 1; d >= 0; --d) {
    const auto i = static_cast<std::size_t>(d);
    t.shape[i] = shape[i];
    t.stride[i] = static_cast<std::int64_t>(stride);
    stride *= static_cast<std::uint64_t>(shape[i]);
  }
  return t;
}

namespace {

// Where a .npy file's elements are, from its preamble and header.
struct NpyLayout {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t data_at = 0, data_bytes = 0;
};

// Parses the preamble and header of a .npy file of `size` bytes. `pre` holds its first
// min(size, 12) bytes; read_text(offset, length) returns `length` bytes from `offset` (the header,
// within the file: the caller checks nothing). Throws Error naming `path` for every malformed input.
template <typename ReadText>
NpyLayout parse_layout(const std::string& path, std::uint64_t size, const unsigned char* pre, ReadText read_text) {
  const std::size_t pre_read = static_cast<std::size_t>(std::min<std::uint64_t>(size, 12));
  if (pre_read < kMagicSize || std::memcmp(pre, kMagic, kMagicSize) != 0)
    fail(path, "not a .npy file: it starts with '" +
                   printable(std::string(reinterpret_cast<const char*>(pre), std::min(pre_read, kMagicSize))) +
                   "', expected the magic string '\\x93NUMPY'");
  if (pre_read < kMagicSize + 2)
    fail(path, "truncated header: the file ends inside the preamble after " +
                   std::to_string(size) + " bytes");
  const int major = pre[6], minor = pre[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    fail(path, "unsupported .npy format version " + std::to_string(major) + "." +
                   std::to_string(minor) + ", expected 1.0, 2.0 or 3.0");
  const std::size_t len_size = major == 1 ? 2 : 4;
  const std::size_t header_at = kMagicSize + 2 + len_size;
  if (size < header_at)
    fail(path, "truncated header: the file ends inside the preamble after " +
                   std::to_string(size) + " bytes");
  const std::uint64_t header_len = little_endian(pre + kMagicSize + 2, len_size);
  if (header_len > size - header_at)
    fail(path, "truncated header: the preamble announces a " + std::to_string(header_len) +
                   "-byte header but only " + std::to_string(size - header_at) +
                   " bytes follow the preamble");

  const std::string text = read_text(header_at, header_len);
  Header h;
  try {
    h = HeaderParser(text).parse();
  } catch (const std::string& what) {
    fail(path, "malformed header: " + what + "; header is \"" + printable(text) +
                   "\", expected a dict like {'descr': '<f4', 'fortran_order': False, "
                   "'shape': (3, 4), }");
  }

  NpyLayout a;
  const std::optional<DType> dtype = dtype_of_descr(h.descr);
  if (!dtype)
    fail(path, "unsupported dtype '" + printable(h.descr) + "', expected " + kSupportedDtypes);
  if (h.fortran_order)
    fail(path, "array is in Fortran order (fortran_order: True), expected C order "
               "(fortran_order: False); save np.ascontiguousarray(x)");
  a.dtype = *dtype;
  a.shape = h.shape;
  const std::optional<std::int64_t> numel = checked_numel(a.shape);
  const auto esize = static_cast<std::int64_t>(dtype_size(a.dtype));
  std::int64_t bytes = 0;
  if (!numel || __builtin_mul_overflow(*numel, esize, &bytes))
    fail(path, "shape " + shape_string(a.shape) +
                   ": the element count overflows 64 bits, expected a shape whose byte size fits "
                   "in 64 bits");
  const std::uint64_t body = size - header_at - header_len;
  if (body != static_cast<std::uint64_t>(bytes))
    fail(path, "shape does not fit the file's size: shape " + shape_string(a.shape) + " of " +
                   dtype_name(a.dtype) + " needs " + std::to_string(bytes) +
                   " bytes of data, but the file has " + std::to_string(body) +
                   " bytes after the header");
  a.data_at = header_at + header_len;
  a.data_bytes = static_cast<std::uint64_t>(bytes);
  return a;
}

}  // namespace

NpyArray parse_npy(const void* bytes, std::size_t size, const std::string& name) {
  const auto* b = static_cast<const unsigned char*>(bytes);
  unsigned char pre[12] = {};
  if (size > 0) std::memcpy(pre, b, std::min<std::size_t>(size, sizeof pre));
  const NpyLayout l = parse_layout(name, size, pre, [&](std::uint64_t at, std::uint64_t n) {
    return std::string(reinterpret_cast<const char*>(b) + at, static_cast<std::size_t>(n));
  });
  NpyArray a;
  a.dtype = l.dtype;
  a.shape = l.shape;
  a.data.resize(static_cast<std::size_t>(l.data_bytes));
  if (l.data_bytes > 0) std::memcpy(a.data.data(), b + l.data_at, static_cast<std::size_t>(l.data_bytes));
  return a;
}

NpyArray read_npy(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status))
    fail(path, "cannot open for reading: no such file, expected an existing .npy file");
  if (!std::filesystem::is_regular_file(status))
    fail(path, "not a regular file, expected a .npy file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open for reading: ") + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  in.seekg(0, std::ios::beg);
  if (end < 0 || !in) fail(path, "cannot determine the file's size");
  const auto size = static_cast<std::uint64_t>(end);

  // Preamble: magic (6), major, minor, header length (2 bytes in 1.0, 4 in 2.0 and 3.0).
  unsigned char pre[12] = {};
  in.read(reinterpret_cast<char*>(pre), static_cast<std::streamsize>(std::min<std::uint64_t>(size, sizeof pre)));
  if (!in) fail(path, "read error in the preamble");
  const NpyLayout l = parse_layout(path, size, pre, [&](std::uint64_t at, std::uint64_t n) {
    std::string text(static_cast<std::size_t>(n), '\0');
    in.seekg(static_cast<std::streamoff>(at), std::ios::beg);
    in.read(text.data(), static_cast<std::streamsize>(n));
    if (!in) fail(path, "read error in the header");
    return text;
  });

  NpyArray a;
  a.dtype = l.dtype;
  a.shape = l.shape;
  const auto bytes = static_cast<std::int64_t>(l.data_bytes);
  a.data.resize(static_cast<std::size_t>(bytes));
  if (bytes > 0) {
    in.seekg(static_cast<std::streamoff>(l.data_at), std::ios::beg);
    in.read(reinterpret_cast<char*>(a.data.data()), static_cast<std::streamsize>(bytes));
    if (!in || in.gcount() != bytes)
      fail(path, "read error in the data after " + std::to_string(in.gcount()) + " of " +
                     std::to_string(bytes) + " bytes");
  }
  return a;
}

std::string npy_header_dict(DType dtype, const std::vector<std::int64_t>& shape) {
  return std::string("{'descr': '") + descr_of(dtype) + "', 'fortran_order': False, 'shape': " +
         shape_string(shape) + ", }";
}

void check_writable_npy(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail(path, "cannot open for writing: is a directory, expected a file path");
    if (::access(path.c_str(), W_OK) != 0) fail(path, std::string("cannot open for writing: ") + std::strerror(errno));
    return;
  }
  const std::size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (::access(dir.c_str(), W_OK) != 0)
    fail(path, std::string("cannot open for writing: folder ") + dir + ": " + std::strerror(errno));
}

void write_npy(const std::string& path, DType dtype, const std::vector<std::int64_t>& shape,
               const void* data) {
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16)
    fail(path, "cannot write unknown dtype code " + std::to_string(static_cast<int>(dtype)) +
                   ", expected float32, bfloat16 or float16");
  for (std::int64_t d : shape)
    if (d < 0) fail(path, "cannot write shape " + shape_string(shape) + ": negative dimension");
  const std::optional<std::int64_t> numel = checked_numel(shape);
  std::int64_t bytes = 0;
  if (!numel || __builtin_mul_overflow(*numel, static_cast<std::int64_t>(dtype_size(dtype)), &bytes))
    fail(path, "cannot write shape " + shape_string(shape) +
                   ": the element count overflows 64 bits");
  if (data == nullptr && bytes > 0)
    fail(path, "cannot write shape " + shape_string(shape) + ": null data pointer");

  // Header: dict, spaces, '\n', so that preamble + header is a multiple of kAlign bytes.
  std::string header = npy_header_dict(dtype, shape);
  int major = 1;
  std::size_t preamble = kMagicSize + 2 + 2;
  auto padded = [&](std::size_t pre) {
    return (pre + header.size() + 1 + kAlign - 1) / kAlign * kAlign - pre;
  };
  if (padded(preamble) > kMaxV1HeaderLen) {
    major = 2;
    preamble = kMagicSize + 2 + 4;
  }
  const std::size_t header_len = padded(preamble);
  header.append(header_len - header.size() - 1, ' ');
  header += '\n';

  std::string pre(kMagic, kMagicSize);
  pre += static_cast<char>(major);
  pre += '\0';
  for (std::size_t i = 0; i < preamble - kMagicSize - 2; ++i)
    pre += static_cast<char>((header_len >> (8 * i)) & 0xff);

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path, std::string("cannot open for writing: ") + std::strerror(errno));
  out.write(pre.data(), static_cast<std::streamsize>(pre.size()));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  if (bytes > 0) out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  out.flush();
  if (!out) fail(path, std::string("write failed: ") + std::strerror(errno));
  out.close();
  if (!out) fail(path, std::string("write failed on close: ") + std::strerror(errno));
}

}  // namespace flashgqa
