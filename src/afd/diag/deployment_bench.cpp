#include "afd/diag/deployment_bench.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>

#include "afd/common/error.h"
#include "afd/model/loader.h"
#include "afd/runtime/engine.h"

namespace afd::diag {

using deploy::DeploymentSpec;

std::vector<DeploymentBenchRow> BenchDecodeOnDeployment(DeploymentSpec spec,
                                                        const DeploymentBenchOptions& o) {
  model::OpenOptions open;
  open.num_layers = o.num_layers;
  const model::ModelConfig config = model::PeekModelConfig(o.model, open);
  const int64_t ctx = o.context;
  const int64_t warm = runtime::GenerationStats::kWarmDecodeSteps;
  AFD_CHECK(ctx + o.steps + warm + 1 <= config.max_position_embeddings,
            "--context {} + --steps {} (+ {} warm-up steps): longer than the model's {} positions",
            ctx, o.steps, warm, config.max_position_embeddings);
  std::vector<DeploymentBenchRow> rows;
  for (int64_t batch : o.batch_sizes) {
    std::vector<std::vector<int32_t>> prompts(batch);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < ctx; ++i) {  // deterministic ids, away from the special ones
        const uint64_t h = (o.seed + 1) * 0x9E3779B97F4A7C15ull + b * 7919 + i * 104729;
        prompts[b].push_back(static_cast<int32_t>(2 + h % (config.vocab_size - 2)));
      }
    }
    spec.worker_flags = o.worker_flags(batch);
    std::vector<nlohmann::json> stats;
    RunDeployment(spec, prompts, &stats);
    double slowest_decode = 0, slowest_prefill = 0, ms = 0;
    int64_t decode_tokens = 0, prefill_tokens = 0;
    for (size_t r = 0; r < stats.size(); ++r) {
      const nlohmann::json& st = stats[r];
      // The steady decode steps: after each engine's warm-up steps (first kernel and library
      // use, as the one-process bench leaves out).
      if (st.value("steady_decode_steps", int64_t{0}) == 0) continue;
      const double ds = st["steady_decode_seconds"].get<double>();
      slowest_decode = std::max(slowest_decode, ds);
      slowest_prefill = std::max(slowest_prefill, st["prefill_seconds"].get<double>());
      ms = std::max(ms, 1e3 * ds / st["steady_decode_steps"].get<int64_t>());
      if (static_cast<int>(r) % spec.attention_tp == 0) {  // TP peers repeat them
        decode_tokens += st["steady_decode_tokens"].get<int64_t>();
        prefill_tokens += st["prefill_tokens"].get<int64_t>();
      }
    }
    AFD_CHECK(slowest_decode > 0, "no attention rank decoded (batch {})", batch);
    rows.push_back({batch, ms, decode_tokens / slowest_decode,
                    prefill_tokens / std::max(slowest_prefill, 1e-12)});
  }
  return rows;
}

std::string RankTracePrefix(const std::string& csv, int64_t batch) {
  // Absolute: the rank processes need not share this process's working directory.
  return fmt::format("{}.b{}.", std::filesystem::absolute(csv).string(), batch);
}

void MergeRankTraces(const std::string& csv, const std::vector<int64_t>& batches) {
  namespace fs = std::filesystem;
  struct Line {
    uint64_t start_ns, end_ns;
    std::string rank, head, name;  // head: "stream,graph,launch"
  };
  std::ofstream out(csv);
  AFD_CHECK(out.good(), "{}: cannot open it for writing", csv);
  out << "batch,rank,stream,graph,launch,start_us,end_us,kernel\n";
  const fs::path dir = fs::absolute(fs::path(csv)).parent_path();
  for (const int64_t batch : batches) {
    const std::string prefix = fs::path(RankTracePrefix(csv, batch)).filename().string();
    std::vector<Line> lines;
    std::vector<fs::path> parts;
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      const std::string file = e.path().filename().string();
      if (file.rfind(prefix, 0) != 0 || e.path().extension() != ".csv") continue;
      parts.push_back(e.path());
    }
    std::sort(parts.begin(), parts.end());
    for (const fs::path& part : parts) {
      const std::string file = part.filename().string();
      const std::string rank = file.substr(prefix.size(), file.size() - prefix.size() - 4);
      std::ifstream in(part);
      std::string line;
      std::getline(in, line);  // the header
      while (std::getline(in, line)) {
        // stream,graph,launch,start_ns,end_ns,"kernel"
        size_t commas[5], at = 0;
        for (size_t& c : commas) {
          c = line.find(',', at);
          AFD_CHECK(c != std::string::npos, "{}: a line without its six fields: {}", part.string(),
                    line);
          at = c + 1;
        }
        const auto number = [&](size_t from, size_t to) {
          uint64_t v = 0;
          const char* end = line.data() + to;
          const auto [p, ec] = std::from_chars(line.data() + from, end, v);
          AFD_CHECK(ec == std::errc() && p == end && to > from,
                    "{}: a start or end that is not a whole number of ns: {}", part.string(), line);
          return v;
        };
        Line l;
        l.head = line.substr(0, commas[2]);
        l.start_ns = number(commas[2] + 1, commas[3]);
        l.end_ns = number(commas[3] + 1, commas[4]);
        l.name = line.substr(commas[4] + 1);
        l.rank = rank;
        lines.push_back(std::move(l));
      }
    }
    AFD_CHECK(!parts.empty(), "{}: batch {}'s ranks wrote no trace ({}*.csv)", csv, batch,
              (dir / prefix).string());
    std::stable_sort(lines.begin(), lines.end(),
                     [](const Line& x, const Line& y) { return x.start_ns < y.start_ns; });
    const uint64_t t0 = lines.empty() ? 0 : lines.front().start_ns;
    for (const Line& l : lines) {
      out << fmt::format("{},{},{},{:.3f},{:.3f},{}\n", batch, l.rank, l.head,
                         static_cast<double>(l.start_ns - t0) / 1e3,
                         static_cast<double>(l.end_ns - t0) / 1e3, l.name);
    }
    for (const fs::path& p : parts) fs::remove(p);
  }
  out.close();
  AFD_CHECK(out.good(), "{}: writing it failed", csv);
}

}  // namespace afd::diag
