// OpRegistry: the set of registered implementations per op.
#include "core/registry.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <set>

#include "core/catalogue.h"
#include "core/device.h"
#include "core/policy_state.h"

namespace tefl {

const char* KindName(BackendImplKind kind) {
  switch (kind) {
    case BackendImplKind::DEFAULT:
      return "flagos";
    case BackendImplKind::VENDOR:
      return "vendor";
    case BackendImplKind::REFERENCE:
      return "reference";
  }
  return "unknown";
}

namespace {
tefl_status* CallFunctionKernel(const tefl_call_frame* frame, void* user_data) {
  try {
    return (*static_cast<KernelFunction*>(user_data))(*frame).ToC();
  } catch (const std::exception& e) {
    return tefl_status_new(TEFL_INTERNAL, (std::string("kernel threw: ") + e.what()).c_str());
  } catch (...) {
    return tefl_status_new(TEFL_INTERNAL, "kernel threw a non-standard exception");
  }
}
}  // namespace

OpImpl OpImpl::FromFunction(std::string op_name, std::string impl_id, BackendImplKind kind, std::string vendor,
                            int32_t priority, KernelFunction fn) {
  OpImpl impl;
  impl.op_name = std::move(op_name);
  impl.impl_id = std::move(impl_id);
  impl.kind = kind;
  impl.vendor = std::move(vendor);
  impl.priority = priority;
  auto holder = std::make_shared<KernelFunction>(std::move(fn));
  impl.user_data = holder.get();
  impl.keepalive = holder;
  impl.kernel = CallFunctionKernel;
  return impl;
}

Status OpImpl::CheckDesc(const tefl_impl_desc* desc) {
  if (desc == nullptr) return Status(TEFL_INVALID_ARGUMENT, "register_impl: the descriptor is NULL");
  constexpr size_t kMin = TEFL_STRUCT_SIZE(tefl_impl_desc, kernel);
  if (desc->struct_size < kMin)
    return Status(TEFL_INVALID_ARGUMENT, "register_impl: descriptor struct_size " + std::to_string(desc->struct_size) +
                                             " is smaller than " + std::to_string(kMin) +
                                             " (through 'kernel'); set it to TEFL_IMPL_DESC_STRUCT_SIZE (" +
                                             std::to_string(TEFL_IMPL_DESC_STRUCT_SIZE) + ")");
  return Status::OK();
}

OpImpl OpImpl::FromDesc(const tefl_impl_desc& desc, std::string origin) {
  // Fields beyond a smaller struct_size keep their defaults.
  tefl_impl_desc d = {};
  std::memcpy(&d, &desc, std::min<size_t>(desc.struct_size, TEFL_IMPL_DESC_STRUCT_SIZE));
  OpImpl impl;
  impl.op_name = d.op_name ? d.op_name : "";
  impl.impl_id = d.impl_id ? d.impl_id : "";
  impl.kind = BackendImplKind(d.kind);
  impl.vendor = d.vendor ? d.vendor : "";
  impl.priority = d.priority;
  impl.device_mask =
      desc.struct_size >= TEFL_STRUCT_SIZE(tefl_impl_desc, device_mask) ? d.device_mask : TEFL_DEVICE_BIT(kDLCPU);
  impl.kernel = d.kernel;
  impl.supports = d.supports;
  impl.user_data = d.user_data;
  impl.origin = std::move(origin);
  return impl;
}

Status OpRegistry::Rep::CheckLocked(const OpImpl& impl, int32_t* op_id) const {
  if (impl.op_name.empty())
    return Status(TEFL_INVALID_ARGUMENT, "register_impl(" + impl.impl_id + "): op_name is empty (or NULL)");
  const OpSchema* op = FindOp(impl.op_name);
  if (op == nullptr)
    return Status(TEFL_NOT_FOUND, "register_impl(" + impl.impl_id + "): unknown op '" + impl.op_name + "'" +
                                      DidYouMeanOp(impl.op_name));
  if (impl.impl_id.empty()) return Status(TEFL_INVALID_ARGUMENT, "register_impl(" + impl.op_name + "): empty impl_id");
  if (int(impl.kind) < 0 || int(impl.kind) > 2)
    return Status(TEFL_INVALID_ARGUMENT,
                  "register_impl(" + impl.impl_id + "): kind must be flagos, vendor or reference");
  // impl_id is "kind.name" (DESIGN.md §2): the prefix says the kind, so a
  // log line or a policy token never shows a vendor kernel as "default.*";
  // the name's characters keep it addressable in TE_FL_PER_OP (impl:ID).
  {
    static constexpr const char* kPrefix[] = {"default", "vendor", "reference"};
    const std::string prefix = std::string(kPrefix[int(impl.kind)]) + ".";
    const std::string_view name = std::string_view(impl.impl_id).substr(std::min(prefix.size(), impl.impl_id.size()));
    const bool name_ok = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
             c == '.';
    });
    if (impl.impl_id.rfind(prefix, 0) != 0 || !name_ok)
      return Status(TEFL_INVALID_ARGUMENT, "register_impl(" + impl.impl_id + "): impl_id must be '" + prefix +
                                               "NAME' for kind " + KindName(impl.kind) +
                                               ", NAME made of letters, digits, '_', '-' and '.'");
  }
  if (impl.kind == BackendImplKind::VENDOR && impl.vendor.empty())
    return Status(TEFL_INVALID_ARGUMENT,
                  "register_impl(" + impl.impl_id + "): a vendor implementation needs a vendor name");
  if (impl.kernel == nullptr) return Status(TEFL_INVALID_ARGUMENT, "register_impl(" + impl.impl_id + "): no kernel");
  if (impl.device_mask == 0)
    return Status(TEFL_INVALID_ARGUMENT, "register_impl(" + impl.impl_id + "): device_mask names no device type");
  for (const ImplRecord* r : by_op[size_t(op->id)]) {
    if (r->impl.impl_id == impl.impl_id)
      return Status(TEFL_ALREADY_EXISTS,
                    "register_impl: op '" + std::string(op->name) + "' already has impl_id '" + impl.impl_id + "'");
  }
  *op_id = op->id;
  return Status::OK();
}

void OpRegistry::Rep::AddLocked(const OpImpl& impl, int32_t op_id) {
  auto rec = std::make_unique<ImplRecord>(ImplRecord{impl, op_id});
  rec->impl.op_name = FindOp(op_id)->name;  // aliases become the canonical name
  by_op[size_t(op_id)].push_back(rec.get());
  records.push_back(std::move(rec));
}

std::vector<const ImplRecord*> OpRegistry::Rep::ImplsOf(int32_t op_id) const {
  std::lock_guard<std::mutex> lock(mu);
  return by_op[size_t(op_id)];
}

uint64_t NextRegistryId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

OpRegistry::OpRegistry() : rep_(std::make_unique<Rep>()) {}
OpRegistry::~OpRegistry() = default;

Status OpRegistry::CheckImpl(const OpImpl& impl) const {
  std::lock_guard<std::mutex> lock(rep_->mu);
  int32_t op_id;
  return rep_->CheckLocked(impl, &op_id);
}

Status OpRegistry::RegisterImpl(const OpImpl& impl) {
  {
    std::lock_guard<std::mutex> lock(rep_->mu);
    int32_t op_id;
    Status s = rep_->CheckLocked(impl, &op_id);
    if (!s.ok()) return s;
    rep_->AddLocked(impl, op_id);
  }
  BumpPolicyEpoch();
  return Status::OK();
}

Status OpRegistry::RegisterMany(const std::vector<OpImpl>& impls) {
  {
    std::lock_guard<std::mutex> lock(rep_->mu);
    std::vector<int32_t> ids(impls.size());
    std::set<std::pair<int32_t, std::string>> seen;
    for (size_t i = 0; i < impls.size(); ++i) {
      Status s = rep_->CheckLocked(impls[i], &ids[i]);
      if (!s.ok()) return s;
      if (!seen.insert({ids[i], impls[i].impl_id}).second)
        return Status(TEFL_ALREADY_EXISTS, "register_many: impl_id '" + impls[i].impl_id + "' given twice for op '" +
                                               impls[i].op_name + "'");
    }
    for (size_t i = 0; i < impls.size(); ++i) rep_->AddLocked(impls[i], ids[i]);
  }
  BumpPolicyEpoch();
  return Status::OK();
}

std::vector<OpImpl> OpRegistry::GetImplementations(std::string_view op_name) const {
  std::vector<OpImpl> out;
  const OpSchema* op = FindOp(op_name);
  if (op == nullptr) return out;
  for (const ImplRecord* r : rep_->ImplsOf(op->id)) out.push_back(r->impl);
  return out;
}

std::optional<OpImpl> OpRegistry::GetImplementation(std::string_view op_name, std::string_view impl_id) const {
  const OpSchema* op = FindOp(op_name);
  if (op == nullptr) return std::nullopt;
  for (const ImplRecord* r : rep_->ImplsOf(op->id))
    if (r->impl.impl_id == impl_id) return r->impl;
  return std::nullopt;
}

std::vector<std::string> OpRegistry::ListOperators() const {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(rep_->mu);
  for (const OpSchema& op : AllOps())
    if (op.name && !rep_->by_op[size_t(op.id)].empty()) out.push_back(op.name);
  return out;
}

std::vector<OpImpl> OpRegistry::Snapshot() const {
  std::vector<OpImpl> out;
  std::lock_guard<std::mutex> lock(rep_->mu);
  for (const auto& list : rep_->by_op)
    for (const ImplRecord* r : list) out.push_back(r->impl);
  return out;
}

std::vector<std::string> OpRegistry::ImplIds() const {
  std::set<std::string> ids;
  std::lock_guard<std::mutex> lock(rep_->mu);
  for (const auto& list : rep_->by_op)
    for (const ImplRecord* r : list) ids.insert(r->impl.impl_id);
  return {ids.begin(), ids.end()};
}

void OpRegistry::Clear() {
  {
    std::lock_guard<std::mutex> lock(rep_->mu);
    for (auto& list : rep_->by_op) list.clear();  // records stay alive
    rep_->builtins_registered = false;
  }
  BumpPolicyEpoch();
}

namespace {
tefl_status* RegistrarRegisterImpl(void* ctx, const tefl_impl_desc* desc) {
  if (Status st = OpImpl::CheckDesc(desc); !st.ok()) return st.ToC();
  return static_cast<OpRegistry*>(ctx)->RegisterImpl(OpImpl::FromDesc(*desc)).ToC();
}
tefl_status* RegistrarRegisterRuntime(void*, const tefl_device_runtime* runtime) {
  return RegisterDeviceRuntime(runtime);
}
}  // namespace

tefl_registrar OpRegistry::Registrar() {
  return tefl_registrar{TEFL_REGISTRAR_STRUCT_SIZE, this, RegistrarRegisterImpl, RegistrarRegisterRuntime};
}

}  // namespace tefl
