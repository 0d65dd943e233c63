// DraftSwapper's memory over many publishes: it keeps live acceptance and a checkpoint
// directory only for the installed version, its predecessor and a fetched one not yet
// installed, not for every version a long-running worker has served.
#include <algorithm>
#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <zmq.hpp>

#include "common/channel/draft_channel.h"
#include "common/model/llama_model.h"
#include "serve/draft_swapper.h"
#include "tests/serve/test_util.h"

namespace specloop {
namespace {

TEST(DraftSwapperBounds, KeepsOnlyTheInstalledVersionAndItsPredecessor) {
  serve_test::TempDir tmp;
  zmq::context_t ctx;
  PublisherOptions po;
  po.pub_endpoint = "tcp://127.0.0.1:*";
  po.router_endpoint = "tcp://127.0.0.1:*";
  std::unique_ptr<DraftPublisher> publisher;
  ASSERT_TRUE(DraftPublisher::Start(&ctx, po, tmp.path(), &publisher).ok());
  std::unique_ptr<LlamaModel> target;
  ASSERT_TRUE(LlamaModel::Load(serve_test::TargetDir(), {}, &target).ok());
  std::unique_ptr<ServingMetrics> metrics;
  ASSERT_TRUE(ServingMetrics::Create(ServingMetricsOptions(), &metrics).ok());
  DraftSwapperOptions wo;
  wo.fetcher.pub_endpoint = publisher->pub_endpoint();
  wo.fetcher.router_endpoint = publisher->router_endpoint();
  wo.staging_dir = tmp.path() + "/staging";
  wo.initial_draft_dir = serve_test::DraftDir();
  std::unique_ptr<DraftSwapper> swapper;
  ASSERT_TRUE(DraftSwapper::Start(&ctx, wo, *target, metrics.get(), &swapper).ok());

  // As the scheduler does on each swap: install, then report the version's acceptance on
  // two domains (fewer steps than a rollback needs, so none happens).
  size_t most = 0;
  for (uint64_t v = 1; v <= 30; ++v) {
    swapper->OnInstalled(v, Status::OK());
    swapper->ObserveAcceptance(v, "prose", 4, 3);
    swapper->ObserveAcceptance(v, "python", 4, 2);
    most = std::max(most, swapper->versions_kept());
  }
  // The installed version, its predecessor (a rollback compares with it) and version 0's
  // directory (the newest fetched: none fetched here).
  EXPECT_LE(most, 3u) << "kept " << swapper->versions_kept();
  EXPECT_GE(swapper->versions_kept(), 2u);  // the predecessor is still there to compare with
  swapper->Stop();
  publisher->Stop();
}

}  // namespace
}  // namespace specloop
