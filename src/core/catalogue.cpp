#include "core/catalogue.h"

#include <array>

namespace tefl {
namespace {

// Indexed by op id; every id below TEFL_OP_COUNT_ has a schema (checked by
// the catalogue test).
struct Table {
  std::array<OpSchema, TEFL_OP_COUNT_> ops{};
};

// Built once from the family tables (function-local static: no
// initialisation-order dependency between translation units).
const Table& GetTable() {
  static const Table table = [] {
    Table t;
    for (std::span<const OpSchema> family :
         {NormalizationSchemas(), RopeSchemas(), ActivationSchemas(), SoftmaxSchemas(), DropoutSchemas(),
          AttentionSchemas(), QuantizationSchemas(), GemmSchemas()}) {
      for (const OpSchema& op : family) {
        t.ops[size_t(op.id)] = op;
      }
    }
    return t;
  }();
  return table;
}

}  // namespace

std::span<const OpSchema> AllOps() { return GetTable().ops; }

namespace catalogue_internal {
std::atomic<const OpSchema*> g_ops{nullptr};
const OpSchema* BuildTable() {
  const OpSchema* ops = GetTable().ops.data();
  g_ops.store(ops, std::memory_order_release);
  return ops;
}
}  // namespace catalogue_internal

const OpSchema* FindOp(std::string_view name) {
  for (const OpSchema& op : AllOps()) {
    if (op.name == nullptr) continue;  // an id without a schema (a test catches it)
    if (name == op.name) return &op;
    for (const char* alias : op.aliases)
      if (name == alias) return &op;
  }
  return nullptr;
}

}  // namespace tefl
