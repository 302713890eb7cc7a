// KV cache block accounting for one model runner: which of its `num_blocks` blocks are free, and
// which belong to which sequence. Blocks are handed out and taken back whole; nothing is shared
// between sequences (no prefix caching), so "free + owned == total" holds at all times.
#pragma once

#include <cstdint>
#include <vector>

#include "server/sequence.h"

namespace megamoe::server {

class KvBlockManager {
 public:
  KvBlockManager(int num_blocks, int block_size);

  int block_size() const { return block_size_; }
  int num_blocks() const { return num_blocks_; }
  int num_free() const { return int(free_.size()); }
  int blocks_for_tokens(int num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }

  // Grows `seq.block_table` so it covers positions [0, num_tokens). Returns false (and changes
  // nothing) when not enough blocks are free.
  bool ensure_capacity(Sequence& seq, int num_tokens);
  // Returns all of `seq`'s blocks to the free list and empties its table.
  void release(Sequence& seq);

 private:
  int num_blocks_;
  int block_size_;
  std::vector<int32_t> free_;       // stack of free block ids
  std::vector<uint8_t> in_use_;     // guards against double release
};

}  // namespace megamoe::server
