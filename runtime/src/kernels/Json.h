//===- Json.h - A small JSON value, writer and parser ----------*- C++ -*-===//
//
// Enough JSON for bundle manifests and benchmark results: null, booleans,
// numbers (kept as double, with exact int64 when integral), strings, arrays
// and objects (key order preserved). Parsing and writing are nlohmann/json's.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_RUNTIME_CUDA_JSON_H
#define PAGEDC_RUNTIME_CUDA_JSON_H

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pagedc::json {

class Value {
public:
  enum class Kind { Null, Bool, Number, String, Array, Object };

  Value() = default;
  Value(bool value) : kind_(Kind::Bool), bool_(value) {}
  Value(int value) : Value(static_cast<int64_t>(value)) {}
  Value(int64_t value) : kind_(Kind::Number), number_(static_cast<double>(value)), integer_(value), isInteger_(true) {}
  Value(double value) : kind_(Kind::Number), number_(value) {}
  Value(const char *value) : kind_(Kind::String), string_(value) {}
  Value(std::string value) : kind_(Kind::String), string_(std::move(value)) {}
  static Value array() { Value v; v.kind_ = Kind::Array; return v; }
  static Value object() { Value v; v.kind_ = Kind::Object; return v; }

  Kind kind() const { return kind_; }
  bool isObject() const { return kind_ == Kind::Object; }
  bool isInteger() const { return kind_ == Kind::Number && isInteger_; }
  /// Object members in insertion order.
  const std::vector<std::pair<std::string, Value>> &members() const { return members_; }

  /// Typed access; throw pagedc::Error naming `what` on a kind mismatch.
  bool asBool(std::string_view what) const;
  int64_t asInt(std::string_view what) const;
  double asDouble(std::string_view what) const;
  const std::string &asString(std::string_view what) const;
  const std::vector<Value> &asArray(std::string_view what) const;

  /// Object member or null when absent (objects only).
  const Value *find(std::string_view key) const;
  /// Object member; throws pagedc::Error naming the missing key.
  const Value &at(std::string_view key) const;

  void push(Value value) { items_.push_back(std::move(value)); }
  void set(std::string key, Value value);

  std::string dump(int indent = 2) const;
  static Value parse(std::string_view text);

private:
  Kind kind_ = Kind::Null;
  bool bool_ = false;
  double number_ = 0;
  int64_t integer_ = 0;
  bool isInteger_ = false;
  std::string string_;
  std::vector<Value> items_;
  std::vector<std::pair<std::string, Value>> members_;
};

} // namespace pagedc::json

#endif // PAGEDC_RUNTIME_CUDA_JSON_H
