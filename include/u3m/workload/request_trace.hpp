// Serving request traces with prompt structure (docs/requests.md): the u3m
// request format (JSON lines), importers for Mooncake and Azure LLM inference
// traces, and the prefix-sharing analysis that is the ground truth for the
// KV cache. The plain `Request` of requests.hpp is a ServeRequest with the
// segments summed (to_requests), so the serving generators can replay these.
#pragma once

#include <cstdint>
#include <istream>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "u3m/workload/requests.hpp"

namespace u3m {
class OutputFile;
}

namespace u3m::workload {

// A run of prompt tokens with an identity. Equal ids mean equal content, so
// two prompts that start with the same chain of ids share that prefix's KV.
struct PromptSegment {
  std::string id;
  std::uint32_t tokens = 0;  // >= 1
  bool operator==(const PromptSegment&) const = default;
};

struct ServeRequest {
  double timestamp_ms = 0;  // arrival, ms from the trace's start; finite, >= 0
  std::uint32_t output_tokens = 1;
  std::vector<PromptSegment> prompt;  // in order; at least one segment
  std::string session;                // empty: not part of a multi-turn session
  std::uint64_t prompt_tokens() const;
  bool operator==(const ServeRequest&) const = default;
};

enum class RequestFormat : std::uint8_t { u3m, mooncake, azure_csv };
std::string_view to_string(RequestFormat f);
// "u3m", "mooncake", "azure"; nullopt otherwise.
std::optional<RequestFormat> parse_request_format(std::string_view s);
// The format of a file from its first non-blank line; nullopt if none fits.
std::optional<RequestFormat> detect_request_format(std::string_view first_line);

// What to do when a Mooncake line's hash_ids do not cover input_length in
// blocks of block_tokens (ceil(input_length / block) != number of ids).
enum class MooncakeMismatch : std::uint8_t {
  error,  // InputError naming the line (the default; the published traces never mismatch)
  fit,    // Note [Mooncake block fitting]
};

struct ImportOptions {
  std::optional<RequestFormat> format;  // nullopt: detect from the first line
  bool require_sorted = true;           // false: accept decreasing timestamps (sort afterwards)
  std::uint32_t mooncake_block_tokens = 512;
  MooncakeMismatch mooncake_mismatch = MooncakeMismatch::error;
};

// Streams requests from any supported format, one line at a time. Every
// error is an InputError naming the source, the line and the field. Checks
// applied to every format: timestamps do not decrease (unless
// !require_sorted), every token count is >= 1, a prompt's total fits in 32
// bits, and a segment id has the same token count wherever it appears.
class RequestStream {
 public:
  // `in` must outlive the stream. `source` names it in errors.
  RequestStream(std::istream& in, std::string source, ImportOptions opt = {});
  ~RequestStream();
  RequestStream(const RequestStream&) = delete;
  RequestStream& operator=(const RequestStream&) = delete;

  std::optional<ServeRequest> next();
  // The format in use; detection happens on the first next() if not given.
  std::optional<RequestFormat> format() const;
  std::uint64_t line() const;  // the last line read, 1-based

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A file opened for streaming (gzip by magic bytes, read whole first).
class RequestFile {
 public:
  explicit RequestFile(const std::string& path, ImportOptions opt = {});
  ~RequestFile();
  RequestStream& stream() { return *stream_; }
  std::optional<ServeRequest> next() { return stream_->next(); }

 private:
  std::unique_ptr<std::istream> in_;
  std::unique_ptr<RequestStream> stream_;
};

std::vector<ServeRequest> load_requests(const std::string& path, const ImportOptions& opt = {});
std::vector<ServeRequest> parse_requests(std::string_view text, std::string_view source,
                                         const ImportOptions& opt = {});
// Stable sort by timestamp: equal timestamps keep their file order. Times
// below 0 (an unsorted Azure trace is timed from its first line) are shifted
// so the earliest request is at 0.
void sort_by_timestamp(std::vector<ServeRequest>& requests);

// One JSON line of the u3m format, without the newline.
std::string to_json_line(const ServeRequest& r);

// Writes the u3m format; the file appears only on finish() (OutputFile).
class RequestWriter {
 public:
  explicit RequestWriter(const std::string& path);  // "-": stdout
  ~RequestWriter();
  void write(const ServeRequest& r);
  void finish();
  std::uint64_t written() const { return written_; }

 private:
  std::unique_ptr<OutputFile> file_;
  std::string buf_;
  std::uint64_t written_ = 0;
};

// Plain requests for the serving generators: ids 0.., arrival in ns, prompt
// tokens summed over the segments.
std::vector<Request> to_requests(const std::vector<ServeRequest>& requests);

// ---------------------------------------------------------------- prefix sharing

// Chain keys: key(i) = xxh64(segment i's id, seed key(i-1)), key(-1) = 0, so a
// key names a segment together with everything before it in the prompt.
std::vector<std::uint64_t> chain_keys(const ServeRequest& r);

// Note [Ideal prefix cache]
// The analysis replays requests in arrival order through a cache of chain
// keys, ignoring time: a request's prefix is cached the moment it arrives,
// and nothing is in flight. A request hits the longest run of leading
// segments whose chain keys are resident (attention needs every earlier
// token's KV, so a resident segment after a miss is no use); its hit tokens
// are those segments' tokens. Then all its chain keys become resident.
//  * Unbounded: nothing is evicted; the hit rate is the most any prefix cache
//    at segment granularity can reach on this trace.
//  * LRU bounded to B tokens: after each request, least recently used keys are
//    evicted until at most B tokens stay resident. A request's keys are
//    touched from the last segment to the first, so a prefix is always more
//    recent than its extensions and is evicted after them (vLLM frees a
//    request's blocks in reverse order for the same reason). A request longer
//    than B leaves only its leading segments that fit.
// Granularity is the segment (Mooncake: 512-token blocks); a block-granular
// cache with smaller blocks can do slightly better on partial segments.
class PrefixCache {
 public:
  // capacity_tokens: nullopt for unbounded.
  explicit PrefixCache(std::optional<std::uint64_t> capacity_tokens);
  // Hit tokens of this request, then insert it. `keys` = chain_keys(r).
  std::uint64_t access(const ServeRequest& r, const std::vector<std::uint64_t>& keys);
  std::uint64_t resident_tokens() const { return resident_; }
  std::optional<std::uint64_t> capacity() const { return capacity_; }

 private:
  struct Entry {
    std::uint64_t key;
    std::uint32_t tokens;
  };
  std::optional<std::uint64_t> capacity_;
  std::uint64_t resident_ = 0;
  std::list<Entry> lru_;  // front: most recently used
  std::unordered_map<std::uint64_t, std::list<Entry>::iterator> where_;
};

struct Distribution {
  std::uint64_t count = 0;
  double mean = 0;
  std::uint64_t min = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;  // nearest rank
  static Distribution of(std::vector<std::uint64_t> values);
};

struct CacheResult {
  std::optional<std::uint64_t> capacity_tokens;  // nullopt: unbounded
  std::uint64_t hit_tokens = 0;
  std::uint64_t requests_with_hit = 0;
  double hit_rate = 0;  // hit_tokens / all prompt tokens
};

struct RequestStatsReport {
  std::uint64_t requests = 0;
  double first_ms = 0, last_ms = 0;
  double rate_per_s = 0;  // (requests - 1) / (last - first); 0 when the span is 0
  Distribution prompt_tokens, output_tokens, segments;
  std::uint64_t total_prompt_tokens = 0, total_output_tokens = 0;
  std::uint64_t distinct_segments = 0;       // distinct ids
  std::uint64_t distinct_prefix_tokens = 0;  // tokens of distinct chain keys: unbounded footprint
  std::uint64_t sessions = 0;                // distinct non-empty session ids
  std::vector<CacheResult> caches;           // unbounded first, then each capacity asked for
};

// Accumulates one pass over a trace (Note [Ideal prefix cache]). Requests
// must come in arrival order, as the readers give them.
class RequestStats {
 public:
  explicit RequestStats(std::vector<std::uint64_t> lru_capacities_tokens = {});
  void add(const ServeRequest& r);
  RequestStatsReport report() const;

 private:
  std::vector<std::uint64_t> prompt_, output_, segments_;
  double first_ms_ = 0, last_ms_ = 0;
  std::uint64_t total_prompt_ = 0, total_output_ = 0;
  std::unordered_set<std::string> segment_ids_, sessions_;
  std::vector<PrefixCache> caches_;
  std::vector<std::uint64_t> hits_, hit_requests_;
};

}  // namespace u3m::workload
