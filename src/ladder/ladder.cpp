// The one place that maps an Algorithm to its rung.
#include "ladder/ladder.hpp"

namespace flashgqa {

void run_algorithm(const Problem& p, Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::naive: return naive_attention(p);
    case Algorithm::chunked_unstable: return chunked_unstable_attention(p);
    case Algorithm::chunked: return chunked_attention(p);
    case Algorithm::kernel1: return kernel1_attention(p);
    case Algorithm::flash: return flash_attention(p);
  }
}

}  // namespace flashgqa
