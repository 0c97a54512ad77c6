// shardlm run: the main job.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <fstream>

#include "arch/model.h"
#include "cli/commands.h"
#include "cli/run_info.h"
#include "cli/run_options.h"
#include "compute/backend.h"
#include "core/build_info.h"
#include "core/error.h"
#include "cpu/threads.h"
#include "engine/engine.h"
#include "io/request_reader.h"
#include "io/result_writer.h"
#include "model/checkpoint.h"
#include "model/model_spec.h"
#include "parallel/mpi_env.h"
#include "parallel/replica_results.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

namespace {

class ReaderSource final : public RequestSource {
 public:
  explicit ReaderSource(RequestReader& r) : r_(r) {}
  std::optional<ParsedRequest> next() override { return r_.next(); }

 private:
  RequestReader& r_;
};

// On the writer rank: every result (its own and other replicas') goes to the file and the totals.
class WriterSink final : public ResultSink {
 public:
  WriterSink(ResultWriter& w, RunStats& stats) : w_(w), stats_(stats) {}
  void on_result(const RequestResult& r) override {
    w_.append(r);
    stats_.add_result(r);
  }
  void on_step(const StepRecord& s) override { w_.append_step(s); }

 private:
  ResultWriter& w_;
  RunStats& stats_;
};

// The writer rank's own engine: after each of its steps, take in what other replicas sent.
class PollingSink final : public ResultSink {
 public:
  PollingSink(ResultSink& inner, ReplicaCollector& c) : inner_(inner), c_(c) {}
  void on_result(const RequestResult& r) override { inner_.on_result(r); }
  void on_step(const StepRecord& s) override {
    inner_.on_step(s);
    c_.poll();
  }

 private:
  ResultSink& inner_;
  ReplicaCollector& c_;
};

// Rank 0 prints one line per rank: where it runs and what it does.
void print_layout(int world) {
  char host[64] = {0};
  std::snprintf(host, sizeof host, "%s", MpiEnv::host().c_str());
  std::vector<char> all(static_cast<size_t>(world) * sizeof host);
  MPI_Gather(host, sizeof host, MPI_CHAR, all.data(), sizeof host, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (MpiEnv::rank() != 0) return;
  std::fprintf(stderr, "[shardlm] layout: %d rank(s), replicas=%d pp=1 tp=1\n[shardlm]   rank  host              replica\n",
               world, world);
  for (int r = 0; r < world; ++r) {
    std::fprintf(stderr, "[shardlm]   %4d  %-16s  %7d\n", r, all.data() + static_cast<size_t>(r) * sizeof host, r);
  }
}

// Lines in the prompt file, for the progress line's total (a streaming count, memory flat).
int64_t count_lines(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return -1;
  static char buf[1 << 16];
  int64_t n = 0;
  char last = '\n';
  while (f.read(buf, sizeof buf) || f.gcount() > 0) {
    const std::streamsize got = f.gcount();
    for (std::streamsize i = 0; i < got; ++i) n += buf[i] == '\n';
    last = buf[got - 1];
  }
  return n + (last != '\n');
}

double seconds(std::chrono::steady_clock::time_point a) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

}  // namespace

int cmd_run(int argc, char** argv) {
  RunOptions opt;
  if (!parse_run_options(argc, argv, &opt)) return 0;
  // Every rank is a replica: a whole model copy taking every world-th request; rank 0 also writes.
  const int rank = MpiEnv::rank(), world = MpiEnv::size();
  const bool writer_rank = rank == 0;
  cpu::set_num_threads(opt.threads);
  const std::string started = iso_time_now();

  const auto t_load = std::chrono::steady_clock::now();
  ModelSpec spec = ModelSpec::load(opt.model);
  std::unique_ptr<Tokenizer> tok = Tokenizer::load(opt.model);
  std::unique_ptr<Checkpoint> ckpt = Checkpoint::open(opt.model);
  std::unique_ptr<ComputeBackend> backend = make_backend(opt.backend);
  std::unique_ptr<Model> model = build_model(spec, *ckpt, *backend);
  const double load_s = seconds(t_load);

  EngineConfig ec;
  ec.scheduler.max_batch_tokens = opt.max_batch_tokens;
  ec.scheduler.max_seqs = opt.max_seqs;
  ec.scheduler.block_size = opt.block_size;
  ec.defaults.max_tokens = opt.max_new_tokens;
  ec.defaults.temperature = opt.temperature;
  ec.defaults.top_p = opt.top_p;
  ec.defaults.top_k = opt.top_k;
  ec.defaults.min_p = opt.min_p;
  ec.defaults.seed = opt.seed;
  ec.defaults.stop = opt.stop;
  ec.defaults.ignore_eos = opt.ignore_eos;
  SHARDLM_CHECK(ec.defaults.validate().empty(), "run defaults: " << ec.defaults.validate());
  ec.kv_cache_bytes = static_cast<int64_t>(opt.kv_cache_gb * (1ull << 30));
  ec.progress_interval_s = opt.quiet ? 0 : opt.progress_interval;
  ec.total_requests = count_lines(opt.prompts);
  if (ec.total_requests >= 0) ec.total_requests = (ec.total_requests + world - 1 - rank) / world;  // its stripe
  ec.replica = rank;
  Engine engine(*model, *tok, *backend, ec);

  if (!opt.quiet) print_layout(world);
  if (!opt.quiet && writer_rank) {
    std::fprintf(stderr,
                 "[shardlm] %s: %s, %lld layers, hidden %lld, %lld heads (%lld KV), vocab %lld; %.2f GB of weights "
                 "loaded in %.2f s; KV cache %d blocks x %lld tokens; backend %s, %d threads\n",
                 opt.model.c_str(), spec.architecture.c_str(), static_cast<long long>(spec.num_layers),
                 static_cast<long long>(spec.hidden_size), static_cast<long long>(spec.num_heads),
                 static_cast<long long>(spec.num_kv_heads), static_cast<long long>(spec.vocab_size),
                 ckpt->total_bytes() / 1e9, load_s, engine.kv_blocks(), static_cast<long long>(opt.block_size),
                 backend->name().c_str(), cpu::num_threads());
  }

  RequestReader reader(opt.prompts, prompt_format_from_name(opt.format));
  reader.set_stripe(rank, world);
  ReaderSource source(reader);
  if (!writer_rank) {
    RemoteSink sink(0);
    RunStats local = engine.run(source, sink);
    sink.finish({local.steps, local.preemptions});
    return 0;
  }

  ResultWriter writer(opt.out, opt.flush_every);
  writer.set_attr("version", std::string(SHARDLM_VERSION));
  writer.set_attr("git_commit", std::string(SHARDLM_GIT_COMMIT));
  writer.set_attr("command_line", command_line(argc + 1, argv - 1));
  writer.set_attr("config", to_ini(opt));
  writer.set_attr("model_architecture", spec.architecture);
  writer.set_attr("model_config_hash", spec.config_hash);
  writer.set_attr("layout", "world=" + std::to_string(world) + " replicas=" + std::to_string(world) + " pp=1 tp=1");
  writer.set_attr("backend", backend->name());
  writer.set_attr("seed", static_cast<int64_t>(opt.seed));
  writer.set_attr("start_time", started);
  writer.set_attr("load_seconds", load_s);
  writer.set_attr("load_bytes", static_cast<int64_t>(ckpt->total_bytes()));
  for (const auto& [lib, ver] : library_versions()) writer.set_attr("version_" + lib, ver);

  RunStats stats;  // every replica's requests
  WriterSink sink(writer, stats);
  ReplicaCollector collector(sink, world, opt.comm_timeout);
  PollingSink polling(sink, collector);
  const auto t_run = std::chrono::steady_clock::now();
  RunStats local = engine.run(source, polling);
  collector.drain();
  stats.wall_s = seconds(t_run);
  stats.steps = local.steps + collector.totals().steps;
  stats.preemptions = local.preemptions + collector.totals().preemptions;

  writer.set_attr("end_time", iso_time_now());
  writer.set_attr("summary", stats.summary());
  writer.set_attr("requests", stats.requests);
  writer.set_attr("request_errors", stats.errors);
  writer.set_attr("prompt_tokens", stats.prompt_tokens);
  writer.set_attr("output_tokens", stats.output_tokens);
  writer.set_attr("wall_seconds", stats.wall_s);
  writer.set_attr("output_tokens_per_s", stats.output_tokens_per_s());
  writer.set_attr("total_tokens_per_s", stats.total_tokens_per_s());
  writer.set_attr("requests_per_s", stats.requests_per_s());
  writer.set_attr("steps", stats.steps);
  writer.set_attr("preemptions", stats.preemptions);
  for (double q : {50.0, 90.0, 99.0}) {
    const std::string p = std::to_string(static_cast<int>(q));
    writer.set_attr("ttft_p" + p + "_s", percentile(stats.ttft_s, q));
    writer.set_attr("tpot_p" + p + "_s", percentile(stats.tpot_s, q));
  }
  writer.close();
  std::fprintf(stderr, "[shardlm] done: %s -> %s\n", stats.summary().c_str(), opt.out.c_str());
  return 0;
}

}  // namespace shardlm
