// The automatic choice of collective algorithm and data path: a table of rows, first feasible match wins.
// Update the rows from bench-collectives measurements (docs/collectives.md says how).
#pragma once

#include <cstddef>
#include <vector>

#include "loom/ops/collectives.hpp"

namespace loom::coll {

enum class GpuSharing { Any, Shared, Distinct };

struct ChoiceRow {
    CollKind kind;
    std::size_t max_bytes;  // the row applies up to this size (inclusive); SIZE_MAX: no limit
    GpuSharing sharing;
    CollAlgo algo;
    DataPath path;
    const char* why;
    int max_world = 0;  // the row applies up to this world size; 0: any
};

const std::vector<ChoiceRow>& choice_table();
// Is `algo` on `path` offered for `kind` (independent of buffers)?
bool offered(CollKind kind, CollAlgo algo, DataPath path);
// The data path an explicitly chosen algorithm uses when the caller leaves the path on Auto.
DataPath default_path(CollKind kind, CollAlgo algo, std::size_t bytes, const CollTopology& topo);
// Can `algo` run with these buffers (symmetric-ness)?
bool feasible(CollKind kind, CollAlgo algo, bool in_symmetric, bool out_symmetric);

}  // namespace loom::coll
