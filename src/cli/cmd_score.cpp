// shardlm score: the model's next-token logits at every position of a token sequence, written as
// a .npy file [T, vocab] float32. For checking shardlm against another implementation on the same
// weights (tests/hf_compare.py) and for scoring text.
#include <boost/program_options.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "arch/model.h"
#include "arch/replica_steps.h"
#include "cli/commands.h"
#include "cli/subcommand.h"
#include "compute/backend.h"
#include "core/error.h"
#include "cpu/threads.h"
#include "engine/kv_cache.h"
#include "model/checkpoint.h"
#include "model/model_spec.h"
#include "parallel/layout_groups.h"
#include "parallel/mpi_env.h"
#include "parallel/topology.h"

namespace po = boost::program_options;

namespace shardlm {

namespace {

void write_npy_f32(const std::string& path, const std::vector<float>& data, int64_t rows, int64_t cols) {
  std::ofstream f(path, std::ios::binary);
  SHARDLM_CHECK(f, "cannot write " << path);
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "), }";
  // Magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of 64.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  const uint16_t hlen = static_cast<uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.put(static_cast<char>(hlen & 0xff));
  f.put(static_cast<char>(hlen >> 8));
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(float)));
  SHARDLM_CHECK(f.good(), "short write to " << path);
}

}  // namespace

int cmd_score(int argc, char** argv) {
  std::string model_dir, ids_text, out, comm = "mpi", kv_dtype = "fp32", kv_scales;
  int threads = 0, tp = 1, pp = 1;
  double comm_timeout = 600;
  po::options_description d("shardlm score options");
  d.add_options()("model", po::value(&model_dir), "model directory")(
      "ids", po::value(&ids_text), "space-separated token ids (include BOS if wanted)")(
      "out", po::value(&out), "output .npy file: float32 logits [T, vocab]")(
      "threads", po::value(&threads)->default_value(threads), "CPU threads (0 = all cores)")(
      "tp", po::value(&tp)->default_value(tp), "tensor-parallel ranks (mpirun -np tp x pp)")(
      "pp", po::value(&pp)->default_value(pp), "pipeline stages")(
      "comm", po::value(&comm)->default_value(comm), "communicator of the tp and pp groups: mpi, fabric or nccl")(
      "comm-timeout", po::value(&comm_timeout)->default_value(comm_timeout), "seconds a rank waits on another")(
      "kv-dtype", po::value(&kv_dtype)->default_value(kv_dtype),
      "KV cache the scores attend over: fp32 (unrounded keys and values), bf16, fp8 or auto, as shardlm run")(
      "kv-scales", po::value(&kv_scales), "an fp8 cache's per-layer scales from this safetensors file, as shardlm run");
  po::variables_map vm;
  const char* usage = "[mpirun -np TPxPP] shardlm score --model DIR --ids \"1 2 3\" --out logits.npy [--tp T] [--pp P]";
  if (!parse_subcommand(argc, argv, "score", usage, d, &vm)) return 0;
  SHARDLM_CHECK(!model_dir.empty() && !out.empty() && !ids_text.empty(), "shardlm score: --model, --ids and --out are required");
  cpu::set_num_threads(threads);
  ModelSpec spec = ModelSpec::load(model_dir);
  const DType cache_dtype = resolve_kv_dtype(kv_dtype, spec.torch_dtype);
  std::vector<int32_t> ids;
  {
    std::istringstream in(ids_text);
    long long v;
    while (in >> v) {
      SHARDLM_CHECK(v >= 0 && v < spec.vocab_size, "shardlm score: id " << v << " outside [0, " << spec.vocab_size << ")");
      ids.push_back(static_cast<int32_t>(v));
    }
    SHARDLM_CHECK(in.eof(), "shardlm score: --ids must be integers separated by spaces");
  }
  const int64_t T = static_cast<int64_t>(ids.size());
  SHARDLM_CHECK(T > 0 && T <= spec.max_position_embeddings, "shardlm score: need 1.." << spec.max_position_embeddings << " ids");
  // One model copy over tp x pp ranks; the leader (rank 0) writes the file.
  const Topology topo(Layout{tp, pp, 1}, MpiEnv::rank(), MpiEnv::size(), spec);
  const LayoutGroups groups = make_layout_groups(topo, comm, comm_timeout);
  const auto [first_layer, last_layer] = topo.stage_layers(topo.coords().pp);
  ShardPlan plan = ShardPlan::make(spec, topo.coords().tp, tp, topo.coords().pp, pp, first_layer, last_layer);
  plan.set_expert_parallel(spec, 0, 1);  // experts split over tp
  std::unique_ptr<Checkpoint> ckpt = Checkpoint::open(model_dir);
  if (!kv_scales.empty()) ckpt->add_file(kv_scales);
  std::unique_ptr<ComputeBackend> backend = make_backend("cpu");
  std::unique_ptr<Model> model = build_model(spec, *ckpt, *backend, plan, groups.shard());
  const int64_t blocks = (T + 15) / 16;
  if (!topo.is_replica_leader()) {
    serve_replica_steps(*model, *groups.replica, INT64_MAX / 2, 16, blocks, cache_dtype);
    return 0;
  }
  std::unique_ptr<BroadcastingModel> broadcasting;
  Model* leader = model.get();
  if (groups.replica) {
    broadcasting = std::make_unique<BroadcastingModel>(*model, *groups.replica);
    leader = broadcasting.get();
  }
  leader->allocate_kv_cache(INT64_MAX / 2, 16, blocks, cache_dtype);
  std::vector<int32_t> table(blocks);
  for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(b);
  ForwardBatch batch;
  batch.clear();
  batch.add_chunk(ids.data(), 0, T, table, 16, false);
  for (int64_t t = 0; t < T; ++t) batch.logit_rows.push_back(static_cast<int32_t>(t));
  std::vector<float> logits(static_cast<size_t>(T * spec.vocab_size));
  leader->forward(batch, logits.data());
  if (broadcasting) broadcasting->finish();
  write_npy_f32(out, logits, T, spec.vocab_size);
  return 0;
}

}  // namespace shardlm
