// The sampler of generation (zoi/decoder/reference.py::sample), in float64: greedy (lowest id on
// ties) or temperature -> top-k -> top-p -> a counter-based draw (splitmix64 of seed and index).
// Compiled once with the base flags: its cost is a sort over the vocabulary, not arithmetic.
#pragma once
#include <cstdint>

namespace zoi {

// logits [V] of one sequence; temp <= 0 or top_k == 1: argmax. idx [V] int32 and cum [V] double:
// the caller's scratch. Returns the token id.
int32_t sample_token(const float* logits, int V, double temp, long top_k, double top_p, uint64_t seed,
                     int64_t index, int32_t* idx, double* cum);

}  // namespace zoi
