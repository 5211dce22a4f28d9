// Host side of the diagnostic mailbox (device side and layout: include/loom/lang/diag.cuh).
//
// One mailbox per process, created by the first World and kept until exit (a kernel of a destroyed World may
// still trap into it). The library's error paths (loom::detail::throw_cuda / throw_cu, World::shutdown) append
// its decoded records to their message when CUDA reports a sticky device error, so a timed-out wait in a kernel
// that may not printf still says who waited for what.
#pragma once

#include <cuda.h>

#include <string>

#include "loom/lang/diag.cuh"

namespace loom::diag {

// World creation (after the device is bound): create the mailbox on first use (pinned host memory, registered
// mapped + portable) and point the module globals bound before it at it; clear it; remember `rank` for records
// that carry none. Returns the device address for Ctx::diag. Thread-safe. A mailbox that cannot be created is
// warned about once on stderr and null is returned (the World works on; its timeouts trap without a report).
DiagMailbox* attach(int rank);

// The JIT, after loading a module in the current context: at LOOM_LOG_LEVEL debug, set the module's
// loom_wait_verbose (every timed-out wait prints its own line). If the module defines loom_diag_mailbox, write the
// mailbox's device address into it (now, or at attach() when no World exists yet). Waits only for its own copy
// (non-blocking stream), never for kernels already running. Raises loom::Error when the module has a malformed
// global or the context reports a sticky error; any other failure is warned about once and the load goes on.
void bind_library(CUlibrary library);

// The process's records, decoded, one "  wait timeout: ..." line each; "" when there is no mailbox or no
// record. Never throws; lock-free (safe inside error paths, including ones raised under attach()).
std::string report();

// "; device diagnostics (loom mailbox):\n<report>" when `code` (cudaError_t or CUresult: same numbers) is a sticky
// device error and the mailbox holds records; "" otherwise.
std::string report_for_error(int code);

// Errors after which the context is unusable and a trapped kernel may have left records: illegal address,
// launch timeout, device assert, hardware stack error, illegal instruction, misaligned address, invalid address
// space, invalid PC, launch failure.
bool is_sticky_device_error(int code);

// Decoding, exposed for the unit tests. `fallback_rank` replaces a record's rank of -1 (waits with no Ctx).
std::string format_record(const DiagRecord& r, int fallback_rank);
// Every complete record of `m` plus a line for claimed-but-unrecorded timeouts; "" when there is none.
std::string format_mailbox(const DiagMailbox& m, int fallback_rank);

}  // namespace loom::diag
