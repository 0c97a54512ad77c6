// The network preflight of `shardlm run` end to end, on the tiny random-weight model: a normal run
// prints one fabric line and records the fabric attributes; --require-efa (flag or job-file key)
// ends the job with the node and its providers named, alone and as a 2-rank job, on this
// EFA-less machine; --comm fabric records its provider, or fails naming what libfabric said.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common/cli_runner.h"
#include "common/h5_read.h"
#include "common/test_files.h"

namespace fs = std::filesystem;

namespace shardlm {
namespace {

using test::Proc;
using test::sh;

class FabricPreflightCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(test::fresh_dir("fabric"));
    Proc m = sh(test::shardlm_bin() + " make-model --config " + src("inputs/models/tiny-llama.json") + " --out " +
                at("model") + " --seed 1");
    ASSERT_EQ(m.code, 0) << m.out;
    test::write_file(*dir_ / "p.jsonl", "{\"id\": \"a\", \"prompt\": \"Once upon a time\"}\n"
                                        "{\"id\": \"b\", \"prompt\": \"The dog\"}\n");
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override {
    if (fs::exists("/opt/amazon/efa")) GTEST_SKIP() << "an EFA node: these checks expect a machine without EFA";
  }

  static std::string src(const std::string& rel) { return std::string(SHARDLM_SOURCE_DIR) + "/" + rel; }
  static std::string at(const std::string& name) { return (*dir_ / name).string(); }
  static Proc run(const std::string& out, const std::string& more, int np = 1) {
    return sh((np > 1 ? test::mpirun(np) : std::string()) + test::shardlm_bin() + " run --config " +
              src("jobs/tiny.ini") + " --model " + at("model") + " --prompts " + at("p.jsonl") + " --out " + at(out) +
              " --max-new-tokens 4 --threads 1 -q " + more);
  }

  static fs::path* dir_;
};

fs::path* FabricPreflightCli::dir_ = nullptr;

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_F(FabricPreflightCli, NormalRunPrintsOneLineAndRecordsTheFabric) {
  Proc p = run("ok.h5", "");
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_EQ(count_of(p.out, "[shardlm] fabric"), 1) << p.out;
  EXPECT_NE(p.out.find("[shardlm] fabric: "), std::string::npos) << p.out;

  test::H5Reader h(at("ok.h5"));
  ASSERT_TRUE(h.ok());
  const std::string providers = h.string_attr("fabric_providers");
#ifdef SHARDLM_HAVE_LIBFABRIC
  EXPECT_TRUE(providers.find("tcp") != std::string::npos || providers.find("shm") != std::string::npos ||
              providers.find("sockets") != std::string::npos)
      << providers;
#endif
  EXPECT_EQ(providers.find("efa"), std::string::npos) << providers;
  EXPECT_EQ(h.scalar_attr<int64_t>("fabric_efa_devices", H5T_NATIVE_INT64), 0);
  EXPECT_EQ(h.scalar_attr<int64_t>("nodes", H5T_NATIVE_INT64), 1);
  EXPECT_GE(h.scalar_attr<int64_t>("gpus_per_node", H5T_NATIVE_INT64), 0);
  const std::string net = h.string_attr("fabric_nccl_net");
  EXPECT_TRUE(net == "Socket" || net == "IB" || net == "aws-ofi-nccl") << net;
  const auto warnings = nlohmann::json::parse(h.string_attr("fabric_warnings"));
  EXPECT_TRUE(warnings.is_array()) << warnings.dump();
  const auto nodes = nlohmann::json::parse(h.string_attr("fabric_nodes"));
  ASSERT_TRUE(nodes.is_array());
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_FALSE(nodes[0].value("host", "").empty());
  EXPECT_FALSE(h.string_attr("nccl_version").empty());
  EXPECT_FALSE(h.string_attr("cuda_runtime_version").empty());
  EXPECT_FALSE(h.string_attr("cuda_driver_version").empty());
  EXPECT_NE(h.string_attr("config").find("require-efa = false"), std::string::npos);
}

TEST_F(FabricPreflightCli, RequireEfaFailsNamingTheNodeAndItsProviders) {
  Proc p = run("efa.h5", "--require-efa");
  EXPECT_NE(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("--require-efa: no efa libfabric provider on 1 of 1 node(s): node 0 ("), std::string::npos)
      << p.out;
  EXPECT_NE(p.out.find(") has providers ["), std::string::npos) << p.out;
}

TEST_F(FabricPreflightCli, RequireEfaFromTheJobFile) {
  test::write_file(*dir_ / "efa.ini", "require-efa = true\n");
  Proc p = sh(test::shardlm_bin() + " run --config " + at("efa.ini") + " --model " + at("model") + " --prompts " +
              at("p.jsonl") + " --out " + at("ini.h5") + " --threads 1 -q");
  EXPECT_NE(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("--require-efa: no efa libfabric provider"), std::string::npos) << p.out;
}

// Two ranks: the verdict reaches both, the job ends (no rank left waiting), the report came first.
TEST_F(FabricPreflightCli, RequireEfaEndsATwoRankJob) {
  Proc p = run("efa2.h5", "--require-efa --comm-timeout 60", 2);
  EXPECT_NE(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("[shardlm] fabric node 0 ("), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("--require-efa: no efa libfabric provider on 1 of 1 node(s): node 0 ("), std::string::npos)
      << p.out;
}

// --comm fabric: the run header and the output file name the provider the tp group opened; a
// provider that does not exist ends the job on every rank with libfabric's answer.
TEST_F(FabricPreflightCli, FabricCommunicatorNamesItsProviderOrFailsClearly) {
#ifndef SHARDLM_HAVE_LIBFABRIC
  GTEST_SKIP() << "built without libfabric: no --comm fabric";
#else
  Proc ok = run("comm.h5", "--tp 2 --comm fabric --comm-timeout 60", 2);
  ASSERT_EQ(ok.code, 0) << ok.out;
  test::H5Reader h(at("comm.h5"));
  ASSERT_TRUE(h.ok());
  const std::string transport = h.string_attr("comm_transport");
  EXPECT_EQ(transport.rfind("libfabric shm (fabric ", 0), 0u) << transport;  // one node, FI_PROVIDER unset
  Proc missing = sh("FI_PROVIDER=bogus " + test::mpirun(2) + test::shardlm_bin() + " run --config " +
                    src("jobs/tiny.ini") + " --model " + at("model") + " --prompts " + at("p.jsonl") + " --out " +
                    at("bogus.h5") + " --max-new-tokens 4 --threads 1 -q --tp 2 --comm fabric --comm-timeout 60");
  EXPECT_NE(missing.code, 0) << missing.out;
  EXPECT_NE(missing.out.find("no provider offers a reliable-datagram endpoint with tagged, send-ordered messages "
                             "(FI_PROVIDER=bogus)"),
            std::string::npos)
      << missing.out;
#endif
}

TEST_F(FabricPreflightCli, BadReportModeIsAnError) {
  Proc p = run("bad.h5", "--fabric-report loud");
  EXPECT_NE(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("--fabric-report must be auto, on, line or off, not 'loud'"), std::string::npos) << p.out;
}

}  // namespace
}  // namespace shardlm
