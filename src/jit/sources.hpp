// The header side of the JIT: Loom's embedded headers (materialised on disk for the compilers) and the
// dependency hash of a user's kernel header.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::jit::detail {

// Generated into libloom by cmake/embed_headers.cmake: every header under include/loom as
// ("loom/lang/context.cuh", contents).
const std::vector<std::pair<std::string_view, std::string_view>>& embedded_headers();

// SHA-256 over every embedded header's path and contents: a change to any Loom header changes every key.
const std::string& embedded_set_hash();

// Is `header` one of the embedded headers ("loom/kernels/gemm/gemm.cuh")?
bool is_embedded(std::string_view header);

// A directory holding the embedded set as files (<dir>/loom/...), to be passed with -I. Content-addressed
// under <cache>/headers/<hash>; written once, to a temporary directory renamed into place, so concurrent
// processes never see a partial tree. Thread-safe.
std::string embedded_include_dir();

// SHA-256 over the user files a kernel header (transitively) includes: the header itself and every
// `#include "x"` / `#include <x>` that resolves to a file in the header's directory or in `include_dirs`.
// Includes of Loom's embedded headers and of system headers are not files here and are skipped (the
// embedded set is hashed separately). Conditional includes are followed regardless of the condition, so the
// hash may cover more files than the compiler reads: a spurious miss, never a stale hit. Raises when the
// header itself does not exist.
std::string user_header_hash(const std::string& header, const std::vector<std::string>& include_dirs);

}  // namespace loom::jit::detail
