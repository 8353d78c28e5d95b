// `afd bench decode --topology --kernel-trace-csv`: the rank processes' trace files merged into
// one CSV (diag::MergeRankTraces).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "afd/common/error.h"
#include "afd/diag/deployment_bench.h"

namespace afd::diag {
namespace {

namespace fs = std::filesystem;

class RankTraces : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("afd_rank_traces_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    csv_ = (dir_ / "trace.csv").string();
  }
  void TearDown() override { fs::remove_all(dir_); }
  void WritePart(int64_t batch, const std::string& rank, const std::string& body) {
    std::ofstream(RankTracePrefix(csv_, batch) + rank + ".csv")
        << "stream,graph,launch,start_ns,end_ns,kernel\n"
        << body;
  }
  std::string Read() const {
    std::stringstream s;
    s << std::ifstream(csv_).rdbuf();
    return s.str();
  }
  fs::path dir_;
  std::string csv_;
};

TEST_F(RankTraces, MergesEveryRankByStartFromTheBatchsFirstKernel) {
  WritePart(1, "attention0",
            "7,3,100,5000,6500,\"PublishSlot\"\n7,3,100,9000,12000,\"AwaitSlot\"\n");
  WritePart(1, "ffn0", "13,0,40,7000,8250,\"Gemv<4, \"\"a\"\">\"\n");
  WritePart(16, "attention0", "7,9,300,1000000,1000500,\"Rms\"\n");
  MergeRankTraces(csv_, {1, 16});
  EXPECT_EQ(Read(),
            "batch,rank,stream,graph,launch,start_us,end_us,kernel\n"
            "1,attention0,7,3,100,0.000,1.500,\"PublishSlot\"\n"
            "1,ffn0,13,0,40,2.000,3.250,\"Gemv<4, \"\"a\"\">\"\n"
            "1,attention0,7,3,100,4.000,7.000,\"AwaitSlot\"\n"
            "16,attention0,7,9,300,0.000,0.500,\"Rms\"\n");
  // The parts are gone, the merged file stays.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST_F(RankTraces, AMissingBatchOrABadLineIsNamed) {
  WritePart(1, "attention0", "7,3,100,5000,6500,\"PublishSlot\"\n");
  try {
    MergeRankTraces(csv_, {1, 64});
    FAIL() << "a batch without parts was merged";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch 64's ranks wrote no trace"), std::string::npos)
        << e.what();
  }
  WritePart(2, "ffn1", "7,3,100,50x0,6500,\"PublishSlot\"\n");
  try {
    MergeRankTraces(csv_, {2});
    FAIL() << "a malformed line was merged";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("trace.csv.b2.ffn1.csv: a start or end that is not"),
              std::string::npos)
        << e.what();
  }
  WritePart(3, "ffn0", "7,3\n");
  try {
    MergeRankTraces(csv_, {3});
    FAIL() << "a short line was merged";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a line without its six fields: 7,3"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace afd::diag
