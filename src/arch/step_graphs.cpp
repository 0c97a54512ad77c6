#include "arch/step_graphs.h"

#include <algorithm>
#include <iterator>

#include "core/error.h"
#include "engine/kv_cache.h"

namespace shardlm {

int64_t graph_bucket(const ForwardBatch& batch) {
  const int64_t T = batch.num_tokens();
  if (T == 0 || T > kGraphBuckets[std::size(kGraphBuckets) - 1]) return 0;
  if (static_cast<int64_t>(batch.logit_rows.size()) != T ||
      static_cast<int64_t>(batch.seq_block_start.size()) != T + 1) {
    return 0;
  }
  for (int64_t t = 0; t < T; ++t) {
    if (batch.token_seq[t] != t || batch.logit_rows[t] != t) return 0;
  }
  for (const int64_t b : kGraphBuckets) {
    if (b >= T) return b;
  }
  return 0;
}

namespace {
constexpr int32_t kNoOverflow = 0;
}  // namespace

StepGraphs::StepGraphs(ComputeBackend& b, Scratch& scratch, const ModelSpec& spec, const ShardPlan& plan,
                       const ShardComms& comms)
    : b_(b), scratch_(scratch), spec_(spec), plan_(plan), comms_(comms), generation_(scratch.generation()) {}

StepGraphs::~StepGraphs() { b_.free(overflow_dev_); }

std::string StepGraphs::enable(double ep_capacity, bool recording_kv) {
  std::string why;
  ep_capacity_ = ep_capacity;
  if (!b_.supports_capture()) {
    why = "backend " + b_.name() + " cannot capture graphs";
  } else if (recording_kv) {
    why = "a KV cache calibration records every step eagerly";
  } else if (comms_.ep && !comms_.ep->can_enqueue()) {
    // A captured MoE layer queues its fixed-size all-to-alls on the stream
    // (arch/expert_exchange.h); without ep the routing alone stays on the device.
    why = "graphs with ep need --comm nccl (the expert all-to-alls must be queued on the captured stream)";
  } else if (plan_.tp_size > 1 && !(comms_.tp && comms_.tp->can_enqueue())) {
    // An MPI or libfabric all-reduce goes through host memory, which no graph can hold; NCCL's
    // is queued on the captured stream.
    why = "graphs with tp need --comm nccl (the tp all-reduce must be queued on the captured stream)";
  }
  on_ = why.empty();
  return why;
}

void StepGraphs::disable() {
  drop();
  on_ = false;
}

void StepGraphs::drop() {
  b_.drop_captures();
  graphs_.clear();
  generation_ = scratch_.generation();
}

void StepGraphs::reserve_inputs(const ForwardBatch& batch, const KvCache& cache,
                                const std::function<void(int64_t rows)>& reserve_stage) {
  constexpr int64_t kRows = kGraphBuckets[std::size(kGraphBuckets) - 1];
  if (block_capacity_ < static_cast<size_t>(cache.num_blocks())) block_capacity_ = cache.num_blocks();
  if (batch.blocks.size() > block_capacity_) block_capacity_ = std::max(batch.blocks.size(), 2 * block_capacity_);
  scratch_.get_as<int32_t>(3, kRows);
  scratch_.get_as<int32_t>(4, kRows);
  scratch_.get_as<int64_t>(5, kRows);
  scratch_.get_as<int32_t>(6, std::max<size_t>(block_capacity_, 1));
  scratch_.get_as<int32_t>(7, kRows);
  if (reserve_stage) reserve_stage(kRows);
}

int64_t StepGraphs::step_bucket(const ForwardBatch& batch, const KvCache& cache,
                                const std::function<void(int64_t rows)>& reserve_stage) {
  if (!on_) return 0;
  if (!comms_.ep) return graph_bucket(batch);
  // Whatever this step's inputs need grows here, before the ranks compare their generations:
  // nothing may reallocate between this agreement and the replay (see ready()).
  reserve_inputs(batch, cache, reserve_stage);
  // {a rank cannot replay, the largest bucket, a rank's graphs are stale}; a rank with no tokens
  // joins any bucket.
  int64_t v[3] = {0, 0, scratch_.generation() != generation_ ? 1 : 0};
  if (batch.num_tokens() > 0) {
    v[1] = graph_bucket(batch);
    v[0] = v[1] == 0 ? 1 : 0;
  }
  comms_.ep->all_reduce(v, 3, CommDType::kI64, ReduceOp::kMax);
  if (v[2] != 0) drop();  // every rank of the group recaptures, or none
  return v[0] == 0 ? v[1] : 0;
}

StepContext StepGraphs::upload_inputs(const ForwardBatch& batch, int64_t B, const KvCache& cache,
                                      int64_t* expert_tokens) {
  const int64_t T = batch.num_tokens();
  ids_.assign(static_cast<size_t>(B), -1);
  pos_.assign(static_cast<size_t>(B), -1);
  slots_.assign(static_cast<size_t>(B), -1);
  start_.assign(static_cast<size_t>(B), 0);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = batch.tokens[t] - plan_.vocab0;
    ids_[t] = (id >= 0 && id < plan_.vocab) ? static_cast<int32_t>(id) : -1;
    pos_[t] = batch.positions[t];
    slots_[t] = batch.slots[t];
    start_[t] = batch.seq_block_start[t];
  }
  reserve_inputs(batch, cache, nullptr);  // done already with ep (step_bucket)
  StepContext ctx;
  ctx.batch = nullptr;  // a captured step must not read the batch: another one is there at replay
  ctx.T = B;
  ctx.block_size = cache.shape().block_size;
  int32_t* ids = scratch_.get_as<int32_t>(3, B);
  ctx.pos = scratch_.get_as<int32_t>(4, B);
  ctx.slots = scratch_.get_as<int64_t>(5, B);
  int32_t* blocks = scratch_.get_as<int32_t>(6, std::max<size_t>(block_capacity_, 1));
  int32_t* start = scratch_.get_as<int32_t>(7, B);
  b_.copy_to_device(ids, ids_.data(), B * sizeof(int32_t));
  b_.copy_to_device(const_cast<int32_t*>(ctx.pos), pos_.data(), B * sizeof(int32_t));
  b_.copy_to_device(const_cast<int64_t*>(ctx.slots), slots_.data(), B * sizeof(int64_t));
  b_.copy_to_device(blocks, batch.blocks.data(), batch.blocks.size() * sizeof(int32_t));
  b_.copy_to_device(start, start_.data(), B * sizeof(int32_t));
  // Backend memory only: the host arrays change from step to step, a replay reads the slots.
  // Positions stay below the engine's context limit (the model's, or the cache's if smaller).
  const int64_t max_len =
      std::min<int64_t>(spec_.max_position_embeddings, cache.num_blocks() * cache.shape().block_size);
  ctx.tables = BlockTables{blocks, start, nullptr, nullptr, max_len - 1};
  ctx.device_routing = true;
  ctx.expert_tokens = expert_tokens;
  if (comms_.ep) {
    ctx.ep_capacity = ep_capacity_;
    ctx.ep_overflow = overflow_flag();
  }
  return ctx;
}

const StepGraphs::Captured& StepGraphs::ready(const StepContext& ctx, const std::function<void()>& work,
                                              const std::function<void()>& after_warm_up, const MoeStepStats* moe) {
  const int64_t B = ctx.T;
  // The whole captured part: the stage's work, then the overflow flag reduced over ep so that
  // every rank of the group reads the same answer after the replay.
  const auto captured_work = [&] {
    work();
    if (ctx.ep_overflow) {
      comms_.ep->enqueue_all_reduce(ctx.ep_overflow, 1, CommDType::kI32, ReduceOp::kMax, b_.current_stream());
    }
  };
  if (scratch_.generation() != generation_) {
    // Over tp alone every rank runs the same shapes, so each drops at the same step. With ep the
    // group agreed on its graphs in step_bucket, after the step's inputs were sized: a rank that
    // dropped alone here would warm up (exchanges included) while its peers replay.
    SHARDLM_CHECK(!comms_.ep, "graph step on " << comms_.ep->name()
                                               << ": the scratch was reallocated after the ep group agreed on its "
                                                  "graphs (an input slot not sized by step_bucket)");
    drop();
  }
  if (auto it = graphs_.find(B); it != graphs_.end()) {
    if (comms_.tp) comms_.tp->count_replayed(it->second.tp_moved);
    if (comms_.ep) comms_.ep->count_replayed(it->second.ep_moved);
    return it->second;
  }
  // Every rank of the ep group has the same buckets captured (they capture and drop together),
  // so all of them are here for this bucket.
  captured_work();  // the warm-up run (see the file comment)
  after_warm_up();
  // Its queued collectives under the communicators' deadlines, as a replay's (replay()).
  for (Communicator* c : {comms_.ep, comms_.tp}) {
    if (c && c->can_enqueue()) c->wait_stream(b_.current_stream(), "graph warm-up");
  }
  // The warm-up grows each rank's scratch by its own shapes (a rank whose dp group ran only
  // small steps grows most); the group drops its other graphs together.
  int64_t grew = scratch_.generation() != generation_ ? 1 : 0;
  if (comms_.ep) comms_.ep->all_reduce(&grew, 1, CommDType::kI64, ReduceOp::kMax);
  if (grew != 0) drop();
  const CommStats tp_before = comms_.tp ? comms_.tp->stats() : CommStats{};
  const CommStats ep_before = comms_.ep ? comms_.ep->stats() : CommStats{};
  const int64_t dispatch_before = moe ? moe->dispatch_bytes : 0, combine_before = moe ? moe->combine_bytes : 0;
  b_.begin_capture();
  capturing_ = true;
  try {
    captured_work();
  } catch (...) {
    capturing_ = false;
    // Leave the backend out of capture mode; the partial graph is of no use.
    try {
      b_.end_capture();
    } catch (...) {
    }
    drop();
    throw;
  }
  capturing_ = false;
  Captured step;
  step.handle = b_.end_capture();
  if (comms_.tp) step.tp_moved = moved_since(*comms_.tp, tp_before);
  if (comms_.ep) step.ep_moved = moved_since(*comms_.ep, ep_before);
  if (moe) {
    step.dispatch_bytes = moe->dispatch_bytes - dispatch_before;
    step.combine_bytes = moe->combine_bytes - combine_before;
  }
  return graphs_.emplace(B, step).first->second;
}

int64_t StepGraphs::nodes(int64_t bucket) const {
  auto it = graphs_.find(bucket);
  return it == graphs_.end() ? 0 : b_.captured_nodes(it->second.handle);
}

bool StepGraphs::replay(const Captured& step, const StepContext& ctx) {
  if (ctx.ep_overflow) b_.copy_to_device(ctx.ep_overflow, &kNoOverflow, sizeof(int32_t));
  b_.replay(step.handle);
  // The graph's collectives under the communicators' deadlines and error checks, before anything
  // is read back (the overflow flag here, the expert counts after): a plain stream synchronize
  // would block for ever on a failed peer. The ep exchange first, the likelier to stall.
  for (Communicator* c : {comms_.ep, comms_.tp}) {
    const bool used = c == comms_.ep ? step.ep_moved.calls > 0 : step.tp_moved.calls > 0;
    if (c && used) c->wait_stream(b_.current_stream(), "replayed step");
  }
  if (ctx.ep_overflow) {
    int32_t overflowed = 0;
    b_.copy_to_host(&overflowed, ctx.ep_overflow, sizeof(int32_t));
    if (overflowed != 0) {
      ++reruns_;
      return false;
    }
  }
  ++steps_;
  return true;
}

CommStats StepGraphs::moved_since(const Communicator& c, const CommStats& before) {
  CommStats m;
  m.calls = c.stats().calls - before.calls;
  m.bytes_sent = c.stats().bytes_sent - before.bytes_sent;
  return m;
}

int32_t* StepGraphs::overflow_flag() {
  if (!overflow_dev_) {
    overflow_dev_ = static_cast<int32_t*>(b_.alloc(sizeof(int32_t)));
    b_.copy_to_device(overflow_dev_, &kNoOverflow, sizeof(int32_t));
  }
  return overflow_dev_;
}

}  // namespace shardlm
