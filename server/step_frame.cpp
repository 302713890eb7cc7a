#include "server/step_frame.h"

#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "megamoe/error.h"

namespace megamoe::server {
namespace {

// Appends fields to a frame whose header is patched with the payload size at the end.
class FrameWriter {
 public:
  explicit FrameWriter(FrameKind kind) : bytes_(kFrameHeaderBytes, 0) {
    put_raw(0, kFrameMagic);
    put_raw(4, uint32_t(kind));
  }
  template <typename T> void put(T value) {
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &value, sizeof(T));
    bytes_.insert(bytes_.end(), raw, raw + sizeof(T));
  }
  template <typename T> void put_array(const std::vector<T>& values) {
    put<int32_t>(int32_t(values.size()));
    const size_t at = bytes_.size();
    bytes_.resize(at + values.size() * sizeof(T));
    if (!values.empty()) std::memcpy(bytes_.data() + at, values.data(), values.size() * sizeof(T));
  }
  void put_string(const std::string& s) { put_array(std::vector<char>(s.begin(), s.end())); }
  std::vector<uint8_t> finish() {
    put_raw(8, uint64_t(bytes_.size() - kFrameHeaderBytes));
    return std::move(bytes_);
  }

 private:
  template <typename T> void put_raw(size_t at, T value) { std::memcpy(bytes_.data() + at, &value, sizeof(T)); }
  std::vector<uint8_t> bytes_;
};

// Reads fields in order; every failure names the field being read.
class FrameReader {
 public:
  FrameReader(const char* frame, const uint8_t* data, size_t size) : frame_(frame), data_(data), size_(size) {}
  template <typename T> T get(const char* field) {
    need(sizeof(T), field);
    T value;
    std::memcpy(&value, data_ + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  int32_t count(const char* field, int64_t element_bytes) {
    const int32_t n = get<int32_t>(field);
    MEGAMOE_CHECK(n >= 0, frame_, " frame: field ", field, " = ", n, " must be >= 0");
    MEGAMOE_CHECK(element_bytes == 0 || int64_t(n) * element_bytes <= int64_t(size_ - at_), frame_, " frame: field ",
                  field, " = ", n, " needs ", int64_t(n) * element_bytes, " bytes, only ", size_ - at_, " left");
    return n;
  }
  template <typename T> std::vector<T> get_array(const char* field) {
    const int32_t n = count(field, sizeof(T));
    std::vector<T> values(static_cast<size_t>(n));
    if (n > 0) std::memcpy(values.data(), data_ + at_, size_t(n) * sizeof(T));
    at_ += size_t(n) * sizeof(T);
    return values;
  }
  std::string get_string(const char* field) {
    const auto chars = get_array<char>(field);
    return std::string(chars.begin(), chars.end());
  }
  void expect_end() {
    MEGAMOE_CHECK(at_ == size_, frame_, " frame: ", size_ - at_, " trailing bytes after the last field");
  }

 private:
  void need(size_t bytes, const char* field) {
    MEGAMOE_CHECK(size_ - at_ >= bytes, frame_, " frame truncated: field ", field, " needs ", bytes,
                  " bytes at offset ", at_, ", payload has ", size_);
  }
  const char* frame_;
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

}  // namespace

std::vector<uint8_t> encode_hello(const WorkerHello& hello) {
  FrameWriter w(FrameKind::kHello);
  w.put<int32_t>(hello.info.vocab_size);
  w.put<int32_t>(hello.info.max_position_embeddings);
  w.put<int32_t>(hello.info.num_layers);
  w.put<int32_t>(hello.num_kv_blocks);
  w.put<int32_t>(hello.kv_block_size);
  w.put_string(hello.info.model_type);
  w.put_array(hello.info.eos_token_ids);
  return w.finish();
}

namespace {

void put_batch(FrameWriter& w, const engine::StepBatch& batch) {
  w.put<int32_t>(int32_t(batch.chunks.size()));
  for (const auto& chunk : batch.chunks) {
    w.put<int64_t>(chunk.seq_id);
    w.put<int32_t>(chunk.start_position);
    w.put<uint8_t>(chunk.want_logits ? 1 : 0);
    w.put_array(chunk.tokens);
    w.put_array(chunk.block_table);
  }
}

engine::StepBatch get_batch(FrameReader& r) {
  engine::StepBatch batch;
  // Smallest chunk: seq_id + start_position + want_logits + two counts = 8 + 4 + 1 + 4 + 4 bytes.
  const int32_t chunks = r.count("chunks", 21);
  batch.chunks.resize(size_t(chunks));
  for (auto& chunk : batch.chunks) {
    chunk.seq_id = r.get<int64_t>("chunk.seq_id");
    chunk.start_position = r.get<int32_t>("chunk.start_position");
    const uint8_t want = r.get<uint8_t>("chunk.want_logits");
    MEGAMOE_CHECK(want <= 1, "step frame: field chunk.want_logits = ", int(want), " must be 0 or 1");
    chunk.want_logits = want == 1;
    chunk.tokens = r.get_array<int32_t>("chunk.tokens");
    chunk.block_table = r.get_array<int32_t>("chunk.block_table");
  }
  return batch;
}

}  // namespace

std::vector<uint8_t> encode_step(const engine::StepBatch& batch) {
  FrameWriter w(FrameKind::kStep);
  put_batch(w, batch);
  return w.finish();
}

std::vector<uint8_t> encode_sample_step(const engine::StepBatch& batch, const std::vector<engine::ChunkSampling>& sampling) {
  FrameWriter w(FrameKind::kSampleStep);
  put_batch(w, batch);
  w.put<int32_t>(int32_t(sampling.size()));
  for (const auto& s : sampling) {
    w.put<float>(s.temperature);
    w.put<float>(s.top_p);
    w.put<int64_t>(s.seed);
    w.put<int64_t>(s.draws);
  }
  return w.finish();
}

std::vector<uint8_t> encode_tokens(const std::vector<int32_t>& tokens) {
  FrameWriter w(FrameKind::kTokens);
  w.put_array(tokens);
  return w.finish();
}

std::vector<uint8_t> encode_output(const engine::StepOutput& output) {
  FrameWriter w(FrameKind::kOutput);
  const int32_t row_length = output.logits.empty() ? 0 : int32_t(output.logits.front().size());
  w.put<int32_t>(int32_t(output.logits.size()));
  w.put<int32_t>(row_length);
  for (const auto& row : output.logits) {
    MEGAMOE_CHECK(int32_t(row.size()) == row_length, "step output: logits rows of ", row.size(), " and ", row_length,
                  " entries");
    for (float v : row) w.put<float>(v);
  }
  return w.finish();
}

std::vector<uint8_t> encode_error(const std::string& message) {
  FrameWriter w(FrameKind::kError);
  w.put_string(message);
  return w.finish();
}

std::vector<uint8_t> encode_stop() { return FrameWriter(FrameKind::kStop).finish(); }

FrameHeader decode_header(const uint8_t* bytes, size_t size) {
  MEGAMOE_CHECK(size >= kFrameHeaderBytes, "frame header truncated: ", size, " of ", kFrameHeaderBytes, " bytes");
  uint32_t magic = 0, kind = 0;
  uint64_t payload = 0;
  std::memcpy(&magic, bytes, 4);
  std::memcpy(&kind, bytes + 4, 4);
  std::memcpy(&payload, bytes + 8, 8);
  MEGAMOE_CHECK(magic == kFrameMagic, "frame header: field magic = ", magic, " must be ", kFrameMagic);
  MEGAMOE_CHECK(kind >= uint32_t(FrameKind::kHello) && kind <= kLastFrameKind, "frame header: field kind = ",
                kind, " must be in [1, ", kLastFrameKind, "]");
  MEGAMOE_CHECK(payload <= kMaxFramePayloadBytes, "frame header: field payload_bytes = ", payload, " must be <= ",
                kMaxFramePayloadBytes);
  return {FrameKind(kind), payload};
}

WorkerHello decode_hello(const uint8_t* payload, size_t size) {
  FrameReader r("hello", payload, size);
  WorkerHello hello;
  hello.info.vocab_size = r.get<int32_t>("vocab_size");
  hello.info.max_position_embeddings = r.get<int32_t>("max_position_embeddings");
  hello.info.num_layers = r.get<int32_t>("num_layers");
  hello.num_kv_blocks = r.get<int32_t>("num_kv_blocks");
  hello.kv_block_size = r.get<int32_t>("kv_block_size");
  hello.info.model_type = r.get_string("model_type");
  hello.info.eos_token_ids = r.get_array<int32_t>("eos_token_ids");
  r.expect_end();
  MEGAMOE_CHECK(hello.info.vocab_size > 0, "hello frame: field vocab_size = ", hello.info.vocab_size, " must be > 0");
  MEGAMOE_CHECK(hello.num_kv_blocks > 0, "hello frame: field num_kv_blocks = ", hello.num_kv_blocks, " must be > 0");
  MEGAMOE_CHECK(hello.kv_block_size > 0, "hello frame: field kv_block_size = ", hello.kv_block_size, " must be > 0");
  return hello;
}

engine::StepBatch decode_step(const uint8_t* payload, size_t size) {
  FrameReader r("step", payload, size);
  engine::StepBatch batch = get_batch(r);
  r.expect_end();
  return batch;
}

SampleStep decode_sample_step(const uint8_t* payload, size_t size) {
  FrameReader r("sample step", payload, size);
  SampleStep step;
  step.batch = get_batch(r);
  const int32_t entries = r.count("sampling", 24);
  step.sampling.resize(size_t(entries));
  for (auto& s : step.sampling) {
    s.temperature = r.get<float>("sampling.temperature");
    s.top_p = r.get<float>("sampling.top_p");
    s.seed = r.get<int64_t>("sampling.seed");
    s.draws = r.get<int64_t>("sampling.draws");
    MEGAMOE_CHECK(s.draws >= 0, "sample step frame: field sampling.draws = ", s.draws, " must be >= 0");
  }
  r.expect_end();
  return step;
}

std::vector<int32_t> decode_tokens(const uint8_t* payload, size_t size) {
  FrameReader r("tokens", payload, size);
  std::vector<int32_t> tokens = r.get_array<int32_t>("tokens");
  r.expect_end();
  return tokens;
}

engine::StepOutput decode_output(const uint8_t* payload, size_t size) {
  FrameReader r("output", payload, size);
  engine::StepOutput output;
  const int32_t rows = r.count("rows", 0);
  const int32_t row_length = r.count("row_length", 0);
  MEGAMOE_CHECK(int64_t(rows) * row_length * 4 == int64_t(size) - 8, "output frame: field rows x row_length = ", rows,
                " x ", row_length, " floats does not match the ", size - 8, " bytes of logits");
  output.logits.assign(size_t(rows), std::vector<float>(size_t(row_length)));
  for (auto& row : output.logits)
    for (auto& v : row) v = r.get<float>("logits");
  r.expect_end();
  return output;
}

std::string decode_error(const uint8_t* payload, size_t size) {
  FrameReader r("error", payload, size);
  std::string message = r.get_string("message");
  r.expect_end();
  return message;
}

void write_frame(int fd, const std::vector<uint8_t>& frame, const std::string& who) {
  size_t done = 0;
  while (done < frame.size()) {
    // send + MSG_NOSIGNAL: a peer that died is an error here, not a SIGPIPE for the whole server.
    const ssize_t n = ::send(fd, frame.data() + done, frame.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    MEGAMOE_CHECK(n > 0, who, ": socket write failed after ", done, " of ", frame.size(), " bytes (",
                  std::strerror(errno), ")");
    done += size_t(n);
  }
}

namespace {
// Reads exactly `size` bytes; returns the count read before EOF.
size_t read_exactly(int fd, uint8_t* out, size_t size, const std::string& who) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, out + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    MEGAMOE_CHECK(n >= 0, who, ": socket read failed (", std::strerror(errno), ")");
    if (n == 0) break;
    done += size_t(n);
  }
  return done;
}
}  // namespace

bool read_frame(int fd, FrameHeader* header, std::vector<uint8_t>* payload, const std::string& who) {
  uint8_t head[kFrameHeaderBytes];
  const size_t got = read_exactly(fd, head, sizeof(head), who);
  if (got == 0) return false;
  MEGAMOE_CHECK(got == sizeof(head), who, ": connection closed inside a frame header (", got, " of ",
                sizeof(head), " bytes)");
  *header = decode_header(head, sizeof(head));
  payload->resize(size_t(header->payload_bytes));
  const size_t body = read_exactly(fd, payload->data(), payload->size(), who);
  MEGAMOE_CHECK(body == payload->size(), who, ": connection closed inside a frame (", body, " of ", payload->size(),
                " payload bytes)");
  return true;
}

}  // namespace megamoe::server
