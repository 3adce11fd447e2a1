// A pass-through sink that reports progress on stderr for long runs, only when
// stderr is a terminal so logs and CI output stay clean.
#pragma once

#include <chrono>
#include <cstdio>

#include <fmt/format.h>
#include <unistd.h>

#include "u3m/trace/model.hpp"

namespace u3m::cli {

class ProgressSink final : public trace::TraceSink {
 public:
  ProgressSink(trace::TraceSink& out, std::string_view what)
      : out_(out), what_(what), tty_(isatty(STDERR_FILENO)), start_(Clock::now()), last_(start_) {}

  void meta(std::string_view k, std::string_view v) override { out_.meta(k, v); }
  void job(std::string_view name) override { out_.job(name); }
  void tensor(const trace::Tensor& t) override { out_.tensor(t); }
  void op(const trace::Op& o) override { out_.op(o); }
  void event(const trace::Event& e) override {
    out_.event(e);
    if (tty_ && (++events_ & 0xFFFFF) == 0) tick();  // counts only when it can show
  }
  void finish() override {
    out_.finish();
    if (shown_) fmt::print(stderr, "\r\033[K");
  }

 private:
  using Clock = std::chrono::steady_clock;
  void tick() {
    auto now = Clock::now();
    if (now - last_ < std::chrono::seconds(1)) return;
    last_ = now;
    shown_ = true;
    double s = std::chrono::duration<double>(now - start_).count();
    fmt::print(stderr, "\r{}: {:.1f} M events, {:.0f} s", what_, events_ / 1e6, s);
  }
  trace::TraceSink& out_;
  std::string what_;
  bool tty_, shown_ = false;
  std::uint64_t events_ = 0;
  Clock::time_point start_, last_;
};

}  // namespace u3m::cli
