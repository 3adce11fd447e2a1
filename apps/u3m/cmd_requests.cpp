// u3m requests import|gen|stats: serving request traces in the u3m format
// (docs/requests.md). The work lives in src/workload (request_trace, rag).
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "commands.hpp"
#include "u3m/util/error.hpp"
#include "u3m/workload/rag.hpp"
#include "u3m/workload/request_trace.hpp"

namespace u3m::cli {
namespace {

using namespace u3m::workload;

// Options every command that reads a trace shares.
struct ReadArgs {
  std::string format = "auto";
  std::uint32_t mooncake_block = 512;
  std::string mooncake_mismatch = "error";

  void add(CLI::App* c) {
    c->add_option("--format", format,
                  "Input format: auto (from the first line), u3m, mooncake, azure")
        ->check(CLI::IsMember({"auto", "u3m", "mooncake", "azure"}))
        ->capture_default_str();
    c->add_option("--mooncake-block-tokens", mooncake_block,
                  "Tokens per Mooncake hash id (the published traces use 512)")
        ->capture_default_str();
    c->add_option("--mooncake-mismatch", mooncake_mismatch,
                  "A Mooncake line whose hash_ids do not cover input_length: error, or fit "
                  "(docs/requests.md)")
        ->check(CLI::IsMember({"error", "fit"}))
        ->capture_default_str();
  }
  ImportOptions options(bool sorted) const {
    ImportOptions o;
    o.format = parse_request_format(format);
    if (mooncake_block == 0) input_error("--mooncake-block-tokens", "must be >= 1");
    o.mooncake_block_tokens = mooncake_block;
    o.mooncake_mismatch =
        mooncake_mismatch == "fit" ? MooncakeMismatch::fit : MooncakeMismatch::error;
    o.require_sorted = sorted;
    return o;
  }
};

// ---------------------------------------------------------------- import

struct ImportArgs {
  ReadArgs read;
  std::string in, out;
  bool sort = false;
  std::uint64_t limit = 0;
};

void run_import(const ImportArgs& a) {
  RequestFile f(a.in, a.read.options(!a.sort));
  RequestWriter w(a.out);
  RequestStats stats;
  auto take = [&](const ServeRequest& r) {
    stats.add(r);
    w.write(r);
  };
  if (a.sort) {
    std::vector<ServeRequest> all;
    while (auto r = f.next()) all.push_back(std::move(*r));
    sort_by_timestamp(all);
    if (a.limit && all.size() > a.limit) all.resize(a.limit);
    for (const ServeRequest& r : all) take(r);
  } else {
    while (w.written() < a.limit || a.limit == 0) {
      auto r = f.next();
      if (!r) break;
      take(*r);
    }
  }
  // As serve sim and --arrivals-from: a trace without requests is a mistake
  // (an empty or wrong file), not a result. The output is left as it was.
  if (w.written() == 0) input_error(a.in, "no requests");
  w.finish();
  const RequestStatsReport rep = stats.report();
  // stdout may be the output itself; the summary goes to stderr then.
  std::FILE* say = a.out == "-" ? stderr : stdout;
  fmt::print(say, "u3m requests import: {} requests ({} format) from {} -> {}\n", rep.requests,
             f.stream().format() ? to_string(*f.stream().format()) : "empty", a.in, a.out);
  fmt::print(say, "  prompt tokens {}, output tokens {}, {} distinct segments (counted)\n",
             rep.total_prompt_tokens, rep.total_output_tokens, rep.distinct_segments);
}

// ---------------------------------------------------------------- gen rag

struct RagArgs {
  RagConfig cfg;
  std::string passage_len, question_len, output_len, order = "rank";
  std::string arrivals_from, out;
  ReadArgs read;
};

void print_summary(std::FILE* say, const RequestStatsReport& rep, const char* label);

void run_gen_rag(RagArgs a) {
  a.cfg.passage = LengthDist::parse(a.passage_len, "--passage-len");
  a.cfg.question = LengthDist::parse(a.question_len, "--question-len");
  a.cfg.output = LengthDist::parse(a.output_len, "--output-len");
  a.cfg.sort_passages = a.order == "sorted";
  std::vector<ServeRequest> reqs;
  if (a.arrivals_from.empty()) {
    reqs = generate_rag(a.cfg);
  } else {
    std::vector<double> at;
    RequestFile f(a.arrivals_from, a.read.options(true));
    while (auto r = f.next()) at.push_back(r->timestamp_ms);
    if (at.empty()) input_error(a.arrivals_from, "no requests to take arrival times from");
    reqs = generate_rag(a.cfg, &at);
  }
  RequestWriter w(a.out);
  RequestStats stats;
  for (const ServeRequest& r : reqs) {
    stats.add(r);
    w.write(r);
  }
  w.finish();
  std::FILE* say = a.out == "-" ? stderr : stdout;
  fmt::print(say, "u3m requests gen rag: {} requests -> {}\n", reqs.size(), a.out);
  fmt::print(say, "  workload: {}{}\n", a.cfg.describe(),
             a.arrivals_from.empty() ? "" : ", arrivals from " + a.arrivals_from);
  print_summary(say, stats.report(), "computed from the generated requests");
}

// ---------------------------------------------------------------- stats

struct StatsArgs {
  ReadArgs read;
  std::string file, cache_tokens;
  bool json = false, sort = false;
};

std::string cache_name(const CacheResult& c) {
  return c.capacity_tokens ? fmt::format("LRU {} tokens", *c.capacity_tokens) : "unbounded";
}

void print_summary(std::FILE* say, const RequestStatsReport& rep, const char* label) {
  fmt::print(say, "  figures {} (not measured)\n", label);
  fmt::print(say, "  requests            {} over {:.1f} s, mean arrival rate {:.3f}/s\n",
             rep.requests, (rep.last_ms - rep.first_ms) / 1e3, rep.rate_per_s);
  auto dist = [&](const char* name, const Distribution& d) {
    fmt::print(say, "  {:<19} p50 {}  p90 {}  p99 {}  max {}  mean {:.1f}\n", name, d.p50, d.p90,
               d.p99, d.max, d.mean);
  };
  dist("prompt tokens", rep.prompt_tokens);
  dist("output tokens", rep.output_tokens);
  dist("segments/request", rep.segments);
  fmt::print(say, "  totals              {} prompt tokens, {} output tokens\n",
             rep.total_prompt_tokens, rep.total_output_tokens);
  fmt::print(say,
             "  distinct            {} segment ids; {} prompt tokens under distinct prefixes "
             "(an unbounded prefix cache's footprint)\n",
             rep.distinct_segments, rep.distinct_prefix_tokens);
  if (rep.sessions) fmt::print(say, "  sessions            {}\n", rep.sessions);
  fmt::print(say,
             "  ideal prefix-cache hit rate (replayed in arrival order, segment granularity, "
             "docs/requests.md):\n");
  for (const CacheResult& c : rep.caches)
    fmt::print(say, "    {:<22} {:6.2f}% of prompt tokens, {} of {} requests hit\n", cache_name(c),
               100 * c.hit_rate, c.requests_with_hit, rep.requests);
}

nlohmann::json to_json(const Distribution& d) {
  return {{"p50", d.p50}, {"p90", d.p90},   {"p99", d.p99},    {"min", d.min},
          {"max", d.max}, {"mean", d.mean}, {"count", d.count}};
}

void run_stats(const StatsArgs& a) {
  RequestStats stats(parse_token_list(a.cache_tokens, "--cache-tokens"));
  RequestFile f(a.file, a.read.options(!a.sort));
  if (a.sort) {
    std::vector<ServeRequest> all;
    while (auto r = f.next()) all.push_back(std::move(*r));
    sort_by_timestamp(all);
    for (const ServeRequest& r : all) stats.add(r);
  } else {
    while (auto r = f.next()) stats.add(*r);
  }
  const RequestStatsReport rep = stats.report();
  if (rep.requests == 0) input_error(a.file, "no requests");
  const std::string format(f.stream().format() ? to_string(*f.stream().format()) : "empty");
  const char* label = "computed from the trace";
  if (a.json) {
    nlohmann::json caches = nlohmann::json::array();
    for (const CacheResult& c : rep.caches)
      caches.push_back({{"capacity_tokens", c.capacity_tokens ? nlohmann::json(*c.capacity_tokens)
                                                              : nlohmann::json(nullptr)},
                        {"policy", c.capacity_tokens ? "lru" : "unbounded"},
                        {"hit_tokens", c.hit_tokens},
                        {"hit_rate", c.hit_rate},
                        {"requests_with_hit", c.requests_with_hit}});
    nlohmann::json j = {{"file", a.file},
                        {"format", format},
                        {"figures", std::string(label) + ", not measured"},
                        {"requests", rep.requests},
                        {"first_ms", rep.first_ms},
                        {"last_ms", rep.last_ms},
                        {"rate_per_s", rep.rate_per_s},
                        {"prompt_tokens", to_json(rep.prompt_tokens)},
                        {"output_tokens", to_json(rep.output_tokens)},
                        {"segments_per_request", to_json(rep.segments)},
                        {"total_prompt_tokens", rep.total_prompt_tokens},
                        {"total_output_tokens", rep.total_output_tokens},
                        {"distinct_segments", rep.distinct_segments},
                        {"distinct_prefix_tokens", rep.distinct_prefix_tokens},
                        {"sessions", rep.sessions},
                        {"prefix_cache", caches}};
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("u3m requests stats: {} ({} format)\n", a.file, format);
  print_summary(stdout, rep, label);
}

}  // namespace

void add_requests_commands(CLI::App& app) {
  CLI::App* req = app.add_subcommand(
      "requests",
      "Serving request traces in the u3m format (prompt segments that name shared prefixes): "
      "import Mooncake / Azure traces, generate a RAG workload, prefix-sharing statistics. "
      "See docs/requests.md.");
  req->require_subcommand(1);

  auto ia = std::make_shared<ImportArgs>();
  CLI::App* imp = req->add_subcommand(
      "import",
      "Convert a Mooncake JSONL or Azure LLM inference CSV trace (or a u3m one) to the u3m "
      "request format. Gzip input is read transparently.");
  imp->add_option("input", ia->in, "Trace to import")->required();
  imp->add_option("-o,--output", ia->out, "u3m request file to write (.jsonl; - for stdout)")
      ->required();
  imp->add_flag("--sort", ia->sort,
                "Accept decreasing timestamps and sort by time (stable: ties keep file order)");
  imp->add_option("--limit", ia->limit, "Keep only the first N requests (0: all)")
      ->capture_default_str();
  ia->read.add(imp);
  imp->callback([ia] { run_import(*ia); });

  CLI::App* gen = req->add_subcommand("gen", "Generate a synthetic request workload");
  gen->require_subcommand(1);
  auto ra = std::make_shared<RagArgs>();
  RagArgs& r = *ra;
  const RagConfig def;
  r.passage_len = def.passage.describe();
  r.question_len = def.question.describe();
  r.output_len = def.output.describe();
  CLI::App* rag = gen->add_subcommand(
      "rag",
      "RAG serving: one of a few system prompts, the top-k passages of a Zipf-popular query "
      "topic under rank noise, a unique question; Poisson or trace arrivals; optional "
      "multi-turn sessions. Defaults and their sources: docs/requests.md.");
  rag->add_option("-o,--output", r.out, "u3m request file to write (.jsonl; - for stdout)")
      ->required();
  rag->add_option("--requests", r.cfg.requests,
                  "Requests to generate (with --arrivals-from: at most this many, 0 = all)")
      ->capture_default_str();
  rag->add_option("--rate", r.cfg.rate_per_s, "Poisson arrival rate, requests per second")
      ->capture_default_str();
  rag->add_option("--arrivals-from", r.arrivals_from,
                  "Take arrival times from this request trace (any format) instead of Poisson");
  rag->add_option("--system-tokens", r.cfg.system_tokens, "Shared system prompt (0: none)")
      ->capture_default_str();
  rag->add_option("--corpus", r.cfg.corpus, "Passages in the corpus")->capture_default_str();
  rag->add_option("--passages", r.cfg.passages_per_request, "Passages retrieved per request (k)")
      ->capture_default_str();
  rag->add_option("--zipf", r.cfg.zipf_s, "Zipf exponent of passage popularity (0: uniform)")
      ->capture_default_str();
  rag->add_option("--passage-len", r.passage_len,
                  "Passage length: fixed:N | uniform:LO:HI | lognormal:MEDIAN:SIGMA:MAX")
      ->capture_default_str();
  rag->add_option("--question-len", r.question_len, "Question length, same syntax")
      ->capture_default_str();
  rag->add_option("--output-len", r.output_len, "Output length, same syntax")
      ->capture_default_str();
  rag->add_option("--passage-order", r.order,
                  "rank (retrieval order) | sorted (by passage id: equal sets share a prefix)")
      ->check(CLI::IsMember({"rank", "sorted"}))
      ->capture_default_str();
  rag->add_option("--turns", r.cfg.turns,
                  "Turns per session; a follow-up repeats the previous prompt and answer "
                  "(1: single-turn)")
      ->capture_default_str();
  rag->add_option("--followup-prob", r.cfg.followup_prob,
                  "Chance that an arrival continues an open session (with --turns > 1)")
      ->capture_default_str();
  rag->add_option("--system-prompts", r.cfg.system_prompts,
                  "Application system prompts, drawn with Zipf popularity (1: one shared)")
      ->capture_default_str();
  rag->add_option("--system-zipf", r.cfg.system_zipf, "Zipf exponent of system-prompt popularity")
      ->capture_default_str();
  rag->add_option("--topics", r.cfg.topics,
                  "Query topics; a topic retrieves from its own ranked list (0: no topics, "
                  "independent passage draws)")
      ->capture_default_str();
  rag->add_option("--topic-zipf", r.cfg.topic_zipf, "Zipf exponent of topic popularity")
      ->capture_default_str();
  rag->add_option("--rank-noise", r.cfg.rank_noise,
                  "Std. dev. of the per-query rank noise, in ranks (0: a topic's top-k is fixed)")
      ->capture_default_str();
  rag->add_option("--seed", r.cfg.seed, "Seed")->capture_default_str();
  r.read.add(rag);
  rag->callback([ra] { run_gen_rag(*ra); });

  auto sa = std::make_shared<StatsArgs>();
  CLI::App* st = req->add_subcommand(
      "stats",
      "Request count, arrival rate, prompt/output token percentiles and the ideal prefix-cache "
      "hit rate (unbounded, and LRU bounded to --cache-tokens), computed from the trace.");
  st->add_option("file", sa->file, "Request trace (u3m, Mooncake or Azure)")->required();
  st->add_flag("--json", sa->json, "Print JSON");
  st->add_option("--cache-tokens", sa->cache_tokens,
                 "Also replay through an LRU prefix cache of this many tokens (comma list)");
  st->add_flag("--sort", sa->sort, "Accept decreasing timestamps and sort by time first");
  sa->read.add(st);
  st->callback([sa] { run_stats(*sa); });
}

}  // namespace u3m::cli
