//===- Bindings.cpp - Check launch bindings against declarations ----------===//
//
// resolveBindings() turns the name-keyed Bindings of a launch into the
// declaration-ordered PagedcModContext that compiled mods read, checking
// every buffer and param on the way.
//
//===----------------------------------------------------------------------===//
#include "pagedc/Error.h"
#include "pagedc/Mods.h"

#include <fmt/format.h>

#include <set>

namespace pagedc {

const char *scalarKindName(ScalarKind kind) {
  switch (kind) {
  case ScalarKind::I32:
    return "i32";
  case ScalarKind::F32:
    return "f32";
  case ScalarKind::Bool:
    return "bool";
  }
  return "?";
}

static std::string declaredNames(const std::vector<std::string> &names) {
  if (names.empty())
    return "none";
  std::string text;
  for (const std::string &name : names)
    text += (text.empty() ? "" : ", ") + name;
  return text;
}

static std::string dimString(const BufferDim &dim) {
  switch (dim.kind) {
  case BufferDim::Fixed:
    return std::to_string(dim.size);
  case BufferDim::Named:
    return dim.name;
  case BufferDim::Any:
    return "?";
  }
  return "?";
}

static std::string declString(const BufferDecl &decl) {
  std::string text = fmt::format("{}[", dtypeName(decl.elementType));
  for (size_t i = 0; i < decl.dims.size(); ++i)
    text += (i ? ", " : "") + dimString(decl.dims[i]);
  return text + "]";
}

ResolvedBindings resolveBindings(const CompiledMods &mods, const Bindings &bindings,
                                 Device device) {
  // Names the launch gives that the program never declares are mistakes
  // (usually a typo), so they are errors rather than silently ignored.
  std::set<std::string> bufferNames, paramNames;
  std::vector<std::string> bufferList, paramList;
  for (const BufferDecl &decl : mods.buffers) {
    bufferNames.insert(decl.name);
    bufferList.push_back(decl.name);
  }
  for (const ParamDecl &decl : mods.params) {
    paramNames.insert(decl.name);
    paramList.push_back(decl.name);
  }
  for (const auto &[name, view] : bindings.buffers)
    if (!bufferNames.count(name))
      throw Error(fmt::format("unknown buffer '{}' in the bindings (the program declares: {})",
                              name, declaredNames(bufferList)));
  for (const auto &[name, value] : bindings.params)
    if (!paramNames.count(name))
      throw Error(fmt::format("unknown param '{}' in the bindings (the program declares: {})", name,
                              declaredNames(paramList)));

  ResolvedBindings resolved;
  std::map<std::string, std::pair<int64_t, std::string>> namedDims; // size, where
  for (const BufferDecl &decl : mods.buffers) {
    auto it = bindings.buffers.find(decl.name);
    if (it == bindings.buffers.end())
      throw Error(fmt::format("missing binding for buffer '{}' (declared {})", decl.name,
                              declString(decl)));
    const TensorView &view = it->second;
    if (decl.dims.size() > 4)
      throw Error(fmt::format("buffer '{}' is declared with rank {}; at most 4 is supported",
                              decl.name, decl.dims.size()));
    if (view.dtype() != decl.elementType)
      throw Error(fmt::format("buffer '{}' is declared {} but the bound tensor is {}", decl.name,
                              dtypeName(decl.elementType), dtypeName(view.dtype())));
    if (view.rank() != static_cast<int>(decl.dims.size()))
      throw Error(fmt::format("buffer '{}' is declared {} (rank {}) but the bound tensor has "
                              "shape {} (rank {})",
                              decl.name, declString(decl), decl.dims.size(), view.shapeString(),
                              view.rank()));
    if (view.device() != device)
      throw Error(fmt::format("buffer '{}' is on {} but the call runs on {}", decl.name,
                              deviceName(view.device()), deviceName(device)));
    if (view.data() == nullptr && view.numel() != 0)
      throw Error(fmt::format("buffer '{}' is bound to a tensor with no data", decl.name));
    for (int d = 0; d < view.rank(); ++d) {
      const BufferDim &dim = decl.dims[d];
      int64_t size = view.size(d);
      if (dim.kind == BufferDim::Fixed && size != dim.size)
        throw Error(fmt::format("buffer '{}' dimension {} must be {} but the bound tensor has "
                                "shape {}",
                                decl.name, d, dim.size, view.shapeString()));
      if (dim.kind == BufferDim::Named) {
        std::string where = fmt::format("buffer '{}' dimension {}", decl.name, d);
        auto [entry, inserted] = namedDims.emplace(dim.name, std::make_pair(size, where));
        if (!inserted && entry->second.first != size)
          throw Error(fmt::format("size '{}' is {} in {} but {} in {}", dim.name,
                                  entry->second.first, entry->second.second, size, where));
      }
    }
    PagedcBufferRef ref;
    ref.data = view.data();
    for (int d = 0; d < 4; ++d) {
      ref.sizes[d] = d < view.rank() ? view.size(d) : 1;
      ref.strides[d] = d < view.rank() ? view.stride(d) : 0;
    }
    resolved.buffers_.push_back(ref);
  }

  for (const ParamDecl &decl : mods.params) {
    auto it = bindings.params.find(decl.name);
    ParamValue value;
    if (it != bindings.params.end())
      value = it->second;
    else if (decl.defaultValue)
      value = *decl.defaultValue;
    else
      throw Error(fmt::format("missing value for param '{}' ({}, no default)", decl.name,
                              scalarKindName(decl.type)));
    if (value.kind != decl.type)
      throw Error(fmt::format("param '{}' is declared {} but was given a value of type {}",
                              decl.name, scalarKindName(decl.type), scalarKindName(value.kind)));
    PagedcParamSlot slot;
    switch (decl.type) {
    case ScalarKind::I32:
      slot.i32 = value.i32;
      break;
    case ScalarKind::F32:
      slot.f32 = value.f32;
      break;
    case ScalarKind::Bool:
      slot.i32 = value.boolean ? 1 : 0;
      break;
    }
    resolved.params_.push_back(slot);
  }
  resolved.context_ = {resolved.buffers_.empty() ? nullptr : resolved.buffers_.data(),
                       resolved.params_.empty() ? nullptr : resolved.params_.data()};
  return resolved;
}

} // namespace pagedc
