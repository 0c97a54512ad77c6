#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <csignal>
#include <deque>
#include <limits>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/stop_signal.h"
#include "parallel/communicator.h"

namespace shardlm {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

int64_t context_limit(const ModelSpec& s, const SchedulerConfig& c) {
  return c.max_model_len > 0 ? c.max_model_len : s.max_position_embeddings;
}

int64_t kv_block_cap(const ModelSpec& s, const SchedulerConfig& c) {
  const int64_t per_seq = (context_limit(s, c) + c.block_size - 1) / c.block_size;
  return std::max<int64_t>(1, per_seq * c.max_seqs);
}

Engine::Engine(Model& model, const Tokenizer& tokenizer, const EngineConfig& cfg)
    : model_(model),
      tok_(tokenizer),
      cfg_(cfg),
      blocks_(model.allocate_kv_cache(cfg.kv_cache_bytes, cfg.scheduler.block_size,
                                      kv_block_cap(model.spec(), cfg.scheduler), cfg.kv_dtype)) {
  const int64_t m = std::max(1, model.max_steps_in_flight());
  // Each micro-batch takes its share of the sequence cap (the first ones one more where it does
  // not divide, so that together they hold --max-seqs, which the KV block cap is sized for); the
  // token budget is per step.
  for (int64_t i = 0; i < m; ++i) {
    SchedulerConfig per = cfg.scheduler;
    per.max_seqs = std::max<int64_t>(1, cfg.scheduler.max_seqs / m + (i < cfg.scheduler.max_seqs % m ? 1 : 0));
    // The logit rows likewise (the profile steps' micro-batch takes the rounded-up share).
    const int64_t rows = cfg.scheduler.max_logit_rows;
    per.max_logit_rows = rows > 0 ? std::max<int64_t>(1, rows / m + (i < rows % m ? 1 : 0)) : 0;
    schedulers_.push_back(std::make_unique<Scheduler>(per, blocks_));
  }
  for (int32_t id : model.spec().eos_token_ids) eos_.insert(id);
  for (int32_t id : tokenizer.eos_ids()) eos_.insert(id);
  const int64_t cache = schedulers_[0]->capacity_tokens();
  if (cfg.scheduler.max_model_len > 0) {
    // As vLLM: a limit that is asked for is kept, or the run does not start.
    SHARDLM_CHECK(cfg.scheduler.max_model_len <= cache,
                  "--max-model-len " << cfg.scheduler.max_model_len << ": the KV cache holds " << cache
                                     << " tokens, less than one sequence of it: raise --kv-cache-gb or lower "
                                        "--max-model-len");
    max_model_len_ = cfg.scheduler.max_model_len;
  } else {
    max_model_len_ = std::min<int64_t>(model.spec().max_position_embeddings, cache);
  }
}

std::unique_ptr<Sequence> Engine::prepare(const ParsedRequest& req, double now, RequestResult* err) const {
  err->id = req.id;
  err->line = req.line;
  err->t_queued = err->t_first_token = err->t_finished = now;
  err->finish_reason = FinishReason::kError;
  if (!req.error.empty()) {
    err->error = req.error;
    return nullptr;
  }
  auto s = std::make_unique<Sequence>();
  s->params = cfg_.defaults.resolved(req.overrides, req.id);
  if (std::string bad = s->params.validate(); !bad.empty()) {
    err->error = "line " + std::to_string(req.line) + ": " + bad;
    return nullptr;
  }
  std::vector<int32_t> ids;
  if (req.prompt_token_ids) {
    ids = *req.prompt_token_ids;
  } else if (req.prompt && !req.prompt->empty()) {
    if (auto bos = tok_.bos_to_prepend()) ids.push_back(*bos);
    std::vector<int32_t> body = tok_.encode(*req.prompt);
    ids.insert(ids.end(), body.begin(), body.end());
  }
  // Given ids, and a tokenizer's too: one whose added tokens lie past the model's embedding rows
  // would otherwise have the step read outside them.
  const int64_t vocab = model_.spec().vocab_size;
  if (std::string bad = s->params.validate_token_ids(vocab); !bad.empty()) {
    err->error = "line " + std::to_string(req.line) + ": " + bad;
    return nullptr;
  }
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab) {
      err->error = "line " + std::to_string(req.line) + ": token id " + std::to_string(id) +
                   (req.prompt_token_ids ? "" : " (from the tokenizer)") + " is outside the vocabulary [0, " +
                   std::to_string(vocab) + ")";
      return nullptr;
    }
  }
  if (ids.empty()) {
    err->error = "line " + std::to_string(req.line) + ": empty prompt";
    return nullptr;
  }
  if (static_cast<int64_t>(ids.size()) >= max_model_len_) {
    err->prompt_tokens = ids;
    err->error = "line " + std::to_string(req.line) + ": prompt of " + std::to_string(ids.size()) +
                 " tokens leaves no room to generate within the context of " + std::to_string(max_model_len_) +
                 " tokens";
    const int64_t model_len = model_.spec().max_position_embeddings;
    if (max_model_len_ < model_len) {
      // The model is not the limit: say what is, and what raises it.
      const bool by_cache = cfg_.scheduler.max_model_len == 0 || cfg_.context_limited_by_cache;
      err->error += by_cache ? " (what the KV cache holds; the model's context is " + std::to_string(model_len) +
                                   " tokens: a larger --kv-cache-gb raises it)"
                             : " (--max-model-len; the model's context is " + std::to_string(model_len) + " tokens)";
    }
    return nullptr;
  }
  s->result.id = req.id;
  s->result.line = req.line;
  s->result.prompt_tokens = ids;
  s->result.t_queued = now;
  s->tokens = std::move(ids);
  // As vLLM: the output decodes as the prompt's continuation (SentencePiece's leading space stays).
  s->decoder = std::make_unique<StreamDecoder>(tok_);
  s->decoder->prime(detokenization_context(tok_, s->tokens));
  return s;
}

namespace {

// A prompt-logprobs request's arrays, made when its first position is scored (not while it waits
// in the read-ahead window) and written by position as the prefill goes (a recomputed prefill
// finds them written). The first position has no context, as vLLM's None.
void make_prompt_logprobs(Sequence& s) {
  RequestResult& r = s.result;
  if (!s.params.scores_prompt() || !r.prompt_logprobs.empty()) return;
  const size_t n = r.prompt_tokens.size(), top = n * static_cast<size_t>(s.params.prompt_logprobs);
  r.prompt_logprobs.assign(n, std::numeric_limits<float>::quiet_NaN());
  r.prompt_top_token_ids.assign(top, -1);
  r.prompt_top_logprobs.assign(top, std::numeric_limits<float>::quiet_NaN());
}

}  // namespace

void Engine::add_token_edits(Sequence& s, SampleRow& row, std::vector<TokenEdit>& edits) {
  const SamplingParams& p = s.params;
  const int64_t out = s.len() - s.prompt_len();
  if (!p.edits_logits(out)) return;
  const size_t begin = edits.size();
  row.edits_begin = static_cast<int64_t>(begin);
  row.allowed_only = !p.allowed_token_ids.empty();
  if (p.penalized()) {
    s.seen.update(s.tokens, s.prompt_len());
    edits.insert(edits.end(), s.seen.list().begin(), s.seen.list().end());
  }
  const bool bar_stops = out < p.min_tokens;
  if (bar_stops || !p.logit_bias.empty() || row.allowed_only) {
    // Each token listed once: the seen ones found by token, the others added unseen.
    std::unordered_map<int32_t, size_t> at;
    for (size_t i = begin; i < edits.size(); ++i) at.emplace(edits[i].token, i);
    auto entry = [&](int32_t t) -> TokenEdit& {
      auto [it, added] = at.try_emplace(t, edits.size());
      if (added) edits.push_back(TokenEdit{t, -1, 0.0f, 0});
      return edits[it->second];
    };
    const int64_t vocab = model_.spec().vocab_size;
    if (bar_stops) {
      // vLLM's min_tokens: the stop tokens (EOS unless ignored, stop_token_ids) cannot be chosen
      // before it. An id past the vocabulary can never be chosen anyway.
      auto bar = [&](int32_t t) {
        if (t >= 0 && t < vocab) entry(t).bias = -INFINITY;
      };
      if (!p.ignore_eos)
        for (int32_t t : eos_) bar(t);
      for (int32_t t : p.stop_token_ids) bar(t);
    }
    for (const auto& [t, b] : p.logit_bias) entry(t).bias += b;  // after min_tokens, as vLLM: -inf stays
    for (int32_t t : p.allowed_token_ids) entry(t).allowed = 1;
  }
  row.edits_count = static_cast<int64_t>(edits.size() - begin);
}

bool Engine::append_token(Sequence& s, const Sample& smp, const int32_t* top_ids, const float* top_lps, double now) {
  RequestResult& r = s.result;
  if (r.output_tokens.empty()) r.t_first_token = now;
  r.output_tokens.push_back(smp.token);
  r.token_logprobs.push_back(smp.logprob);
  r.top_token_ids.insert(r.top_token_ids.end(), top_ids, top_ids + s.params.logprobs);
  r.top_logprobs.insert(r.top_logprobs.end(), top_lps, top_lps + s.params.logprobs);
  s.tokens.push_back(smp.token);
  // As vLLM: before min_tokens output tokens no stop token ends the request, and a stop string
  // only once the output is longer than min_tokens.
  const int64_t out = static_cast<int64_t>(r.output_tokens.size());
  if (out >= s.params.min_tokens && is_stop_token(s.params, smp.token)) {
    // As vLLM: the stop token's id stays in output_tokens, its text stays out of output_text (an
    // EOS that is a special token has none anyway).
    r.output_text = s.text;
    s.text_final = true;
    r.finish_reason = FinishReason::kStop;
    return true;
  }
  const size_t before = s.text.size();
  s.text += s.decoder->push(smp.token);
  for (const std::string& stop : s.params.stop) {
    if (out <= s.params.min_tokens) break;
    // Only the new text and the stop string's length before it can hold a new match.
    const size_t from = before >= stop.size() ? before - stop.size() + 1 : 0;
    const size_t at = s.text.find(stop, from);
    if (at != std::string::npos) {
      s.text.resize(at);
      r.output_text = s.text;
      s.text_final = true;
      r.finish_reason = FinishReason::kStop;
      return true;
    }
  }
  if (static_cast<int64_t>(r.output_tokens.size()) >= s.params.max_tokens || s.len() >= max_model_len_) {
    r.finish_reason = FinishReason::kLength;
    return true;
  }
  return false;
}

void Engine::finalize(Sequence& s, double now) {
  s.result.t_finished = now;
  make_prompt_logprobs(s);  // a one-token prompt has no position to score
  // As vLLM's, the text is what the stream gave: characters the output left unfinished stay out.
  if (!s.text_final) s.result.output_text = s.text;
}

RunStats Engine::run(RequestSource& source, ResultSink& sink) {
  const auto t0 = Clock::now();
  RunStats stats;
  const size_t M = schedulers_.size();
  const size_t lookahead =
      static_cast<size_t>(cfg_.lookahead > 0 ? cfg_.lookahead : cfg_.scheduler.max_seqs * 2 + 8);
  bool source_done = false;
  int64_t arrival = 0;
  double last_progress = 0;

  auto emit = [&](RequestResult& r) {
    r.replica = cfg_.replica;
    stats.add_result(r);
    sink.on_result(r);
  };
  auto count = [&](size_t (Scheduler::*what)() const) {
    size_t n = 0;
    for (const auto& s : schedulers_) n += ((*s).*what)();
    return n;
  };
  auto all_idle = [&] {
    for (const auto& s : schedulers_) {
      if (!s->idle()) return false;
    }
    return true;
  };

  struct InFlight {
    size_t m;
    std::vector<ScheduledChunk> chunks;
    std::vector<std::pair<int64_t, int64_t>> scored;  // each chunk's positions_to_score when issued
    StepRecord rec;
  };
  std::deque<InFlight> inflight;
  std::vector<bool> busy(M, false);
  size_t next_m = 0;
  ForwardBatch batch;
  StepChoices choices;
  // Expert-parallel models run every step on every rank of the group, empty or not.
  const bool lockstep = model_.runs_empty_steps();
  for (;;) {
    bool stop = stop_requested();
    // Keep a bounded window of requests read ahead: the prompt file is streamed, never loaded.
    while (!stop && !source_done && count(&Scheduler::num_waiting) < lookahead) {
      std::optional<ParsedRequest> req = source.next();
      if (!req) {
        source_done = true;
        break;
      }
      RequestResult err;
      std::unique_ptr<Sequence> s = prepare(*req, seconds_since(t0), &err);
      if (!s) {
        emit(err);
        continue;
      }
      s->arrival = arrival++;
      // To the micro-batch with the fewest sequences.
      Scheduler* target = schedulers_[0].get();
      for (const auto& sch : schedulers_) {
        if (sch->num_waiting() + sch->num_running() < target->num_waiting() + target->num_running()) target = sch.get();
      }
      target->add(std::move(s));
    }
    // Empty lockstep steps in flight are not work: a pipeline always has some.
    const bool working = std::any_of(inflight.begin(), inflight.end(), [](const InFlight& f) { return !f.chunks.empty(); });
    bool active = !(all_idle() && source_done && !working);
    if (cfg_.lockstep) {
      int64_t flags[2] = {stop ? 1 : 0, active ? 1 : 0};
      cfg_.lockstep->all_reduce(flags, 2, CommDType::kI64, ReduceOp::kMax);
      stop = flags[0] != 0;
      active = flags[1] != 0;
    }
    if (stop || !active) {
      // Stop admitting and stop stepping: what is in flight is dropped (a resumed run redoes it);
      // pipelined steps already begun are ended so every rank of the replica stays in step. At
      // the normal end only empty lockstep steps can be in flight.
      while (!inflight.empty()) {
        model_.end_step_sampled(&choices);
        inflight.pop_front();
      }
      if (stop) stats.interrupted_by = stop_requested() ? stop_signal() : SIGTERM;
      break;
    }

    // Issue a step for every micro-batch that is not in flight and has work.
    for (size_t k = 0; k < M; ++k) {
      const size_t m = (next_m + k) % M;
      if (busy[m]) continue;
      std::vector<ScheduledChunk> chunks = schedulers_[m]->schedule();
      // In lockstep an idle micro-batch still steps (empty), so every group begins as many steps.
      if (chunks.empty() && !lockstep) continue;
      InFlight f{m, std::move(chunks), {}, {}};
      f.rec.replica = cfg_.replica;
      f.rec.batch_size = static_cast<int32_t>(f.chunks.size());
      f.rec.t_start = seconds_since(t0);
      batch.clear();
      int64_t top = 0;  // the step's top alternatives so far (SampleRow::top_begin)
      for (const ScheduledChunk& c : f.chunks) {
        const int64_t first = batch.num_tokens();
        batch.add_chunk(c.seq->tokens.data(), c.start, c.len, c.seq->blocks, cfg_.scheduler.block_size, false);
        // Prompt logprobs: a row at each position whose next token is a prompt token, scored on it.
        const auto [from, to] = c.seq->positions_to_score(c.start, c.len);
        f.scored.emplace_back(from, to);
        for (int64_t p = from; p < to; ++p) {
          SampleRow row;
          row.target = c.seq->tokens[static_cast<size_t>(p + 1)];
          row.position = p + 1;
          row.top_n = c.seq->params.prompt_logprobs;
          row.top_begin = top;
          top += row.top_n;
          batch.logit_rows.push_back(static_cast<int32_t>(first + p - c.start));
          batch.sample_rows.push_back(row);
        }
        // The sampled token takes index len() in its sequence, which no other step in flight
        // changes (a sequence belongs to one micro-batch, with one step in flight).
        if (c.samples) {
          SampleRow row = sample_row(c.seq->params, c.seq->len());
          add_token_edits(*c.seq, row, batch.token_edits);
          row.top_n = c.seq->params.logprobs;
          row.top_begin = top;
          top += row.top_n;
          batch.logit_rows.push_back(static_cast<int32_t>(batch.num_tokens() - 1));
          batch.sample_rows.push_back(row);
        }
        // A chunk of one token past the prompt is decode; anything else is prefill (or recompute).
        if (c.len == 1 && c.start >= c.seq->prompt_len()) {
          f.rec.decode_tokens += 1;
        } else {
          f.rec.prefill_tokens += static_cast<int32_t>(c.len);
        }
      }
      model_.begin_step(batch);
      busy[m] = true;
      inflight.push_back(std::move(f));
    }
    next_m = (next_m + 1) % M;
    SHARDLM_CHECK(!inflight.empty(), "scheduler made no progress with " << count(&Scheduler::num_waiting)
                                                                      << " waiting and " << count(&Scheduler::num_running)
                                                                      << " running");

    // Finish the oldest step: sample, stop, and hand finished requests on.
    InFlight f = std::move(inflight.front());
    inflight.pop_front();
    // The model sampled where its logits ended (the last stage's device), with the rows the step
    // was begun with.
    model_.end_step_sampled(&choices);
    const double now = seconds_since(t0);
    size_t row = 0;
    int64_t top = 0;
    std::vector<Sequence*> done;
    for (size_t i = 0; i < f.chunks.size(); ++i) {
      const ScheduledChunk& c = f.chunks[i];
      Sequence& q = *c.seq;
      q.computed = c.start + c.len;
      RequestResult& r = q.result;
      const int64_t n = q.params.prompt_logprobs;
      if (f.scored[i].first < f.scored[i].second) make_prompt_logprobs(q);
      for (int64_t p = f.scored[i].first; p < f.scored[i].second; ++p, ++row, top += n) {
        const size_t at = static_cast<size_t>(p + 1);
        r.prompt_logprobs[at] = choices.logprobs[row];
        std::copy_n(choices.top_tokens.begin() + top, n, r.prompt_top_token_ids.begin() + static_cast<int64_t>(at) * n);
        std::copy_n(choices.top_logprobs.begin() + top, n,
                    r.prompt_top_logprobs.begin() + static_cast<int64_t>(at) * n);
      }
      q.scored = std::max(q.scored, f.scored[i].second);
      if (!c.samples) continue;
      const Sample smp{choices.tokens[row], choices.logprobs[row]};
      ++row;
      const bool finished =
          append_token(q, smp, choices.top_tokens.data() + top, choices.top_logprobs.data() + top, now);
      top += q.params.logprobs;
      if (finished) done.push_back(c.seq);
    }
    busy[f.m] = false;
    if (f.chunks.empty()) continue;  // an empty lockstep step: nothing to record
    f.rec.kv_blocks_used = blocks_.num_used();
    if (const MoeStepStats* moe = model_.last_step_moe()) {
      f.rec.moe_dispatch_s = moe->dispatch_s;
      f.rec.moe_combine_s = moe->combine_s;
      f.rec.moe_dispatch_bytes = moe->dispatch_bytes;
      f.rec.moe_combine_bytes = moe->combine_bytes;
      f.rec.expert_tokens.assign(moe->expert_tokens.begin(), moe->expert_tokens.end());
    }
    if (const std::vector<StageSeconds>* stages = model_.last_step_stages()) {
      f.rec.stage_compute_s.clear();
      f.rec.stage_comm_s.clear();
      for (const StageSeconds& st : *stages) {
        f.rec.stage_compute_s.push_back(st.compute_s);
        f.rec.stage_comm_s.push_back(st.comm_s);
      }
    }
    for (Sequence* s : done) {
      std::unique_ptr<Sequence> owned = schedulers_[f.m]->finish(s);
      finalize(*owned, now);
      emit(owned->result);
    }
    f.rec.running = static_cast<int32_t>(count(&Scheduler::num_running));
    f.rec.waiting = static_cast<int32_t>(count(&Scheduler::num_waiting));
    f.rec.step = stats.steps;
    f.rec.wall_s = now - f.rec.t_start;
    sink.on_step(f.rec);
    ++stats.steps;

    if (cfg_.progress_interval_s > 0 && now - last_progress >= cfg_.progress_interval_s) {
      last_progress = now;
      // Against this replica's share of what the file has left (replicas claim windows as they go,
      // so the share is an even split); the ETA assumes the rest goes at the rate so far.
      const int64_t replicas = std::max<int32_t>(cfg_.replicas, 1);
      const int64_t share = cfg_.total_requests >= 0 ? (cfg_.total_requests + replicas - 1) / replicas : -1;
      std::string eta = "?", of = "?";
      if (share >= 0) of = (replicas > 1 ? "~" : "") + std::to_string(share);
      if (share >= 0 && stats.requests > 0) {
        const double left = static_cast<double>(std::max<int64_t>(0, share - stats.requests));
        eta = std::to_string(static_cast<int64_t>(left * now / static_cast<double>(stats.requests))) + " s";
      }
      std::fprintf(stderr,
                   "[shardlm] replica %d: %lld/%s requests, %zu running, %zu waiting, %.1f output tok/s, ETA %s, "
                   "KV %d/%d blocks (%.0f%%)\n",
                   cfg_.replica, static_cast<long long>(stats.requests), of.c_str(), count(&Scheduler::num_running),
                   count(&Scheduler::num_waiting), stats.output_tokens / std::max(now, 1e-9), eta.c_str(),
                   blocks_.num_used(), blocks_.num_blocks(),
                   100.0 * blocks_.num_used() / std::max(1, blocks_.num_blocks()));
    }
  }
  stats.wall_s = seconds_since(t0);
  for (const auto& s : schedulers_) stats.preemptions += s->preemptions();
  return stats;
}

}  // namespace shardlm
