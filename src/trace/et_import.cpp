// PyTorch Execution Trace importer. The rules (which nodes become ops, phases,
// iterations, identities, roles, time) are documented in docs/et-import.md;
// the comments here say how the code implements them.
#include "u3m/trace/et_import.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <simdjson.h>
#include <nlohmann/json.hpp>

#include "u3m/trace/op_class.hpp"
#include "u3m/util/error.hpp"
#include "u3m/util/file.hpp"

namespace u3m::trace {
namespace {

namespace dom = simdjson::dom;

constexpr std::string_view kImporter = "u3m et_import (PyTorch Execution Trace)";
constexpr std::string_view kTimeModel = "synthetic: 1 us per op";
constexpr std::uint64_t kNsPerOp = 1000;

// Both layouts carry the same information; they differ in where it lives.
enum class Layout { flat, chakra };
struct SchemaInfo {
  std::string_view name;
  Layout layout;
};
// Only schemas whose layout we have real samples of (data/pytorch-et/), or
// that torch's own ExecutionTraceObserver source shows field by field; others
// are rejected by name rather than half-understood. 1.0.2 (torch 2.2/2.3) has
// 1.0.3's fields; 1.1.1 (torch 2.5 and later) adds `strides` to inputs and
// outputs and a `tensor_range` attr, neither of which the importer needs
// (docs/et-import.md, "Schemas").
constexpr SchemaInfo kSchemas[] = {
    {"1.0.1", Layout::flat},
    {"1.0.2-chakra.0.0.4", Layout::chakra},
    {"1.0.3-chakra.0.0.4", Layout::chakra},
    {"1.1.0-chakra.0.0.4", Layout::chakra},
    {"1.1.1-chakra.0.0.4", Layout::chakra},
};

// Limits that keep byte arithmetic far from overflow; real tensors are far
// below them, so exceeding one means the input is corrupt.
constexpr std::int64_t kMaxNumel = std::int64_t{1} << 50;
constexpr std::int64_t kMaxItemsize = 64;
constexpr std::size_t kMaxPathChars = 1024;

// ---------------------------------------------------------------------------
// Error positions. The DOM parser does not keep source offsets, so on the
// (rare) error path a small scanner finds where node k starts in the text.

std::size_t line_of_offset(std::string_view s, std::size_t off) {
  off = std::min(off, s.size());
  return 1 + static_cast<std::size_t>(std::count(s.begin(), s.begin() + off, '\n'));
}

// Byte offset of element `k` of the top-level "nodes" array of a valid JSON
// document, or npos.
std::size_t node_offset(std::string_view s, std::size_t k) {
  int depth = 0;
  int nodes_depth = -1;  // depth inside the "nodes" array once found
  bool expect_element = false;
  std::size_t count = 0;
  std::size_t i = 0;
  auto skip_ws = [&](std::size_t j) {
    while (j < s.size() && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n' || s[j] == '\r')) ++j;
    return j;
  };
  while (i < s.size()) {
    char c = s[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++i;
      continue;
    }
    if (expect_element && depth == nodes_depth) {
      if (count == k) return i;
      ++count;
      expect_element = false;
    }
    if (c == '"') {
      std::size_t start = ++i;
      while (i < s.size() && s[i] != '"') i += (s[i] == '\\') ? 2 : 1;
      std::string_view str = s.substr(start, std::min(i, s.size()) - start);
      ++i;
      if (depth == 1 && nodes_depth < 0 && str == "nodes") {
        std::size_t j = skip_ws(i);
        if (j < s.size() && s[j] == ':') {
          j = skip_ws(j + 1);
          if (j < s.size() && s[j] == '[') {
            nodes_depth = 2;
            expect_element = true;
            depth = 2;
            i = j + 1;
          }
        }
      }
      continue;
    }
    if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (depth == nodes_depth) return std::string_view::npos;  // array ended
      --depth;
    } else if (c == ',' && depth == nodes_depth) {
      expect_element = true;
    }
    ++i;
  }
  return std::string_view::npos;
}

// Finds the line and column of a JSON syntax error with nlohmann's SAX parser,
// which builds nothing and is not recursive, so hostile nesting is safe.
struct ErrorFinder : nlohmann::json_sax<nlohmann::json> {
  std::size_t position = 0;
  std::string message;
  bool failed = false;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t pos, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    failed = true;
    position = pos;
    message = ex.what();
    return false;
  }
};

[[noreturn]] void syntax_error(std::string_view json, std::string_view source,
                               simdjson::error_code code) {
  ErrorFinder finder;
  nlohmann::json::sax_parse(json.begin(), json.end(), &finder);
  if (finder.failed) {
    // nlohmann's position is 1-based: the character that broke the parse.
    std::size_t off = finder.position > 0 ? finder.position - 1 : 0;
    off = std::min(off, json.size());
    std::size_t line = line_of_offset(json, off);
    std::size_t line_start = json.substr(0, off).rfind('\n');
    std::size_t column = line_start == std::string_view::npos ? off + 1 : off - line_start;
    // Keep the reason ("syntax error while parsing value - ..."), drop the
    // "[json.exception.parse_error.101] parse error at line 1, column 2: " prefix.
    std::string_view why = finder.message;
    if (auto p = why.find(": "); p != std::string_view::npos) why.remove_prefix(p + 2);
    input_error(fmt::format("{}:{}", source, line), "JSON syntax error at line {}, column {}: {}",
                line, column, why);
  }
  // Valid JSON that simdjson still refuses (nesting deeper than its limit,
  // integers beyond 64 bits): no position to give, only the reason.
  input_error(source, "JSON not accepted: {}", simdjson::error_message(code));
}

// ---------------------------------------------------------------------------
// Small helpers over DOM values.

std::string_view type_name(dom::element_type t) {
  switch (t) {
    case dom::element_type::ARRAY:
      return "array";
    case dom::element_type::OBJECT:
      return "object";
    case dom::element_type::INT64:
    case dom::element_type::UINT64:
      return "integer";
    case dom::element_type::DOUBLE:
      return "number";
    case dom::element_type::STRING:
      return "string";
    case dom::element_type::BOOL:
      return "bool";
    case dom::element_type::NULL_VALUE:
      return "null";
  }
  return "value";
}

std::optional<std::int64_t> as_int(dom::element e) {
  std::int64_t v;
  if (e.get_int64().get(v) == simdjson::SUCCESS) return v;
  return std::nullopt;
}

DType dtype_from_type(std::string_view t) {
  // t is "Tensor(float)"; the part in parentheses is c10's scalar type name.
  auto open = t.find('(');
  auto close = t.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open)
    return DType::other;
  std::string_view s = t.substr(open + 1, close - open - 1);
  if (s.starts_with("c10::")) s.remove_prefix(5);
  static const std::pair<std::string_view, DType> kMap[] = {
      {"float", DType::f32},        {"double", DType::f64},         {"Half", DType::f16},
      {"half", DType::f16},         {"BFloat16", DType::bf16},      {"bfloat16", DType::bf16},
      {"long", DType::i64},         {"long int", DType::i64},       {"int64_t", DType::i64},
      {"int", DType::i32},          {"short", DType::i16},          {"signed char", DType::i8},
      {"unsigned char", DType::u8}, {"bool", DType::boolean},       {"Float8_e4m3fn", DType::f8},
      {"Float8_e5m2", DType::f8},   {"Float8_e4m3fnuz", DType::f8}, {"Float8_e5m2fnuz", DType::f8},
  };
  for (const auto& [name, d] : kMap)
    if (s == name) return d;
  return DType::other;
}

// Element `j` of "GenericList[Tensor(float),Tensor(long)]".
std::string_view list_element_type(std::string_view t, std::size_t j) {
  auto open = t.find('[');
  if (open == std::string_view::npos) return {};
  std::string_view body = t.substr(open + 1);
  if (!body.empty() && body.back() == ']') body.remove_suffix(1);
  int depth = 0;
  std::size_t idx = 0, start = 0;
  for (std::size_t i = 0; i <= body.size(); ++i) {
    char c = i < body.size() ? body[i] : ',';
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (c == ',' && depth == 0) {
      if (idx == j) return body.substr(start, i - start);
      ++idx;
      start = i + 1;
    }
  }
  return {};
}

// ---------------------------------------------------------------------------
// The importer proper.

struct Node {
  std::int64_t id = 0;
  std::int64_t parent = 0;
  bool has_parent = false;
  bool has_schema_field = false;
  std::string_view name;
  std::string_view schema;  // op_schema; empty for record_function ranges
  std::int64_t seq_id = -1;  // autograd sequence number: >= 0 when the op recorded a gradient graph
  bool has_seq = false;
  dom::element el;
  std::uint32_t doc_index = 0;  // position in the "nodes" array, for errors
};

struct Arg {
  std::int64_t storage = 0;
  std::int64_t offset = 0;
  std::int64_t numel = 0;
  std::int64_t itemsize = 0;
  bool cpu = false;
  DType dtype = DType::other;
  std::uint32_t slot = 0;
  std::int32_t elem = -1;  // index inside a GenericList, -1 for a plain Tensor argument
  std::uint64_t bytes() const { return static_cast<std::uint64_t>(numel * itemsize); }
  std::uint64_t extent() const { return static_cast<std::uint64_t>((offset + numel) * itemsize); }
};

enum PhaseBit : std::uint8_t { kFwd = 0, kBwd = 1, kOpt = 2 };

struct TensorInfo {
  std::string name;
  std::uint64_t bytes = 0;
  DType dtype = DType::other;
  bool entering = false;  // named after its first reader (not produced in the iteration)
  bool constant = false;  // a CPU scalar argument
  bool weight_slot = false;
  bool sqrt_in_opt = false;
  std::uint8_t read = 0, written = 0;  // PhaseBit masks
  std::uint32_t last_use = 0;          // op index of the latest access
  std::uint32_t job = 0;               // of the op that named it
  bool scalar_state = false;  // a CPU scalar written in place (not a constant)
  bool hidden = false;        // a hidden result of a nested op (".inner")
  bool used_later = false;    // accessed by an op other than one producing it
  std::uint32_t made_ctx = UINT32_MAX;  // context of its latest production
  bool persistent = false;  // produced, and used in a later iteration than the one that made it
  bool kv = false;          // produced by a model call and used by a later one (a KV cache)
  // Optimizer state (Note [Optimizer state in ETs]).
  std::uint8_t state_kind = 0;
  std::uint32_t state_param = UINT32_MAX;
  std::uint32_t first_opt_op = UINT32_MAX;       // first optimizer op that reads it
  std::uint32_t list_op = UINT32_MAX;            // first optimizer op that has it in a list
  std::int32_t list_elem = -1;                   // at this position
};

struct Access {
  std::uint32_t tensor;
  EventKind kind;
  std::uint64_t bytes;
};

struct NodeState {
  bool inside_op = false;  // this node or an ancestor is an op: its subtree is not imported
  bool backward = false;
  bool optimizer = false;
  std::string path;
};

bool is_framework_node(std::string_view name) {
  return name.starts_with("[pytorch|profiler|");
}
bool is_step_marker(std::string_view name) {
  return name.starts_with("ProfilerStep#");
}
bool is_backward_range(std::string_view name) {
  return name.starts_with("autograd::engine::evaluate_function:");
}
bool is_optimizer_range(std::string_view name) {
  return name.starts_with("Optimizer.step#") || name.starts_with("Optimizer.zero_grad#");
}

class Importer {
 public:
  Importer(std::string_view json, std::string_view source, const EtImportOptions& opt)
      : json_(json), source_(source), opt_(opt) {}

  void run(TraceSink& out);

 private:
  template <typename... Args>
  [[noreturn]] void node_error(const Node& n, fmt::format_string<Args...> f, Args&&... args) {
    std::size_t off = node_offset(json_, n.doc_index);
    std::string where = off == std::string_view::npos
                            ? std::string(source_)
                            : fmt::format("{}:{}", source_, line_of_offset(json_, off));
    input_error(where, "node id {} ('{}'): {}", n.id, n.name,
                fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  [[noreturn]] void doc_error(std::size_t doc_index, fmt::format_string<Args...> f,
                              Args&&... args) {
    std::size_t off = node_offset(json_, doc_index);
    std::string where = off == std::string_view::npos
                            ? std::string(source_)
                            : fmt::format("{}:{}", source_, line_of_offset(json_, off));
    input_error(where, "nodes[{}]: {}", doc_index, fmt::format(f, std::forward<Args>(args)...));
  }

  void read_header(dom::element root);
  void read_nodes(dom::array nodes);
  void find_iterations();
  void find_contexts();
  void walk();
  [[noreturn]] void no_operators() const;
  void import_op(std::size_t i);
  void scan_nested(std::size_t i);
  void read_args(const Node& n, bool outputs, std::vector<Arg>& args);
  void read_tensor(const Node& n, std::string_view field, dom::element v, std::string_view type,
                   std::uint32_t slot, std::int32_t elem, std::vector<Arg>& args);
  std::vector<std::int64_t> shape(const Node& n, bool outputs, std::uint32_t slot);
  double flops(const Node& n);
  std::uint32_t tensor_named(std::string&& name, const Arg& a);
  void access(std::uint32_t t, EventKind kind, std::uint64_t bytes, std::uint8_t phase_bit);
  void optimizer_facts(const Node& n);
  void compute_lifetimes();
  void name_optimizer_state();
  Role role_of(const TensorInfo& t) const;
  void emit(TraceSink& out);

  std::string_view json_;
  std::string_view source_;
  const EtImportOptions& opt_;
  std::string_view schema_;
  Layout layout_ = Layout::flat;

  std::vector<Node> nodes_;  // sorted by id, which is execution order
  std::vector<NodeState> state_;
  std::vector<std::int64_t> parent_pos_;  // position of each node's parent, -1 for none
  std::string iteration_rule_;
  // An iteration of a job, from the node with id first_id on (Note [ET jobs and iterations]).
  struct Ctx {
    std::int64_t first_id;
    std::uint32_t job, iteration;
    Phase phase;  // forward for training; prefill or decode for a model call
  };
  std::vector<Ctx> ctx_;
  std::vector<std::string> jobs_;
  std::uint32_t cur_ctx_ = 0;
  bool last_outer_embedding_ = false, segment_saw_embedding_ = false;
  std::int64_t last_call_positions_ = 0;  // token positions the last model call embedded

  // Storage id -> logical tensor, kept across iterations (Note [Lifetimes in
  // ET imports]); sibling ordinals, reset every iteration.
  std::unordered_map<std::int64_t, std::uint32_t> binding_;
  std::unordered_map<std::string, std::uint32_t> ordinals_;

  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, std::uint32_t> by_name_;
  std::vector<Op> ops_;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> op_events_;  // [begin, end) in events_
  std::vector<Access> events_;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> frees_;  // (op, tensor)
  std::vector<std::uint32_t> op_ctx_;                            // context of each op
  std::vector<bool> drop_;  // events_ left out: an alloc of a tensor still live
  // Optimizer-phase writes in op order (op, tensor, list element), for linking state to params.
  struct OptWrite {
    std::uint32_t op, tensor;
    std::int32_t elem;
  };
  std::vector<OptWrite> opt_writes_;
  std::size_t view_ops_skipped_ = 0;

  // Scratch buffers reused across ops.
  std::vector<Arg> ins_, outs_;
  std::vector<std::uint32_t> in_tensor_;  // logical tensor of each entry of ins_
  std::vector<Arg> inner_, nested_in_, nested_out_;
  std::vector<std::string> inner_names_;  // name suffix of each entry of inner_
  std::unordered_map<std::string_view, std::uint32_t> nested_ord_;
  std::uint64_t nested_writes_ = 0;
  std::vector<std::uint32_t> stack_;
  std::vector<std::uint32_t> child_begin_, children_;  // children of node i: CSR form
  std::vector<Access> acc_;
  std::unordered_map<std::uint64_t, std::uint32_t> acc_index_;  // (tensor, kind) -> acc_ entry
  std::unordered_map<std::int64_t, std::uint32_t> input_at_;    // storage -> first entry of ins_
  std::unordered_set<std::int64_t> seen_, nested_in_storages_;
};

void Importer::run(TraceSink& out) {
  dom::parser parser;
  dom::element root;
  if (auto err = parser.parse(json_.data(), json_.size()).get(root))
    syntax_error(json_, source_, err);
  read_header(root);
  dom::array nodes;
  dom::element nodes_el;
  if (root.at_key("nodes").get(nodes_el) != simdjson::SUCCESS)
    input_error(source_, "missing field 'nodes' (the list of ET nodes)");
  if (nodes_el.get_array().get(nodes) != simdjson::SUCCESS)
    input_error(source_, "field 'nodes' must be an array, not {}", type_name(nodes_el.type()));
  read_nodes(nodes);
  find_iterations();
  walk();
  if (ops_.empty()) no_operators();
  compute_lifetimes();
  name_optimizer_state();
  emit(out);
}

// A trace with nothing to import is an error, not an empty trace: most
// likely a capture that stopped before the program ran, or a cut file.
void Importer::no_operators() const {
  if (nodes_.empty()) input_error(source_, "field 'nodes' is empty: no operator to import");
  const Node& n = nodes_.front();
  if (nodes_.size() == 1 && n.has_parent && n.parent == n.id)
    input_error(source_, "node id {} ('{}') is its own parent and the only node: no operator to import",
                n.id, n.name);
  input_error(source_,
              "none of its {} nodes is an operator (a node with a non-empty op_schema, or named "
              "aten::/c10d:: without one): nothing to import",
              nodes_.size());
}

void Importer::read_header(dom::element root) {
  if (!root.is_object())
    input_error(source_, "an execution trace is a JSON object, not {}", type_name(root.type()));
  dom::element s;
  if (root.at_key("schema").get(s) != simdjson::SUCCESS)
    input_error(source_, "missing field 'schema'");
  if (s.get_string().get(schema_) != simdjson::SUCCESS)
    input_error(source_, "field 'schema' must be a string, not {}", type_name(s.type()));
  for (const auto& k : kSchemas) {
    if (k.name == schema_) {
      layout_ = k.layout;
      return;
    }
  }
  std::vector<std::string_view> names;
  for (const auto& k : kSchemas) names.push_back(k.name);
  input_error(source_, "unknown ET schema '{}' (supported: {})", schema_, fmt::join(names, ", "));
}

void Importer::read_nodes(dom::array nodes) {
  nodes_.reserve(nodes.size());
  std::uint32_t k = 0;
  for (dom::element e : nodes) {
    Node n;
    n.doc_index = k++;
    n.el = e;
    if (!e.is_object())
      doc_error(n.doc_index, "a node must be an object, not {}", type_name(e.type()));
    dom::element v;
    if (e.at_key("id").get(v) != simdjson::SUCCESS) doc_error(n.doc_index, "missing field 'id'");
    auto id = as_int(v);
    if (!id) doc_error(n.doc_index, "field 'id' must be an integer, not {}", type_name(v.type()));
    n.id = *id;
    if (e.at_key("name").get(v) != simdjson::SUCCESS || v.get_string().get(n.name))
      doc_error(n.doc_index, "node id {}: field 'name' missing or not a string", n.id);
    std::string_view parent_key = layout_ == Layout::flat ? "parent" : "ctrl_deps";
    if (e.at_key(parent_key).get(v) == simdjson::SUCCESS) {
      auto p = as_int(v);
      if (!p)
        node_error(n, "field '{}' must be an integer, not {}", parent_key, type_name(v.type()));
      n.parent = *p;
      n.has_parent = true;
    }
    auto read_seq = [&](dom::element sv) {
      if (auto q = as_int(sv)) {
        n.seq_id = *q;
        n.has_seq = true;
      }
    };
    if (layout_ == Layout::flat) {
      if (e.at_key("op_schema").get(v) == simdjson::SUCCESS) {
        if (v.get_string().get(n.schema)) node_error(n, "field 'op_schema' must be a string");
        n.has_schema_field = true;
      }
      if (e.at_key("seq_id").get(v) == simdjson::SUCCESS) read_seq(v);
    } else if (e.at_key("attrs").get(v) == simdjson::SUCCESS) {
      dom::array attrs;
      if (v.get_array().get(attrs)) node_error(n, "field 'attrs' must be an array");
      for (dom::element a : attrs) {
        std::string_view an;
        dom::element av;
        if (!a.is_object() || a.at_key("name").get(av) || av.get_string().get(an))
          node_error(n, "each entry of 'attrs' must be an object with a string 'name'");
        if (an == "seq_id" && a.at_key("value").get(av) == simdjson::SUCCESS) read_seq(av);
        if (an != "op_schema") continue;
        if (a.at_key("value").get(av) || av.get_string().get(n.schema))
          node_error(n, "attrs 'op_schema' needs a string 'value'");
        n.has_schema_field = true;
      }
    }
    nodes_.push_back(n);
  }
  // Node ids are handed out when an operator starts, so id order is
  // execution order; the file itself lists nodes as they finish.
  std::stable_sort(nodes_.begin(), nodes_.end(),
                   [](const Node& a, const Node& b) { return a.id < b.id; });
  for (std::size_t i = 1; i < nodes_.size(); ++i)
    if (nodes_[i].id == nodes_[i - 1].id) node_error(nodes_[i], "duplicate node id");
}

// A node is an operator when the dispatcher recorded a schema for it;
// record_function ranges and autograd nodes have an empty op_schema. Traces
// without the field fall back to the operator namespaces.
bool is_operator(const Node& n) {
  if (n.has_schema_field) return !n.schema.empty();
  return n.name.starts_with("aten::") || n.name.starts_with("c10d::");
}

void Importer::find_iterations() {
  std::unordered_map<std::int64_t, std::size_t> index;
  index.reserve(nodes_.size());
  for (std::size_t i = 0; i < nodes_.size(); ++i) index.emplace(nodes_[i].id, i);
  // Parents as positions; a parent that does not precede its child (corrupt
  // input) is ignored so the walk below never sees an unprocessed parent.
  state_.resize(nodes_.size());
  parent_pos_.assign(nodes_.size(), -1);
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    if (!n.has_parent || n.parent == n.id) continue;
    auto it = index.find(n.parent);
    if (it != index.end() && it->second < i) parent_pos_[i] = static_cast<std::int64_t>(it->second);
  }
  child_begin_.assign(nodes_.size() + 1, 0);
  for (std::int64_t p : parent_pos_)
    if (p >= 0) ++child_begin_[static_cast<std::size_t>(p) + 1];
  for (std::size_t i = 0; i < nodes_.size(); ++i) child_begin_[i + 1] += child_begin_[i];
  children_.resize(child_begin_.back());
  std::vector<std::uint32_t> fill(child_begin_.begin(), child_begin_.end() - 1);
  for (std::size_t i = 0; i < nodes_.size(); ++i)  // ascending i keeps children in id order
    if (parent_pos_[i] >= 0)
      children_[fill[static_cast<std::size_t>(parent_pos_[i])]++] = static_cast<std::uint32_t>(i);
  find_contexts();
}

// Note [ET jobs and iterations]
// An ET has no notion of job: a program that trains and generates writes one
// stream. The stream is cut into *items*: the top-level nodes of each thread
// (children of a thread root; a ProfilerStep# range is looked through, its
// start remembered). An item is
// - training if it holds backward (autograd::engine ranges), an optimizer
//   range (Optimizer.step#/zero_grad#), or an operator that recorded an
//   autograd graph (seq_id >= 0: grad mode was on and it had inputs that
//   require grad);
// - inference if it holds model work (a matmul, convolution, attention or
//   embedding op) and none of that: run under no_grad or inference_mode, and
//   no backward follows it;
// - neutral otherwise (drawing a batch, a prompt, logging), and then belongs
//   to the next item that is not neutral.
// Consecutive items of one kind form a segment; training segments are job
// `opt.job`, inference segments job `opt.infer_job`. A segment starts an
// iteration of its job. Within a training segment an iteration also starts at
// each ProfilerStep#, else after each Optimizer.step# range (the step ends an
// iteration, so gradient accumulation stays inside one), else at each
// occurrence of the first repeated top-level range. Within an inference
// segment an iteration (a model call) starts at each ProfilerStep# and at each
// `aten::embedding` that begins a run of lookups (a language model's forward
// begins with its token embedding); the first call is the prefill, the others
// decode steps. Items of a thread that only runs autograd (the backward thread
// of a CUDA program) belong to the iteration running when they start (by id),
// so backward is merged into its iteration. Without seq_id (grad mode
// unknown) nothing is taken for inference.
void Importer::find_contexts() {
  const std::size_t n = nodes_.size();
  auto is_thread_root = [&](const Node& x) {
    return is_framework_node(x.name) && x.name.find("thread") != std::string_view::npos;
  };
  // Items, and the ProfilerStep# that precedes each.
  std::vector<std::int64_t> item_of(n, -1);
  std::vector<bool> step_start(n, false), is_item(n, false);
  std::vector<std::int64_t> root_of(n, -1);  // the thread root above each item
  bool pending_step = false, have_steps = false;
  for (std::size_t i = 0; i < n; ++i) {
    const Node& x = nodes_[i];
    const std::int64_t p = parent_pos_[i];
    if (is_framework_node(x.name)) continue;
    const bool parent_is_root = p < 0 || is_framework_node(nodes_[p].name);
    if (is_step_marker(x.name) && parent_is_root) {
      pending_step = have_steps = true;
      continue;
    }
    const bool parent_is_step = p >= 0 && is_step_marker(nodes_[p].name);
    if (parent_is_root || parent_is_step) {
      is_item[i] = true;
      item_of[i] = static_cast<std::int64_t>(i);
      if (pending_step) step_start[i] = true, pending_step = false;
      std::int64_t r = p;
      while (r >= 0 && !is_thread_root(nodes_[r])) r = parent_pos_[r];
      root_of[i] = r;
    } else {
      item_of[i] = item_of[p];
    }
  }
  // Flags per item, from its subtree.
  enum : std::uint8_t { kBwdF = 1, kOptF = 2, kGradF = 4, kModelF = 8, kZeroF = 16, kStepF = 32 };
  std::vector<std::uint8_t> flags(n, 0);
  std::vector<bool> in_opt(n, false);
  bool grad_known = false;
  for (std::size_t i = 0; i < n; ++i) {
    const Node& x = nodes_[i];
    const std::int64_t p = parent_pos_[i];
    in_opt[i] = (p >= 0 && in_opt[p]) || is_optimizer_range(x.name);
    if (item_of[i] < 0) continue;
    std::uint8_t& f = flags[item_of[i]];
    if (is_backward_range(x.name)) f |= kBwdF;
    if (x.name.starts_with("Optimizer.step#")) f |= kOptF | kStepF;
    if (x.name.starts_with("Optimizer.zero_grad#")) f |= kOptF | kZeroF;
    // seq_id >= 0 on an operator, or on a custom autograd Function's range
    // (activation checkpointing runs its forward under no_grad inside one).
    if (x.has_seq && x.seq_id >= 0) {
      grad_known = true;
      if (!in_opt[i]) f |= kGradF;
    }
    if (!is_operator(x)) continue;
    const OpClass c = classify_op(x.name, Phase::forward);
    if (c == OpClass::matmul || c == OpClass::attn_prefill || c == OpClass::embedding) f |= kModelF;
  }
  // Threads that run only autograd: their items follow the iteration by id.
  std::unordered_map<std::int64_t, std::pair<std::size_t, std::size_t>> per_root;  // (autograd, all)
  for (std::size_t i = 0; i < n; ++i)
    if (is_item[i]) {
      auto& c = per_root[root_of[i]];
      c.first += is_backward_range(nodes_[i].name);
      ++c.second;
    }
  std::vector<std::size_t> items;
  for (std::size_t i = 0; i < n; ++i) {
    if (!is_item[i]) continue;
    const auto& c = per_root[root_of[i]];
    if (root_of[i] >= 0 && c.first == c.second) continue;  // a backward thread
    items.push_back(i);
  }
  enum Kind : std::uint8_t { kNeutral, kTrain, kInfer };
  std::vector<Kind> kind(items.size(), kNeutral);
  bool any_infer = false;
  // A trace with no backward and no optimizer at all is inference only, seq_id or not.
  const bool no_training = std::none_of(items.begin(), items.end(), [&](std::size_t i) {
    return flags[i] & (kBwdF | kOptF);
  }) && std::none_of(flags.begin(), flags.end(), [&](std::uint8_t f) { return f & kBwdF; });
  for (std::size_t k = 0; k < items.size(); ++k) {
    const std::uint8_t f = flags[items[k]];
    if (f & (kBwdF | kOptF | kGradF))
      kind[k] = kTrain;
    else if ((f & kModelF) && (grad_known || no_training))
      kind[k] = kInfer, any_infer = true;
  }
  std::vector<std::int64_t> backward_ids;  // ascending, as nodes_ is
  for (const Node& x : nodes_)
    if (is_backward_range(x.name)) backward_ids.push_back(x.id);
  // "No backward after them": a forward that recorded an autograd graph but
  // is followed by no backward or optimizer step (generation left with grad
  // mode on) is inference too.
  for (std::size_t k = 0; k < items.size();) {
    const std::uint8_t f = flags[items[k]];
    if (kind[k] != kTrain || (f & (kBwdF | kOptF))) {
      ++k;
      continue;
    }
    std::size_t e = k;
    bool model = false;
    while (e < items.size() && kind[e] != kInfer && !(flags[items[e]] & (kBwdF | kOptF))) {
      model |= (flags[items[e]] & kModelF) != 0;
      ++e;
    }
    // The backward of a CUDA program runs on another thread: it follows by id.
    bool backward_follows = e < items.size() && kind[e] != kInfer;
    const std::int64_t to =
        e < items.size() ? nodes_[items[e]].id : std::numeric_limits<std::int64_t>::max();
    auto b = std::upper_bound(backward_ids.begin(), backward_ids.end(), nodes_[items[k]].id);
    backward_follows |= b != backward_ids.end() && *b < to;
    if (!backward_follows && model)
      for (std::size_t q = k; q < e; ++q)
        if (kind[q] == kTrain) kind[q] = kInfer, any_infer = true;
    k = e;
  }
  // The outermost operators of item k (its own node if it is one).
  std::vector<bool> under_op(n, false);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t p = parent_pos_[i];
    under_op[i] = p >= 0 && (under_op[p] || is_operator(nodes_[p]));
  }
  auto outer_ops = [&](std::size_t k, auto&& visit) {
    const std::size_t i = items[k], end = k + 1 < items.size() ? items[k + 1] : n;
    for (std::size_t q = i; q < end; ++q)
      if (item_of[q] == static_cast<std::int64_t>(i) && is_operator(nodes_[q]) && !under_op[q])
        visit(nodes_[q]);
  };
  // Note [The tail of a generation]: between an inference item and a
  // training item, the neutral items that consume what the inference wrote
  // (sampling the last token from its logits: softmax, multinomial) finish
  // the generation. The tail ends at the first that does not (drawing the
  // training batch), or that writes what the training item reads (the
  // generated sequence an RLHF step trains on, or a view of it: that is the
  // training's input). Without marks, the tail used to open the next
  // training iteration.
  {
    std::vector<Arg> args;
    std::unordered_set<std::int64_t> written, train_reads;
    auto storages = [&](std::size_t item, bool outputs, std::unordered_set<std::int64_t>& into) {
      outer_ops(item, [&](const Node& x) {
        read_args(x, outputs, args);
        for (const Arg& a : args) into.insert(a.storage);
      });
    };
    auto any_of = [&](std::size_t item, bool outputs, const std::unordered_set<std::int64_t>& in) {
      bool hit = false;
      outer_ops(item, [&](const Node& x) {
        read_args(x, outputs, args);
        for (const Arg& a : args) hit |= in.count(a.storage) != 0;
      });
      return hit;
    };
    for (std::size_t k = 0; k < items.size(); ++k) {
      if (kind[k] != kInfer) continue;
      std::size_t e = k + 1;
      while (e < items.size() && kind[e] == kNeutral) ++e;
      if (e == k + 1 || e == items.size() || kind[e] != kTrain) continue;
      written.clear();
      train_reads.clear();
      storages(k, true, written);
      storages(e, false, train_reads);
      for (std::size_t q = k + 1; q < e; ++q) {
        if (!any_of(q, false, written) || any_of(q, true, train_reads)) break;
        kind[q] = kInfer;
        storages(q, true, written);
      }
      k = e - 1;
    }
  }
  // Neutral items join the next item that is not neutral (the last ones, the one before).
  Kind next = kTrain;
  for (std::size_t k = items.size(); k-- > 0;)
    if (kind[k] != kNeutral) {
      next = kind[k];
      break;
    }
  for (std::size_t k = items.size(); k-- > 0;)
    if (kind[k] == kNeutral)
      kind[k] = next;
    else
      next = kind[k];
  if (!any_infer)
    for (Kind& k : kind) k = kTrain;
  // Jobs in order of first appearance.
  int job_of_kind[3] = {-1, -1, -1};
  auto job_for = [&](Kind k) {
    if (job_of_kind[k] < 0) {
      job_of_kind[k] = static_cast<int>(jobs_.size());
      jobs_.push_back(k == kInfer ? opt_.infer_job : opt_.job);
    }
    return static_cast<std::uint32_t>(job_of_kind[k]);
  };
  const bool have_opt = std::any_of(items.begin(), items.end(),
                                    [&](std::size_t i) { return flags[i] & kStepF; });
  // Rule 3 for training: the first top-level range among training items that recurs.
  std::string_view repeated;
  if (!have_steps && !have_opt) {
    std::unordered_map<std::string_view, int> count;
    std::vector<std::string_view> order;
    for (std::size_t k = 0; k < items.size(); ++k) {
      const Node& x = nodes_[items[k]];
      if (kind[k] != kTrain || is_operator(x) || is_backward_range(x.name)) continue;
      if (count[x.name]++ == 0) order.push_back(x.name);
    }
    for (std::string_view r : order)
      if (count[r] >= 2) {
        repeated = r;
        break;
      }
  }
  iteration_rule_ = have_steps ? "ProfilerStep# ranges"
                    : have_opt ? "after each Optimizer.step# range"
                    : !repeated.empty()
                        ? fmt::format("repeated top-level range '{}'", repeated)
                        : std::string("none found: one iteration per segment");
  if (any_infer)
    iteration_rule_ +=
        "; inference segments (no autograd graph, no backward): one iteration per model call";
  std::vector<std::uint32_t> iters;
  Kind cur = kNeutral;
  std::vector<bool> substantive;  // the context holds model, backward or optimizer work
  // `model_call`: started at a model call's embedding, so it holds model work.
  auto start_ctx = [&](std::size_t pos, Kind k, Phase ph, bool model_call = false) {
    const std::uint32_t j = job_for(k);
    if (iters.size() <= j) iters.resize(j + 1, 0);
    ctx_.push_back({nodes_[pos].id, j, iters[j]++, ph});
    substantive.push_back(model_call);
  };
  // After an Optimizer.step#, the next iteration starts after the zero_grad
  // that follows it, if one does before any backward or autograd-recording
  // item (the loop's step-then-zero_grad), else at the first item after it.
  std::vector<bool> opt_start(items.size(), false);
  for (std::size_t k = 0; k < items.size(); ++k) {
    if (!(flags[items[k]] & kStepF)) continue;
    std::size_t at = k + 1;
    for (std::size_t q = k + 1; q < items.size(); ++q) {
      const std::uint8_t f = flags[items[q]];
      if (f & (kBwdF | kGradF | kStepF)) break;
      if (f & kZeroF) at = q + 1;
    }
    if (at < items.size()) opt_start[at] = true;
  }
  for (std::size_t k = 0; k < items.size(); ++k) {
    const std::size_t i = items[k];
    const Node& x = nodes_[i];
    bool start = kind[k] != cur;
    if (!start && kind[k] == kTrain) {
      if (have_steps)
        start = step_start[i];
      else if (have_opt)
        start = opt_start[k];
      else if (!repeated.empty())
        start = !is_operator(x) && x.name == repeated;
    } else if (!start) {
      start = have_steps && step_start[i];
    }
    if (start) start_ctx(i, kind[k], kind[k] == kInfer ? Phase::prefill : Phase::forward);
    if (!ctx_.empty() && (flags[i] & (kBwdF | kOptF | kGradF | kModelF))) substantive.back() = true;
    cur = kind[k];
    if (kind[k] != kInfer) continue;
    // Model calls inside this item: every aten::embedding that follows a
    // non-embedding outermost op of the same segment, after the first.
    const std::size_t end = k + 1 < items.size() ? items[k + 1] : n;
    bool prev_embedding = false, seen_embedding = false;
    if (!start) {  // continuing a segment: keep the state of the previous item
      prev_embedding = last_outer_embedding_;
      seen_embedding = segment_saw_embedding_;
    } else {
      last_call_positions_ = 0;
    }
    for (std::size_t q = i; q < end; ++q) {
      if (item_of[q] != static_cast<std::int64_t>(i) || !is_operator(nodes_[q]) || under_op[q])
        continue;
      const bool emb = nodes_[q].name == "aten::embedding";
      if (emb && !prev_embedding) {
        // Token positions per sequence: the last dimension of the indices.
        const std::vector<std::int64_t> idx = shape(nodes_[q], false, 1);
        const std::int64_t pos = idx.empty() ? 0 : idx.back();
        // Note [Requests in an inference segment]: a decode step embeds one
        // position (with a KV cache) or one more than the call before (a
        // generate that re-reads its sequence); any other call begins a new
        // request, i.e. is a prefill: consecutive requests without a
        // training step between them are not one long generation.
        if (seen_embedding)
          start_ctx(q, kInfer,
                    pos == 1 || (pos > 0 && pos == last_call_positions_ + 1) || pos == 0
                        ? Phase::decode
                        : Phase::prefill,
                    true);
        last_call_positions_ = pos;
      }
      if (emb) seen_embedding = true;
      prev_embedding = emb;
    }
    last_outer_embedding_ = prev_embedding;
    segment_saw_embedding_ = seen_embedding;
  }
  // A context with nothing but bookkeeping (the handle a profiler range
  // allocates just before the range) is not an iteration: it joins the next.
  std::vector<Ctx> kept;
  std::fill(iters.begin(), iters.end(), 0);
  std::int64_t carry = std::numeric_limits<std::int64_t>::max();
  for (std::size_t c = 0; c < ctx_.size(); ++c) {
    if (!substantive[c] && c + 1 < ctx_.size() && ctx_[c + 1].job == ctx_[c].job) {
      carry = std::min(carry, ctx_[c].first_id);
      continue;
    }
    Ctx x = ctx_[c];
    x.first_id = std::min(x.first_id, carry);
    carry = std::numeric_limits<std::int64_t>::max();
    x.iteration = iters[x.job]++;
    kept.push_back(x);
  }
  ctx_ = std::move(kept);
  if (ctx_.empty()) {
    job_for(kTrain);
    ctx_.push_back({std::numeric_limits<std::int64_t>::min(), 0, 0, Phase::forward});
  }
  ctx_.front().first_id = std::numeric_limits<std::int64_t>::min();  // what precedes belongs to it
}

void Importer::walk() {
  std::size_t c = 0;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    std::size_t was = c;
    while (c + 1 < ctx_.size() && n.id >= ctx_[c + 1].first_id) ++c;
    if (c != was) ordinals_.clear();  // names restart with every iteration
    cur_ctx_ = static_cast<std::uint32_t>(c);
    NodeState& st = state_[i];
    const NodeState* parent = parent_pos_[i] >= 0 ? &state_[parent_pos_[i]] : nullptr;
    if (parent && parent->inside_op) {
      st.inside_op = true;
      continue;
    }
    st.backward = (parent && parent->backward) || is_backward_range(n.name);
    st.optimizer = (parent && parent->optimizer) || is_optimizer_range(n.name);
    const std::string parent_path = parent ? parent->path : std::string();
    if (is_framework_node(n.name) || is_step_marker(n.name)) {
      // Thread roots and the step marker (whose name changes every step) add
      // no path component, so paths repeat from step to step.
      st.path = parent_path;
    } else {
      std::string key = parent_path;
      key += '\x1f';
      key += n.name;
      std::uint32_t ord = ordinals_[key]++;
      st.path = parent_path.empty() ? std::string(n.name) : parent_path + "/" + std::string(n.name);
      if (ord > 0) st.path += fmt::format("#{}", ord);
      // Bounded paths keep hostile nesting (a chain of 100k ranges) linear;
      // real paths are a few hundred characters.
      if (st.path.size() > kMaxPathChars) st.path = fmt::format("~{:016x}", stable_id(st.path));
    }
    if (is_operator(n)) {
      st.inside_op = true;
      import_op(i);
    }
  }
}

void Importer::read_tensor(const Node& n, std::string_view field, dom::element v,
                           std::string_view type, std::uint32_t slot, std::int32_t elem,
                           std::vector<Arg>& args) {
  dom::array a;
  if (v.get_array().get(a))
    node_error(n,
               "{}[{}]: a {} value must be [tensor_id, storage_id, offset, numel, itemsize, "
               "device], not {}",
               field, slot, type, type_name(v.type()));
  std::int64_t f[5];
  static constexpr std::string_view kFields[5] = {"tensor_id", "storage_id", "offset", "numel",
                                                  "itemsize"};
  std::size_t k = 0;
  Arg arg;
  for (dom::element x : a) {
    if (k < 5) {
      auto iv = as_int(x);
      if (!iv)
        node_error(n, "{}[{}]: field {} must be an integer, not {}", field, slot, kFields[k],
                   type_name(x.type()));
      f[k] = *iv;
    } else if (k == 5) {
      std::string_view dev;
      if (x.get_string().get(dev) == simdjson::SUCCESS) arg.cpu = dev == "cpu";
    }
    ++k;
  }
  if (k < 5)
    node_error(n,
               "{}[{}]: a tensor value needs [tensor_id, storage_id, offset, numel, itemsize], "
               "got {} fields",
               field, slot, k);
  if (f[2] < 0 || f[2] > kMaxNumel)
    node_error(n, "{}[{}]: field offset {} is out of range", field, slot, f[2]);
  if (f[3] < 0 || f[3] > kMaxNumel)
    node_error(n, "{}[{}]: field numel {} is {}", field, slot, f[3],
               f[3] < 0 ? "negative" : "implausibly large");
  if (f[4] < 0 || f[4] > kMaxItemsize)
    node_error(n, "{}[{}]: field itemsize {} is {}", field, slot, f[4],
               f[4] < 0 ? "negative" : "implausibly large");
  // Undefined tensors ("nullptr (uninitialized)") and empty ones touch no memory.
  if (f[3] == 0 || f[4] == 0) return;
  // Storage id 0 means no storage was recorded; fall back to the tensor id.
  arg.storage = f[1] != 0 ? f[1] : -1 - std::max<std::int64_t>(f[0], 0);
  arg.offset = f[2];
  arg.numel = f[3];
  arg.itemsize = f[4];
  arg.cpu = arg.cpu && arg.numel == 1;  // only CPU *scalars* are treated as constants
  arg.dtype = dtype_from_type(type);
  arg.slot = slot;
  arg.elem = elem;
  args.push_back(arg);
}

void Importer::read_args(const Node& n, bool outputs, std::vector<Arg>& args) {
  args.clear();
  dom::element values_el, types_el;
  std::string_view field;
  if (layout_ == Layout::flat) {
    field = outputs ? "outputs" : "inputs";
    if (n.el.at_key(field).get(values_el)) return;  // no arguments recorded
    if (n.el.at_key(outputs ? "output_types" : "input_types").get(types_el))
      node_error(n, "field '{}' present without '{}'", field,
                 outputs ? "output_types" : "input_types");
  } else {
    field = outputs ? "outputs.values" : "inputs.values";
    dom::element group;
    if (n.el.at_key(outputs ? "outputs" : "inputs").get(group)) return;
    if (!group.is_object())
      node_error(n, "field '{}' must be an object {{values, shapes, types}}, not {}",
                 outputs ? "outputs" : "inputs", type_name(group.type()));
    if (group.at_key("values").get(values_el) || group.at_key("types").get(types_el))
      node_error(n, "field '{}' needs 'values' and 'types'", outputs ? "outputs" : "inputs");
  }
  dom::array values, types;
  if (values_el.get_array().get(values))
    node_error(n, "field '{}' must be an array, not {}", field, type_name(values_el.type()));
  if (types_el.get_array().get(types)) node_error(n, "the types of '{}' must be an array", field);
  if (values.size() != types.size())
    node_error(n, "'{}' has {} values but {} types", field, values.size(), types.size());
  std::uint32_t slot = 0;
  auto ti = types.begin();
  for (dom::element v : values) {
    std::string_view t;
    if ((*ti).get_string().get(t)) node_error(n, "types of '{}' must be strings", field);
    ++ti;
    if (t.starts_with("Tensor(")) {
      read_tensor(n, field, v, t, slot, -1, args);
    } else if (t.starts_with("GenericList[Tensor")) {
      dom::array list;
      if (v.get_array().get(list))
        node_error(n, "{}[{}]: a {} value must be an array, not {}", field, slot, t.substr(0, 20),
                   type_name(v.type()));
      std::int32_t j = 0;
      for (dom::element x : list) {
        std::string_view et = list_element_type(t, static_cast<std::size_t>(j));
        if (et.starts_with("Tensor(")) read_tensor(n, field, x, et, slot, j, args);
        ++j;
      }
    }
    ++slot;
  }
}

std::vector<std::int64_t> Importer::shape(const Node& n, bool outputs, std::uint32_t slot) {
  std::vector<std::int64_t> dims;
  dom::element shapes;
  bool found = layout_ == Layout::flat
                   ? !n.el.at_key(outputs ? "output_shapes" : "input_shapes").get(shapes)
                   : !n.el.at_key(outputs ? "outputs" : "inputs").at_key("shapes").get(shapes);
  dom::element s;
  dom::array a;
  if (!found || shapes.at(slot).get(s) || s.get_array().get(a)) return dims;
  for (dom::element d : a) {
    auto v = as_int(d);
    if (!v || *v < 0) return {};
    dims.push_back(*v);
  }
  return dims;
}

double product(const std::vector<std::int64_t>& d, std::size_t from = 0) {
  double p = 1;
  for (std::size_t i = from; i < d.size(); ++i) p *= static_cast<double>(d[i]);
  return p;
}

// FLOPs of the matmul-shaped ops from their recorded shapes; 0 when unknown.
double Importer::flops(const Node& n) {
  std::string_view name = n.name;
  auto mm = [](const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b) {
    if (a.size() == 2 && b.size() == 2 && a[1] == b[0]) return 2.0 * a[0] * a[1] * b[1];
    if (a.size() == 3 && b.size() == 3 && a[0] == b[0] && a[2] == b[1])
      return 2.0 * a[0] * a[1] * a[2] * b[2];
    return 0.0;
  };
  if (name == "aten::mm" || name == "aten::bmm" || name == "aten::matmul")
    return mm(shape(n, false, 0), shape(n, false, 1));
  if (name == "aten::addmm" || name == "aten::baddbmm")
    return mm(shape(n, false, 1), shape(n, false, 2));
  if (name == "aten::linear") {
    auto x = shape(n, false, 0), w = shape(n, false, 1);
    if (x.empty() || w.size() != 2 || x.back() != w[1]) return 0;
    return 2.0 * product(x) * static_cast<double>(w[0]);
  }
  bool conv = name == "aten::conv1d" || name == "aten::conv2d" || name == "aten::conv3d" ||
              name == "aten::convolution" || name == "aten::_convolution" ||
              name == "aten::cudnn_convolution" || name == "aten::mkldnn_convolution";
  if (conv) {
    // 2 * output elements * (weight elements per output channel).
    auto w = shape(n, false, 1), y = shape(n, true, 0);
    if (w.size() < 3 || y.empty() || w[0] == 0) return 0;
    return 2.0 * product(y) * product(w, 1);
  }
  if (name == "aten::convolution_backward") {
    // Input-gradient and weight-gradient passes each cost about one forward.
    auto gy = shape(n, false, 0), w = shape(n, false, 2);
    if (w.size() < 3 || gy.empty()) return 0;
    int passes = 2;
    dom::element mask;
    dom::array m;
    bool got = layout_ == Layout::flat ? !n.el.at_key("inputs").at(10).get(mask)
                                       : !n.el.at_key("inputs").at_key("values").at(10).get(mask);
    if (got && !mask.get_array().get(m)) {
      passes = 0;
      int k = 0;
      for (dom::element b : m) {
        bool on = false;
        if (k++ < 2 && !b.get_bool().get(on) && on) ++passes;
      }
    }
    return passes * 2.0 * product(gy) * product(w, 1);
  }
  return 0;
}

// Calls arg(text, slot) for each argument of an operator schema
// ("aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> ..."),
// "*" (the keyword-only marker) skipped; returns the position of the closing
// parenthesis, or npos.
template <typename F>
std::size_t for_each_schema_arg(std::string_view s, F&& arg) {
  auto open = s.find('(');
  if (open == std::string_view::npos) return std::string_view::npos;
  int depth = 0;
  std::size_t start = open + 1;
  std::uint32_t slot = 0;
  for (std::size_t i = open + 1; i < s.size(); ++i) {
    char c = s[i];
    if (c == '(' || c == '[') ++depth;
    if ((c == ')' || c == ']') && depth > 0) {
      --depth;
      continue;
    }
    if ((c == ',' || c == ')') && depth == 0) {
      std::string_view text = s.substr(start, i - start);
      while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
      if (text != "*" && !text.empty()) arg(text, slot++);
      start = i + 1;
      if (c == ')') return i;
    }
  }
  return std::string_view::npos;
}

// The argument names of an operator schema, by slot ("self", "tensor1", ...).
void schema_arg_names(std::string_view s, std::vector<std::string_view>& out) {
  out.clear();
  for_each_schema_arg(s, [&](std::string_view text, std::uint32_t) {
    if (auto eq = text.find('='); eq != std::string_view::npos) text = text.substr(0, eq);
    out.push_back(text.substr(text.rfind(' ') + 1));
  });
}

// Slots an operator writes in place, from "Tensor(a!)" in its schema.
std::uint64_t mutated_slots(const Node& n, bool* writes_returns) {
  std::uint64_t mask = 0;
  *writes_returns = false;
  std::string_view s = n.schema;
  if (s.empty()) {
    // No schema: PyTorch's naming convention for in-place ops.
    if (n.name.ends_with("_")) mask = 1, *writes_returns = true;
    return mask;
  }
  const std::size_t close = for_each_schema_arg(s, [&](std::string_view text, std::uint32_t slot) {
    if (text.find("!)") != std::string_view::npos && slot < 64) mask |= std::uint64_t{1} << slot;
  });
  if (close != std::string_view::npos && s.substr(close).find('!') != std::string_view::npos)
    *writes_returns = true;
  return mask;
}

std::uint32_t Importer::tensor_named(std::string&& name, const Arg& a) {
  auto [it, fresh] =
      by_name_.try_emplace(std::move(name), static_cast<std::uint32_t>(tensors_.size()));
  if (fresh) {
    TensorInfo t;
    t.name = it->first;
    t.dtype = a.dtype;
    t.job = ctx_[cur_ctx_].job;
    tensors_.push_back(std::move(t));
  }
  return it->second;
}

void Importer::access(std::uint32_t t, EventKind kind, std::uint64_t bytes,
                      std::uint8_t phase_bit) {
  auto [it, fresh] =
      acc_index_.try_emplace((std::uint64_t{t} << 2) | static_cast<std::uint64_t>(kind),
                             static_cast<std::uint32_t>(acc_.size()));
  if (!fresh) {
    Access& a = acc_[it->second];
    a.bytes = std::max(a.bytes, bytes);  // two views of one tensor count once
    return;
  }
  acc_.push_back({t, kind, bytes});
  TensorInfo& ti = tensors_[t];
  if (kind == EventKind::read) ti.read |= std::uint8_t(1u << phase_bit);
  if (kind == EventKind::write) ti.written |= std::uint8_t(1u << phase_bit);
  ti.last_use = static_cast<std::uint32_t>(ops_.size());
}

std::string slot_name(const char* dir, const Arg& a) {
  return a.elem < 0 ? fmt::format(".{}{}", dir, a.slot)
                    : fmt::format(".{}{}.{}", dir, a.slot, a.elem);
}

// Looks inside operator i for what its own arguments do not show: tensors
// its nested operators create and keep (inner_) and in-place writes nested
// operators make to i's inputs (nested_writes_, a bit per position in ins_).
void Importer::scan_nested(std::size_t i) {
  inner_.clear();
  inner_names_.clear();
  nested_ord_.clear();
  nested_writes_ = 0;
  stack_.assign(children_.begin() + child_begin_[i], children_.begin() + child_begin_[i + 1]);
  std::reverse(stack_.begin(), stack_.end());
  seen_.clear();
  for (const auto* v : {&ins_, &outs_})
    for (const Arg& a : *v) seen_.insert(a.storage);
  while (!stack_.empty()) {
    std::uint32_t d = stack_.back();
    stack_.pop_back();
    for (std::uint32_t c = child_begin_[d + 1]; c-- > child_begin_[d];)
      stack_.push_back(children_[c]);
    const Node& n = nodes_[d];
    read_args(n, false, nested_in_);
    read_args(n, true, nested_out_);
    std::string_view short_name = n.name;
    if (short_name.starts_with("aten::")) short_name.remove_prefix(6);
    const std::uint32_t ord = nested_ord_[short_name]++;
    bool ignored = false;
    if (std::uint64_t m = mutated_slots(n, &ignored)) {
      for (const Arg& a : nested_in_) {
        if (a.slot >= 64 || !((m >> a.slot) & 1)) continue;
        auto k = input_at_.find(a.storage);
        if (k != input_at_.end() && k->second < 64) nested_writes_ |= std::uint64_t{1} << k->second;
      }
    }
    nested_in_storages_.clear();
    for (const Arg& a : nested_in_) nested_in_storages_.insert(a.storage);
    for (const Arg& o : nested_out_) {
      // Skip aliases of the nested op's own inputs and storages already seen.
      if (nested_in_storages_.count(o.storage) || !seen_.insert(o.storage).second) continue;
      // Named by the nested op and its result slot, not by a running count:
      // a recycled storage id that hides one hidden result must not rename the others.
      inner_names_.push_back(ord ? fmt::format(".inner.{}#{}.out{}", short_name, ord, o.slot)
                                 : fmt::format(".inner.{}.out{}", short_name, o.slot));
      inner_.push_back(o);
    }
  }
}

void Importer::import_op(std::size_t i) {
  const Node& n = nodes_[i];
  const NodeState& st = state_[i];
  read_args(n, false, ins_);
  read_args(n, true, outs_);
  const Ctx& cx = ctx_[cur_ctx_];
  const bool infer = cx.phase == Phase::prefill || cx.phase == Phase::decode;
  Phase ctx = st.backward    ? Phase::backward
              : st.optimizer ? Phase::optimizer
              : infer        ? cx.phase
                             : Phase::forward;
  std::uint8_t bit = st.backward ? kBwd : st.optimizer ? kOpt : kFwd;
  OpClass cls = classify_op(n.name, ctx);
  bool writes_returns = false;
  std::uint64_t mutated = mutated_slots(n, &writes_returns);
  // Collectives work in place on the tensors they are given, whatever their
  // schema says (c10d::allreduce_ returns its input list).
  if (cls == OpClass::collective) writes_returns = true;
  input_at_.clear();
  for (std::size_t k = 0; k < ins_.size(); ++k)
    input_at_.try_emplace(ins_[k].storage, static_cast<std::uint32_t>(k));
  // Position in ins_ of the first input sharing o's storage, or -1.
  auto aliased_input = [&](const Arg& o) -> std::int64_t {
    auto it = input_at_.find(o.storage);
    return it == input_at_.end() ? -1 : static_cast<std::int64_t>(it->second);
  };
  auto aliases_input = [&](const Arg& o) { return aliased_input(o) >= 0; };
  scan_nested(i);
  if (ins_.empty() && outs_.empty() && inner_.empty()) return;  // touches no tensor
  if (mutated == 0 && !writes_returns && inner_.empty() && nested_writes_ == 0 &&
      std::all_of(outs_.begin(), outs_.end(), aliases_input)) {
    // A view (t, view, expand, detach, ...): no data moves. Its output keeps
    // the storage, so later readers resolve to the same logical tensor.
    ++view_ops_skipped_;
    return;
  }

  Op op;
  op.name = std::string(n.name);
  op.cls = classify_op(n.name, ctx);
  op.phase = op.cls == OpClass::collective ? Phase::collective : ctx;
  op.job = cx.job;
  op.iteration = cx.iteration;
  op.flops = flops(n);

  acc_.clear();
  acc_index_.clear();
  // A model call's tensors carry its phase: a prefill's activations are not a decode step's.
  const std::string prefix = jobs_[cx.job] + "." +
                             (infer ? std::string(to_string(cx.phase)) + "." : std::string()) +
                             st.path;
  const auto op_index = static_cast<std::uint32_t>(ops_.size());
  auto produce = [&](const std::string& suffix, const Arg& o) {
    std::uint32_t t = tensor_named(prefix + suffix, o);
    TensorInfo& ti = tensors_[t];
    ti.bytes = std::max(ti.bytes, o.extent());
    ti.made_ctx = cur_ctx_;
    binding_[o.storage] = t;
    access(t, EventKind::alloc, 0, bit);
    access(t, EventKind::write, o.bytes(), bit);
  };
  bool weight_op =
      op.cls == OpClass::matmul || op.cls == OpClass::norm || op.cls == OpClass::embedding;
  bool sqrt_op = n.name.find("sqrt") != std::string_view::npos;
  in_tensor_.clear();
  for (const Arg& a : ins_) {
    std::uint32_t t;
    auto b = binding_.find(a.storage);
    const bool mutated_here = a.slot < 64 && ((mutated >> a.slot) & 1);
    // A CPU scalar (wrapped number, lr, 1/world_size): its storage id is
    // recycled between unrelated scalars, so it is a constant of this op,
    // unless it is state an op writes in place (an optimizer's step count)
    // or was made in this iteration (a loss on the CPU).
    // (The bound tensor must be a scalar too: a wrapped number can land on
    // the storage id of a scratch buffer freed a moment ago.)
    const bool bound_scalar = b != binding_.end() && tensors_[b->second].bytes == a.extent() &&
                              (tensors_[b->second].scalar_state ||
                               tensors_[b->second].made_ctx == cur_ctx_);
    if (a.cpu && !mutated_here && !bound_scalar) {
      t = tensor_named(prefix + slot_name("in", a), a);
      tensors_[t].constant = true;
    } else if (b != binding_.end() && (!a.cpu || bound_scalar || mutated_here)) {
      t = b->second;
    } else {
      // Enters the iteration without being produced in it: named after its
      // first reader. See Note [Stable ET identities] in docs/et-import.md.
      t = tensor_named(prefix + slot_name("in", a), a);
      tensors_[t].entering = true;
      binding_.emplace(a.storage, t);
    }
    in_tensor_.push_back(t);
    TensorInfo& ti = tensors_[t];
    if (a.cpu && mutated_here) ti.scalar_state = true;
    if (ti.entering || ti.constant) ti.bytes = std::max(ti.bytes, a.extent());
    if (weight_op && a.slot >= 1 && bit == kFwd) ti.weight_slot = true;
    if (sqrt_op && ctx == Phase::optimizer) ti.sqrt_in_opt = true;
    // A broadcast view can claim more elements than its storage holds.
    access(t, EventKind::read, std::min(a.bytes(), ti.bytes), bit);
  }
  for (std::size_t k = 0; k < ins_.size(); ++k)
    if ((ins_[k].slot < 64 && (mutated >> ins_[k].slot) & 1) ||
        (k < 64 && (nested_writes_ >> k) & 1))
      access(in_tensor_[k], EventKind::write,
             std::min(ins_[k].bytes(), tensors_[in_tensor_[k]].bytes), bit);
  for (const Arg& o : outs_) {
    if (std::int64_t k = aliased_input(o); k >= 0) {
      // Returned alias of an input: an in-place or out= write, or a view.
      std::uint32_t t = in_tensor_[static_cast<std::size_t>(k)];
      if (writes_returns || mutated)
        access(t, EventKind::write, std::min(o.bytes(), tensors_[t].bytes), bit);
      continue;
    }
    // New storage: a tensor produced here. Its storage id may be a recycled
    // one, so it always rebinds.
    produce(slot_name("out", o), o);
  }
  // Made by a nested operator and not returned (saved statistics, pooling
  // indices, scratch): produced here under an ".inner<k>" name.
  for (std::size_t k = 0; k < inner_.size(); ++k) {
    produce(inner_names_[k], inner_[k]);
    tensors_[binding_[inner_[k].storage]].hidden = true;
  }
  std::uint64_t bytes = 0;
  for (const Access& a : acc_) {
    std::uint64_t room = std::numeric_limits<std::uint64_t>::max() - bytes;
    bytes += std::min(a.bytes, room);
  }
  op.bytes = bytes;
  if (ctx == Phase::optimizer) {
    for (std::size_t k = 0; k < ins_.size(); ++k) {
      TensorInfo& ti = tensors_[in_tensor_[k]];
      if (ti.first_opt_op == UINT32_MAX) ti.first_opt_op = op_index;
      if (ins_[k].elem >= 0 && ti.list_op == UINT32_MAX) ti.list_op = op_index, ti.list_elem = ins_[k].elem;
      if ((ins_[k].slot < 64 && (mutated >> ins_[k].slot) & 1))
        opt_writes_.push_back({op_index, in_tensor_[k], ins_[k].elem});
    }
    optimizer_facts(n);
  }
  op_ctx_.push_back(cur_ctx_);
  auto begin = static_cast<std::uint32_t>(events_.size());
  // Order inside an op: allocs, reads, writes (times follow the same order).
  for (EventKind k : {EventKind::alloc, EventKind::read, EventKind::write})
    for (const Access& a : acc_)
      if (a.kind == k) events_.push_back(a);
  op_events_.emplace_back(begin, static_cast<std::uint32_t>(events_.size()));
  ops_.push_back(std::move(op));
}

// Note [Optimizer state in ETs]
// An ET has no parameter or state names, but torch.optim's update is
// recognisable by its data flow inside Optimizer.step#, the same in the
// single-tensor, foreach (lists, paired by position) and fused forms:
// - exp_avg: the numerator of addcdiv_(param, exp_avg, denom) (Adam, AdamW,
//   torch 1.x and 2.x), the self of lerp_(exp_avg, grad) (torch 2.x), or the
//   `exp_avgs` argument of _fused_adam(w)_;
// - exp_avg_sq: the self of addcmul_(v, grad, grad), or `exp_avg_sqs`;
// - max_exp_avg_sq: what maximum(..., out=) writes (AMSGrad), or `max_exp_avg_sqs`;
// - momentum_buffer: what add_(param, buf) adds to a parameter (SGD), or
//   `momentum_buffer_list`;
// - step: a one-element state that add_ increments, or `state_steps`.
// A state tensor is one used only inside the optimizer and alive across
// iterations (it entered the trace, or was made by the first step and read by
// later ones); temporaries (the denominator) are workspace. Each is renamed
// `<param>.<kind>` after the parameter it updates: the one paired with it
// above, else the first parameter the optimizer writes after the state's
// first use (at the same list position).
enum StateKind : std::uint8_t { kNoState, kExpAvg, kExpAvgSq, kMaxExpAvgSq, kMomentum, kStepCount };
constexpr std::string_view kStateNames[] = {"", "exp_avg", "exp_avg_sq", "max_exp_avg_sq",
                                            "momentum_buffer", "step"};

void Importer::optimizer_facts(const Node& n) {
  std::string_view op = n.name;
  if (op.starts_with("aten::")) op.remove_prefix(6);
  static thread_local std::vector<std::string_view> names;
  schema_arg_names(n.schema, names);
  auto name_of = [&](const Arg& a) {
    return a.slot < names.size() ? names[a.slot] : std::string_view();
  };
  // The tensor at argument `arg`, list element `elem` (-1: a plain argument).
  auto at = [&](std::string_view arg, std::int32_t elem) -> std::uint32_t {
    for (std::size_t k = 0; k < ins_.size(); ++k)
      if (name_of(ins_[k]) == arg && ins_[k].elem == elem) return in_tensor_[k];
    return UINT32_MAX;
  };
  auto set = [&](std::uint32_t t, StateKind k, std::uint32_t param) {
    if (t == UINT32_MAX) return;
    TensorInfo& ti = tensors_[t];
    if (ti.state_kind == kNoState) ti.state_kind = k;
    if (param != UINT32_MAX && ti.state_param == UINT32_MAX) ti.state_param = param;
  };
  const bool foreach = op.starts_with("_foreach_");
  std::string_view base = foreach ? op.substr(9) : op;
  std::int32_t elems = 0;  // list length of `self` (foreach), else one plain argument
  if (foreach)
    for (const Arg& a : ins_)
      if (name_of(a) == "self") elems = std::max(elems, a.elem + 1);
  auto each = [&](auto&& f) {
    if (!foreach) return f(-1);
    for (std::int32_t e = 0; e < elems; ++e) f(e);
  };
  if (base == "addcdiv_") {
    each([&](std::int32_t e) { set(at("tensor1", e), kExpAvg, at("self", e)); });
  } else if (base == "addcmul_") {
    each([&](std::int32_t e) {
      const std::uint32_t t1 = at("tensor1", e);
      if (t1 != UINT32_MAX && t1 == at("tensor2", e)) set(at("self", e), kExpAvgSq, UINT32_MAX);
    });
  } else if (base == "lerp_") {
    each([&](std::int32_t e) { set(at("self", e), kExpAvg, UINT32_MAX); });
  } else if (base == "maximum" || base == "maximum_") {
    each([&](std::int32_t e) { set(at(foreach ? "self" : "out", e), kMaxExpAvgSq, UINT32_MAX); });
  } else if (base == "add_") {
    each([&](std::int32_t e) {
      const std::uint32_t self = at("self", e), other = at("other", e);
      if (other != UINT32_MAX && !tensors_[other].constant)
        set(other, kMomentum, self);  // param.add_(buf): confirmed once roles are known
      else if (self != UINT32_MAX && tensors_[self].bytes <= 8)
        set(self, kStepCount, UINT32_MAX);
    });
  } else if (op.starts_with("_fused_")) {
    static constexpr std::pair<std::string_view, StateKind> kArgs[] = {
        {"exp_avgs", kExpAvg},           {"exp_avg_sqs", kExpAvgSq},
        {"max_exp_avg_sqs", kMaxExpAvgSq}, {"momentum_buffer_list", kMomentum},
        {"state_steps", kStepCount}};
    for (const Arg& a : ins_)
      for (const auto& [arg, k] : kArgs)
        if (name_of(a) == arg) set(at(arg, a.elem), k, at("self", a.elem));
  }
}

// Note [Lifetimes in ET imports]
// Storage ids are bound to logical tensors across iterations, so a tensor
// made in one iteration and used in a later one (optimizer state made by the
// first step, gradients kept by zero_grad(set_to_none=False), a rollout that
// training reads, a KV cache grown by torch.cat from one decode step to the
// next) is one tensor, not a new "entering" one each time. Its lifetime
// follows: a produced tensor is allocated when produced and freed after its
// last access before it is produced again; produced again by an op that also
// reads it (cat onto itself) it stays allocated; if its last use lies in a
// later iteration than its production and nothing produces it again, it
// outlives the trace (no free). Persistence decides roles (state rather than
// workspace; a tensor one model call makes and a later one reads is KV).
void Importer::compute_lifetimes() {
  struct Inst {
    bool open = false;
    std::uint32_t start_ctx = 0, last_op = 0, last_ctx = 0;
  };
  std::vector<Inst> inst(tensors_.size());
  drop_.assign(events_.size(), false);
  // A hidden result no later op reads is the op's own scratch (the
  // workspace of a batch norm): left out, so a recycled storage id that
  // hides it in one step and not the next does not change the step.
  // Per op, which tensors it allocates and reads (stamps: no quadratic scans).
  std::vector<std::uint32_t> alloc_at(tensors_.size(), UINT32_MAX), read_at(tensors_.size(), UINT32_MAX);
  auto stamp_op = [&](std::uint32_t i) {
    for (std::uint32_t k = op_events_[i].first; k < op_events_[i].second; ++k) {
      const Access& a = events_[k];
      if (a.kind == EventKind::alloc) alloc_at[a.tensor] = i;
      if (a.kind == EventKind::read) read_at[a.tensor] = i;
    }
  };
  for (std::uint32_t i = 0; i < ops_.size(); ++i) {
    stamp_op(i);
    for (std::uint32_t k = op_events_[i].first; k < op_events_[i].second; ++k)
      if (alloc_at[events_[k].tensor] != i) tensors_[events_[k].tensor].used_later = true;
  }
  for (std::uint32_t k = 0; k < events_.size(); ++k)
    if (tensors_[events_[k].tensor].hidden && !tensors_[events_[k].tensor].used_later) drop_[k] = true;
  auto infer_ctx = [&](std::uint32_t c) {
    return ctx_[c].phase == Phase::prefill || ctx_[c].phase == Phase::decode;
  };
  for (std::uint32_t i = 0; i < ops_.size(); ++i) {
    const std::uint32_t c = op_ctx_[i];
    const auto [b, e] = op_events_[i];
    stamp_op(i);
    for (std::uint32_t k = b; k < e; ++k) {
      if (drop_[k]) continue;
      const Access& a = events_[k];
      Inst& in = inst[a.tensor];
      TensorInfo& ti = tensors_[a.tensor];
      if (a.kind == EventKind::alloc) {
        if (in.open) {
          if (read_at[a.tensor] == i) {  // grows onto itself: still allocated
            drop_[k] = true;
            continue;
          }
          frees_.emplace_back(in.last_op, a.tensor);
        }
        in = {true, c, i, c};
        continue;
      }
      if (!in.open) continue;
      if (c != in.start_ctx) {
        ti.persistent = true;
        if (infer_ctx(c) && infer_ctx(in.start_ctx) && ctx_[c].job == ctx_[in.start_ctx].job)
          ti.kv = true;
      }
      in.last_op = i;
      in.last_ctx = c;
    }
  }
  for (std::uint32_t t = 0; t < inst.size(); ++t)
    if (inst[t].open && inst[t].last_ctx == inst[t].start_ctx) frees_.emplace_back(inst[t].last_op, t);
}

void Importer::name_optimizer_state() {
  std::vector<Role> roles(tensors_.size());
  for (std::size_t t = 0; t < tensors_.size(); ++t) roles[t] = role_of(tensors_[t]);
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    TensorInfo& ti = tensors_[t];
    if (!(roles[t] == Role::optim_m || roles[t] == Role::optim_v || ti.state_kind == kStepCount) ||
        !(ti.entering || ti.persistent || ti.scalar_state))
      continue;
    if (ti.state_kind == kMomentum &&
        (ti.state_param == UINT32_MAX || roles[ti.state_param] != Role::param)) {
      ti.state_kind = kNoState;  // added to something that is not a parameter
      ti.state_param = UINT32_MAX;
    }
    std::uint32_t param = ti.state_param;
    if (param != UINT32_MAX && roles[param] != Role::param) param = UINT32_MAX;
    // In lists (foreach), the parameter at the same position of the next
    // list the optimizer writes parameters in; else the next parameter written.
    const bool in_list = ti.list_op != UINT32_MAX;
    const std::uint32_t from = in_list ? ti.list_op : ti.first_opt_op;
    if (param == UINT32_MAX && from != UINT32_MAX) {
      auto w = std::lower_bound(opt_writes_.begin(), opt_writes_.end(), from,
                                [](const OptWrite& x, std::uint32_t op) { return x.op < op; });
      for (; w != opt_writes_.end() && op_ctx_[w->op] == op_ctx_[from]; ++w)
        if (roles[w->tensor] == Role::param && (in_list ? w->elem == ti.list_elem : w->elem < 0)) {
          param = w->tensor;
          break;
        }
    }
    if (ti.state_kind == kNoState || param == UINT32_MAX) continue;
    std::string name = fmt::format("{}.{}", tensors_[param].name, kStateNames[ti.state_kind]);
    if (by_name_.count(name)) continue;  // two states of one kind on one parameter: keep both apart
    by_name_.erase(ti.name);
    by_name_.emplace(name, static_cast<std::uint32_t>(t));
    ti.name = std::move(name);
  }
}

Role Importer::role_of(const TensorInfo& t) const {
  const std::uint8_t fwd = 1u << kFwd, bwd = 1u << kBwd, opt = 1u << kOpt;
  const std::uint8_t used = t.read | t.written;
  if (t.constant) return Role::other;
  if ((t.written & bwd) && (t.read & opt)) return Role::grad;
  if (t.entering && !(t.written & bwd) &&
      (((t.written & opt) && (used & (fwd | bwd))) || t.weight_slot))
    return Role::param;
  if (used == opt) {
    // Temporaries of the optimizer step; state lives across steps.
    if (!t.entering && !t.persistent && !t.scalar_state) return Role::workspace;
    switch (t.state_kind) {
      case kExpAvg:
      case kMomentum:
        return Role::optim_m;
      case kExpAvgSq:
      case kMaxExpAvgSq:
        return Role::optim_v;
      case kStepCount:
        return Role::other;
      default:
        return t.sqrt_in_opt ? Role::optim_v : Role::optim_m;
    }
  }
  if (!t.entering) return t.kv ? Role::kv : Role::activation;
  // Entering data read in forward (the input batch, labels) flows like an
  // activation; anything else entering (communication buckets) is "other".
  return (t.read & fwd) && !t.written ? Role::activation : Role::other;
}

void Importer::emit(TraceSink& out) {
  out.meta("source", source_);
  out.meta("et_schema", schema_);
  out.meta("importer", kImporter);
  out.meta("time_model", kTimeModel);
  out.meta("et_iteration_rule", iteration_rule_);
  out.meta("et_view_ops_skipped", std::to_string(view_ops_skipped_));
  for (const std::string& j : jobs_) out.job(j);
  // Model state belongs to the training job, whichever job touched it first.
  std::uint32_t train_job = 0;
  for (std::uint32_t j = 0; j < jobs_.size(); ++j)
    if (jobs_[j] == opt_.job) train_job = j;
  for (const TensorInfo& ti : tensors_) {
    Tensor t;
    t.id = stable_id(ti.name);
    t.name = ti.name;
    t.bytes = ti.bytes;
    t.dtype = ti.dtype;
    t.role = role_of(ti);
    const bool model_state = t.role == Role::param || t.role == Role::grad ||
                             t.role == Role::optim_m || t.role == Role::optim_v ||
                             ti.state_kind != kNoState;
    t.job = model_state ? train_job : ti.job;
    out.tensor(t);
  }
  std::stable_sort(frees_.begin(), frees_.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::size_t f = 0;
  for (std::uint32_t i = 0; i < ops_.size(); ++i) {
    out.op(ops_[i]);
    const std::uint64_t t0 = kNsPerOp * i;
    for (std::uint32_t e = op_events_[i].first; e < op_events_[i].second; ++e) {
      if (drop_[e]) continue;
      const Access& a = events_[e];
      out.event({a.kind == EventKind::write ? t0 + kNsPerOp / 2 : t0, i, a.tensor, a.kind});
    }
    for (; f < frees_.size() && frees_[f].first == i; ++f)
      out.event({t0 + kNsPerOp - 1, i, frees_[f].second, EventKind::free});
  }
  out.finish();
}

}  // namespace

void import_pytorch_et(std::string_view json, std::string_view source, TraceSink& out,
                       const EtImportOptions& opt) {
  Importer(json, source, opt).run(out);
}

void import_pytorch_et_file(const std::string& path, TraceSink& out, const EtImportOptions& opt) {
  std::string data = read_file(path);
  import_pytorch_et(data, path, out, opt);
}

}  // namespace u3m::trace
