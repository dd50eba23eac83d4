#include "core/catalogue.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

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

// Levenshtein distance.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string AttrValueString(AttrType type, double v) {
  switch (type) {
    case AttrType::kF32:
      return fmt::format("{}", float(v));
    case AttrType::kBool:
      return v != 0 ? "true" : "false";
    default:
      return fmt::format("{}", int64_t(v));
  }
}

std::string AttrRangeString(const AttrSchema& at) {
  if (at.type == AttrType::kU64) return "any";
  if (at.type == AttrType::kBool) return "0 or 1";
  if (at.type != AttrType::kF32) return fmt::format("[{}, {}]", int64_t(at.min_value), int64_t(at.max_value));
  const float lo = float(at.min_value), hi = float(at.max_value);
  const float below = std::nextafter(lo, -INFINITY), above = std::nextafter(hi, INFINITY);
  const bool open_lo = std::isfinite(below) && below == std::trunc(below) && lo != std::trunc(lo);
  const bool open_hi = std::isfinite(above) && above == std::trunc(above) && hi != std::trunc(hi);
  return fmt::format("{}{}, {}{}", open_lo ? "(" : "[", open_lo ? below : lo, open_hi ? above : hi,
                     open_hi ? ")" : "]");
}

std::string DidYouMeanOp(std::string_view name) {
  // An op whose name is the given one's leading word(s) wins ("gelu_fwd" ->
  // "gelu", the longest such); else the closest by edit distance.
  std::string_view best;
  size_t best_d = ~size_t(0);
  for (const OpSchema& op : AllOps()) {
    if (op.name == nullptr) continue;
    const std::string_view n = op.name;
    if (name.size() > n.size() && name.substr(0, n.size()) == n && name[n.size()] == '_' &&
        (best_d != 0 || n.size() > best.size()))
      best_d = 0, best = n;
  }
  for (const OpSchema& op : AllOps()) {
    if (op.name == nullptr || best_d == 0) continue;
    const size_t d = EditDistance(name, op.name);
    if (d < best_d) best_d = d, best = op.name;
  }
  if (best.empty() || best_d > 4) return "";
  return "; did you mean '" + std::string(best) + "'?";
}

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
