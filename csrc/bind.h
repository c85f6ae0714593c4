// What the nanobind files of the core share (module.cc, runtime/bind_gen.cc): the array types
// they take and the kernel table an `isa` argument names.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>
#include <string>

#include "kernels/kernels.h"

namespace zoi_bind {

template <class T>
using Arr = nanobind::ndarray<T, nanobind::c_contig, nanobind::device::cpu>;
template <class T>
using Opt = std::optional<Arr<T>>;

// "" = the active ISA; an unknown or unsupported name raises ValueError (module.cc)
const zoi::KernelTable& table_for(const std::string& isa);

}  // namespace zoi_bind
