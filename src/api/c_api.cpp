// The C entry points for callers (tefl.h): thin wrappers over the default
// manager. No exception crosses the C boundary.
#include <memory>
#include <new>

#include "core/catalogue.h"
#include "tefl/tefl.hpp"

extern "C" {

tefl_status* tefl_call(int32_t op_id, const DLTensor* const* inputs, int32_t num_inputs, DLTensor* const* outputs,
                       int32_t num_outputs, const void* attrs, void* stream) {
  if (num_inputs < 0 || num_outputs < 0)
    return tefl_status_new(TEFL_INVALID_ARGUMENT, "tefl_call: negative argument count");
  try {
    return tefl::GetDefaultManager()
        .Call(op_id, std::span<const DLTensor* const>(inputs, size_t(num_inputs)),
              std::span<DLTensor* const>(outputs, size_t(num_outputs)), attrs, stream)
        .ToC();
  } catch (const std::bad_alloc&) {
    return tefl_status_new(TEFL_RUNTIME_ERROR, "tefl_call: out of memory");
  } catch (const std::exception& e) {
    return tefl_status_new(TEFL_INTERNAL, e.what());
  }
}

struct tefl_prepared_call {
  tefl::PreparedCall call;
};

tefl_status* tefl_prepare_call(int32_t op_id, const DLTensor* const* inputs, int32_t num_inputs,
                               DLTensor* const* outputs, int32_t num_outputs, const void* attrs,
                               tefl_prepared_call** out) {
  if (out == nullptr) return tefl_status_new(TEFL_INVALID_ARGUMENT, "tefl_prepare_call: out is NULL");
  if (num_inputs < 0 || num_outputs < 0)
    return tefl_status_new(TEFL_INVALID_ARGUMENT, "tefl_prepare_call: negative argument count");
  try {
    auto prepared = std::make_unique<tefl_prepared_call>();
    tefl::Status s = tefl::GetDefaultManager().Prepare(
        op_id, std::span<const DLTensor* const>(inputs, size_t(num_inputs)),
        std::span<DLTensor* const>(outputs, size_t(num_outputs)), attrs, &prepared->call);
    if (!s.ok()) return s.ToC();
    *out = prepared.release();
    return nullptr;
  } catch (const std::bad_alloc&) {
    return tefl_status_new(TEFL_RUNTIME_ERROR, "tefl_prepare_call: out of memory");
  } catch (const std::exception& e) {
    return tefl_status_new(TEFL_INTERNAL, e.what());
  }
}

tefl_status* tefl_prepared_call_run(tefl_prepared_call* call, void* const* input_data, int32_t num_inputs,
                                    void* const* output_data, int32_t num_outputs, void* stream) {
  if (call == nullptr) return tefl_status_new(TEFL_INVALID_ARGUMENT, "tefl_prepared_call_run: call is NULL");
  if (num_inputs < 0 || num_outputs < 0)
    return tefl_status_new(TEFL_INVALID_ARGUMENT, "tefl_prepared_call_run: negative argument count");
  try {
    return call->call
        .Run(std::span<void* const>(input_data, size_t(num_inputs)),
             std::span<void* const>(output_data, size_t(num_outputs)), stream)
        .ToC();
  } catch (const std::bad_alloc&) {
    return tefl_status_new(TEFL_RUNTIME_ERROR, "tefl_prepared_call_run: out of memory");
  } catch (const std::exception& e) {
    return tefl_status_new(TEFL_INTERNAL, e.what());
  }
}

void tefl_prepared_call_free(tefl_prepared_call* call) { delete call; }

int32_t tefl_op_id(const char* op_name) {
  if (op_name == nullptr) return -1;
  const tefl::OpSchema* op = tefl::FindOp(std::string_view(op_name));
  return op ? op->id : -1;
}

tefl_status* tefl_register_impl(const tefl_impl_desc* desc) {
  if (desc == nullptr) return tefl_status_new(TEFL_INVALID_ARGUMENT, "tefl_register_impl: NULL descriptor");
  try {
    tefl_registrar r = tefl::GetDefaultRegistry().Registrar();
    return r.register_impl(r.ctx, desc);
  } catch (const std::exception& e) {
    return tefl_status_new(TEFL_INTERNAL, e.what());
  }
}

}  // extern "C"
