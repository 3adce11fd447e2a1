#include "commands.hpp"
namespace u3m::cli {
void add_predict_commands(CLI::App&) {}  // placeholder until the predict layer lands
}  // namespace u3m::cli
