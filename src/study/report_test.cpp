// The bench report's CSV, JSON and SVG are well-formed (checked by small validators here, so the test
// needs nothing outside the project).
#include "study/report.hpp"

#include <gtest/gtest.h>

#include <cctype>
#include <sstream>
#include <vector>

namespace flashgqa::study {
namespace {

BenchReport sample() {
  BenchReport r;
  r.cpu = "Test \"CPU\", model\t1";
  r.threads = 2;
  r.machine = {4.6e11, 3e10};
  r.available_memory = 2e10;
  for (std::int64_t T : {256, 512, 1024})
    for (const char* algo : {"naive", "flash"}) {
      BenchRow b;
      b.algo = algo;
      b.shape = {1, 2, 4, T, T, 128};
      b.repeats = 3;
      b.median_s = 1e-4 * static_cast<double>(T);
      b.min_s = b.median_s * 0.9;
      b.max_s = b.median_s * 1.1;
      b.gflops = 100;
      b.percent_peak = 21.7;
      b.predicted_s = b.median_s / 2;
      b.intensity = 50;
      b.memory_bytes = 1e6;
      if (T == 1024 && b.algo == "naive") b.skipped = true, b.skip_reason = "over the time budget, \"5 s\"";
      r.rows.push_back(b);
    }
  r.longest = {{"naive", 65536}, {"flash", 1 << 20}};
  return r;
}

// A minimal JSON validator (RFC 8259 grammar, no semantics).
struct Json {
  const std::string& s;
  std::size_t i = 0;
  void ws() { while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i; }
  bool lit(const char* w) {
    const std::string t(w);
    if (s.compare(i, t.size(), t) != 0) return false;
    i += t.size();
    return true;
  }
  bool string() {
    if (s[i] != '"') return false;
    for (++i; i < s.size(); ++i) {
      if (s[i] == '"') return ++i, true;
      if (static_cast<unsigned char>(s[i]) < 0x20) return false;
      if (s[i] == '\\') ++i;
    }
    return false;
  }
  bool number() {
    const std::size_t start = i;
    if (s[i] == '-') ++i;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.' || s[i] == 'e' ||
                            s[i] == 'E' || s[i] == '+' || s[i] == '-'))
      ++i;
    return i > start;
  }
  bool value() {
    ws();
    if (i >= s.size()) return false;
    bool ok;
    if (s[i] == '{') {
      ++i, ws();
      if (s[i] == '}') return ++i, true;
      do {
        ws();
        if (!string()) return false;
        ws();
        if (s[i++] != ':' || !value()) return false;
        ws();
      } while (s[i] == ',' && ++i);
      ok = s[i++] == '}';
    } else if (s[i] == '[') {
      ++i, ws();
      if (s[i] == ']') return ++i, true;
      do {
        if (!value()) return false;
        ws();
      } while (s[i] == ',' && ++i);
      ok = s[i++] == ']';
    } else if (s[i] == '"') {
      ok = string();
    } else {
      ok = lit("true") || lit("false") || lit("null") || number();
    }
    ws();
    return ok;
  }
};

TEST(Report, JsonIsWellFormed) {
  const std::string json = to_json(sample());
  Json parser{json};
  EXPECT_TRUE(parser.value() && parser.i == json.size()) << json;
  EXPECT_NE(json.find("\"longest_fit\""), std::string::npos);
  Json broken_parser{"{\"a\": [1, 2,}"};
  EXPECT_FALSE(broken_parser.value());  // the validator can fail
}

TEST(Report, CsvHasOneHeaderAndEqualColumns) {
  const std::string csv = to_csv(sample());
  std::istringstream in(csv);
  std::string line;
  std::vector<std::size_t> columns;
  while (std::getline(in, line)) columns.push_back(static_cast<std::size_t>(std::count(line.begin(), line.end(), ',')));
  ASSERT_EQ(columns.size(), 1 + sample().rows.size());
  for (std::size_t c : columns) EXPECT_EQ(c, columns[0]);
  EXPECT_EQ(csv.rfind("algo,B,K,G,T,S,H,", 0), 0u);
}

TEST(Report, SvgTagsBalance) {
  const std::string svg = to_svg(sample());
  std::vector<std::string> stack;
  for (std::size_t i = svg.find('<'); i != std::string::npos; i = svg.find('<', i + 1)) {
    const std::size_t end = svg.find('>', i);
    ASSERT_NE(end, std::string::npos);
    const std::string tag = svg.substr(i + 1, end - i - 1);
    if (tag.back() == '/') continue;  // self-closing
    std::string name = tag.substr(0, tag.find(' '));
    if (name[0] == '/') {
      ASSERT_FALSE(stack.empty()) << name;
      EXPECT_EQ(stack.back(), name.substr(1));
      stack.pop_back();
    } else {
      stack.push_back(name);
    }
  }
  EXPECT_TRUE(stack.empty());
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("polyline"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
}

TEST(Report, TableMentionsSkipsAndLongestFits) {
  const std::string table = to_table(sample());
  EXPECT_NE(table.find("skipped: over the time budget"), std::string::npos);
  EXPECT_NE(table.find("naive 65536"), std::string::npos);
}

}  // namespace
}  // namespace flashgqa::study
