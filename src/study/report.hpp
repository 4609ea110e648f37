// What `flashgqa bench` measured, and its renderings: a text table, CSV, JSON and an SVG chart of
// time against sequence length on log axes (one line per algorithm, dashed roofline predictions).
#pragma once

#include <string>
#include <vector>

#include "study/roofline.hpp"

namespace flashgqa::study {

struct BenchRow {
  std::string algo;
  Shape shape;
  bool causal = false;
  bool skipped = false;
  std::string skip_reason;  // when skipped
  int repeats = 0;
  double median_s = 0, min_s = 0, max_s = 0;
  double gflops = 0;         // FLOPs / median
  double percent_peak = 0;   // of the measured bf16 peak
  double predicted_s = 0;    // roofline max(t_math, t_comms)
  double intensity = 0;      // FLOP per byte
  double memory_bytes = 0;   // allocated at once
  double measured_over_predicted() const { return predicted_s > 0 ? median_s / predicted_s : 0; }
};

struct LongestFit {
  std::string algo;
  std::int64_t length = 0;  // longest power-of-two T = S whose memory fits
};

struct BenchReport {
  std::string cpu;
  int threads = 0;
  Machine machine;  // measured ceilings
  std::vector<BenchRow> rows;
  std::vector<LongestFit> longest;
  double available_memory = 0;  // bytes
};

std::string to_table(const BenchReport& r);
std::string to_csv(const BenchReport& r);
std::string to_json(const BenchReport& r);
std::string to_svg(const BenchReport& r);

// JSON string literal with escapes.
std::string json_quote(const std::string& s);

}  // namespace flashgqa::study
