// The flat binary frames that cross the Unix socket between the serve front-end (RemoteRunner) and
// its worker processes (server/worker_process.h). Every frame is a 16-byte header followed by a
// payload of little-endian fixed-width fields, arrays as a count then the elements:
//   header  : u32 magic 'MMSF', u32 kind (FrameKind), u64 payload bytes
//   kHello  : (worker -> front-end, once) i32 vocab_size, i32 max_position_embeddings, i32 num_layers,
//             i32 num_kv_blocks, i32 kv_block_size, str model_type, i32[] eos_token_ids
//   kStep   : (front-end -> worker) i32 chunks, per chunk: i64 seq_id, i32 start_position,
//             u8 want_logits, i32[] tokens, i32[] block_table
//   kOutput : (worker -> front-end) i32 rows, i32 row_length, f32[rows x row_length] logits
//   kError  : (worker -> front-end) str message (a megamoe::Error raised by the worker's step)
//   kStop   : (front-end -> worker) empty: the worker exits its loop
//   kSampleStep : (front-end -> worker) the kStep fields, then i32 entries, per entry (one per
//             want_logits chunk): f32 temperature, f32 top_p, i64 seed, i64 draws
//   kTokens : (worker -> front-end) i32[] sampled token ids, one per want_logits chunk
// NOTES: decoding never trusts a count: every array length is checked against the bytes left before
// anything is allocated, and a malformed frame throws megamoe::Error naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/runner.h"

namespace megamoe::server {

inline constexpr uint32_t kFrameMagic = 0x46534d4du;  // "MMSF"
inline constexpr size_t kFrameHeaderBytes = 16;
inline constexpr uint64_t kMaxFramePayloadBytes = uint64_t(1) << 32;  // 4 GiB: a corrupt length, not a step

enum class FrameKind : uint32_t { kHello = 1, kStep = 2, kOutput = 3, kError = 4, kStop = 5, kSampleStep = 6, kTokens = 7 };
inline constexpr uint32_t kLastFrameKind = 7;

struct SampleStep {
  engine::StepBatch batch;
  std::vector<engine::ChunkSampling> sampling;
};

struct WorkerHello {
  engine::ModelInfo info;
  int num_kv_blocks = 0;
  int kv_block_size = 0;
};

struct FrameHeader {
  FrameKind kind = FrameKind::kStop;
  uint64_t payload_bytes = 0;
};

// Whole frames (header + payload).
std::vector<uint8_t> encode_hello(const WorkerHello& hello);
std::vector<uint8_t> encode_step(const engine::StepBatch& batch);
std::vector<uint8_t> encode_output(const engine::StepOutput& output);
std::vector<uint8_t> encode_error(const std::string& message);
std::vector<uint8_t> encode_stop();
std::vector<uint8_t> encode_sample_step(const engine::StepBatch& batch, const std::vector<engine::ChunkSampling>& sampling);
std::vector<uint8_t> encode_tokens(const std::vector<int32_t>& tokens);

// Header: checks the magic, the kind and the payload bound.
FrameHeader decode_header(const uint8_t* bytes, size_t size);
// Payloads (the bytes after the header); each throws megamoe::Error naming the field on truncation,
// negative or oversized counts, or trailing bytes.
WorkerHello decode_hello(const uint8_t* payload, size_t size);
engine::StepBatch decode_step(const uint8_t* payload, size_t size);
engine::StepOutput decode_output(const uint8_t* payload, size_t size);
std::string decode_error(const uint8_t* payload, size_t size);
SampleStep decode_sample_step(const uint8_t* payload, size_t size);
std::vector<int32_t> decode_tokens(const uint8_t* payload, size_t size);

// Blocking whole-frame socket I/O (EINTR-safe). read_frame returns false on a clean EOF before the
// header; a short frame or a socket error throws megamoe::Error with `who` in the message.
void write_frame(int fd, const std::vector<uint8_t>& frame, const std::string& who);
bool read_frame(int fd, FrameHeader* header, std::vector<uint8_t>* payload, const std::string& who);

}  // namespace megamoe::server
