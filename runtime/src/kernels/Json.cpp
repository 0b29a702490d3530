//===- Json.cpp - A small JSON value over nlohmann/json -------------------===//
//
// Parsing and writing are nlohmann/json's (Debian nlohmann-json3-dev); this
// file converts between its documents and Value, whose typed accessors give
// errors that name the field.
//
//===----------------------------------------------------------------------===//

#include "kernels/Json.h"

#include "pagedc/Error.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <climits>
#include <cmath>
#include <cstdlib>

namespace pagedc::json {

namespace {

const char *kindName(Value::Kind kind) {
  switch (kind) {
  case Value::Kind::Null: return "null";
  case Value::Kind::Bool: return "a boolean";
  case Value::Kind::Number: return "a number";
  case Value::Kind::String: return "a string";
  case Value::Kind::Array: return "an array";
  case Value::Kind::Object: return "an object";
  }
  return "?";
}

using Document = nlohmann::ordered_json;

/// Value -> nlohmann document (the writer is nlohmann's).
Document toDocument(const Value &value);

/// nlohmann document -> Value; `depth` bounds nesting (hostile input).
Value fromDocument(const Document &document, int depth) {
  if (depth > 256)
    throw Error("JSON nested deeper than 256 levels");
  switch (document.type()) {
  case Document::value_t::null:
  case Document::value_t::discarded:
    return Value();
  case Document::value_t::boolean:
    return Value(document.get<bool>());
  case Document::value_t::number_integer:
    return Value(document.get<int64_t>());
  case Document::value_t::number_unsigned: {
    const uint64_t value = document.get<uint64_t>();
    if (value > static_cast<uint64_t>(INT64_MAX))
      return Value(static_cast<double>(value));
    return Value(static_cast<int64_t>(value));
  }
  case Document::value_t::number_float:
    return Value(document.get<double>());
  case Document::value_t::string:
    return Value(document.get<std::string>());
  case Document::value_t::binary:
    throw Error("JSON binary values are not supported");
  case Document::value_t::array: {
    Value array = Value::array();
    for (const Document &item : document)
      array.push(fromDocument(item, depth + 1));
    return array;
  }
  case Document::value_t::object: {
    Value object = Value::object();
    for (auto it = document.begin(); it != document.end(); ++it)
      object.set(it.key(), fromDocument(it.value(), depth + 1));
    return object;
  }
  }
  return Value();
}

} // namespace

bool Value::asBool(std::string_view what) const {
  if (kind_ != Kind::Bool)
    throw Error(fmt::format("{} must be a boolean, not {}", what, kindName(kind_)));
  return bool_;
}
int64_t Value::asInt(std::string_view what) const {
  if (kind_ != Kind::Number || (!isInteger_ && std::floor(number_) != number_))
    throw Error(fmt::format("{} must be an integer, not {}", what, kindName(kind_)));
  if (isInteger_)
    return integer_;
  // An integral double such as 8.3e57 or 1e19 has no int64 value (the
  // conversion would be undefined): out of range, said so. 2^63 is the first
  // double past INT64_MAX; -2^63 itself fits.
  if (!(number_ >= -9223372036854775808.0 && number_ < 9223372036854775808.0))
    throw Error(fmt::format("{} is out of the range of a 64-bit integer: {}", what, number_));
  return static_cast<int64_t>(number_);
}
double Value::asDouble(std::string_view what) const {
  if (kind_ != Kind::Number)
    throw Error(fmt::format("{} must be a number, not {}", what, kindName(kind_)));
  return number_;
}
const std::string &Value::asString(std::string_view what) const {
  if (kind_ != Kind::String)
    throw Error(fmt::format("{} must be a string, not {}", what, kindName(kind_)));
  return string_;
}
const std::vector<Value> &Value::asArray(std::string_view what) const {
  if (kind_ != Kind::Array)
    throw Error(fmt::format("{} must be an array, not {}", what, kindName(kind_)));
  return items_;
}
const Value *Value::find(std::string_view key) const {
  for (const auto &member : members_)
    if (member.first == key)
      return &member.second;
  return nullptr;
}
const Value &Value::at(std::string_view key) const {
  if (kind_ != Kind::Object)
    throw Error(fmt::format("expected an object holding '{}'", key));
  if (const Value *value = find(key))
    return *value;
  throw Error(fmt::format("missing field '{}'", key));
}
void Value::set(std::string key, Value value) {
  for (auto &member : members_)
    if (member.first == key) {
      member.second = std::move(value);
      return;
    }
  members_.emplace_back(std::move(key), std::move(value));
}

namespace {
Document toDocument(const Value &value) {
  switch (value.kind()) {
  case Value::Kind::Null:
    return nullptr;
  case Value::Kind::Bool:
    return value.asBool("value");
  case Value::Kind::Number:
    if (value.isInteger())
      return value.asInt("value");
    // NaN and infinities have no JSON spelling.
    return std::isfinite(value.asDouble("value")) ? Document(value.asDouble("value"))
                                                  : Document(nullptr);
  case Value::Kind::String:
    return value.asString("value");
  case Value::Kind::Array: {
    Document array = Document::array();
    for (const Value &item : value.asArray("value"))
      array.push_back(toDocument(item));
    return array;
  }
  case Value::Kind::Object: {
    Document object = Document::object();
    for (const auto &[key, member] : value.members())
      object[key] = toDocument(member);
    return object;
  }
  }
  return nullptr;
}
} // namespace

std::string Value::dump(int indent) const {
  return toDocument(*this).dump(indent > 0 ? indent : -1) + "\n";
}

Value Value::parse(std::string_view text) {
  Document document;
  try {
    document = Document::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception &error) {
    throw Error(fmt::format("invalid JSON: {}", error.what()));
  }
  return fromDocument(document, 0);
}

} // namespace pagedc::json
