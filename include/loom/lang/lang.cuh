// The Loom device language: include this one header in a kernel. See docs/language.md.
#pragma once

#include "loom/lang/barrier.cuh"
#include "loom/lang/context.cuh"
#include "loom/lang/copy.cuh"
#include "loom/lang/group.cuh"
#include "loom/lang/launch_epoch.cuh"
#include "loom/lang/ll.cuh"
#include "loom/lang/rank.cuh"
#include "loom/lang/share.cuh"
#include "loom/lang/signal.cuh"
#include "loom/lang/spin.cuh"
