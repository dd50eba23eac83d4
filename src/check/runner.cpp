#include "check/runner.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "core/catalogue.h"

namespace tefl::check {

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kPass:
      return "PASS";
    case Verdict::kFail:
      return "FAIL";
    default:
      return "DECLINED";
  }
}

Status RunReference(const Case& c, std::vector<Tensor>* expected) {
  Case ref = c;
  const Status s = RunPinned(ref.op, "reference.cpp", ref.InputPtrs(), ref.OutputPtrs(), ref.attrs_ptr());
  if (s.ok()) *expected = ref.outputs;
  return s;
}

namespace {

// Device copies of a case's tensors, freed on destruction.
class DeviceTensors {
 public:
  DeviceTensors(const tefl_device_runtime* rt, int32_t device_type) : rt_(rt), device_type_(device_type) {}
  ~DeviceTensors() {
    for (void* p : allocations_) rt_->free(rt_->ctx, 0, p);
  }
  DeviceTensors(const DeviceTensors&) = delete;
  DeviceTensors& operator=(const DeviceTensors&) = delete;

  // A device tensor holding a copy of `host` (same shape and dtype).
  Status Upload(const Tensor& host, DLTensor* out) {
    *out = host.dl();
    out->device = DLDevice{DLDeviceType(device_type_), 0};
    void* p = nullptr;
    const size_t bytes = std::max<size_t>(host.nbytes(), 1);
    if (tefl_status* s = rt_->alloc(rt_->ctx, 0, bytes, 64, &p)) return Status::FromC(s);
    allocations_.push_back(p);
    out->data = p;
    out->byte_offset = 0;
    if (host.nbytes() == 0) return Status::OK();
    return Status::FromC(rt_->copy_to_device(rt_->ctx, 0, p, host.bytes(), host.nbytes(), nullptr));
  }
  Status Download(const DLTensor& dev, Tensor* host) {
    if (host->nbytes() == 0) return Status::OK();
    if (tefl_status* s = rt_->stream_sync(rt_->ctx, 0, nullptr)) return Status::FromC(s);
    return Status::FromC(rt_->copy_to_host(rt_->ctx, 0, host->bytes(), dev.data, host->nbytes(), nullptr));
  }

 private:
  const tefl_device_runtime* rt_;
  int32_t device_type_;
  std::vector<void*> allocations_;
};

bool AllSentinel(const Tensor& now, const Tensor& before) { return now.SameBytes(before); }

std::string OutputName(const std::string& op, size_t i) {
  const OpSchema* s = FindOp(op);
  return s && i < s->outputs.size() ? s->outputs[i].name : "output " + std::to_string(i);
}

}  // namespace

std::string ImplReason(const std::string& message) {
  const size_t strict = message.find(": strict mode (");
  if (strict == std::string::npos) return message;
  for (const char* marker : {" cannot run: ", " declined: ", " failed: "}) {
    const size_t at = message.find(marker, strict);
    if (at != std::string::npos) return message.substr(at + std::strlen(marker));
  }
  return message;
}

CheckResult RunCheck(const Case& c, const std::string& impl_id, DLDeviceType device,
                     const std::vector<Tensor>& expected) {
  CheckResult r;
  r.impl_id = impl_id;
  r.op = c.op;
  r.dtype = c.dtype;
  r.shape = c.shape;
  r.note = c.note;
  const tefl_device_runtime* rt = tefl_host()->device_runtime(device);
  if (rt == nullptr) {
    r.verdict = Verdict::kFail;
    r.reason = fmt::format("no device runtime registered for device type {}", int(device));
    return r;
  }
  DeviceTensors dev(rt, device);
  std::vector<DLTensor> din(c.inputs.size()), dout(c.outputs.size());
  std::vector<const DLTensor*> in;
  std::vector<DLTensor*> out;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!c.inputs[i]) {
      in.push_back(nullptr);
      continue;
    }
    if (Status s = dev.Upload(*c.inputs[i], &din[i]); !s.ok()) {
      r.verdict = Verdict::kFail;
      r.reason = "copying an input to the device: " + s.ToString();
      return r;
    }
    in.push_back(&din[i]);
  }
  for (size_t i = 0; i < c.outputs.size(); ++i) {
    if (c.absent(i)) {
      out.push_back(nullptr);
      continue;
    }
    if (Status s = dev.Upload(c.outputs[i], &dout[i]); !s.ok()) {
      r.verdict = Verdict::kFail;
      r.reason = "copying an output to the device: " + s.ToString();
      return r;
    }
    out.push_back(&dout[i]);
  }
  const Status s = RunPinned(c.op, impl_id, in, out, c.attrs_ptr());
  std::vector<Tensor> got = c.outputs;
  for (size_t i = 0; i < got.size(); ++i) {
    if (c.absent(i)) continue;
    if (Status d = dev.Download(dout[i], &got[i]); !d.ok()) {
      r.verdict = Verdict::kFail;
      r.reason = "copying an output back: " + d.ToString();
      return r;
    }
  }
  if (!s.ok()) {
    // A decline (supports() or the kernel's TEFL_UNSUPPORTED; strict policy
    // reports both as FAILED_PRECONDITION) must leave every output as it was.
    bool untouched = true;
    for (size_t i = 0; i < got.size(); ++i) untouched = untouched && AllSentinel(got[i], c.outputs[i]);
    if (s.code() == TEFL_FAILED_PRECONDITION || s.code() == TEFL_UNSUPPORTED) {
      r.verdict = untouched ? Verdict::kDeclined : Verdict::kFail;
      r.reason = untouched ? ImplReason(s.message()) : "declined after writing an output: " + ImplReason(s.message());
    } else {
      r.verdict = Verdict::kFail;
      r.reason = fmt::format("{}: {}", StatusCodeName(s.code()), ImplReason(s.message()));
    }
    return r;
  }
  r.compared = true;
  for (size_t i = 0; i < got.size(); ++i) {
    if (c.absent(i)) continue;
    if (c.exact[i]) {
      if (!got[i].SameBytes(expected[i])) {
        int64_t bad = 0;
        for (int64_t k = 0; k < got[i].numel(); ++k) bad += got[i].at(k) != expected[i].at(k);
        r.mismatches += std::max<int64_t>(bad, 1);
        r.reason =
            fmt::format("'{}' differs from reference.cpp in {} element(s) (must be exact)", OutputName(c.op, i), bad);
      }
      continue;
    }
    const CompareResult cr = Compare(got[i], expected[i], c.tolerances[i]);
    r.max_abs = std::max(r.max_abs, cr.max_abs);
    r.max_rel = std::max(r.max_rel, cr.max_rel);
    if (cr.mismatches > 0 && r.reason.empty())
      r.reason =
          fmt::format("'{}': {} mismatch(es), first at element {} (got {:.9g}, expected {:.9g}; atol {}, rtol {})",
                      OutputName(c.op, i), cr.mismatches, cr.first_bad, got[i].at(cr.first_bad),
                      expected[i].at(cr.first_bad), c.tolerances[i].atol, c.tolerances[i].rtol);
    r.mismatches += cr.mismatches;
  }
  r.verdict = r.mismatches == 0 ? Verdict::kPass : Verdict::kFail;
  return r;
}

}  // namespace tefl::check
