//===- pagedc.h - The pagedc runtime API, all in one include ---*- C++ -*-===//
//
// Include this to use the runtime: tensors and DLPack, the paged KV cache,
// block masks (logical and physical), compiled mods and their bindings, the
// attention call, and the serving engine's batch call with merge_state.
// Link `pagedc::runtime` (find_package(pagedc)).
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_PAGEDC_H
#define PAGEDC_PAGEDC_H

#include "pagedc/Attention.h"
#include "pagedc/BatchAttention.h"
#include "pagedc/BlockMask.h"
#include "pagedc/Error.h"
#include "pagedc/KVCache.h"
#include "pagedc/ModABI.h"
#include "pagedc/Mods.h"
#include "pagedc/PhysicalBlockMask.h"
#include "pagedc/Tensor.h"

#endif // PAGEDC_PAGEDC_H
