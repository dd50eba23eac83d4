// onednn — tefl's vendor plugin backed by Intel oneDNN (2.6 API): the entry
// points. Implementations (impl_id "vendor.onednn", kind vendor, vendor
// "onednn", priority 100, CPU only), one file per op family:
//   normalization.cpp  layernorm_fwd, layernorm_bwd
//   activation.cpp     gelu, silu, qgelu, relu and their backward ops
//   softmax.cpp        scaled_softmax_forward, scaled_softmax_backward
//   gemm.cpp           generic_gemm (matmul)
//
// Only tefl_plugin_info and tefl_plugin_register are exported (extern "C",
// exports.map); everything else has hidden visibility. No C++ exception
// crosses the ABI: every entry point and kernel catches and turns it into a
// tefl status.
#include "common.h"

// Declared extern "C" and noexcept by tefl/tefl.h.
TEFL_PLUGIN_EXPORT const tefl_plugin_metadata* tefl_plugin_info(void) noexcept {
  static const tefl_plugin_metadata info = {
      TEFL_PLUGIN_METADATA_STRUCT_SIZE, "onednn", "1.1.0", "onednn", TEFL_ABI_MAJOR, TEFL_ABI_MINOR,
  };
  return &info;
}

TEFL_PLUGIN_EXPORT tefl_status* tefl_plugin_register(const tefl_host_services* host,
                                                     const tefl_registrar* registrar) noexcept {
  try {
    if (registrar == nullptr || registrar->struct_size < TEFL_STRUCT_SIZE(tefl_registrar, register_impl))
      return host->status_new(TEFL_INVALID_ARGUMENT, "onednn: the registrar has no register_impl");
    // Creating the engine here surfaces a oneDNN without a CPU engine at load
    // time rather than on the first call.
    (void)onednn_plugin::GetState();
    // Registration is transactional on the host side: on an error nothing stays.
    using Fn = tefl_status* (*)(const tefl_registrar*);
    for (Fn family : {onednn_plugin::RegisterNormalization, onednn_plugin::RegisterActivation,
                      onednn_plugin::RegisterSoftmax, onednn_plugin::RegisterGemm}) {
      if (tefl_status* s = family(registrar)) return s;
    }
    return nullptr;
  } catch (const std::exception& e) {
    return host->status_new(TEFL_RUNTIME_ERROR, (std::string("onednn: registration failed: ") + e.what()).c_str());
  } catch (...) {
    return host->status_new(TEFL_RUNTIME_ERROR, "onednn: registration failed");
  }
}
