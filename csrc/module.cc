// nanobind entry point of zoi._cpu. Kernels and the runtime register their bindings here.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "isa.h"

namespace nb = nanobind;

NB_MODULE(_cpu, m) {
  m.doc() = "zoi native CPU core";
  m.def("cpu_info", []() {
    const zoi::CpuFeatures& f = zoi::cpu_features();
    nb::dict d;
    d["vendor"] = f.vendor;
    d["brand"] = f.brand;
    d["avx2"] = f.avx2;
    d["fma"] = f.fma;
    d["avx512f"] = f.avx512f;
    d["avx512bw"] = f.avx512bw;
    d["avx512vl"] = f.avx512vl;
    d["avx512vnni"] = f.avx512vnni;
    d["avx_vnni"] = f.avx_vnni;
    d["best_isa"] = zoi::isa_name(zoi::best_isa());
    return d;
  });
  m.def("active_isa", []() { return std::string(zoi::isa_name(zoi::active_isa())); },
        "ISA the dispatcher uses (ZOI_CPU_ISA overrides; raises ValueError if unsupported)");
  m.def("isa_supported", [](const std::string& s) {
    zoi::Isa i;
    if (!zoi::parse_isa(s, &i)) throw nb::value_error("unknown ISA; expected vnni|avx512|avx2|scalar");
    return zoi::isa_supported(i);
  });
}
