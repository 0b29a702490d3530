//===- Json.cpp - A small JSON value, writer and parser -------------------===//

#include "kernels/Json.h"

#include "pagedc/Error.h"

#include <fmt/format.h>

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

void escape(std::string &out, const std::string &text) {
  out += '"';
  for (unsigned char c : text) {
    switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\t': out += "\\t"; break;
    case '\r': out += "\\r"; break;
    default:
      if (c < 0x20)
        out += fmt::format("\\u{:04x}", c);
      else
        out += static_cast<char>(c);
    }
  }
  out += '"';
}

class Parser {
public:
  explicit Parser(std::string_view text) : text_(text) {}

  Value document() {
    Value value = parseValue();
    skipSpace();
    if (at_ != text_.size())
      fail("trailing characters");
    return value;
  }

private:
  [[noreturn]] void fail(const std::string &what) {
    throw Error(fmt::format("invalid JSON at offset {}: {}", at_, what));
  }
  void skipSpace() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\n' ||
                                  text_[at_] == '\t' || text_[at_] == '\r'))
      ++at_;
  }
  bool consume(std::string_view word) {
    if (text_.substr(at_, word.size()) == word) {
      at_ += word.size();
      return true;
    }
    return false;
  }
  Value parseValue() {
    skipSpace();
    if (at_ >= text_.size())
      fail("unexpected end");
    char c = text_[at_];
    if (c == '{')
      return parseObject();
    if (c == '[')
      return parseArray();
    if (c == '"')
      return Value(parseString());
    if (consume("true"))
      return Value(true);
    if (consume("false"))
      return Value(false);
    if (consume("null"))
      return Value();
    return parseNumber();
  }
  Value parseNumber() {
    size_t begin = at_;
    if (at_ < text_.size() && text_[at_] == '-')
      ++at_;
    bool integral = true;
    while (at_ < text_.size()) {
      char c = text_[at_];
      if (c >= '0' && c <= '9') {
        ++at_;
      } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
        integral = false;
        ++at_;
      } else {
        break;
      }
    }
    std::string number(text_.substr(begin, at_ - begin));
    if (number.empty() || number == "-")
      fail("expected a value");
    char *end = nullptr;
    if (integral) {
      long long value = std::strtoll(number.c_str(), &end, 10);
      return Value(static_cast<int64_t>(value));
    }
    double value = std::strtod(number.c_str(), &end);
    if (*end)
      fail("bad number '" + number + "'");
    return Value(value);
  }
  std::string parseString() {
    ++at_; // opening quote
    std::string out;
    while (true) {
      if (at_ >= text_.size())
        fail("unterminated string");
      char c = text_[at_++];
      if (c == '"')
        return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size())
        fail("unterminated escape");
      char e = text_[at_++];
      switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'u': {
        if (at_ + 4 > text_.size())
          fail("short \\u escape");
        unsigned code = std::strtoul(std::string(text_.substr(at_, 4)).c_str(), nullptr, 16);
        at_ += 4;
        if (code < 0x80) {
          out += static_cast<char>(code);
        } else if (code < 0x800) {
          out += static_cast<char>(0xc0 | (code >> 6));
          out += static_cast<char>(0x80 | (code & 0x3f));
        } else {
          out += static_cast<char>(0xe0 | (code >> 12));
          out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
          out += static_cast<char>(0x80 | (code & 0x3f));
        }
        break;
      }
      default:
        fail(std::string("bad escape \\") + e);
      }
    }
  }
  Value parseArray() {
    ++at_;
    Value array = Value::array();
    skipSpace();
    if (consume("]"))
      return array;
    while (true) {
      array.push(parseValue());
      skipSpace();
      if (consume("]"))
        return array;
      if (!consume(","))
        fail("expected ',' or ']'");
    }
  }
  Value parseObject() {
    ++at_;
    Value object = Value::object();
    skipSpace();
    if (consume("}"))
      return object;
    while (true) {
      skipSpace();
      if (at_ >= text_.size() || text_[at_] != '"')
        fail("expected a key");
      std::string key = parseString();
      skipSpace();
      if (!consume(":"))
        fail("expected ':'");
      object.set(std::move(key), parseValue());
      skipSpace();
      if (consume("}"))
        return object;
      if (!consume(","))
        fail("expected ',' or '}'");
    }
  }

  std::string_view text_;
  size_t at_ = 0;
};

} // namespace

bool Value::asBool(std::string_view what) const {
  if (kind_ != Kind::Bool)
    throw Error(fmt::format("{} must be a boolean, not {}", what, kindName(kind_)));
  return bool_;
}
int64_t Value::asInt(std::string_view what) const {
  if (kind_ != Kind::Number || (!isInteger_ && std::floor(number_) != number_))
    throw Error(fmt::format("{} must be an integer, not {}", what, kindName(kind_)));
  return isInteger_ ? integer_ : static_cast<int64_t>(number_);
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

std::string Value::dump(int indent) const {
  std::string out;
  dumpTo(out, indent, 0);
  out += '\n';
  return out;
}

void Value::dumpTo(std::string &out, int indent, int depth) const {
  auto newline = [&](int level) {
    if (indent > 0) {
      out += '\n';
      out.append(static_cast<size_t>(indent * level), ' ');
    }
  };
  switch (kind_) {
  case Kind::Null: out += "null"; break;
  case Kind::Bool: out += bool_ ? "true" : "false"; break;
  case Kind::Number:
    if (isInteger_)
      out += std::to_string(integer_);
    else if (std::isfinite(number_))
      out += fmt::format("{}", number_);
    else
      out += "null";
    break;
  case Kind::String: escape(out, string_); break;
  case Kind::Array:
    out += '[';
    for (size_t i = 0; i < items_.size(); ++i) {
      if (i)
        out += ',';
      newline(depth + 1);
      items_[i].dumpTo(out, indent, depth + 1);
    }
    if (!items_.empty())
      newline(depth);
    out += ']';
    break;
  case Kind::Object:
    out += '{';
    for (size_t i = 0; i < members_.size(); ++i) {
      if (i)
        out += ',';
      newline(depth + 1);
      escape(out, members_[i].first);
      out += indent > 0 ? ": " : ":";
      members_[i].second.dumpTo(out, indent, depth + 1);
    }
    if (!members_.empty())
      newline(depth);
    out += '}';
    break;
  }
}

Value Value::parse(std::string_view text) { return Parser(text).document(); }

} // namespace pagedc::json
