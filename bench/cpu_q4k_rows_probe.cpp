// A probe, not kept: the AVX-512 exact Q4_K row (formats_dot_x86.h's table lookups) for one row
// at a time against two and four rows that share each load of x (a 2048-value row reads 8 KB of
// x from L1 for 1.1 KB of weights), on a Q4_K-like block (128 code bytes, eight runs' scales and
// offsets as floats), ns per row, in and out of the caches (4,000 and 40,000 rows):
//   g++ -O3 -march=native -std=c++17 cpu_q4k_rows_probe.cpp -o probe && ./probe [rows]
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include <random>
struct Blk { float sc[8], of[8]; uint8_t qs[128]; };
static inline __m512 tcodes() { return _mm512_setr_ps(0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15); }
__attribute__((noinline)) float dot_cur(const Blk* b, const float* x, int nb) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  for (int i = 0; i < nb; ++i) {
    const Blk& B = b[i]; const float* xb = x + 256 * i;
    for (int j = 0; j < 4; ++j) {
      __m512 t0 = _mm512_fmadd_ps(tcodes(), _mm512_set1_ps(B.sc[2*j]), _mm512_set1_ps(B.of[2*j]));
      __m512 t1 = _mm512_fmadd_ps(tcodes(), _mm512_set1_ps(B.sc[2*j+1]), _mm512_set1_ps(B.of[2*j+1]));
      for (int k = 0; k < 2; ++k) {
        __m512i by = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(B.qs + 32*j + 16*k)));
        a0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(by, t0), _mm512_loadu_ps(xb + 64*j + 16*k), a0);
        a1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(by, 4), t1), _mm512_loadu_ps(xb + 64*j + 32 + 16*k), a1);
      }
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}
template <int R>
__attribute__((noinline)) void dot_rows(const Blk* const* b, const float* x, int nb, float* out) {
  __m512 a0[R], a1[R];
  for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm512_setzero_ps();
  for (int i = 0; i < nb; ++i) {
    const float* xb = x + 256 * i;
    for (int j = 0; j < 4; ++j) {
      __m512 t0[R], t1[R];
      for (int r = 0; r < R; ++r) {
        t0[r] = _mm512_fmadd_ps(tcodes(), _mm512_set1_ps(b[r][i].sc[2*j]), _mm512_set1_ps(b[r][i].of[2*j]));
        t1[r] = _mm512_fmadd_ps(tcodes(), _mm512_set1_ps(b[r][i].sc[2*j+1]), _mm512_set1_ps(b[r][i].of[2*j+1]));
      }
      for (int k = 0; k < 2; ++k) {
        const __m512 xl = _mm512_loadu_ps(xb + 64*j + 16*k), xh = _mm512_loadu_ps(xb + 64*j + 32 + 16*k);
        for (int r = 0; r < R; ++r) {
          __m512i by = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(b[r][i].qs + 32*j + 16*k)));
          a0[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(by, t0[r]), xl, a0[r]);
          a1[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(by, 4), t1[r]), xh, a1[r]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0[r], a1[r]));
}
int main(int argc, char** argv) {
  const int K = 2048, nb = K / 256, rows = argc > 1 ? atoi(argv[1]) : 4000;
  std::mt19937 g(1); std::uniform_real_distribution<float> u(-1, 1);
  std::vector<Blk> w((size_t)rows * nb);
  for (auto& B : w) { for (int r = 0; r < 8; ++r) { B.sc[r] = u(g); B.of[r] = u(g); } for (auto& q : B.qs) q = g(); }
  std::vector<float> x(K); for (auto& v : x) v = u(g);
  static volatile float sink;
  for (int rep0 = 0; rep0 < 3; ++rep0) {
    auto t0 = std::chrono::steady_clock::now(); float s = 0;
    for (int rep = 0; rep < 5; ++rep) for (int r = 0; r < rows; ++r) s += dot_cur(&w[(size_t)r*nb], x.data(), nb);
    double ns1 = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / (5.0 * rows);
    sink = s;
    auto run = [&](auto tag) {
      constexpr int R = decltype(tag)::value; float o[R];
      auto t = std::chrono::steady_clock::now(); float s2 = 0;
      for (int rep = 0; rep < 5; ++rep) for (int r = 0; r + R <= rows; r += R) {
        const Blk* p[R]; for (int q = 0; q < R; ++q) p[q] = &w[(size_t)(r+q)*nb];
        dot_rows<R>(p, x.data(), nb, o); s2 += o[0];
      }
      sink = s2;
      return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t).count() / (5.0 * rows);
    };
    double n2 = run(std::integral_constant<int,2>{}), n4 = run(std::integral_constant<int,4>{});
    const Blk* p2[2] = {&w[0], &w[nb]}; float o2[2]; dot_rows<2>(p2, x.data(), nb, o2);
    printf("rows %d: 1-row %.1f ns/row, 2-row %.1f, 4-row %.1f   check %.6f %.6f | %.6f %.6f\n", rows, ns1, n2, n4,
           dot_cur(&w[0], x.data(), nb), dot_cur(&w[nb], x.data(), nb), o2[0], o2[1]);
  }
}
