// FP4 (E2M1) -> FP8 (E4M3) decode of one weight row slice in shared memory, for the W4A8 GEMMs
// (layout and rounding rule: grouped_gemm.h, "W4A8"). Device-only; shared with the fused kernel.
//
// Per group of 16 (NVFP4) / 32 (MXFP4) values the decoder builds an 8-byte lookup table
//   lut[c] = e4m3_rn(e2m1(c) * s'),   c = 0..7 (the magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6),   s' = scale * 2^p
// with four f16x2 multiplies (exact: e2m1 has 2 significant bits, s' at most 4, |product| <= 448 and >=
// 2^-13 for NVFP4, so no f16 rounding) and four cvt.rn.satfinite.e4m3x2.f16x2 (the one rounding). Each
// packed 32-bit word (8 values, bit layout in grouped_gemm.h) then becomes 8 E4M3 bytes with
//   bytes 0-3 = prmt(lut, word & 0x7777) ^ (word & 0x80808080)
//   bytes 4-7 = prmt(lut, (word >> 16) & 0x7777) ^ ((word << 4) & 0x80808080)
// (the sign is XOR-ed so that a negative NVFP4 scale, whose table holds negative values, stays exact).
// NOTES:
// - MXFP4 s' = 2^(e8m0 - 127 + p) is built from its exponent in FP32 (0 below 2^-126) and rounded to f16;
//   below 2^-14 the f16 product may round, but then |value| <= 6 * 2^-15 < 2^-10 and E4M3 gives 0 for
//   both the exact and the rounded product, so the result still equals e4m3_rn(exact).
// - NVFP4 2^p is an f16 power of two, p in [-3, 15] by construction (scales in [2^-9, 448]).
//
// v7 / v8 decode (decode_fp4_row_chunks_v7 / _v8; MEGAMOE_W4A8_DECODE=auto|old|v7|v8, default auto:
// v8 for MXFP4, old for NVFP4): the same
// E4M3 bytes with fewer instructions (docs/grouped_gemm.md "W4A8 v7 decode", "W4A8 v8 decode"). v8 is
// v7's arithmetic below with the old decoder's shared-memory accesses (v7's physical-slot addressing
// conflicts 4-way: decode_fp4_row_chunks_v8 NOTES):
// - 7 instructions per packed word (one shared `word & 0x77777777` for both PRMT selectors).
// - NVFP4 tables by integer arithmetic on the scale bytes, 4 groups (one 32-bit scale word) at a time:
//   with c1 = b + 8p (the E4M3 code of s' = s * 2^p when s > 0 and s' is normal) the table is
//     low  = [0, c1 - 8, c1, c15],  high = [c1 + 8, c15 + 8, c1 + 16, c15 + 16],  c15 = c1 + d(b & 7)
//   where c15 is the code of e4m3_rn(1.5 s') and d(m) = 4, 5, 5, 5, 5, 5, 4, 4 (m = mantissa 0..7: 1.m * 1.5
//   rounded to E4M3 by RNE, ties 1.6875 -> 1.75 and 2.625 -> 2.5). Exact iff every entry is a normal
//   E4M3 <= 448: 16 <= c1 <= 105 and b < 0x80 (c1 = 105 with d = 5 gives 6 s' = 0x7E = 448; 106 = m 2 gives
//   0x7F); the packing's p makes c1 <= 105 hold for every group, so only b >= 8, c1 >= 16 and the sign are
//   tested (one byte-wise subtraction for the 4 groups); a scale word with any group outside takes the f16
//   path (make_fp8_lut) for its 4 groups.
// - MXFP4 tables as mxfp4_lut_by_exponent (the same integer formula, written c * 0x08080800 + K(p)).
// - Shared addresses by physical slot: slot q of the FP4 row holds logical chunk q ^ ((row >> 1) & 3),
//   whose two 16-byte halves h go to output slots 2q + (h ^ (row & 1)); so every LDS / STS is base +
//   immediate, and the scale bytes are permuted once per row by one PRMT (selector 0x3210 ^ k * 0x2222).
//   (v7 only: measured 0.68-0.87x of old, shared-memory bound.)
#pragma once

#if !defined(__CUDACC__)
#include <cuda_runtime.h>  // __host__ / __device__ for the host test (tests/cpu/test_fp4_decode.cpp)
#endif
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>

#define MEGAMOE_FP4_HD __host__ __device__ __forceinline__
#if defined(__CUDACC__)
#define MEGAMOE_FP4_PRAGMA(x) _Pragma(#x)
#else
#define MEGAMOE_FP4_PRAGMA(x)
#endif

namespace megamoe::kernels::sm90 {

// prmt.b32 (default mode, as __byte_perm on the device): byte i of the result is byte (s >> 4i) & 7 of
// {b, a} (a = bytes 0-3), or, when bit 3 of that nibble is set, that byte's sign replicated.
MEGAMOE_FP4_HD uint32_t fp4_byte_perm(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, s);
#else
  const uint64_t bytes = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t result = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t nibble = (s >> (4 * i)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(bytes >> (8 * (nibble & 7u))) & 0xFFu;
    if (nibble & 8u) byte = (byte & 0x80u) ? 0xFFu : 0x00u;
    result |= byte << (8 * i);
  }
  return result;
#endif
}

enum class Fp4Format : int { kNvfp4 = 0, kMxfp4 = 1 };

template <Fp4Format kFormat>
struct Fp4Traits {
  static constexpr int kGroup = kFormat == Fp4Format::kNvfp4 ? 16 : 32;
  static constexpr int kScaleBytesPerRow = 128 / kGroup;  // scale bytes per row per 128-K slice
};

struct Fp8Lut {
  uint32_t low, high;  // E4M3 bytes of magnitudes 0..3 and 4..7
};

MEGAMOE_FP4_HD uint32_t fp8x2_of(__half2 value) {
  return __nv_cvt_halfraw2_to_fp8x2(static_cast<__half2_raw>(value), __NV_SATFINITE, __NV_E4M3);
}

MEGAMOE_FP4_HD Fp8Lut make_fp8_lut(__half2 scale) {
  const __half2 m01 = __floats2half2_rn(0.0f, 0.5f), m23 = __floats2half2_rn(1.0f, 1.5f);
  const __half2 m45 = __floats2half2_rn(2.0f, 3.0f), m67 = __floats2half2_rn(4.0f, 6.0f);
  return {fp8x2_of(__hmul2(m01, scale)) | (fp8x2_of(__hmul2(m23, scale)) << 16),
          fp8x2_of(__hmul2(m45, scale)) | (fp8x2_of(__hmul2(m67, scale)) << 16)};
}

// 8 values of one packed word -> 8 E4M3 bytes (two words, K order).
MEGAMOE_FP4_HD uint2 decode_fp4_word(uint32_t word, const Fp8Lut& lut) {
  const uint32_t low = fp4_byte_perm(lut.low, lut.high, word & 0x7777u) ^ (word & 0x80808080u);
  const uint32_t high = fp4_byte_perm(lut.low, lut.high, (word >> 16) & 0x7777u) ^ ((word << 4) & 0x80808080u);
  return make_uint2(low, high);
}

// s' = 2^(bits - 127 + p) as f16 (see NOTES).
MEGAMOE_FP4_HD __half mxfp4_scale(uint32_t bits, int decode_exponent) {
  const int biased = static_cast<int>(bits) + decode_exponent;
#if defined(__CUDA_ARCH__)
  const float power = __int_as_float(biased << 23);
#else
  float power;
  const int bits_of_power = biased << 23;
  std::memcpy(&power, &bits_of_power, 4);
#endif
  return __float2half_rn(biased >= 1 ? power : 0.0f);
}

// MXFP4 table for s' = 2^e: the E4M3 codes of the magnitudes times 1 (0, .5, 1, 1.5 | 2, 3, 4, 6 =
// 0x00 30 38 3C | 40 44 48 4C) with e added to the exponent field of every nonzero byte. Exact (and
// equal to make_fp8_lut) for e in [-5, 6]: 0.5 * 2^-5 = 2^-6 is E4M3's smallest normal, 6 * 2^6 = 384;
// no byte borrows or carries. p makes e <= 6; smaller e (groups 2^11 below the block's largest) take
// the general path.
MEGAMOE_FP4_HD bool mxfp4_lut_by_exponent(uint32_t bits, int decode_exponent, Fp8Lut& lut) {
  const int e = static_cast<int>(bits) - 127 + decode_exponent;
  if (e < -5) return false;
  lut = {0x3C383000u + static_cast<uint32_t>(8 * e) * 0x01010100u, 0x4C484440u + static_cast<uint32_t>(8 * e) * 0x01010101u};
  return true;
}

// The f16-path NVFP4 tables of two groups (scale_pair = first group's E4M3 byte | second's << 8).
MEGAMOE_FP4_HD void nvfp4_luts_f16(uint32_t scale_pair, int decode_exponent, Fp8Lut& first, Fp8Lut& second) {
  const __half2 pow2 = __half2half2(__ushort_as_half(static_cast<unsigned short>((decode_exponent + 15) << 10)));
  const __half2 scales = __hmul2(
      static_cast<__half2>(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(scale_pair), __NV_E4M3)),
      pow2);
  first = make_fp8_lut(__low2half2(scales));
  second = make_fp8_lut(__high2half2(scales));
}

// The old MXFP4 table of one group: by exponent where exact, else the f16 path.
MEGAMOE_FP4_HD Fp8Lut mxfp4_lut_old(uint32_t bits, int decode_exponent) {
  Fp8Lut lut;
  if (!mxfp4_lut_by_exponent(bits, decode_exponent, lut))
    lut = make_fp8_lut(__half2half2(mxfp4_scale(bits, decode_exponent)));
  return lut;
}

// ---- v7 (see the header comment) ------------------------------------------------------------------

// 8 values of one packed word -> 8 E4M3 bytes, 7 instructions: the two PRMT selectors share one mask
// (prmt reads the low 16 bits of its selector).
// NOTES: on the device this is inline PTX: written in C++, the compiler splits the shared mask back into
// `& 0x7777` and `& 0x77770000` (prmt only reads 16 selector bits), 8 instructions again.
MEGAMOE_FP4_HD uint2 decode_fp4_word_v7(uint32_t word, const Fp8Lut& lut) {
#if defined(__CUDA_ARCH__)
  uint32_t low, high;
  asm("{\n\t.reg .b32 sel, sel_high, sign_high;\n\t"
      "and.b32 sel, %2, 0x77777777;\n\t"
      "shr.u32 sel_high, sel, 16;\n\t"
      "prmt.b32 %0, %3, %4, sel;\n\t"
      "prmt.b32 %1, %3, %4, sel_high;\n\t"
      "lop3.b32 %0, %0, %2, 0x80808080, 0x78;\n\t"  // low ^ (word & 0x80808080)
      "shl.b32 sign_high, %2, 4;\n\t"
      "lop3.b32 %1, %1, sign_high, 0x80808080, 0x78;\n\t"  // high ^ ((word << 4) & 0x80808080)
      "}"
      : "=r"(low), "=r"(high)
      : "r"(word), "r"(lut.low), "r"(lut.high));
  return make_uint2(low, high);
#else
  const uint32_t selectors = word & 0x77777777u;
  const uint32_t low = fp4_byte_perm(lut.low, lut.high, selectors) ^ (word & 0x80808080u);
  const uint32_t high = fp4_byte_perm(lut.low, lut.high, selectors >> 16) ^ ((word << 4) & 0x80808080u);
  return make_uint2(low, high);
#endif
}

// d(m) = code(e4m3_rn(1.5 * s)) - code(s) for a normal E4M3 s of mantissa m (bytes m = 0..7).
constexpr uint32_t kNvfp4ThreeHalvesLow = 0x05050504u, kNvfp4ThreeHalvesHigh = 0x04040505u;

// Per-call constants of the NVFP4 v7 tables for decode exponent p.
struct Nvfp4V7Constants {
  uint32_t lowest;      // min(max(16 - 8p, 8), 128) in every byte: the smallest scale byte of the fast path
  uint32_t low_add;     // [0, 8p - 8, 8p, 8p] (as one integer)
  uint32_t high_add;    // [8p + 8, 8p + 8, 8p + 16, 8p + 16]
};

MEGAMOE_FP4_HD Nvfp4V7Constants nvfp4_v7_constants(int decode_exponent) {
  const int p8 = 8 * decode_exponent;
  // NOTES: the fast path needs b >= 8 (a normal scale: the code arithmetic is wrong for subnormal bytes),
  // c1 = b + 8p >= 16 (0.5 s' normal) and b < 0x80 (a positive scale); c1 <= 105 (6 s' <= 448) is NOT
  // tested: it holds for every group of a block packed by pack_w4a8_expert_weights (p is the largest with
  // 6 max|s| 2^p <= 448), which is what makes v7 == old (tests/cpu/test_fp4_decode.cpp).
  const int lower = 16 - p8 > 8 ? 16 - p8 : 8;
  const int lowest = lower < 128 ? lower : 128;  // <= 128: no borrow between the bytes below
  Nvfp4V7Constants c;
  c.lowest = static_cast<uint32_t>(lowest) * 0x01010101u;
  c.low_add = static_cast<uint32_t>(p8 - 8) * 0x100u + static_cast<uint32_t>(p8) * 0x01010000u;
  c.high_add = static_cast<uint32_t>(p8 + 8) * 0x0101u + static_cast<uint32_t>(p8 + 16) * 0x01010000u;
  return c;
}

// The tables of the 4 groups of one scale word (byte i = group i's E4M3 scale) by code arithmetic;
// false if any group is outside the fast range (the caller then takes nvfp4_luts_f16 for all four).
MEGAMOE_FP4_HD bool nvfp4_luts_v7(uint32_t scales, const Nvfp4V7Constants& c, Fp8Lut (&lut)[4]) {
  // Byte-wise (b | 0x80) - lowest never borrows (lowest <= 128) and has its top bit set iff b & 0x7F >= lowest.
  const uint32_t at_least = ((scales | 0x80808080u) - c.lowest) & ~scales & 0x80808080u;
  const uint32_t mantissas = scales & 0x07070707u;
MEGAMOE_FP4_PRAGMA(unroll)
  for (int pair = 0; pair < 2; ++pair) {
    const uint32_t lanes = fp4_byte_perm(scales, 0u, pair == 0 ? 0x4140u : 0x4342u);  // [b, 0, b', 0]
    // [d(m), 4, d(m'), 4]: nibbles 1 and 3 of the selector are 0
    const uint32_t d = fp4_byte_perm(kNvfp4ThreeHalvesLow, kNvfp4ThreeHalvesHigh, pair == 0 ? mantissas : mantissas >> 16);
    const uint32_t lanes15 = lanes + d;  // [b + d, ., b' + d', .]: c15 - 8p
    lut[2 * pair] = {fp4_byte_perm(lanes, lanes15, 0x4001u) + c.low_add,
                     fp4_byte_perm(lanes, lanes15, 0x4040u) + c.high_add};
    lut[2 * pair + 1] = {fp4_byte_perm(lanes, lanes15, 0x6221u) + c.low_add,
                         fp4_byte_perm(lanes, lanes15, 0x6262u) + c.high_add};
  }
  return at_least == 0x80808080u;
}

// MXFP4 v7 table: mxfp4_lut_by_exponent's integer formula (equal modulo 2^32), returned with its
// exactness test (e >= -5).
struct Mxfp4V7Constants {
  uint32_t low_add, high_add;
  int lowest_bits;  // bits >= lowest_bits <=> e >= -5
};
MEGAMOE_FP4_HD Mxfp4V7Constants mxfp4_v7_constants(int decode_exponent) {
  const uint32_t e8 = static_cast<uint32_t>(8 * (decode_exponent - 127));
  return {0x3C383000u + e8 * 0x01010100u, 0x4C484440u + e8 * 0x01010101u, 122 - decode_exponent};
}
MEGAMOE_FP4_HD bool mxfp4_lut_v7(uint32_t bits, const Mxfp4V7Constants& c, Fp8Lut& lut) {
  lut = {bits * 0x08080800u + c.low_add, bits * 0x08080808u + c.high_add};
  return static_cast<int>(bits) >= c.lowest_bits;
}

// One 16-byte FP4 chunk c (0..3, 32 K-consecutive values) of row `row` -> two 16-byte E4M3 chunks
// 2c, 2c + 1 of the row's output (layouts: decode_fp4_row). scale_bits: NVFP4, the two group-scale bytes
// of the chunk (low byte = first 16 values); MXFP4, the chunk's E8M0 byte.
template <Fp4Format kFormat>
MEGAMOE_FP4_HD void decode_fp4_chunk(const uint8_t* in_row, uint8_t* out_row, int row, int c,
                                                 uint32_t scale_bits, int decode_exponent) {
  const uint4 in = *reinterpret_cast<const uint4*>(in_row + ((c ^ ((row >> 1) & 3)) << 4));
  if constexpr (kFormat == Fp4Format::kNvfp4) {
    Fp8Lut luts[2];
    nvfp4_luts_f16(scale_bits, decode_exponent, luts[0], luts[1]);
MEGAMOE_FP4_PRAGMA(unroll)
    for (int h = 0; h < 2; ++h) {
      const Fp8Lut& lut = luts[h];
      const uint2 first = decode_fp4_word(h == 0 ? in.x : in.z, lut);
      const uint2 second = decode_fp4_word(h == 0 ? in.y : in.w, lut);
      *reinterpret_cast<uint4*>(out_row + (((2 * c + h) ^ (row & 7)) << 4)) =
          make_uint4(first.x, first.y, second.x, second.y);
    }
  } else {
    const Fp8Lut lut = mxfp4_lut_old(scale_bits, decode_exponent);
    const uint2 w0 = decode_fp4_word(in.x, lut), w1 = decode_fp4_word(in.y, lut);
    const uint2 w2 = decode_fp4_word(in.z, lut), w3 = decode_fp4_word(in.w, lut);
    *reinterpret_cast<uint4*>(out_row + (((2 * c) ^ (row & 7)) << 4)) = make_uint4(w0.x, w0.y, w1.x, w1.y);
    *reinterpret_cast<uint4*>(out_row + (((2 * c + 1) ^ (row & 7)) << 4)) = make_uint4(w2.x, w2.y, w3.x, w3.y);
  }
}

// Decodes chunks first_chunk .. first_chunk + kChunks - 1 (16-byte FP4 chunks of 32 values) of row `row`
// of a row-block x 128-K slice (row < 128; row blocks are 8-row aligned, so the swizzles below hold
// relative to any such block base):
//   fp4_tile    [rows][64] bytes, TMA 64-byte swizzle (16-byte chunk c of row r at chunk c ^ ((r >> 1) & 3))
//   scale_tile  [rows][kScaleBytesPerRow] group scale bytes
//   fp8_tile    [rows][128] E4M3, the 128-byte swizzle of a TMA-written wgmma operand (chunk j of row r at
//               chunk j ^ (r & 7)); tile bases 1024-byte aligned.
// kChunks = 4 decodes the whole row (the 2-warpgroup kernels: one row per thread), 2 half a row (the
// small-M kernel: two threads per row). kChunksInFlight: chunks unrolled together (ILP vs registers; the
// caller may hold ~200 accumulator registers while decoding).
template <Fp4Format kFormat, int kChunks, int kChunksInFlight = kChunks>
MEGAMOE_FP4_HD void decode_fp4_row_chunks(const uint8_t* fp4_tile, const uint8_t* scale_tile,
                                                      uint8_t* fp8_tile, int row, int first_chunk,
                                                      int decode_exponent) {
  static_assert(kChunks == 2 || kChunks == 4, "a whole row or half of one");
  const uint8_t* in_row = fp4_tile + row * 64;
  uint8_t* out_row = fp8_tile + row * 128;
  if constexpr (kFormat == Fp4Format::kNvfp4) {
    // 16 bits of group scales per chunk: bytes 2c, 2c + 1 of the row's 8.
    uint32_t words[kChunks / 2];
MEGAMOE_FP4_PRAGMA(unroll)
    for (int i = 0; i < kChunks / 2; ++i)
      words[i] = *reinterpret_cast<const uint32_t*>(scale_tile + row * 8 + 2 * first_chunk + 4 * i);
MEGAMOE_FP4_PRAGMA(unroll kChunksInFlight)
    for (int i = 0; i < kChunks; ++i)
      decode_fp4_chunk<kFormat>(in_row, out_row, row, first_chunk + i, (words[i / 2] >> (16 * (i & 1))) & 0xFFFFu,
                                decode_exponent);
  } else {
    const uint32_t scale_bytes = *reinterpret_cast<const uint32_t*>(scale_tile + row * 4);
MEGAMOE_FP4_PRAGMA(unroll kChunksInFlight)
    for (int i = 0; i < kChunks; ++i)
      decode_fp4_chunk<kFormat>(in_row, out_row, row, first_chunk + i, (scale_bytes >> (8 * (first_chunk + i))) & 0xFFu,
                                decode_exponent);
  }
}

// v7 of decode_fp4_row_chunks (same layouts, same bytes). Here first_chunk .. first_chunk + kChunks - 1
// are PHYSICAL 16-byte slots of the FP4 row (slot q holds logical chunk q ^ ((row >> 1) & 3)); the
// callers' splits (a whole row; slots 0-1 / 2-3 per thread pair) cover every row either way.
// NOTES: each chunk is read into a uint4 by value; a reference into shared memory made the compiler
// issue four 4-byte loads next to the PTX word decoder.
template <Fp4Format kFormat, int kChunks>
MEGAMOE_FP4_HD void decode_fp4_row_chunks_v7(const uint8_t* fp4_tile, const uint8_t* scale_tile,
                                                         uint8_t* fp8_tile, int row, int first_chunk,
                                                         int decode_exponent) {
  static_assert(kChunks == 2 || kChunks == 4, "a whole row or half of one");
  const uint32_t swizzle = static_cast<uint32_t>(row >> 1) & 3u;
  const uint8_t* in = fp4_tile + row * 64 + first_chunk * 16;
  // Logical chunk c = q ^ swizzle writes halves h = 0, 1 to output slots 2q + (h ^ (row & 1)).
  uint8_t* out_first = fp8_tile + row * 128 + first_chunk * 32 + 16 * (row & 1);
  uint8_t* out_second = fp8_tile + row * 128 + first_chunk * 32 + 16 * ((row & 1) ^ 1);
  auto store_chunk = [&](int i, const Fp8Lut& first, const Fp8Lut& second) {
    const uint4 v = *reinterpret_cast<const uint4*>(in + 16 * i);  // one 16-byte load (by value: NOTES)
    const uint2 a = decode_fp4_word_v7(v.x, first), b = decode_fp4_word_v7(v.y, first);
    const uint2 c = decode_fp4_word_v7(v.z, second), d = decode_fp4_word_v7(v.w, second);
    *reinterpret_cast<uint4*>(out_first + 32 * i) = make_uint4(a.x, a.y, b.x, b.y);
    *reinterpret_cast<uint4*>(out_second + 32 * i) = make_uint4(c.x, c.y, d.x, d.y);
  };
  if constexpr (kFormat == Fp4Format::kNvfp4) {
    const Nvfp4V7Constants constants = nvfp4_v7_constants(decode_exponent);
    const uint2 raw = *reinterpret_cast<const uint2*>(scale_tile + row * 8);
    // Bytes 2c, 2c + 1 (logical chunk c) of the row's 8, in slot order: nibble ^= 2 * swizzle, ^= 4 per slot pair.
    const uint32_t selector = 0x3210u ^ (swizzle * 0x2222u) ^ (static_cast<uint32_t>(first_chunk >> 1) * 0x4444u);
MEGAMOE_FP4_PRAGMA(unroll)
    for (int w = 0; w < kChunks / 2; ++w) {
      const uint32_t scales = fp4_byte_perm(raw.x, raw.y, selector ^ (w * 0x4444u));
      Fp8Lut lut[4];
      if (!nvfp4_luts_v7(scales, constants, lut)) {  // rare: some group outside the exact range
        nvfp4_luts_f16(scales & 0xFFFFu, decode_exponent, lut[0], lut[1]);
        nvfp4_luts_f16(scales >> 16, decode_exponent, lut[2], lut[3]);
      }
MEGAMOE_FP4_PRAGMA(unroll)
      for (int i = 0; i < 2; ++i)
        store_chunk(2 * w + i, lut[2 * i], lut[2 * i + 1]);
    }
  } else {
    const Mxfp4V7Constants constants = mxfp4_v7_constants(decode_exponent);
    const uint32_t raw = *reinterpret_cast<const uint32_t*>(scale_tile + row * 4);
    const uint32_t scales =
        fp4_byte_perm(raw, 0u, 0x3210u ^ (swizzle * 0x1111u) ^ (static_cast<uint32_t>(first_chunk >> 1) * 0x2222u));
    Fp8Lut lut[kChunks];
    bool exact = true;
MEGAMOE_FP4_PRAGMA(unroll)
    for (int i = 0; i < kChunks; ++i) exact &= mxfp4_lut_v7((scales >> (8 * i)) & 0xFFu, constants, lut[i]);
    if (!exact) {  // rare: a group 2^11 below the block's largest
MEGAMOE_FP4_PRAGMA(unroll)
      for (int i = 0; i < kChunks; ++i) lut[i] = mxfp4_lut_old((scales >> (8 * i)) & 0xFFu, decode_exponent);
    }
MEGAMOE_FP4_PRAGMA(unroll)
    for (int i = 0; i < kChunks; ++i) store_chunk(i, lut[i], lut[i]);
  }
}

// Decodes row `row` (0..127) of a 128-row x 128-K slice (layouts: decode_fp4_row_chunks).
template <Fp4Format kFormat, int kChunksInFlight = 4>
MEGAMOE_FP4_HD void decode_fp4_row(const uint8_t* fp4_tile, const uint8_t* scale_tile, uint8_t* fp8_tile,
                                               int row, int decode_exponent) {
  decode_fp4_row_chunks<kFormat, 4, kChunksInFlight>(fp4_tile, scale_tile, fp8_tile, row, 0, decode_exponent);
}

// v8 of decode_fp4_row_chunks: v7's arithmetic (decode_fp4_word_v7, nvfp4_luts_v7 / mxfp4_lut_v7 with
// the same fallbacks) with the OLD decoder's shared-memory accesses: the same loads and stores, same
// addresses, same widths and the same per-instruction address pattern across a warp. first_chunk ..
// first_chunk + kChunks - 1 are LOGICAL chunks, as in decode_fp4_row_chunks; logical chunk c is read
// from slot c ^ ((row >> 1) & 3) and written to slots 2c ^ (row & 7), (2c + 1) ^ (row & 7).
// NOTES: why not v7's physical-slot addressing: one LDS.128 / STS.128 instruction is served 8 threads
// (128 bytes) per shared-memory wavefront. With the old addressing the 8 rows r..r+7 of one phase hit 8
// different 16-byte bank groups (FP4 rows are 64 bytes apart, so (r & 1) * 64 + 16 (c ^ ((r >> 1) & 3))
// covers 0..127; E4M3 rows are 128 bytes apart and 16 (j ^ (r & 7)) covers 0..127): 1 wavefront per
// phase. v7 sends every row of a warp to the same slot q: FP4 offsets (r & 1) * 64 + 16 q take 2 bank
// groups (4-way conflict), E4M3 offsets 32 q + 16 (r & 1) take 2 (4-way): 4x the wavefronts on every
// LDS.128 / STS.128 (docs/grouped_gemm.md "W4A8 v8 decode"). The scale bytes need no reordering here:
// scale word i (bytes 4i..4i+3 = groups of logical chunks 2i, 2i + 1) is what nvfp4_luts_v7 takes.
template <Fp4Format kFormat, int kChunks>
MEGAMOE_FP4_HD void decode_fp4_row_chunks_v8(const uint8_t* fp4_tile, const uint8_t* scale_tile, uint8_t* fp8_tile,
                                          int row, int first_chunk, int decode_exponent) {
  static_assert(kChunks == 2 || kChunks == 4, "a whole row or half of one");
  const uint8_t* in_row = fp4_tile + row * 64;
  uint8_t* out_row = fp8_tile + row * 128;
  // Logical chunk c with the tables of its first and second 16 values (MXFP4: the same table twice).
  auto chunk = [&](int c, const Fp8Lut& first, const Fp8Lut& second) {
    const uint4 v = *reinterpret_cast<const uint4*>(in_row + ((c ^ ((row >> 1) & 3)) << 4));  // by value (v7 NOTES)
    const uint2 a = decode_fp4_word_v7(v.x, first), b = decode_fp4_word_v7(v.y, first);
    const uint2 d0 = decode_fp4_word_v7(v.z, second), d1 = decode_fp4_word_v7(v.w, second);
    *reinterpret_cast<uint4*>(out_row + (((2 * c) ^ (row & 7)) << 4)) = make_uint4(a.x, a.y, b.x, b.y);
    *reinterpret_cast<uint4*>(out_row + (((2 * c + 1) ^ (row & 7)) << 4)) = make_uint4(d0.x, d0.y, d1.x, d1.y);
  };
  if constexpr (kFormat == Fp4Format::kNvfp4) {
    const Nvfp4V7Constants constants = nvfp4_v7_constants(decode_exponent);
    // As decode_fp4_row_chunks: one 4-byte load per scale word (bytes 2c .. 2c + 3 of the row's 8).
    uint32_t words[kChunks / 2];
MEGAMOE_FP4_PRAGMA(unroll)
    for (int w = 0; w < kChunks / 2; ++w)
      words[w] = *reinterpret_cast<const uint32_t*>(scale_tile + row * 8 + 2 * first_chunk + 4 * w);
MEGAMOE_FP4_PRAGMA(unroll)
    for (int w = 0; w < kChunks / 2; ++w) {
      Fp8Lut lut[4];
      if (!nvfp4_luts_v7(words[w], constants, lut)) {  // rare: some group outside the exact range
        nvfp4_luts_f16(words[w] & 0xFFFFu, decode_exponent, lut[0], lut[1]);
        nvfp4_luts_f16(words[w] >> 16, decode_exponent, lut[2], lut[3]);
      }
MEGAMOE_FP4_PRAGMA(unroll)
      for (int i = 0; i < 2; ++i) chunk(first_chunk + 2 * w + i, lut[2 * i], lut[2 * i + 1]);
    }
  } else {
    const Mxfp4V7Constants constants = mxfp4_v7_constants(decode_exponent);
    const uint32_t scale_bytes = *reinterpret_cast<const uint32_t*>(scale_tile + row * 4);
    Fp8Lut lut[kChunks];
    bool exact = true;
MEGAMOE_FP4_PRAGMA(unroll)
    for (int i = 0; i < kChunks; ++i)
      exact &= mxfp4_lut_v7((scale_bytes >> (8 * (first_chunk + i))) & 0xFFu, constants, lut[i]);
    if (!exact) {  // rare: a group 2^11 below the block's largest
MEGAMOE_FP4_PRAGMA(unroll)
      for (int i = 0; i < kChunks; ++i)
        lut[i] = mxfp4_lut_old((scale_bytes >> (8 * (first_chunk + i))) & 0xFFu, decode_exponent);
    }
MEGAMOE_FP4_PRAGMA(unroll)
    for (int i = 0; i < kChunks; ++i) chunk(first_chunk + i, lut[i], lut[i]);
  }
}

// The FP4 decoders the kernels can run (MEGAMOE_W4A8_DECODE; grouped_gemm.h w4a8_decode).
// kAuto (the default): v8 for MXFP4, old for NVFP4 (session 15 call G, one H200, 32 experts: v8 / old = 1.00-1.05x
// for MXFP4 at 8 / 32 / 1024 rows, 0.97-1.02x for NVFP4; docs/grouped_gemm.md "W4A8 v8 decode").
enum class Fp4Decoder : int { kOld = 0, kV7 = 1, kV8 = 2, kAuto = 3 };

template <Fp4Format kFormat>
__device__ __forceinline__ int resolve_fp4_decoder(int decoder) {
  if (decoder != static_cast<int>(Fp4Decoder::kAuto)) return decoder;
  return static_cast<int>(kFormat == Fp4Format::kMxfp4 ? Fp4Decoder::kV8 : Fp4Decoder::kOld);
}

// The decoder the kernels run: auto (default), old, v7 or v8. `decoder` is uniform over the CTA.
template <Fp4Format kFormat, int kChunksInFlight = 4>
__device__ __forceinline__ void decode_fp4_row_select(int decoder, const uint8_t* fp4_tile, const uint8_t* scale_tile,
                                                      uint8_t* fp8_tile, int row, int decode_exponent) {
decoder = resolve_fp4_decoder<kFormat>(decoder);
#if defined(MEGAMOE_FP4_DECODE_FORCE)  // SASS counting only (-DMEGAMOE_FP4_DECODE_FORCE=0|1|2): one decoder compiled
  decoder = MEGAMOE_FP4_DECODE_FORCE;
#endif
  if (decoder == static_cast<int>(Fp4Decoder::kV7))
    decode_fp4_row_chunks_v7<kFormat, 4>(fp4_tile, scale_tile, fp8_tile, row, 0, decode_exponent);
  else if (decoder == static_cast<int>(Fp4Decoder::kV8))
    decode_fp4_row_chunks_v8<kFormat, 4>(fp4_tile, scale_tile, fp8_tile, row, 0, decode_exponent);
  else
    decode_fp4_row<kFormat, kChunksInFlight>(fp4_tile, scale_tile, fp8_tile, row, decode_exponent);
}

// The same for the small-M kernel's half rows (first_chunk: LOGICAL chunk for old and v8, physical slot for
// v7; each covers the row between a thread pair).
template <Fp4Format kFormat>
__device__ __forceinline__ void decode_fp4_half_row_select(int decoder, const uint8_t* fp4_tile,
                                                           const uint8_t* scale_tile, uint8_t* fp8_tile, int row,
                                                           int first_chunk, int decode_exponent) {
decoder = resolve_fp4_decoder<kFormat>(decoder);
#if defined(MEGAMOE_FP4_DECODE_FORCE)
  decoder = MEGAMOE_FP4_DECODE_FORCE;
#endif
  if (decoder == static_cast<int>(Fp4Decoder::kV7))
    decode_fp4_row_chunks_v7<kFormat, 2>(fp4_tile, scale_tile, fp8_tile, row, first_chunk, decode_exponent);
  else if (decoder == static_cast<int>(Fp4Decoder::kV8))
    decode_fp4_row_chunks_v8<kFormat, 2>(fp4_tile, scale_tile, fp8_tile, row, first_chunk, decode_exponent);
  else
    decode_fp4_row_chunks<kFormat, 2>(fp4_tile, scale_tile, fp8_tile, row, first_chunk, decode_exponent);
}

}  // namespace megamoe::kernels::sm90
