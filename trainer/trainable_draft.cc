#include "trainer/trainable_draft.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/GradMode.h>

#include <algorithm>

#include "common/model/eagle3_config.h"
#include "trainer/checkpoint_store.h"
#include "trainer/feature_draft_training.h"
#include "trainer/training_examples.h"

namespace specloop {
namespace trainer {

namespace {

class ModelDraft : public TrainableDraft {
 public:
  explicit ModelDraft(std::unique_ptr<LlamaModel> model) : model_(std::move(model)) {}
  const char* kind() const override { return "model"; }
  std::vector<at::Tensor> Parameters() override { return model_->Parameters(); }
  LlamaModel* model() const override { return model_.get(); }

  Status Backward(const std::vector<const Record*>& batch, const DraftTrainingOptions& options,
                  double* loss_out, std::vector<std::string>* domains) override {
    *loss_out = 0;
    const ModelConfig& c = model_->config();
    // One forward and backward per group of at most kMaxForwardTokens tokens, gradients
    // accumulating: the loss is the mean over all the step's positions, so group g's mean loss
    // enters with weight N_g / N.
    std::vector<PositionBatch> groups;
    int64_t total = 0;
    for (const auto& g : SplitForForward(batch, 0, kMaxForwardTokens)) {
      PositionBatch pb;
      BuildPositionBatch(g, c.vocab_size, c.max_model_len, Positions::kAll, &pb);
      if (pb.size() == 0) continue;
      total += pb.size();
      groups.push_back(std::move(pb));
    }
    if (total == 0) return Status::OK();
    try {
      c10::AutoGradMode grad(true);
      double loss_sum = 0;
      for (PositionBatch& pb : groups) {
        std::vector<KVCache> caches;
        caches.reserve(pb.inputs.size());
        std::vector<ForwardInput> context, in;
        for (size_t i = 0; i < pb.inputs.size(); ++i) {
          const std::vector<int64_t>& tokens = pb.inputs[i];
          const std::vector<int64_t>& rows = pb.logit_rows[i];
          caches.push_back(model_->NewCache(static_cast<int64_t>(tokens.size())));
          // Unless context_gradient, the tokens before the first position read run forward
          // only, without gradients: backward covers the positions read onward.
          const int64_t cut =
              options.context_gradient ? 0 : *std::min_element(rows.begin(), rows.end());
          if (cut > 0) {
            context.push_back(ForwardInput{
                &caches.back(), {tokens.begin(), tokens.begin() + cut}, false, {}, {}});
          }
          std::vector<int64_t> shifted(rows);
          for (int64_t& r : shifted) r -= cut;
          in.push_back(ForwardInput{&caches.back(), {tokens.begin() + cut, tokens.end()}, false,
                                    {}, std::move(shifted)});
        }
        if (!context.empty()) {
          at::NoGradGuard no_grad;  // not InferenceMode: the caches enter the graph below
          model_->Forward(context);
        }
        const at::Device dev = model_->device();
        at::Tensor logits = model_->Forward(in);
        at::Tensor loss = DistillLoss(options.objective, logits, pb.target_ids.to(dev),
                                      pb.target_logprobs.to(dev), pb.target_tail.to(dev),
                                      at::Tensor()) *
                          (static_cast<double>(pb.size()) / static_cast<double>(total));
        loss.backward();
        loss_sum += loss.item<double>();
        domains->insert(domains->end(), pb.domains.begin(), pb.domains.end());
      }
      *loss_out = loss_sum;
    } catch (const c10::Error& e) {
      return Status::IOError(std::string("training step: ") + e.what_without_backtrace());
    }
    return Status::OK();
  }

  Status Estimate(const std::vector<Record>& records, int batch_records,
                  std::vector<RecordAlpha>* out) const override {
    return EstimateRecords(*model_, records, batch_records, out);
  }

  Status Write(const std::string& dir) const override { return WriteModelFiles(*model_, dir); }

 private:
  std::unique_ptr<LlamaModel> model_;
};

class HeadDraft : public TrainableDraft {
 public:
  HeadDraft(std::unique_ptr<Eagle3Head> head, const LlamaModel* target)
      : head_(std::move(head)), target_(target) {}
  const char* kind() const override { return "eagle3"; }
  std::vector<at::Tensor> Parameters() override { return head_->Parameters(); }
  Eagle3Head* head() const override { return head_.get(); }

  Status Backward(const std::vector<const Record*>& batch, const DraftTrainingOptions& options,
                  double* loss, std::vector<std::string>* domains) override {
    UnrollOptions o;
    o.objective = options.objective;
    o.steps = options.unroll_steps;
    o.step_decay = options.step_decay;
    return AccumulateHeadGradients(*target_, *head_, batch, o, loss, domains);
  }

  Status Estimate(const std::vector<Record>& records, int batch_records,
                  std::vector<RecordAlpha>* out) const override {
    return EstimateHeadRecords(*target_, *head_, records, batch_records, out);
  }

  Status Write(const std::string& dir) const override { return head_->Save(dir, "float32"); }

 private:
  std::unique_ptr<Eagle3Head> head_;
  const LlamaModel* target_;
};

}  // namespace

Status TrainableDraft::Load(const std::string& dir, const LlamaModel* target,
                            const std::string& device, std::unique_ptr<TrainableDraft>* out) {
  LoadOptions lo;
  lo.device = device;
  lo.dtype = "float32";
  if (IsEagle3Dir(dir)) {
    if (target == nullptr) {
      return Status::InvalidArgument(dir + " is an EAGLE-3 head: training it needs its target "
                                           "(--target DIR)");
    }
    std::unique_ptr<Eagle3Head> head;
    SPECLOOP_RETURN_IF_ERROR(Eagle3Head::Load(dir, *target, lo, &head));
    *out = std::make_unique<HeadDraft>(std::move(head), target);
    return Status::OK();
  }
  std::unique_ptr<LlamaModel> model;
  SPECLOOP_RETURN_IF_ERROR(LlamaModel::Load(dir, lo, &model));
  *out = std::make_unique<ModelDraft>(std::move(model));
  return Status::OK();
}

}  // namespace trainer
}  // namespace specloop
