#include "study/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

namespace flashgqa::study {
namespace {

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

// A finite number for JSON (null otherwise).
std::string json_number(double x) { return std::isfinite(x) ? fmt("%.6g", x) : "null"; }

const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"};

}  // namespace

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(c));
          out += esc;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string to_table(const BenchReport& r) {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "%-17s %6s %11s %9s %7s %11s %9s  %s\n", "algo", "T=S", "time ms",
                "GFLOP/s", "% peak", "predict ms", "meas/pred", "note");
  os << line;
  for (const BenchRow& b : r.rows) {
    if (b.skipped) {
      std::snprintf(line, sizeof line, "%-17s %6lld %11s %9s %7s %11.3f %9s  skipped: %s\n", b.algo.c_str(),
                    static_cast<long long>(b.shape.T), "-", "-", "-", b.predicted_s * 1e3, "-",
                    b.skip_reason.c_str());
    } else {
      std::snprintf(line, sizeof line, "%-17s %6lld %11.3f %9.1f %7.1f %11.3f %9.2f  %s\n", b.algo.c_str(),
                    static_cast<long long>(b.shape.T), b.median_s * 1e3, b.gflops, b.percent_peak,
                    b.predicted_s * 1e3, b.measured_over_predicted(),
                    b.predicted_s > 0 && b.intensity >= r.machine.flops / r.machine.bandwidth ? "compute-bound"
                                                                                             : "memory-bound");
    }
    os << line;
  }
  for (const LongestFit& f : r.longest)
    os << "longest T=S that fits in " << fmt("%.1f", r.available_memory / (1 << 30)) << " GiB: " << f.algo
       << " " << f.length << "\n";
  return os.str();
}

std::string to_csv(const BenchReport& r) {
  std::ostringstream os;
  os << "algo,B,K,G,T,S,H,causal,skipped,repeats,median_s,min_s,max_s,gflops,percent_peak,predicted_s,"
        "measured_over_predicted,intensity,memory_bytes,note\n";
  for (const BenchRow& b : r.rows) {
    std::string note = b.skip_reason;
    std::replace(note.begin(), note.end(), ',', ';');
    std::replace(note.begin(), note.end(), '"', '\'');
    os << b.algo << ',' << b.shape.B << ',' << b.shape.K << ',' << b.shape.G << ',' << b.shape.T << ','
       << b.shape.S << ',' << b.shape.H << ',' << (b.causal ? 1 : 0) << ',' << (b.skipped ? 1 : 0) << ','
       << b.repeats << ',' << fmt("%.6g", b.median_s) << ',' << fmt("%.6g", b.min_s) << ','
       << fmt("%.6g", b.max_s) << ',' << fmt("%.6g", b.gflops) << ',' << fmt("%.4g", b.percent_peak) << ','
       << fmt("%.6g", b.predicted_s) << ',' << fmt("%.4g", b.measured_over_predicted()) << ','
       << fmt("%.6g", b.intensity) << ',' << fmt("%.6g", b.memory_bytes) << ',' << note << '\n';
  }
  return os.str();
}

std::string to_json(const BenchReport& r) {
  std::ostringstream os;
  os << "{\n  \"cpu\": " << json_quote(r.cpu) << ",\n  \"threads\": " << r.threads
     << ",\n  \"peak_flops\": " << json_number(r.machine.flops)
     << ",\n  \"dram_bytes_per_s\": " << json_number(r.machine.bandwidth)
     << ",\n  \"available_memory_bytes\": " << json_number(r.available_memory) << ",\n  \"rows\": [";
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const BenchRow& b = r.rows[i];
    os << (i ? "," : "") << "\n    {\"algo\": " << json_quote(b.algo) << ", \"shape\": [" << b.shape.B << ", "
       << b.shape.K << ", " << b.shape.G << ", " << b.shape.T << ", " << b.shape.S << ", " << b.shape.H
       << "], \"causal\": " << (b.causal ? "true" : "false") << ", \"skipped\": " << (b.skipped ? "true" : "false")
       << ", \"skip_reason\": " << json_quote(b.skip_reason) << ", \"repeats\": " << b.repeats
       << ", \"median_s\": " << json_number(b.median_s) << ", \"min_s\": " << json_number(b.min_s)
       << ", \"max_s\": " << json_number(b.max_s) << ", \"gflops\": " << json_number(b.gflops)
       << ", \"percent_peak\": " << json_number(b.percent_peak) << ", \"predicted_s\": " << json_number(b.predicted_s)
       << ", \"measured_over_predicted\": " << json_number(b.measured_over_predicted())
       << ", \"intensity\": " << json_number(b.intensity) << ", \"memory_bytes\": " << json_number(b.memory_bytes)
       << "}";
  }
  os << "\n  ],\n  \"longest_fit\": {";
  for (std::size_t i = 0; i < r.longest.size(); ++i)
    os << (i ? ", " : "") << json_quote(r.longest[i].algo) << ": " << r.longest[i].length;
  os << "}\n}\n";
  return os.str();
}

std::string to_svg(const BenchReport& r) {
  // Log-log axes over the measured and predicted times.
  constexpr double kW = 720, kH = 480, kLeft = 70, kRight = 170, kTop = 30, kBottom = 50;
  double lmin = 1e300, lmax = 0, tmin = 1e300, tmax = 0;
  std::map<std::string, std::vector<const BenchRow*>> by_algo;
  std::vector<std::string> order;
  for (const BenchRow& b : r.rows) {
    if (!by_algo.count(b.algo)) order.push_back(b.algo);
    by_algo[b.algo].push_back(&b);
    lmin = std::min(lmin, static_cast<double>(b.shape.T));
    lmax = std::max(lmax, static_cast<double>(b.shape.T));
    for (double t : {b.skipped ? 0.0 : b.median_s, b.predicted_s})
      if (t > 0) tmin = std::min(tmin, t), tmax = std::max(tmax, t);
  }
  if (lmax <= 0 || tmax <= 0) lmin = 1, lmax = 2, tmin = 1e-3, tmax = 1;
  if (lmax <= lmin) lmax = lmin * 2;
  if (tmax <= tmin) tmax = tmin * 10;
  const double lx0 = std::log10(lmin), lx1 = std::log10(lmax);
  const double ly0 = std::floor(std::log10(tmin)), ly1 = std::ceil(std::log10(tmax));
  auto X = [&](double l) { return kLeft + (std::log10(l) - lx0) / (lx1 - lx0) * (kW - kLeft - kRight); };
  auto Y = [&](double t) { return kH - kBottom - (std::log10(t) - ly0) / (ly1 - ly0) * (kH - kTop - kBottom); };
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << kH
     << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  os << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  os << "<text x=\"" << kW / 2 << "\" y=\"18\" text-anchor=\"middle\">attention time vs sequence length ("
     << r.threads << " threads; dashed: roofline prediction)</text>\n";
  // Axes, decade grid lines and labels.
  for (double e = ly0; e <= ly1; ++e) {
    const double y = Y(std::pow(10.0, e));
    os << "<line x1=\"" << kLeft << "\" y1=\"" << y << "\" x2=\"" << kW - kRight << "\" y2=\"" << y
       << "\" stroke=\"#ddd\"/>\n<text x=\"" << kLeft - 6 << "\" y=\"" << y + 4
       << "\" text-anchor=\"end\">1e" << static_cast<int>(e) << " s</text>\n";
  }
  for (const BenchRow* b : by_algo.empty() ? std::vector<const BenchRow*>{} : by_algo[order[0]]) {
    const double x = X(static_cast<double>(b->shape.T));
    os << "<line x1=\"" << x << "\" y1=\"" << kTop << "\" x2=\"" << x << "\" y2=\"" << kH - kBottom
       << "\" stroke=\"#eee\"/>\n<text x=\"" << x << "\" y=\"" << kH - kBottom + 16
       << "\" text-anchor=\"middle\">" << b->shape.T << "</text>\n";
  }
  os << "<text x=\"" << (kLeft + kW - kRight) / 2 << "\" y=\"" << kH - 12
     << "\" text-anchor=\"middle\">T = S</text>\n";
  os << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << kW - kLeft - kRight << "\" height=\""
     << kH - kTop - kBottom << "\" fill=\"none\" stroke=\"black\"/>\n";
  for (std::size_t a = 0; a < order.size(); ++a) {
    const char* color = kColors[a % (sizeof kColors / sizeof kColors[0])];
    std::string measured, predicted;
    for (const BenchRow* b : by_algo[order[a]]) {
      const double x = X(static_cast<double>(b->shape.T));
      if (!b->skipped && b->median_s > 0) measured += fmt("%.1f,", x) + fmt("%.1f ", Y(b->median_s));
      if (b->predicted_s > 0) predicted += fmt("%.1f,", x) + fmt("%.1f ", Y(b->predicted_s));
    }
    if (!measured.empty())
      os << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"" << measured
         << "\"/>\n";
    if (!predicted.empty())
      os << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-dasharray=\"5,4\" points=\""
         << predicted << "\"/>\n";
    const double ly = kTop + 16 + 18 * static_cast<double>(a);
    os << "<line x1=\"" << kW - kRight + 12 << "\" y1=\"" << ly - 4 << "\" x2=\"" << kW - kRight + 36
       << "\" y2=\"" << ly - 4 << "\" stroke=\"" << color << "\" stroke-width=\"2\"/>\n<text x=\""
       << kW - kRight + 42 << "\" y=\"" << ly << "\">" << order[a] << "</text>\n";
  }
  os << "</svg>\n";
  return os.str();
}

}  // namespace flashgqa::study
