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
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace megamoe::kernels::sm90 {

enum class Fp4Format : int { kNvfp4 = 0, kMxfp4 = 1 };

template <Fp4Format kFormat>
struct Fp4Traits {
  static constexpr int kGroup = kFormat == Fp4Format::kNvfp4 ? 16 : 32;
  static constexpr int kScaleBytesPerRow = 128 / kGroup;  // scale bytes per row per 128-K slice
};

struct Fp8Lut {
  uint32_t low, high;  // E4M3 bytes of magnitudes 0..3 and 4..7
};

__device__ __forceinline__ uint32_t fp8x2_of(__half2 value) {
  return __nv_cvt_halfraw2_to_fp8x2(static_cast<__half2_raw>(value), __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ Fp8Lut make_fp8_lut(__half2 scale) {
  const __half2 m01 = __floats2half2_rn(0.0f, 0.5f), m23 = __floats2half2_rn(1.0f, 1.5f);
  const __half2 m45 = __floats2half2_rn(2.0f, 3.0f), m67 = __floats2half2_rn(4.0f, 6.0f);
  return {fp8x2_of(__hmul2(m01, scale)) | (fp8x2_of(__hmul2(m23, scale)) << 16),
          fp8x2_of(__hmul2(m45, scale)) | (fp8x2_of(__hmul2(m67, scale)) << 16)};
}

// 8 values of one packed word -> 8 E4M3 bytes (two words, K order).
__device__ __forceinline__ uint2 decode_fp4_word(uint32_t word, const Fp8Lut& lut) {
  const uint32_t low = __byte_perm(lut.low, lut.high, word & 0x7777u) ^ (word & 0x80808080u);
  const uint32_t high = __byte_perm(lut.low, lut.high, (word >> 16) & 0x7777u) ^ ((word << 4) & 0x80808080u);
  return make_uint2(low, high);
}

// s' = 2^(bits - 127 + p) as f16 (see NOTES).
__device__ __forceinline__ __half mxfp4_scale(uint32_t bits, int decode_exponent) {
  const int biased = static_cast<int>(bits) + decode_exponent;
  return __float2half_rn(biased >= 1 ? __int_as_float(biased << 23) : 0.0f);
}

// MXFP4 table for s' = 2^e: the E4M3 codes of the magnitudes times 1 (0, .5, 1, 1.5 | 2, 3, 4, 6 =
// 0x00 30 38 3C | 40 44 48 4C) with e added to the exponent field of every nonzero byte. Exact (and
// equal to make_fp8_lut) for e in [-5, 6]: 0.5 * 2^-5 = 2^-6 is E4M3's smallest normal, 6 * 2^6 = 384;
// no byte borrows or carries. p makes e <= 6; smaller e (groups 2^11 below the block's largest) take
// the general path.
__device__ __forceinline__ bool mxfp4_lut_by_exponent(uint32_t bits, int decode_exponent, Fp8Lut& lut) {
  const int e = static_cast<int>(bits) - 127 + decode_exponent;
  if (e < -5) return false;
  lut = {0x3C383000u + static_cast<uint32_t>(8 * e) * 0x01010100u, 0x4C484440u + static_cast<uint32_t>(8 * e) * 0x01010101u};
  return true;
}

// One 16-byte FP4 chunk c (0..3, 32 K-consecutive values) of row `row` -> two 16-byte E4M3 chunks
// 2c, 2c + 1 of the row's output (layouts: decode_fp4_row). scale_bits: NVFP4, the two group-scale bytes
// of the chunk (low byte = first 16 values); MXFP4, the chunk's E8M0 byte.
template <Fp4Format kFormat>
__device__ __forceinline__ void decode_fp4_chunk(const uint8_t* in_row, uint8_t* out_row, int row, int c,
                                                 uint32_t scale_bits, int decode_exponent) {
  const uint4 in = *reinterpret_cast<const uint4*>(in_row + ((c ^ ((row >> 1) & 3)) << 4));
  if constexpr (kFormat == Fp4Format::kNvfp4) {
    const __half2 pow2 = __half2half2(__ushort_as_half(static_cast<unsigned short>((decode_exponent + 15) << 10)));
    const __half2 scales = __hmul2(
        static_cast<__half2>(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(scale_bits), __NV_E4M3)),
        pow2);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const Fp8Lut lut = make_fp8_lut(h == 0 ? __low2half2(scales) : __high2half2(scales));
      const uint2 first = decode_fp4_word(h == 0 ? in.x : in.z, lut);
      const uint2 second = decode_fp4_word(h == 0 ? in.y : in.w, lut);
      *reinterpret_cast<uint4*>(out_row + (((2 * c + h) ^ (row & 7)) << 4)) =
          make_uint4(first.x, first.y, second.x, second.y);
    }
  } else {
    Fp8Lut lut;
    if (!mxfp4_lut_by_exponent(scale_bits, decode_exponent, lut))
      lut = make_fp8_lut(__half2half2(mxfp4_scale(scale_bits, decode_exponent)));
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
__device__ __forceinline__ void decode_fp4_row_chunks(const uint8_t* fp4_tile, const uint8_t* scale_tile,
                                                      uint8_t* fp8_tile, int row, int first_chunk,
                                                      int decode_exponent) {
  static_assert(kChunks == 2 || kChunks == 4, "a whole row or half of one");
  const uint8_t* in_row = fp4_tile + row * 64;
  uint8_t* out_row = fp8_tile + row * 128;
  if constexpr (kFormat == Fp4Format::kNvfp4) {
    // 16 bits of group scales per chunk: bytes 2c, 2c + 1 of the row's 8.
    uint32_t words[kChunks / 2];
#pragma unroll
    for (int i = 0; i < kChunks / 2; ++i)
      words[i] = *reinterpret_cast<const uint32_t*>(scale_tile + row * 8 + 2 * first_chunk + 4 * i);
#pragma unroll kChunksInFlight
    for (int i = 0; i < kChunks; ++i)
      decode_fp4_chunk<kFormat>(in_row, out_row, row, first_chunk + i, (words[i / 2] >> (16 * (i & 1))) & 0xFFFFu,
                                decode_exponent);
  } else {
    const uint32_t scale_bytes = *reinterpret_cast<const uint32_t*>(scale_tile + row * 4);
#pragma unroll kChunksInFlight
    for (int i = 0; i < kChunks; ++i)
      decode_fp4_chunk<kFormat>(in_row, out_row, row, first_chunk + i, (scale_bytes >> (8 * (first_chunk + i))) & 0xFFu,
                                decode_exponent);
  }
}

// Decodes row `row` (0..127) of a 128-row x 128-K slice (layouts: decode_fp4_row_chunks).
template <Fp4Format kFormat, int kChunksInFlight = 4>
__device__ __forceinline__ void decode_fp4_row(const uint8_t* fp4_tile, const uint8_t* scale_tile, uint8_t* fp8_tile,
                                               int row, int decode_exponent) {
  decode_fp4_row_chunks<kFormat, 4, kChunksInFlight>(fp4_tile, scale_tile, fp8_tile, row, 0, decode_exponent);
}

}  // namespace megamoe::kernels::sm90
