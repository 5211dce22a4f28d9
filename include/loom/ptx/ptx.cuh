// All of Loom's PTX wrappers.
#pragma once

#include "loom/ptx/async.cuh"
#include "loom/ptx/memory.cuh"
#include "loom/ptx/special.cuh"
