// `u3m plan cost`: for a target (a model to train within a throughput-loss
// bound, or a request rate to serve under the SLOs), the cheapest hardware
// that meets it: more cards with HBM only, or cards with more host DRAM and
// SSDs under u3m's tiering. Capacity comes from the simulators that
// `train sim` / `serve capacity` run (never a second model); prices from a
// table that names a source and a date for each (data/prices.json,
// docs/cost.md). `--design` answers the design's own BOM scenario.
//
// Note [Cost search]
// Configurations are priced first and simulated in order of price, per
// family (hbm-only; tiered), until one meets the target: everything cheaper
// in that family was simulated and failed, so the first that meets is the
// cheapest of the family without assuming capacity grows with hardware.
// Where the card has no price (the table says "not found"), the order is
// fewest cards, then the cheapest DRAM and SSDs, and the answer says above
// which card price the tiered configuration is the cheaper. Priced per card:
// the card, its host DRAM (GB) and its SSDs; not priced: chassis, CPUs,
// network and power, which come with every card, so leaving them out
// favours the configurations with more cards (HBM only).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "commands.hpp"
#include "prices.hpp"
#include "u3m/experiments/serve.hpp"
#include "u3m/experiments/train.hpp"
#include "u3m/sim/profile.hpp"
#include "u3m/util/error.hpp"
#include "u3m/workload/rag.hpp"

#ifndef U3M_SOURCE_DATA_DIR
#define U3M_SOURCE_DATA_DIR "data"
#endif

namespace u3m::cli {
namespace {

using nlohmann::json;

// The design's BOM claim (issue 20, MISSION.md item 11): a tiered
// configuration at 1.28 M CNY against 3.2 M CNY of more cards.
constexpr double kBomTiered = 1.28e6, kBomCards = 3.2e6;
constexpr double kGiB = 1073741824.0;
// DRAM and SSD options per card for the tiered family; hbm-only gets the smallest DRAM.
const std::vector<double> kDramGiB = {64, 128, 256, 512, 1024};
const std::vector<std::uint32_t> kSsds = {1, 2};
constexpr double kDriveBytes = 3.84e12;  // the profiles' drive class (PM9A3 3.84 TB)

struct PlanArgs {
  std::string train, requests = "rag", serve_model = "llama3-8b";
  double serve_rate = 0, max_loss = 0.05;
  bool design = false, json = false;
  std::string hw = "ascend-910b-32g";
  std::string prices = U3M_SOURCE_DATA_DIR "/prices.json";
  std::uint32_t max_cards = 32, lora_rank = 16, grad_accum = 1, seq = 1024, micro_batch = 1;
};

struct Config {
  std::string family;  // "hbm-only" or "tiered"
  std::uint32_t cards = 0, group = 0, replicas = 1;  // serving: replicas x tensor-parallel group
  double dram_gib = 0;   // per card
  std::uint32_t ssds = 0;  // per card
  double extras = 0;       // CNY: DRAM + SSDs
  double cost = NAN;       // CNY; NaN when the card has no price
  bool tried = false, meets = false;
  std::string why;  // what it reached, or why not
  json result;
  std::string name() const {
    return family == "hbm-only"
               ? fmt::format("{} card{}, HBM only", cards, cards == 1 ? "" : "s")
               : fmt::format("{} card{} + {:g} GiB DRAM + {} SSD per card", cards,
                             cards == 1 ? "" : "s", dram_gib, ssds);
  }
};

Config make_config(std::string family, std::uint32_t cards, std::uint32_t group, double dram_gib,
                   std::uint32_t ssds) {
  Config c;
  c.family = std::move(family);
  c.cards = cards;
  c.group = group;
  c.dram_gib = dram_gib;
  c.ssds = ssds;
  return c;
}

sim::HwProfile with_host(sim::HwProfile hw, double dram_gib, std::uint32_t ssds) {
  hw.host.dram_capacity.value = dram_gib;
  hw.host.dram_capacity.unit = "GiB";
  hw.host.dram_capacity.si = dram_gib * kGiB;
  hw.host.dram_capacity.source = "u3m plan cost: the configuration priced";
  hw.ssd.drives_per_node.value = hw.ssd.drives_per_node.si = ssds * hw.node.cards_per_node.si;
  hw.ssd.drives_per_node.source = "u3m plan cost: the configuration priced";
  return hw;
}

struct Planner {
  const PlanArgs& a;
  PriceTable prices;
  sim::HwProfile hw;
  const Price* card = nullptr;
  std::vector<Config> configs;

  double extras(std::uint32_t cards, double dram_gib, std::uint32_t ssds) const {
    return cards * (dram_gib * kGiB / 1e9 * prices.at("dram_gb", "--prices").cny +
                    ssds * prices.at("ssd_drive", "--prices").cny);
  }
  void price(Config& c) const {
    c.extras = extras(c.cards, c.dram_gib, c.ssds);
    c.cost = card->value ? c.cards * card->cny + c.extras : NAN;
  }
  // Note [Cost search]: by price, or by cards then extras without a card price.
  static bool cheaper(const Config& x, const Config& y) {
    if (!std::isnan(x.cost) && !std::isnan(y.cost)) return x.cost < y.cost;
    return x.cards != y.cards ? x.cards < y.cards : x.extras < y.extras;
  }
  // Simulates the family's configurations cheapest first until one meets.
  template <typename Eval>
  const Config* cheapest(const std::string& family, Eval eval) {
    std::vector<Config*> order;
    for (Config& c : configs)
      if (c.family == family) order.push_back(&c);
    std::stable_sort(order.begin(), order.end(),
                     [](const Config* x, const Config* y) { return cheaper(*x, *y); });
    for (Config* c : order) {
      c->tried = true;
      try {
        eval(*c);
      } catch (const InputError& e) {  // e.g. a model that cannot be split this way
        c->meets = false;
        c->why = e.what();
      }
      if (c->meets) return c;
    }
    return nullptr;
  }
};

// --- training -------------------------------------------------------------

experiments::TrainScenario train_base(const PlanArgs& a, const sim::HwProfile& hw,
                                      const std::string& model) {
  experiments::TrainScenario s;
  s.shape = experiments::find_model(model);
  s.hw = hw;
  s.train.micro_batch_size = a.micro_batch;
  s.train.seq_len = a.seq;
  s.train.micro_batches = a.grad_accum;
  s.train.lora_rank = a.lora_rank;
  s.card_model = experiments::CardModel::symmetric;  // as train capacity: many simulations
  return s;
}

void plan_train(Planner& p, const experiments::TrainScenario& base) {
  for (std::uint32_t n = 1; n <= p.a.max_cards; ++n) {
    Config h = make_config("hbm-only", n, 0, kDramGiB.front(), 0);
    p.price(h);
    p.configs.push_back(h);
    for (double d : kDramGiB)
      for (std::uint32_t s : kSsds) {
        Config t = make_config("tiered", n, 0, d, s);
        p.price(t);
        p.configs.push_back(t);
      }
  }
  auto eval = [&](Config& c) {
    experiments::TrainScenario s = base;
    s.cards = c.cards;
    s.policy = c.family == "hbm-only" ? "hbm-only" : "u3m";
    // hbm-only never touches the SSD: simulated with one drive per card, none priced.
    s.hw = with_host(p.hw, c.dram_gib, std::max<std::uint32_t>(c.ssds, 1));
    s.validate();
    const experiments::TrainResult r = experiments::simulate_training(s);
    c.meets = r.fits && r.loss <= p.a.max_loss;
    c.why = r.fits ? fmt::format("step {:.3f} s, loss {:.1f}% vs infinite HBM", r.step_s,
                                 100 * r.loss)
                   : "does not fit: " + r.why;
    c.result = {{"policy", s.policy}, {"fits", r.fits}, {"loss", r.loss}, {"step_s", r.step_s},
                {"tokens_per_s", r.tokens_per_s}, {"why", r.why}};
  };
  p.cheapest("hbm-only", eval);
  p.cheapest("tiered", eval);
}

// --- serving --------------------------------------------------------------

void plan_serve(Planner& p) {
  experiments::ServeScenario base;
  base.shape = workload::preset(p.a.serve_model);
  base.hw = p.hw;
  if (p.a.requests == "rag" || p.a.requests.starts_with("rag:")) {
    const workload::RagConfig c = parse_rag_spec(p.a.requests);
    base.requests_label = "RAG generator: " + c.describe();
    base.requests = workload::generate_rag(c);
  } else {
    base.requests = workload::load_requests(p.a.requests);
    base.requests_label = p.a.requests;
  }
  if (base.requests.empty()) input_error(p.a.requests, "no requests");
  // Tensor-parallel groups the heads divide; replicas serve independent shares of the traffic.
  for (std::uint32_t g = 1; g <= std::min<std::uint32_t>(8, p.a.max_cards); g *= 2) {
    if (base.shape.heads % g || base.shape.kv_heads % g) continue;
    p.configs.push_back(make_config("hbm-only", g, g, kDramGiB.front(), 0));
    for (double d : {128.0, 256.0, 512.0}) p.configs.push_back(make_config("tiered", g, g, d, 1));
  }
  // A group's capacity, then as many replicas as the rate needs (priced after).
  for (Config& c : p.configs) {
    experiments::ServeScenario s = base;
    s.cards = c.group;
    s.hw = with_host(p.hw, c.dram_gib, std::max<std::uint32_t>(c.ssds, 1));
    s.ssd_bytes_per_card = std::max<std::uint32_t>(c.ssds, 1) * kDriveBytes;
    const std::string pol = c.family == "hbm-only" ? "hbm-only" : "u3m";
    c.tried = true;
    try {
      s.validate();
      const auto rows = experiments::serving_capacity(s, {pol});
      const double cap = rows.front().rate_rps;
      c.result = {{"kv_policy", pol}, {"group_rate_rps", cap},
                  {"group_goodput_rps", rows.front().at.goodput_rps}};
      if (cap <= 0) {
        c.why = "no rate met the SLOs";
        c.cards = p.a.max_cards + 1;
      } else {
        c.replicas = static_cast<std::uint32_t>(std::ceil(p.a.serve_rate / cap - 1e-9));
        c.cards = c.replicas * c.group;
        c.why = fmt::format("{} x {} cards, {:.2f} req/s each", c.replicas, c.group, cap);
      }
    } catch (const InputError& e) {
      c.why = e.what();
      c.cards = p.a.max_cards + 1;
    }
    c.meets = c.cards <= p.a.max_cards && !c.result.is_null();
    p.price(c);
  }
}

// --- output ---------------------------------------------------------------

json config_json(const Config& c) {
  return {{"name", c.name()},     {"kind", c.family},
          {"cards", c.cards},     {"replicas", c.replicas},
          {"group", c.group},     {"dram_gib_per_card", c.dram_gib},
          {"ssds_per_card", c.ssds},
          {"extras_cny", c.extras},
          {"cost", std::isnan(c.cost) ? json(nullptr) : json(c.cost)},
          {"simulated", c.tried}, {"meets", c.meets},
          {"why", c.why},         {"result", c.result}};
}

const Config* best(const Planner& p, const std::string& family) {
  const Config* b = nullptr;
  for (const Config& c : p.configs)
    if (c.family == family && c.meets && (!b || Planner::cheaper(c, *b))) b = &c;
  return b;
}

std::string money(double cny) {
  return std::isnan(cny) ? std::string("unpriced") : fmt::format("{:.3f} M CNY", cny / 1e6);
}

void report(const Planner& p, const std::string& target, const std::string& label,
            json design) {
  const Config* h = best(p, "hbm-only");
  const Config* t = best(p, "tiered");
  const Config* win = !h ? t : !t ? h : Planner::cheaper(*t, *h) ? t : h;
  // Without a card price: tiered is cheaper iff a card costs more than this.
  double break_even = NAN;
  if (h && t && t->cards < h->cards) break_even = (t->extras - h->extras) / (h->cards - t->cards);
  std::vector<const Config*> tried;  // listed cheapest first (serving simulates every group)
  for (const Config& c : p.configs)
    if (c.tried) tried.push_back(&c);
  std::stable_sort(tried.begin(), tried.end(),
                   [](const Config* x, const Config* y) { return Planner::cheaper(*x, *y); });
  if (p.a.json) {
    json j = {{"plan", "cost"}, {"target", target}, {"figures", label}, {"currency", "CNY"},
              {"prices_file", p.prices.origin}, {"usd_cny", p.prices.usd_cny}};
    j["configs"] = json::array();
    for (const Config* c : tried) j["configs"].push_back(config_json(*c));
    j["cheapest"] = win ? config_json(*win) : json(nullptr);
    j["cheapest_hbm_only"] = h ? config_json(*h) : json(nullptr);
    j["cheapest_tiered"] = t ? config_json(*t) : json(nullptr);
    j["card_price_break_even_cny"] = std::isnan(break_even) ? json(nullptr) : json(break_even);
    json pr = json::object();
    for (const auto& [k, v] : p.prices.items)
      pr[k] = {{"cny", v.value ? json(v.cny) : json(nullptr)}, {"value", v.value ? json(*v.value) : json(nullptr)},
               {"currency", v.currency}, {"unit", v.unit}, {"source", v.source}, {"date", v.date}};
    j["prices"] = pr;
    if (!design.is_null()) j["design_bom"] = design;
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("cost plan for {}\n  {}\n  prices: {} (card {}: {}; DRAM {:.2f} CNY/GB; SSD {:.0f} "
             "CNY/drive; USD at {} CNY)\n",
             target, label, p.prices.origin, p.a.hw,
             p.card->value ? money(p.card->cny) : "not found", p.prices.at("dram_gb", "").cny,
             p.prices.at("ssd_drive", "").cny, p.prices.usd_cny);
  fmt::print("  {:<44} {:>14} {:>14}  {}\n", "configuration (simulated, cheapest first)", "cost",
             "DRAM+SSD", "result");
  for (const Config* c : tried)
    fmt::print("  {:<44} {:>14} {:>14}  {}{}\n", c->name(), money(c->cost), money(c->extras),
               c->meets ? "meets: " : "misses: ", c->why.substr(0, 90));
  auto line = [&](const char* what, const Config* c) {
    fmt::print("  {:<18} {}\n", what,
               c ? fmt::format("{} ({})", c->name(), money(c->cost)) : "none up to --max-cards");
  };
  line("more cards:", h);
  line("tiered:", t);
  if (win && !std::isnan(win->cost))
    fmt::print("  cheapest that meets the target: {} at {}\n", win->name(), money(win->cost));
  else if (!std::isnan(break_even))
    fmt::print("  no card price: the tiered configuration is the cheaper if a card costs more "
               "than {} (its DRAM and SSDs cost {} more for {} fewer cards)\n",
               money(break_even), money(t->extras - h->extras), h->cards - t->cards);
  else if (h && t)
    fmt::print("  no card price: the tiered configuration needs no fewer cards, so it never "
               "saves money\n");
  if (!design.is_null()) fmt::print("{}", design.value("text", ""));
}

// The design's scenario: what its tiered hardware (the profile's DRAM and one SSD per card,
// on 4 cards) trains at the design's LoRA setting, and what that capacity costs.
json design_check(Planner& p, const std::string& model, double tiered_params) {
  const Config* h = best(p, "hbm-only");
  Config bom = make_config("tiered", 4, 0, p.hw.host.dram_capacity.si / kGiB, 1);
  p.price(bom);
  json d = {{"claim_tiered_cny", kBomTiered}, {"claim_more_cards_cny", kBomCards},
            {"claim_ratio", kBomCards / kBomTiered}, {"tiered_model", model},
            {"tiered_params", tiered_params}, {"bom_config", config_json(bom)}};
  std::string text = fmt::format(
      "  design's BOM (claim: tiered {} against {} of more cards, {:.2f}x):\n"
      "    u3m on the design's hardware ({}) trains {} ({:.2f} B params); HBM only needs {}\n",
      money(kBomTiered), money(kBomCards), kBomCards / kBomTiered, bom.name(), model,
      tiered_params / 1e9, h ? fmt::format("{} cards", h->cards) : "more than --max-cards");
  if (h) {
    const double implied = kBomCards / h->cards;  // the card price at which N cards cost 3.2 M
    const double bom_at = 4 * implied + bom.extras;
    d["hbm_only_cards"] = h->cards;
    d["card_price_if_claim_more_cards"] = implied;
    d["bom_cost_at_that_price"] = bom_at;
    text += fmt::format(
        "    if {} cards cost {}, a card costs {} and the design's tiered hardware {} "
        "({:.2f}x the claim's {}); the ratio more cards / tiered is {:.2f}x, not {:.2f}x\n",
        h->cards, money(kBomCards), money(implied), money(bom_at), bom_at / kBomTiered,
        money(kBomTiered), kBomCards / bom_at, kBomCards / kBomTiered);
    d["ratio_at_that_price"] = kBomCards / bom_at;
  }
  d["text"] = text;
  return d;
}

void run_plan(const PlanArgs& a) {
  const int targets = !a.train.empty() + (a.serve_rate > 0) + a.design;
  if (targets != 1)
    input_error("--train", "give exactly one target: --train MODEL, --serve-rate RPS or --design");
  if (a.serve_rate < 0 || !std::isfinite(a.serve_rate))
    input_error("--serve-rate", "must be a rate above 0 requests/s");
  if (a.max_cards < 1 || a.max_cards > 1024) input_error("--max-cards", "must be in [1, 1024]");
  if (!(a.max_loss >= 0 && a.max_loss < 1)) input_error("--max-loss", "must be in [0, 1)");
  Planner p{a, load_prices(a.prices), sim::load_profile(a.hw), nullptr, {}};
  p.card = &p.prices.at("card/" + p.hw.name, "--hw");
  for (const char* k : {"dram_gb", "ssd_drive"})  // a configuration cannot be priced without them
    if (!p.prices.at(k, "--prices").value)
      input_error("--prices", "{}: '{}' has no price; plan cost needs it", a.prices, k);
  if (a.serve_rate > 0) {
    plan_serve(p);
    report(p, fmt::format("serving {:g} requests/s of {} under the SLOs", a.serve_rate,
                          a.serve_model),
           fmt::format("simulated (profile {}, model {}); capacity per configuration from the "
                       "serving simulator (serve capacity); costs from {}",
                       p.hw.name, a.serve_model, a.prices),
           nullptr);
    return;
  }
  std::string model = a.train;
  double tiered_params = 0;
  experiments::TrainScenario base = train_base(a, p.hw, a.design ? "llama2-13b" : model);
  if (a.design) {
    // The design's hardware and setting: 4 cards, LoRA r=16, grad-accum 1 (train capacity).
    experiments::TrainScenario d = base;
    d.cards = 4;
    const auto rows = experiments::training_capacity(d, {"u3m"}, a.max_loss);
    if (rows.front().max_params == 0) input_error("--design", "u3m trains no family shape");
    model = rows.front().model;
    tiered_params = double(rows.front().max_params);
    base = train_base(a, p.hw, model);
  }
  plan_train(p, base);
  const std::string label = fmt::format(
      "simulated (profile {}, model {}, {}, micro-batch {} x {} tokens, grad-accum {}); capacity "
      "per configuration from the training simulator (train sim), loss <= {:g}%; costs from {}",
      p.hw.name, model, a.lora_rank ? fmt::format("LoRA r={}", a.lora_rank) : "full fine-tuning",
      a.micro_batch, a.seq, a.grad_accum, 100 * a.max_loss, a.prices);
  report(p, fmt::format("training {}", model), label,
         a.design ? design_check(p, model, tiered_params) : json(nullptr));
}

}  // namespace

void add_plan_commands(CLI::App& app) {
  auto* plan = app.add_subcommand("plan", "Plan hardware for a target (docs/cost.md)");
  plan->require_subcommand(1);
  auto a = std::make_shared<PlanArgs>();
  auto* cost = plan->add_subcommand(
      "cost",
      "The cheapest hardware that meets a target: more cards (HBM only) or tiered (DRAM, SSDs), "
      "capacity simulated, prices with their sources (docs/cost.md)");
  cost->add_option("--train", a->train, "Target: train this model (e.g. llama2-13b, llama-30b)");
  cost->add_option("--serve-rate", a->serve_rate, "Target: serve this many requests/s under SLO");
  cost->add_flag("--design", a->design,
                 "Target: the design's BOM scenario (what u3m trains on 4 cards with the "
                 "profile's DRAM and SSD, LoRA r=16), checked against its 1.28 M / 3.2 M CNY");
  cost->add_option("--hw", a->hw, "Hardware profile (its card is priced as card/<name>)")
      ->capture_default_str();
  cost->add_option("--prices", a->prices, "Price table (JSON, docs/cost.md)")->capture_default_str();
  cost->add_option("--max-cards", a->max_cards, "Largest card count considered")
      ->capture_default_str();
  cost->add_option("--max-loss", a->max_loss, "Training: throughput-loss bound")
      ->capture_default_str();
  cost->add_option("--lora-rank", a->lora_rank, "Training: LoRA rank (0 = full fine-tuning)")
      ->capture_default_str();
  cost->add_option("--grad-accum", a->grad_accum, "Training: micro-batches per step")
      ->capture_default_str();
  cost->add_option("--seq", a->seq, "Training: tokens per sequence")->capture_default_str();
  cost->add_option("--micro-batch", a->micro_batch, "Training: sequences per micro-batch")
      ->capture_default_str();
  cost->add_option("--requests", a->requests, "Serving: request trace or rag[:KEY=V,...]")
      ->capture_default_str();
  cost->add_option("--model", a->serve_model, "Serving: model preset")->capture_default_str();
  cost->add_flag("--json", a->json, "One JSON object (u3m report plots it)");
  cost->callback([a] { run_plan(*a); });
}

}  // namespace u3m::cli
