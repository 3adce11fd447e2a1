// libFuzzer target for the option and spec strings the CLI hands to the
// libraries. The first byte picks the parser, the rest is its text:
//   0 length distributions (LengthDist::parse: fixed:N, uniform:LO:HI, lognormal:...)
//   1 LoRA target lists (parse_proj_list)
//   2 pool configs (PoolConfig::parse, "key:value,...")
//   3 --fail-card K@STEP (CardFailure::parse; the second byte is --cards)
//   4 serve's RAG spec (parse_rag_spec, "rag:KEY=V,...")
//   5 names: card model, KV eviction policy, request format, serve and train
//     policies, model presets
//   6 SSD fault specs (FaultSpec::parse, "lost_write=0.01,seed=3")
// Bad text must end in an InputError; anything else (a crash, a sanitizer
// report, another exception) is a finding. What parses must also hold the
// parser's promises: it validates, and its written form (describe(),
// to_string) parses back to the same value.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "cli_util.hpp"
#include "u3m/experiments/serve.hpp"
#include "u3m/experiments/train.hpp"
#include "u3m/kv/block_manager.hpp"
#include "u3m/mem/fault_spec.hpp"
#include "u3m/mem/pool.hpp"
#include "u3m/util/error.hpp"
#include "u3m/workload/config.hpp"
#include "u3m/workload/rag.hpp"
#include "u3m/workload/request_trace.hpp"
#include "u3m/workload/shape.hpp"

namespace {

using namespace u3m;

template <typename F>
void allow_input_error(F&& f) {
  try {
    f();
  } catch (const InputError&) {
  }
}

void require(bool ok) {
  if (!ok) std::abort();
}

bool same(const workload::LengthDist& x, const workload::LengthDist& y) {
  return x.kind == y.kind && x.a == y.a && x.b == y.b && x.max == y.max;
}

void length_dist(std::string_view t) {
  workload::LengthDist d;
  try {
    d = workload::LengthDist::parse(t, "--len");
  } catch (const InputError&) {
    return;
  }
  // Lengths are drawn in [1, max]: a parser that lets 0 or more than 1e9 in
  // hands the generators an empty or a 2^32-wrapping prompt.
  require(d.max >= 1 && d.max <= 1'000'000'000 && d.upper_bound() == d.max);
  require(std::isfinite(d.a) && std::isfinite(d.b));
  if (d.kind == workload::LengthDist::Kind::uniform) require(d.a >= 1 && d.a <= d.b);
  if (d.kind == workload::LengthDist::Kind::lognormal) require(d.a >= 1 && d.b >= 0);
  workload::LengthDist back;
  try {
    back = workload::LengthDist::parse(d.describe(), "--len");
  } catch (const InputError&) {
    std::abort();  // describe() wrote what parse() refuses
  }
  // Exact: describe() is what a trace's metadata records to recreate it.
  require(same(back, d));
}

void proj_list(std::string_view t) {
  std::vector<workload::Proj> ps;
  try {
    ps = workload::parse_proj_list(t, "--lora-targets");
  } catch (const InputError&) {
    return;
  }
  require(!ps.empty() && ps.size() <= workload::kNumProj);
  std::string joined;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) require(ps[i] != ps[j]);  // duplicates dropped
    joined += (i ? "," : "") + std::string(workload::to_string(ps[i]));
  }
  require(workload::parse_proj_list(joined, "--lora-targets") == ps);
}

bool same(const mem::PoolConfig& x, const mem::PoolConfig& y) {
  return x.describe() == y.describe();  // describe() prints every field
}

void pool_config(std::string_view t) {
  mem::PoolConfig c;
  try {
    c = mem::PoolConfig::parse(t, "--pool");
  } catch (const InputError&) {
    return;
  }
  try {
    c.validate("--pool");
    require(same(mem::PoolConfig::parse(c.describe(), "--pool"), c));
  } catch (const InputError&) {
    std::abort();  // a parsed config that fails validate(), or describe() it cannot read
  }
}

void fail_card(std::string_view t, std::uint32_t cards) {
  experiments::CardFailure f;
  try {
    f = experiments::CardFailure::parse(t, cards, "--fail-card");
  } catch (const InputError&) {
    return;
  }
  require(cards >= 2 && f.card < cards && f.step >= 1);
  const auto back =
      experiments::CardFailure::parse(fmt::format("{}@{}", f.card, f.step), cards, "--fail-card");
  require(back.card == f.card && back.step == f.step);
}

// The spec form of a RAG config, every key spelled out.
std::string rag_spec(const workload::RagConfig& c) {
  return fmt::format(
      "rag:requests={},rate={},system={},system-prompts={},system-zipf={},corpus={},"
      "passages={},zipf={},topics={},topic-zipf={},rank-noise={},passage-len={},"
      "question-len={},output-len={},order={},turns={},seed={}",
      c.requests, c.rate_per_s, c.system_tokens, c.system_prompts, c.system_zipf, c.corpus,
      c.passages_per_request, c.zipf_s, c.topics, c.topic_zipf, c.rank_noise, c.passage.describe(),
      c.question.describe(), c.output.describe(), c.sort_passages ? "sorted" : "rank", c.turns,
      c.seed);
}

void rag(std::string_view t) {
  workload::RagConfig c;
  try {
    c = cli::parse_rag_spec(t);
  } catch (const InputError&) {
    return;
  }
  try {
    c.validate();  // the spec validated under its own names; the flags' must agree
    // fmt's {} for a double is the shortest form that reads back exactly.
    const workload::RagConfig back = cli::parse_rag_spec(rag_spec(c));
    require(back.describe() == c.describe() && back.rate_per_s == c.rate_per_s &&
            back.zipf_s == c.zipf_s && back.seed == c.seed && back.system_zipf == c.system_zipf &&
            back.topic_zipf == c.topic_zipf && back.rank_noise == c.rank_noise);
  } catch (const InputError&) {
    std::abort();
  }
}

void names(std::string_view t) {
  const std::string s(t);
  allow_input_error([&] {
    const auto m = experiments::parse_card_model(t, "--card-model");
    require(experiments::parse_card_model(experiments::to_string(m), "--card-model") == m);
  });
  allow_input_error([&] {
    const auto p = kv::parse_eviction_policy(t, "--eviction");
    require(kv::parse_eviction_policy(kv::to_string(p), "--eviction") == p);
  });
  if (const auto f = workload::parse_request_format(t))
    require(workload::parse_request_format(workload::to_string(*f)) == f);
  (void)workload::detect_request_format(t);
  allow_input_error([&] { experiments::serve_policy(s); });
  allow_input_error([&] { require(!experiments::find_model(s).name.empty()); });
  allow_input_error([&] { require(workload::preset(t).name == t); });
}

void fault_spec(std::string_view t) {
  mem::FaultSpec f;
  try {
    f = mem::FaultSpec::parse(t, "--ssd-faults");
  } catch (const InputError&) {
    return;
  }
  require(!f.rules.empty() && f.rules.size() <= mem::kIoFaultKinds);
  for (const auto& [kind, p] : f.rules) require(p > 0 && p <= 1);
  const mem::FaultSpec back = mem::FaultSpec::parse(f.describe(), "--ssd-faults");
  require(back.seed == f.seed && back.rules == f.rules);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  std::string_view t(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 7) {
    case 0:
      length_dist(t);
      break;
    case 1:
      proj_list(t);
      break;
    case 2:
      pool_config(t);
      break;
    case 3:
      if (!t.empty()) fail_card(t.substr(1), static_cast<std::uint8_t>(t[0]));
      break;
    case 4:
      rag(t);
      break;
    case 6:
      fault_spec(t);
      break;
    default:
      names(t);
  }
  return 0;
}
