// The order MoeModel::RunLayers starts a step's MoE layers, micro-batches included, is the one
// MoeModel::MoeStartOrder lists: the P2P FFN role serves a step by walking that list, so the two
// must never drift (the cross-process contract of the P2P connector's data plane).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "afd/model/moe_backend.h"
#include "testing/model_harness.h"

namespace afd::model {
namespace {

// Records every Start and checks each micro-batch's Finish follows its Start; the MoE output is
// zeros (the values do not matter here).
class RecordingMoe : public MoeBackend {
 public:
  explicit RecordingMoe(bool empty_steps) : empty_steps_(empty_steps) {}
  void Start(int64_t layer, int stage, const Tensor& /*hidden*/, const Tensor& out,
             Workspace& /*ws*/) override {
    EXPECT_EQ(open_.count(stage), 0u) << "layer " << layer << " stage " << stage;
    open_.insert(stage);
    if (out.numel() > 0) std::fill_n(out.data_as<float>(), out.numel(), 0.0f);
    starts.emplace_back(static_cast<int>(layer), stage);
  }
  void Finish(int stage, Workspace& /*ws*/) override {
    EXPECT_EQ(open_.erase(stage), 1u) << "stage " << stage << " finished without a start";
  }
  bool RunsEmptySteps() const override { return empty_steps_; }
  bool AllFinished() const { return open_.empty(); }

  std::vector<std::pair<int, int>> starts;

 private:
  bool empty_steps_;
  std::set<int> open_;
};

class LayerOrder : public ::testing::TestWithParam<std::string> {};

TEST_P(LayerOrder, RunLayersStartsTheMoeLayersInMoeStartOrder) {
  testing_util::ModelHarness h(GetParam());
  const MoeModel& model = h.model();
  ASSERT_GT(model.config().num_moe_layers(), 0);
  for (int stages : {1, 2, 3}) {
    ForwardBatch batch;
    for (int s = 0; s < 3; ++s) h.Add(batch, h.NewSequence(8), {5 + s, 6, 7}, 0);
    Workspace ws(h.backend());
    const StepInputs in = model.Upload(batch, ws);
    LayerLoop loop;
    for (int s = 0; s <= stages; ++s) loop.splits.push_back(s * in.n / stages);
    RecordingMoe moe(/*empty_steps=*/false);
    model.RunLayers(in, &h.cache(), moe, ws, loop);
    EXPECT_EQ(moe.starts, model.MoeStartOrder(stages)) << stages << " micro-batches";
    EXPECT_TRUE(moe.AllFinished());
  }
  // A step without tokens of a lockstep backend (the P2P attention role's idle step) too.
  for (int stages : {1, 2}) {
    Workspace ws(h.backend());
    LayerLoop loop;
    loop.splits.assign(stages + 1, 0);
    RecordingMoe moe(/*empty_steps=*/true);
    model.RunLayers(StepInputs{}, nullptr, moe, ws, loop);
    EXPECT_EQ(moe.starts, model.MoeStartOrder(stages)) << "empty step, " << stages;
    EXPECT_TRUE(moe.AllFinished());
  }
}

// DeepSeek's first dense layers (preset:tiny) and Qwen3's sparse steps (preset:tiny-qwen3).
INSTANTIATE_TEST_SUITE_P(Models, LayerOrder, ::testing::Values("preset:tiny", "preset:tiny-qwen3"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "preset:tiny" ? std::string("deepseek")
                                                              : std::string("qwen3");
                         });

TEST(LayerOrder, MoeStartOrderIsLayerMajor) {
  testing_util::ModelHarness h("preset:tiny");
  const std::vector<int> layers = h.model().config().MoeLayers();
  const auto order = h.model().MoeStartOrder(2);
  ASSERT_EQ(order.size(), 2 * layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    EXPECT_EQ(order[2 * i], std::make_pair(layers[i], 0));
    EXPECT_EQ(order[2 * i + 1], std::make_pair(layers[i], 1));
  }
}

}  // namespace
}  // namespace afd::model
