// The C entry points for callers (tefl.h): thin wrappers over the default
// manager. No exception crosses the C boundary.
#include <fmt/format.h>

#include <memory>
#include <new>
#include <string>

#include "core/catalogue.h"
#include "tefl/tefl.hpp"

namespace {
// "gelu" for a known op id, else "op id 99".
std::string OpLabel(int32_t op_id) {
  const tefl::OpSchema* op = tefl::FindOp(op_id);
  return op ? std::string(op->name) : fmt::format("op id {}", op_id);
}

// A negative count: the error names the function, the op and which count.
tefl_status* CountError(const char* fn, int32_t op_id, int32_t num_inputs, int32_t num_outputs) {
  return tefl_status_new(TEFL_INVALID_ARGUMENT, fmt::format("{}: {}: {} is {}, expected >= 0", fn, OpLabel(op_id),
                                                            num_inputs < 0 ? "num_inputs" : "num_outputs",
                                                            num_inputs < 0 ? num_inputs : num_outputs)
                                                    .c_str());
}
}  // namespace

extern "C" {

tefl_status* tefl_call(int32_t op_id, const DLTensor* const* inputs, int32_t num_inputs, DLTensor* const* outputs,
                       int32_t num_outputs, const void* attrs, void* stream) {
  if (num_inputs < 0 || num_outputs < 0) return CountError("tefl_call", op_id, num_inputs, num_outputs);
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
  int32_t op_id;  // for error messages
};

tefl_status* tefl_prepare_call(int32_t op_id, const DLTensor* const* inputs, int32_t num_inputs,
                               DLTensor* const* outputs, int32_t num_outputs, const void* attrs,
                               tefl_prepared_call** out) {
  if (out == nullptr) return tefl_status_new(TEFL_INVALID_ARGUMENT, "tefl_prepare_call: out is NULL");
  if (num_inputs < 0 || num_outputs < 0) return CountError("tefl_prepare_call", op_id, num_inputs, num_outputs);
  try {
    auto prepared = std::make_unique<tefl_prepared_call>();
    prepared->op_id = op_id;
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
    return CountError("tefl_prepared_call_run", call->op_id, num_inputs, num_outputs);
  // A NULL array with a nonzero count: the span over it would be read.
  if ((num_inputs > 0 && input_data == nullptr) || (num_outputs > 0 && output_data == nullptr)) {
    const bool in = num_inputs > 0 && input_data == nullptr;
    return tefl_status_new(
        TEFL_INVALID_ARGUMENT,
        fmt::format("tefl_prepared_call_run: {}: {} is NULL, expected {} data pointers", OpLabel(call->op_id),
                    in ? "input_data" : "output_data", in ? num_inputs : num_outputs)
            .c_str());
  }
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
