// A probe, not kept: the AVX-512 exact Q4_K row's weight lookups (formats_dot_x86.h's
// accumulate_nibbles: widen 16 code bytes to 16 lanes with vpmovzxbd, look each nibble's weight
// up with vpermps) against forms that skip the widening shuffle, on a Q4_K-like block (128 code
// bytes, eight runs' scales and offsets as floats), 2048-value rows, ns per row:
//   cur  the kernel's form;
//   bc   16 code bytes broadcast to the four 128-bit lanes (a load), each lane's byte picked by a
//        per-lane shift (vpsrlvd), x read in the matching order (a 4 x 4 transpose of each 16);
//   64   64 code bytes in one load, fixed shifts, vpermt2ps over two runs' tables;
//   cvt  bc's codes converted and scaled (vcvtdq2ps + FMA) instead of looked up.
//   g++ -O3 -march=native -std=c++17 cpu_q4k_lookup_probe.cpp -o probe && ./probe [rows]
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>
#include <random>
// Q4_K-like: per 256 weights: 128 bytes qs + 8 scales/offsets (precomputed floats here)
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
// broadcast 16 bytes, variable shifts; x reordered within each 16-group: x'[16g+d] = x[16g + 4(d%4) + d/4]
__attribute__((noinline)) float dot_bc(const Blk* b, const float* xr, int nb) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  const __m512i sh_lo = _mm512_setr_epi32(0,0,0,0,8,8,8,8,16,16,16,16,24,24,24,24);
  const __m512i sh_hi = _mm512_add_epi32(sh_lo, _mm512_set1_epi32(4));
  for (int i = 0; i < nb; ++i) {
    const Blk& B = b[i]; const float* xb = xr + 256 * i;
    for (int j = 0; j < 4; ++j) {
      __m512 t0 = _mm512_fmadd_ps(tcodes(), _mm512_set1_ps(B.sc[2*j]), _mm512_set1_ps(B.of[2*j]));
      __m512 t1 = _mm512_fmadd_ps(tcodes(), _mm512_set1_ps(B.sc[2*j+1]), _mm512_set1_ps(B.of[2*j+1]));
      for (int k = 0; k < 2; ++k) {
        __m512i by = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)(B.qs + 32*j + 16*k)));
        a0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srlv_epi32(by, sh_lo), t0), _mm512_loadu_ps(xb + 64*j + 16*k), a0);
        a1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srlv_epi32(by, sh_hi), t1), _mm512_loadu_ps(xb + 64*j + 32 + 16*k), a1);
      }
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}
// 64 bytes per load: lanes 0-7 bytes 0..31 (run pair j), lanes 8-15 bytes 32..63 (pair j+1): vpermt2ps with bit 4 from a mask
// x reordered: for group of 64 bytes, shift s (0..7 nibble index within dword: byte s/2, nibble s%2):
__attribute__((noinline)) float dot_64(const Blk* b, const float* xr, int nb) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  const __m512i hi8 = _mm512_setr_epi32(0,0,0,0,0,0,0,0,16,16,16,16,16,16,16,16);
  for (int i = 0; i < nb; ++i) {
    const Blk& B = b[i]; const float* xb = xr + 256 * i;
    for (int jj = 0; jj < 2; ++jj) {
      __m512 t[4];
      for (int r = 0; r < 4; ++r) t[r] = _mm512_fmadd_ps(tcodes(), _mm512_set1_ps(B.sc[4*jj+r]), _mm512_set1_ps(B.of[4*jj+r]));
      // table pair for nibble n: low table t[n] (run 4jj+n, lanes 0-7), high t[2+n] (run 4jj+2+n, lanes 8-15)
      __m512i q = _mm512_loadu_si512(B.qs + 64*jj);
      for (int s = 0; s < 8; ++s) {
        __m512i idx = _mm512_ternarylogic_epi32(_mm512_srli_epi32(q, 4*s), _mm512_set1_epi32(15), hi8, 0xEA); // (a&b)|c
        __m512 w = _mm512_permutex2var_ps(t[s&1], idx, t[2+(s&1)]);
        if (s & 1) a1 = _mm512_fmadd_ps(w, _mm512_loadu_ps(xb + 128*jj + 16*s), a1);
        else a0 = _mm512_fmadd_ps(w, _mm512_loadu_ps(xb + 128*jj + 16*s), a0);
      }
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}
// codes via cvt: broadcast + srlv + and + cvt + fma + fma
__attribute__((noinline)) float dot_cvt(const Blk* b, const float* xr, int nb) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  const __m512i sh_lo = _mm512_setr_epi32(0,0,0,0,8,8,8,8,16,16,16,16,24,24,24,24);
  const __m512i sh_hi = _mm512_add_epi32(sh_lo, _mm512_set1_epi32(4));
  const __m512i m = _mm512_set1_epi32(15);
  for (int i = 0; i < nb; ++i) {
    const Blk& B = b[i]; const float* xb = xr + 256 * i;
    for (int j = 0; j < 4; ++j) {
      __m512 s0 = _mm512_set1_ps(B.sc[2*j]), o0 = _mm512_set1_ps(B.of[2*j]);
      __m512 s1 = _mm512_set1_ps(B.sc[2*j+1]), o1 = _mm512_set1_ps(B.of[2*j+1]);
      for (int k = 0; k < 2; ++k) {
        __m512i by = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)(B.qs + 32*j + 16*k)));
        __m512 c0 = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(by, sh_lo), m));
        __m512 c1 = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(by, sh_hi), m));
        a0 = _mm512_fmadd_ps(_mm512_fmadd_ps(c0, s0, o0), _mm512_loadu_ps(xb + 64*j + 16*k), a0);
        a1 = _mm512_fmadd_ps(_mm512_fmadd_ps(c1, s1, o1), _mm512_loadu_ps(xb + 64*j + 32 + 16*k), a1);
      }
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}
int main(int argc, char** argv) {
  const int K = 2048, nb = K / 256, rows = argc > 1 ? atoi(argv[1]) : 4000;
  std::mt19937 g(1); std::uniform_real_distribution<float> u(-1, 1);
  std::vector<Blk> w((size_t)rows * nb);
  for (auto& B : w) { for (int r = 0; r < 8; ++r) { B.sc[r] = u(g); B.of[r] = u(g); } for (auto& q : B.qs) q = g(); }
  std::vector<float> x(K), xr(K), x64(K);
  for (auto& v : x) v = u(g);
  for (int gq = 0; gq < K / 16; ++gq) for (int d = 0; d < 16; ++d) xr[16*gq + d] = x[16*gq + 4*(d%4) + d/4];
  // dot_64 order: block of 128 weights per 64 bytes: runs r0=4jj..: byte B in 0..63, nibble n; element = 64*(B/32)*... 
  // byte Bt (0..63) at dword lane L=Bt/4 (0..15), within-dword byte c=Bt%4; nibble n; shift s = 2c+n.
  // element index within the 128-group: pair p = Bt/32, byte within pair q = Bt%32 -> element 64p + 32n + q
  for (int gq = 0; gq < K / 128; ++gq) for (int s = 0; s < 8; ++s) for (int L = 0; L < 16; ++L) {
    int c = s / 2, n = s % 2, Bt = 4*L + c, p = Bt / 32, q = Bt % 32;
    x64[128*gq + 16*s + L] = x[128*gq + 64*p + 32*n + q];
  }
  auto bench = [&](const char* name, float (*f)(const Blk*, const float*, int), const float* xx) {
    float s = 0; for (int r = 0; r < rows; ++r) s += f(&w[(size_t)r*nb], xx, nb);
    auto t0 = std::chrono::steady_clock::now();
    for (int rep = 0; rep < 5; ++rep) for (int r = 0; r < rows; ++r) s += f(&w[(size_t)r*nb], xx, nb);
    double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / (5.0 * rows);
    static volatile float sink; sink = s; printf("%-6s %6.1f ns/row  r0=%.6f\n", name, ns, f(&w[0], xx, nb));
  };
  for (int k = 0; k < 2; ++k) { bench("cur", dot_cur, x.data()); bench("bc", dot_bc, xr.data()); bench("64", dot_64, x64.data()); bench("cvt", dot_cvt, xr.data()); }
}
