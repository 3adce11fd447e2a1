// Importer for PyTorch Execution Traces (the MLCommons Chakra JSON family).
// Schemas: 1.0.1 (torch 1.13's ExecutionGraphObserver), 1.0.3-chakra.0.0.4 and
// 1.1.0-chakra.0.0.4. See docs/et-import.md for how stable identities,
// iterations and phases are derived.
#pragma once

#include <string>
#include <string_view>

#include "u3m/trace/model.hpp"

namespace u3m::trace {

struct EtImportOptions {
  // Job names: training (and everything when no inference is recognised),
  // and the inference segments (docs/et-import.md, "Jobs and iterations").
  std::string job = "train-0";
  std::string infer_job = "infer-0";
};

// `json` is the decompressed document; `source` names it in error messages.
void import_pytorch_et(std::string_view json, std::string_view source, TraceSink& out,
                       const EtImportOptions& opt = {});
// Reads a .json or .json.gz file and imports it.
void import_pytorch_et_file(const std::string& path, TraceSink& out,
                            const EtImportOptions& opt = {});

}  // namespace u3m::trace
