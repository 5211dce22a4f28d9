// Included by jit_add.cuh: the JIT cache tests edit a copy of this file to check that a change to an
// included user header changes the cache key.
#pragma once

#define JIT_TEST_SCALE 3
