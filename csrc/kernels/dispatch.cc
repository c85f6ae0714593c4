// Runtime ISA dispatch: the KernelTable of one ISA (compiled with base flags).
#include <stdexcept>
#include <string>

#include "kernels.h"

namespace zoi {

const KernelTable& kernel_table(Isa isa) {
  if (!isa_supported(isa))
    throw std::invalid_argument(std::string("ISA ") + isa_name(isa) + " is not supported by this CPU");
  switch (isa) {
#if defined(ZOI_ARCH_X86)
    case Isa::Vnni: return vnni::table();
    case Isa::Avx512: return avx512::table();
    case Isa::Avx2: return avx2::table();
    case Isa::AvxVnni: return avxvnni::table();
    case Isa::Amx: return amx::table();
#elif defined(ZOI_ARCH_ARM64)
    case Isa::Neon: return neon::table();
    case Isa::Dotprod: return dotprod::table();
    case Isa::I8mm: return i8mm::table();
#endif
    default: break;  // scalar (isa_supported is false for the other architecture's ISAs)
  }
  return scalar::table();
}

void throw_weight_out_of_range(size_t row, size_t col) {
  throw std::invalid_argument("INT8 weight -128 at row " + std::to_string(row) + ", column " +
                              std::to_string(col) + ": zoi's weights are symmetric, in [-127, 127] "
                              "(zoi.numerics.primitives.quantize_weight); re-quantise the model");
}

}  // namespace zoi
