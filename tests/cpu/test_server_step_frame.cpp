// The serve front-end <-> worker frames (server/step_frame.h): seeded random batches round-trip
// bit-exactly; every truncation, bad count, bad magic/kind and trailing byte is a megamoe::Error
// naming the field.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "megamoe/error.h"
#include "server/step_frame.h"

namespace {

using megamoe::server::FrameKind;

megamoe::engine::StepBatch random_batch(std::mt19937_64& rng) {
  megamoe::engine::StepBatch batch;
  std::uniform_int_distribution<int> chunks(1, 9), tokens(0, 40), blocks(0, 12);
  std::uniform_int_distribution<int32_t> id(-5, 151935);
  for (int c = chunks(rng); c > 0; --c) {
    megamoe::engine::SequenceChunk chunk;
    chunk.seq_id = int64_t(rng() >> 1);
    chunk.start_position = id(rng);
    chunk.want_logits = rng() & 1;
    for (int t = tokens(rng); t > 0; --t) chunk.tokens.push_back(id(rng));
    for (int b = blocks(rng); b > 0; --b) chunk.block_table.push_back(id(rng));
    batch.chunks.push_back(std::move(chunk));
  }
  return batch;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const megamoe::Error& e) {
    return e.what();
  }
  return "";
}

TEST(StepFrame, StepBatchRoundTripsBitExact) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 50; ++trial) {
    const auto batch = random_batch(rng);
    const auto frame = megamoe::server::encode_step(batch);
    const auto header = megamoe::server::decode_header(frame.data(), frame.size());
    ASSERT_EQ(header.kind, FrameKind::kStep);
    ASSERT_EQ(header.payload_bytes, frame.size() - megamoe::server::kFrameHeaderBytes);
    const auto back = megamoe::server::decode_step(frame.data() + 16, frame.size() - 16);
    ASSERT_EQ(back.chunks.size(), batch.chunks.size());
    for (size_t c = 0; c < batch.chunks.size(); ++c) {
      EXPECT_EQ(back.chunks[c].seq_id, batch.chunks[c].seq_id);
      EXPECT_EQ(back.chunks[c].start_position, batch.chunks[c].start_position);
      EXPECT_EQ(back.chunks[c].want_logits, batch.chunks[c].want_logits);
      EXPECT_EQ(back.chunks[c].tokens, batch.chunks[c].tokens);
      EXPECT_EQ(back.chunks[c].block_table, batch.chunks[c].block_table);
    }
  }
  // The empty batch (lockstep ranks with nothing to do) too.
  const auto empty = megamoe::server::encode_step({});
  EXPECT_TRUE(megamoe::server::decode_step(empty.data() + 16, empty.size() - 16).chunks.empty());
}

TEST(StepFrame, OutputHelloErrorRoundTrip) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 30.0f);
  megamoe::engine::StepOutput output;
  output.logits.assign(3, std::vector<float>(257));
  for (auto& row : output.logits)
    for (auto& v : row) v = normal(rng);
  output.logits[1][7] = -std::numeric_limits<float>::infinity();
  const auto frame = megamoe::server::encode_output(output);
  EXPECT_EQ(megamoe::server::decode_header(frame.data(), frame.size()).kind, FrameKind::kOutput);
  const auto back = megamoe::server::decode_output(frame.data() + 16, frame.size() - 16);
  ASSERT_EQ(back.logits.size(), 3u);
  for (size_t r = 0; r < 3; ++r)
    EXPECT_EQ(std::memcmp(back.logits[r].data(), output.logits[r].data(), 257 * sizeof(float)), 0) << "row " << r;

  megamoe::server::WorkerHello hello;
  hello.info = {"qwen3_moe", 151936, 40960, {151645, 151643}, 48};
  hello.num_kv_blocks = 12345;
  hello.kv_block_size = 16;
  const auto hello_frame = megamoe::server::encode_hello(hello);
  const auto hello_back = megamoe::server::decode_hello(hello_frame.data() + 16, hello_frame.size() - 16);
  EXPECT_EQ(hello_back.info.model_type, "qwen3_moe");
  EXPECT_EQ(hello_back.info.vocab_size, 151936);
  EXPECT_EQ(hello_back.info.max_position_embeddings, 40960);
  EXPECT_EQ(hello_back.info.eos_token_ids, (std::vector<int32_t>{151645, 151643}));
  EXPECT_EQ(hello_back.info.num_layers, 48);
  EXPECT_EQ(hello_back.num_kv_blocks, 12345);
  EXPECT_EQ(hello_back.kv_block_size, 16);

  const auto error_frame = megamoe::server::encode_error("block_table entry 99 must be < 64");
  EXPECT_EQ(megamoe::server::decode_error(error_frame.data() + 16, error_frame.size() - 16),
            "block_table entry 99 must be < 64");
}

TEST(StepFrame, SampleStepAndTokensRoundTrip) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto batch = random_batch(rng);
  std::vector<megamoe::engine::ChunkSampling> sampling;
  for (const auto& chunk : batch.chunks)
    if (chunk.want_logits)
      sampling.push_back({float(rng() % 1000) / 500.0f, float(rng() % 1000 + 1) / 1000.0f, int64_t(rng() >> 1),
                          int64_t(rng() % 100000)});
  const auto frame = megamoe::server::encode_sample_step(batch, sampling);
  EXPECT_EQ(megamoe::server::decode_header(frame.data(), frame.size()).kind, FrameKind::kSampleStep);
  const auto back = megamoe::server::decode_sample_step(frame.data() + 16, frame.size() - 16);
  ASSERT_EQ(back.batch.chunks.size(), batch.chunks.size());
  for (size_t c = 0; c < batch.chunks.size(); ++c) EXPECT_EQ(back.batch.chunks[c].tokens, batch.chunks[c].tokens);
  ASSERT_EQ(back.sampling.size(), sampling.size());
  for (size_t i = 0; i < sampling.size(); ++i) {
    EXPECT_EQ(back.sampling[i].temperature, sampling[i].temperature);
    EXPECT_EQ(back.sampling[i].top_p, sampling[i].top_p);
    EXPECT_EQ(back.sampling[i].seed, sampling[i].seed);
    EXPECT_EQ(back.sampling[i].draws, sampling[i].draws);
  }
  const std::vector<int32_t> tokens = {5, 0, 151935, 42};
  const auto token_frame = megamoe::server::encode_tokens(tokens);
  EXPECT_EQ(megamoe::server::decode_tokens(token_frame.data() + 16, token_frame.size() - 16), tokens);
  // Truncated sampling entries and a negative draw count name their fields.
  megamoe::engine::StepBatch one;
  one.chunks.push_back({1, {5}, 0, {0}, true});
  auto small = megamoe::server::encode_sample_step(one, {{0.7f, 0.9f, 99, 3}});
  EXPECT_NE(error_of([&] { megamoe::server::decode_sample_step(small.data() + 16, small.size() - 20); }).find("sampling"),
            std::string::npos);
  const int64_t negative = -1;
  std::memcpy(small.data() + small.size() - 8, &negative, 8);
  EXPECT_NE(error_of([&] { megamoe::server::decode_sample_step(small.data() + 16, small.size() - 16); })
                .find("field sampling.draws = -1"),
            std::string::npos);
}

TEST(StepFrame, EveryTruncationIsAnErrorNamingTheField) {
  std::mt19937_64 rng(7);
  const auto frame = megamoe::server::encode_step(random_batch(rng));
  const uint8_t* payload = frame.data() + 16;
  const size_t size = frame.size() - 16;
  for (size_t cut = 0; cut < size; ++cut) {
    const std::string message = error_of([&] { megamoe::server::decode_step(payload, cut); });
    ASSERT_FALSE(message.empty()) << "a step payload cut to " << cut << " of " << size << " bytes decoded";
    EXPECT_TRUE(message.find("field chunk") != std::string::npos || message.find("field chunks") != std::string::npos)
        << message;
  }
  // A cut inside the token array is reported as that field's count exceeding the bytes left.
  megamoe::engine::StepBatch one;
  one.chunks.push_back({1, {5, 6, 7, 8}, 0, {0}, true});
  const auto small = megamoe::server::encode_step(one);
  const std::string message = error_of([&] { megamoe::server::decode_step(small.data() + 16, 4 + 8 + 4 + 1 + 4 + 8); });
  EXPECT_NE(message.find("field chunk.tokens = 4"), std::string::npos) << message;
  // Header, hello and output truncations too.
  EXPECT_NE(error_of([&] { megamoe::server::decode_header(small.data(), 15); }).find("header truncated"), std::string::npos);
  megamoe::server::WorkerHello hello;
  hello.info = {"qwen3_moe", 100, 64, {2}, 2};
  hello.num_kv_blocks = 4;
  hello.kv_block_size = 16;
  const auto hello_frame = megamoe::server::encode_hello(hello);
  EXPECT_NE(error_of([&] { megamoe::server::decode_hello(hello_frame.data() + 16, 10); }).find("field num_layers"),
            std::string::npos);
  megamoe::engine::StepOutput output;
  output.logits.assign(2, std::vector<float>(5, 1.0f));
  const auto output_frame = megamoe::server::encode_output(output);
  EXPECT_NE(error_of([&] { megamoe::server::decode_output(output_frame.data() + 16, output_frame.size() - 17); })
                .find("rows x row_length"),
            std::string::npos);
}

TEST(StepFrame, MalformedFramesAreErrorsNamingTheField) {
  megamoe::engine::StepBatch one;
  one.chunks.push_back({1, {5, 6}, 0, {0}, true});
  auto frame = megamoe::server::encode_step(one);
  // Bad magic, unknown kind, absurd payload length.
  auto bad = frame;
  bad[0] ^= 0xff;
  EXPECT_NE(error_of([&] { megamoe::server::decode_header(bad.data(), bad.size()); }).find("field magic"), std::string::npos);
  bad = frame;
  bad[4] = 9;
  EXPECT_NE(error_of([&] { megamoe::server::decode_header(bad.data(), bad.size()); }).find("field kind = 9"), std::string::npos);
  bad = frame;
  bad[15] = 0x10;
  EXPECT_NE(error_of([&] { megamoe::server::decode_header(bad.data(), bad.size()); }).find("field payload_bytes"),
            std::string::npos);
  // Negative and oversized counts never allocate.
  bad = frame;
  const int32_t negative = -3;
  std::memcpy(bad.data() + 16, &negative, 4);
  EXPECT_NE(error_of([&] { megamoe::server::decode_step(bad.data() + 16, bad.size() - 16); }).find("field chunks = -3"),
            std::string::npos);
  bad = frame;
  const int32_t huge = 1 << 30;
  std::memcpy(bad.data() + 16 + 4 + 8 + 4 + 1, &huge, 4);  // chunk.tokens count
  EXPECT_NE(error_of([&] { megamoe::server::decode_step(bad.data() + 16, bad.size() - 16); })
                .find("field chunk.tokens = 1073741824"),
            std::string::npos);
  // want_logits must be a bool; trailing bytes are refused.
  bad = frame;
  bad[16 + 4 + 8 + 4] = 2;
  EXPECT_NE(error_of([&] { megamoe::server::decode_step(bad.data() + 16, bad.size() - 16); }).find("field chunk.want_logits"),
            std::string::npos);
  bad = frame;
  bad.push_back(0);
  EXPECT_NE(error_of([&] { megamoe::server::decode_step(bad.data() + 16, bad.size() - 16); }).find("trailing"),
            std::string::npos);
}

TEST(StepFrame, SocketReadWriteWholeFramesAndShortFramesFail) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  std::mt19937_64 rng(11);
  const auto batch = random_batch(rng);
  megamoe::server::write_frame(fds[0], megamoe::server::encode_step(batch), "test");
  megamoe::server::FrameHeader header;
  std::vector<uint8_t> payload;
  ASSERT_TRUE(megamoe::server::read_frame(fds[1], &header, &payload, "test"));
  EXPECT_EQ(header.kind, FrameKind::kStep);
  EXPECT_EQ(megamoe::server::decode_step(payload.data(), payload.size()).chunks.size(), batch.chunks.size());
  // A frame cut short by the peer closing is an error; a close between frames is a clean EOF.
  const auto frame = megamoe::server::encode_step(batch);
  ASSERT_EQ(write(fds[0], frame.data(), frame.size() - 3), ssize_t(frame.size() - 3));
  close(fds[0]);
  EXPECT_NE(error_of([&] { megamoe::server::read_frame(fds[1], &header, &payload, "test"); }).find("inside a frame"),
            std::string::npos);
  EXPECT_FALSE(megamoe::server::read_frame(fds[1], &header, &payload, "test"));
  close(fds[1]);
}

}  // namespace
