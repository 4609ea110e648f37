// Tests of the .npy reader and writer: round trips, hand-written headers as numpy and other writers
// produce them, and every malformed-input case (each must throw Error with a telling message).
#include "io/npy.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace flashgqa {
namespace {

namespace fs = std::filesystem;

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("flashgqa_npy_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes raw bytes to `name` and returns its path.
  std::string raw(const std::string& name, const std::string& bytes) const {
    std::ofstream out(path(name), std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path(name);
  }
  // A .npy file with the given version and header text (used as is) followed by `body`.
  std::string npy(const std::string& name, int major, const std::string& header,
                  const std::string& body) const {
    std::string s = "\x93NUMPY";
    s += static_cast<char>(major);
    s += '\0';
    const int len_size = major == 1 ? 2 : 4;
    for (int i = 0; i < len_size; ++i) s += static_cast<char>((header.size() >> (8 * i)) & 0xff);
    return raw(name, s + header + body);
  }

  fs::path dir_;
};

std::string floats(std::initializer_list<float> values) {
  std::string s(values.size() * sizeof(float), '\0');
  std::memcpy(s.data(), values.begin(), s.size());
  return s;
}

// Expects read_npy(path) to throw Error whose message contains `needle` and names the file.
void expect_read_error(const std::string& path, const std::string& needle) {
  try {
    read_npy(path);
    ADD_FAILURE() << "no error reading " << path << ", expected one containing '" << needle << "'";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << "message: " << what;
    EXPECT_NE(what.find(path), std::string::npos) << "message does not name the file: " << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "message is not one line: " << what;
  }
}

TEST_F(NpyTest, RoundTripsEveryDtypeAndShape) {
  const std::vector<std::vector<std::int64_t>> shapes = {
      {}, {0}, {3}, {2, 3}, {2, 0, 4}, {1, 2, 3, 4, 5}, {2, 1, 3, 1, 2}, {7, 1}, {0, 0}};
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const auto& shape : shapes) {
      std::int64_t n = 1;
      for (auto d : shape) n *= d;
      std::vector<std::byte> data(static_cast<std::size_t>(n) * dtype_size(dtype));
      for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 37 + 11);
      const std::string p = path("a.npy");
      write_npy(p, dtype, shape, data.data());
      // numpy aligns the data to 64 bytes.
      const auto size = fs::file_size(p);
      EXPECT_EQ((size - data.size()) % 64, 0u);
      NpyArray a = read_npy(p);
      EXPECT_EQ(a.dtype, dtype);
      EXPECT_EQ(a.shape, shape);
      EXPECT_EQ(a.numel(), n);
      EXPECT_EQ(a.data, data) << dtype_name(dtype) << " rank " << shape.size();
    }
  }
}

TEST_F(NpyTest, WritesTheHeaderNumpyWrites) {
  // np.save(f, np.arange(3, dtype='<f4')): a 118-byte v1 header, 128 bytes before the data.
  const std::string p = path("arange.npy");
  const float data[3] = {0.0f, 1.0f, 2.0f};
  write_npy(p, DType::f32, {3}, data);
  std::ifstream in(p, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), 128u + 12u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(static_cast<unsigned char>(bytes[8]), 118u);
  EXPECT_EQ(bytes[9], '\0');
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
  EXPECT_EQ(bytes.substr(10, dict.size()), dict);
  EXPECT_EQ(bytes.substr(10 + dict.size(), 118 - dict.size() - 1), std::string(118 - dict.size() - 1, ' '));
  EXPECT_EQ(bytes[127], '\n');
  EXPECT_EQ(bytes.substr(128), floats({0.0f, 1.0f, 2.0f}));
  EXPECT_EQ(npy_header_dict(DType::bf16, {2, 3}),
            "{'descr': '<V2', 'fortran_order': False, 'shape': (2, 3), }");
  EXPECT_EQ(npy_header_dict(DType::f16, {}),
            "{'descr': '<f2', 'fortran_order': False, 'shape': (), }");
}

TEST_F(NpyTest, WritesVersion2WhenTheHeaderIsLong) {
  const std::vector<std::int64_t> shape(30000, 1);  // ", 1" each: a header over 65535 bytes
  const float x = 4.5f;
  const std::string p = path("long.npy");
  write_npy(p, DType::f32, shape, &x);
  std::ifstream in(p, std::ios::binary);
  char pre[8];
  in.read(pre, 8);
  EXPECT_EQ(pre[6], 2);
  NpyArray a = read_npy(p);
  EXPECT_EQ(a.shape, shape);
  EXPECT_EQ(a.data.size(), 4u);
  EXPECT_THROW(a.view(), Error);  // rank above 5
}

TEST_F(NpyTest, ReadsHandWrittenHeaders) {
  const std::string body = floats({1.0f, 2.0f, 3.0f});
  // Spaces everywhere, trailing commas, keys in another order, double quotes, no padding.
  for (const std::string& header : {
           std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }\n"),
           std::string("{ 'shape' : ( 3 , ) , 'fortran_order' : False , 'descr' : '<f4' , }   \n"),
           std::string("{\"descr\":\"<f4\",\"fortran_order\":False,\"shape\":(3,)}"),
           std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (3L,)}\t\r\n"),
       }) {
    for (int major : {1, 2, 3}) {
      NpyArray a = read_npy(npy("h.npy", major, header, body));
      EXPECT_EQ(a.dtype, DType::f32) << header;
      EXPECT_EQ(a.shape, std::vector<std::int64_t>{3}) << header;
      EXPECT_EQ(a.data.size(), 12u);
      EXPECT_EQ(std::memcmp(a.data.data(), body.data(), 12), 0);
    }
  }
  NpyArray b = read_npy(npy("b.npy", 1, "{'descr': '|V2', 'fortran_order': False, 'shape': (2, 1)}", "abcd"));
  EXPECT_EQ(b.dtype, DType::bf16);
  EXPECT_EQ(b.shape, (std::vector<std::int64_t>{2, 1}));
  NpyArray c = read_npy(npy("c.npy", 1, "{'descr': 'bfloat16', 'fortran_order': False, 'shape': ()}", "ab"));
  EXPECT_EQ(c.dtype, DType::bf16);
  EXPECT_TRUE(c.shape.empty());
  EXPECT_EQ(c.numel(), 1);
  NpyArray d = read_npy(npy("d.npy", 1, "{'descr': '<f2', 'fortran_order': False, 'shape': (4, 0, 2,), }", ""));
  EXPECT_EQ(d.dtype, DType::f16);
  EXPECT_EQ(d.numel(), 0);
}

TEST_F(NpyTest, ViewIsContiguous) {
  std::vector<float> x(2 * 3 * 4, 1.0f);
  write_npy(path("v.npy"), DType::f32, {2, 3, 4}, x.data());
  NpyArray a = read_npy(path("v.npy"));
  const TensorView t = a.view();
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.data, a.data.data());
  EXPECT_EQ(t.shape[0], 2);
  EXPECT_EQ(t.stride[0], 12);
  EXPECT_EQ(t.stride[1], 4);
  EXPECT_EQ(t.stride[2], 1);
  EXPECT_EQ(t.numel(), 24);
}

TEST_F(NpyTest, RejectsMissingAndUnreadableFiles) {
  expect_read_error(path("does_not_exist.npy"), "no such file");
  fs::create_directories(path("subdir"));
  expect_read_error(path("subdir"), "not a regular file");
}

TEST_F(NpyTest, RejectsBadPreambles) {
  expect_read_error(raw("empty.npy", ""), "magic string");
  expect_read_error(raw("text.npy", "hello world, this is not numpy"), "magic string");
  expect_read_error(raw("short.npy", "\x93NUM"), "magic string");
  expect_read_error(raw("v4.npy", std::string("\x93NUMPY\x04\x00\x10\x00", 10) + std::string(16, ' ')),
                    "unsupported .npy format version 4.0");
  expect_read_error(raw("v11.npy", std::string("\x93NUMPY\x01\x01\x10\x00", 10) + std::string(16, ' ')),
                    "unsupported .npy format version 1.1");
  expect_read_error(raw("nover.npy", "\x93NUMPY"), "truncated header");
  expect_read_error(raw("nolen.npy", std::string("\x93NUMPY\x01\x00\x10", 9)), "truncated header");
  expect_read_error(raw("nolen2.npy", std::string("\x93NUMPY\x02\x00\x10\x00\x00", 11)),
                    "truncated header");
  // The preamble announces a 128-byte header; 7 bytes follow.
  expect_read_error(raw("cut.npy", std::string("\x93NUMPY\x01\x00\x80\x00{'descr'", 17)),
                    "truncated header");
}

TEST_F(NpyTest, RejectsMalformedHeaders) {
  const std::string body = floats({1.0f, 2.0f, 3.0f});
  struct Case {
    std::string header, needle;
  };
  for (const Case& c : std::vector<Case>{
           {"{'fortran_order': False, 'shape': (3,), }", "missing key 'descr'"},
           {"{'descr': '<f4', 'shape': (3,), }", "missing key 'fortran_order'"},
           {"{'descr': '<f4', 'fortran_order': False, }", "missing key 'shape'"},
           {"", "expected '{'"},
           {"'descr': '<f4', 'fortran_order': False, 'shape': (3,)", "expected '{'"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,)", "expected ',' or '}'"},
           {"{'descr': '<f4' 'fortran_order': False, 'shape': (3,)}", "expected ',' or '}'"},
           {"{'descr': '<f4', 'fortran_order': false, 'shape': (3,)}", "True or False"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': [3]}", "expected '('"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 'a')}", "expected a dimension"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (-3,)}", "negative dimension"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
            "does not fit in 64 bits"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3 4)}", "expected ',' or ')'"},
           {"{'descr': '<f4, 'fortran_order': False, 'shape': (3,)}", "expected ',' or '}'"},
           {"{'descr' '<f4', 'fortran_order': False, 'shape': (3,)}", "expected ':'"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}", "unexpected key 'x'"},
           {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}", "appears twice"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,)} junk", "after the closing"},
           {"{descr: '<f4', 'fortran_order': False, 'shape': (3,)}", "quoted string"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,)", "expected ',' or '}'"},
           {"{'descr': '<f\\x34', 'fortran_order': False, 'shape': (3,)}", "escape"},
           {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,)}", "structured"},
           {std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}") + '\0', "after the closing"},
       }) {
    const std::string p = npy("m.npy", 1, c.header, body);
    expect_read_error(p, "malformed header");
    expect_read_error(p, c.needle);
  }
}

TEST_F(NpyTest, RejectsFortranOrder) {
  expect_read_error(npy("f.npy", 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (3,), }",
                        floats({1, 2, 3})),
                    "Fortran order");
}

TEST_F(NpyTest, RejectsUnsupportedDtypes) {
  for (const std::string descr : {"<f8", ">f4", "<i4", "|u1", "<c8", ">f2", "<V4", "|O", ""}) {
    const std::string p = npy("d.npy", 1,
                              "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (3,), }",
                              std::string(24, '\0'));
    expect_read_error(p, "unsupported dtype '" + descr + "'");
    expect_read_error(p, "'<f4' (float32), '<f2' (float16), '<V2' (bfloat16 as ml_dtypes writes it) or '|i1' (int8)");
  }
}

TEST_F(NpyTest, RejectsBodiesThatDoNotFitTheShape) {
  const std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
  expect_read_error(npy("short.npy", 1, header, floats({1, 2})), "shape does not fit the file's size");
  expect_read_error(npy("short2.npy", 1, header, floats({1, 2}) + "x"), "needs 12 bytes");
  expect_read_error(npy("long.npy", 1, header, floats({1, 2, 3, 4})), "shape does not fit the file's size");
  expect_read_error(npy("empty.npy", 1, "{'descr': '<f2', 'fortran_order': False, 'shape': (0, 5), }", "x"),
                    "shape does not fit the file's size");
  expect_read_error(npy("scalar.npy", 1, "{'descr': '<f2', 'fortran_order': False, 'shape': (), }", ""),
                    "shape does not fit the file's size");
  // A shape whose element count (or byte count) overflows 64 bits.
  expect_read_error(npy("huge.npy", 1,
                        "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", ""),
                    "overflows 64 bits");
  expect_read_error(npy("huge2.npy", 1,
                        "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904,), }", ""),
                    "overflows 64 bits");
  // Not an overflow: a zero dimension makes any shape empty.
  NpyArray a = read_npy(npy("zero.npy", 1,
                            "{'descr': '<f4', 'fortran_order': False, 'shape': "
                            "(4294967296, 4294967296, 0), }", ""));
  EXPECT_EQ(a.numel(), 0);
}

TEST_F(NpyTest, ReportsWriteFailures) {
  const float x[2] = {1, 2};
  try {
    write_npy(path("no/such/dir/x.npy"), DType::f32, {2}, x);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open for writing"), std::string::npos) << e.what();
  }
  if (fs::exists("/dev/full")) {
    std::vector<float> big(1 << 20, 1.0f);
    try {
      write_npy("/dev/full", DType::f32, {1 << 20}, big.data());
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("write failed"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(write_npy(path("neg.npy"), DType::f32, {-1}, x), Error);
  EXPECT_THROW(write_npy(path("null.npy"), DType::f32, {2}, nullptr), Error);
  EXPECT_THROW(write_npy(path("big.npy"), DType::f32, {1LL << 62, 4}, x), Error);
  write_npy(path("empty.npy"), DType::f32, {0, 3}, nullptr);  // nothing to write: null is fine
  EXPECT_EQ(read_npy(path("empty.npy")).shape, (std::vector<std::int64_t>{0, 3}));
}

// Every truncation and many corruptions of a valid file: each either reads or throws Error.
TEST_F(NpyTest, NeverCrashesOnGarbage) {
  const float x[6] = {1, 2, 3, 4, 5, 6};
  write_npy(path("ok.npy"), DType::f32, {2, 3}, x);
  std::ifstream in(path("ok.npy"), std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int errors = 0;
  auto attempt = [&](const std::string& bytes) {
    const std::string p = raw("g.npy", bytes);
    try {
      read_npy(p);
    } catch (const Error&) {
      ++errors;
    }
  };
  for (std::size_t n = 0; n < good.size(); ++n) attempt(good.substr(0, n));
  EXPECT_EQ(errors, static_cast<int>(good.size()));  // every truncation is an error
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string bad = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bad[rng() % 128] = static_cast<char>(rng());
    attempt(bad);
  }
  for (int i = 0; i < 200; ++i) {
    std::string bad = std::string("\x93NUMPY", 6) + static_cast<char>(1 + rng() % 3) + '\0';
    const std::size_t n = rng() % 300;
    for (std::size_t j = 0; j < n; ++j) bad += static_cast<char>(rng());
    attempt(bad);
  }
}

}  // namespace
}  // namespace flashgqa
