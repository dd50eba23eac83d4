// The op catalogue as Python data: tefl's Python layer generates every op's
// call signature and output allocation from these schemas.
#include <cstdlib>

#include "bindings.h"

namespace tefl::python {

namespace {

nb::list DTypeNames(DTypeSet set) {
  nb::list out;
  for (int v = 0; v < 16; ++v)
    if (DType(v) != DType::kUnknown && (set & Bit(DType(v)))) out.append(DTypeName(DType(v)));
  return out;
}

nb::list Args(std::span<const ArgSchema> args) {
  nb::list out;
  for (const ArgSchema& a : args) {
    nb::dict d;
    d["name"] = a.name;
    d["dtypes"] = DTypeNames(a.dtypes);
    d["optional"] = a.optional;
    d["shape"] = a.shape ? a.shape : "";
    out.append(d);
  }
  return out;
}

const char* AttrTypeName(AttrType t) {
  switch (t) {
    case AttrType::kF32:
      return "f32";
    case AttrType::kI32:
      return "i32";
    case AttrType::kBool:
      return "bool";
    case AttrType::kU64:
      return "u64";
  }
  return "?";
}

// A float attribute's value as Python shows it: the float32's shortest
// decimal form (1.702, not 1.7020000219345093).
double Float32Shortest(double v) { return std::strtod(fmt::format("{}", float(v)).c_str(), nullptr); }

nb::object AttrValue(AttrType t, double v) {
  if (t == AttrType::kF32) return nb::float_(Float32Shortest(v));
  if (t == AttrType::kBool) return nb::bool_(v != 0);
  if (t == AttrType::kU64) return nb::int_(uint64_t(v));
  return nb::int_(int64_t(v));
}

}  // namespace

void BindSchemas(nb::module_& m) {
  m.def(
      "ops_info",
      [] {
        nb::list out;
        for (const OpSchema& op : AllOps()) {
          if (op.name == nullptr) continue;
          nb::dict d;
          d["id"] = op.id;
          d["name"] = op.name;
          d["family"] = op.family ? op.family : "";
          d["doc"] = op.doc ? op.doc : "";
          d["inputs"] = Args(op.inputs);
          d["outputs"] = Args(op.outputs);
          nb::list attrs;
          for (const AttrSchema& a : op.attrs) {
            nb::dict ad;
            ad["name"] = a.name;
            ad["type"] = AttrTypeName(a.type);
            ad["default"] = AttrValue(a.type, a.default_value);
            // f32: +-inf where unbounded; u64: every value is valid.
            ad["min"] = a.type == AttrType::kU64 ? nb::int_(0) : AttrValue(a.type, a.min_value);
            ad["max"] = a.type == AttrType::kU64 ? nb::int_(UINT64_MAX) : AttrValue(a.type, a.max_value);
            ad["range"] = nb::str(AttrRangeString(a).c_str());
            ad["doc"] = a.doc ? a.doc : "";
            attrs.append(ad);
          }
          d["attrs"] = attrs;
          nb::list aliases;
          for (const char* a : op.aliases) aliases.append(a);
          d["aliases"] = aliases;
          d["in_place"] = (op.flags & kOpInPlace) != 0;
          d["contiguous"] = (op.flags & kOpContiguous) != 0;
          d["inplace_output"] = int(op.inplace_output);
          d["inplace_input"] = int(op.inplace_input);
          out.append(d);
        }
        return out;
      },
      "Every op schema of the catalogue as dicts (id, name, family, doc, inputs, outputs, attrs, aliases, flags).");
  m.def(
      "op_id", [](const std::string& name) { return OpByName(name).id; },
      "The op id of a catalogue name or alias; KeyError if unknown.");
}

}  // namespace tefl::python
