//===- FrontendTest.cpp - Unit tests of the .attn front end ---------------===//

#include "Frontend/Frontend.h"
#include "Frontend/ConstantEvaluator.h"

#include "gtest/gtest.h"

#include <cmath>

using namespace pagedc;
using namespace pagedc::ast;

namespace {

/// Runs the front end on `source`; diagnostics land in `errors`.
std::unique_ptr<Program> compile(llvm::StringRef source, std::string &errors,
                                 FrontendOptions options = {}) {
  llvm::raw_string_ostream stream(errors);
  DiagnosticEngine diags("test.attn", source, stream);
  std::unique_ptr<Program> program = parseAndAnalyze(diags, options);
  diags.flush();
  return program;
}

/// The folded value of the last constant of `source`.
ConstantValue constValue(llvm::StringRef source) {
  std::string errors;
  std::unique_ptr<Program> program = compile(source, errors);
  EXPECT_TRUE(program) << errors;
  if (!program || program->consts.empty())
    return ConstantValue();
  return program->consts.back()->getValue();
}

int64_t intConst(llvm::StringRef expr) {
  ConstantValue value = constValue(("const X = " + expr + "\n").str());
  EXPECT_EQ(value.type, Type::I32) << expr.str();
  return value.intValue;
}

double floatConst(llvm::StringRef expr) {
  ConstantValue value = constValue(("const X = " + expr + "\n").str());
  EXPECT_EQ(value.type, Type::F32) << expr.str();
  return value.floatValue;
}

TEST(FloorArithmetic, IntegersRoundTowardNegativeInfinity) {
  EXPECT_EQ(floorDivide(int64_t(7), int64_t(2)), 3);
  EXPECT_EQ(floorDivide(int64_t(-7), int64_t(2)), -4);
  EXPECT_EQ(floorDivide(int64_t(7), int64_t(-2)), -4);
  EXPECT_EQ(floorDivide(int64_t(-7), int64_t(-2)), 3);
  EXPECT_EQ(floorDivide(int64_t(-6), int64_t(2)), -3);
  EXPECT_EQ(floorModulo(int64_t(7), int64_t(3)), 1);
  EXPECT_EQ(floorModulo(int64_t(-7), int64_t(3)), 2);
  EXPECT_EQ(floorModulo(int64_t(7), int64_t(-3)), -2);
  EXPECT_EQ(floorModulo(int64_t(-7), int64_t(-3)), -1);
  EXPECT_EQ(floorModulo(int64_t(-6), int64_t(3)), 0);
}

TEST(FloorArithmetic, FloatsTakeTheSignOfTheDivisor) {
  EXPECT_DOUBLE_EQ(floorDivide(-7.5, 2.0), -4.0);
  EXPECT_DOUBLE_EQ(floorModulo(-7.5, 2.0), 0.5);
  EXPECT_DOUBLE_EQ(floorModulo(7.5, -2.0), -0.5);
  EXPECT_DOUBLE_EQ(floorModulo(7.5, 2.0), 1.5);
}

TEST(ConstantFolding, PythonSemanticsOnNegatives) {
  EXPECT_EQ(intConst("-7 // 2"), -4);
  EXPECT_EQ(intConst("-7 % 2"), 1);
  EXPECT_EQ(intConst("7 % -2"), -1);
  EXPECT_EQ(intConst("-(7 // -2)"), 4);
  EXPECT_EQ(intConst("2 ** 10"), 1024);
  EXPECT_EQ(intConst("-2 ** 2"), -4);      // ** binds tighter than unary minus
  EXPECT_EQ(intConst("2 ** 3 ** 2"), 512); // right-associative
  EXPECT_EQ(intConst("1 << 4 | 1"), 17);
  EXPECT_EQ(intConst("-16 >> 2"), -4);
  EXPECT_EQ(intConst("~5"), -6);
  EXPECT_EQ(intConst("6 ^ 3"), 5);
  EXPECT_EQ(intConst("abs(-3) + min(2, 5) + max(2, 5) + clamp(9, 0, 4)"), 14);
  EXPECT_EQ(intConst("int(-2.7)"), -2); // truncation toward zero
  EXPECT_EQ(intConst("where(3 > 2, 10, 20)"), 10);
  EXPECT_DOUBLE_EQ(floatConst("7 / 2"), 3.5); // true division
  EXPECT_DOUBLE_EQ(floatConst("-7.5 // 2"), -4.0);
  EXPECT_DOUBLE_EQ(floatConst("-7.5 % 2"), 0.5);
  EXPECT_DOUBLE_EQ(floatConst("2.0 ** -1"), 0.5);
  EXPECT_DOUBLE_EQ(floatConst("round(2.5) + round(3.5)"), 6.0); // half to even
  EXPECT_DOUBLE_EQ(floatConst("exp2(3)"), 8.0);
  EXPECT_TRUE(std::isinf(floatConst("-inf")));
}

TEST(ConstantFolding, UsesEarlierConstantsAndOverrides) {
  std::string errors;
  FrontendOptions options;
  options.constOverrides.push_back({"A", "-3"});
  std::unique_ptr<Program> program = compile(
      "const A = 10\nconst B = A * 2 + 1\nconst C = B // 4\n", errors, options);
  ASSERT_TRUE(program) << errors;
  EXPECT_TRUE(program->consts[0]->isOverridden());
  EXPECT_EQ(program->consts[1]->getValue().intValue, -5);
  EXPECT_EQ(program->consts[2]->getValue().intValue, -2);
}

TEST(ConstantFolding, ReportsProblems) {
  struct Case {
    const char *source;
    const char *error;
  } cases[] = {
      {"const A = 1 // 0\n",
       "test.attn:1:16: error: division by zero in constant expression"},
      {"const A = 1 % 0\n",
       "test.attn:1:15: error: modulo by zero in constant expression"},
      {"const A = 1.0 / 0\n",
       "test.attn:1:17: error: division by zero in constant expression"},
      {"const A = 2 ** -1\n",
       "test.attn:1:16: error: integers cannot be raised to a negative"},
      {"const A = 1 << 64\n",
       "test.attn:1:16: error: shift count 64 out of range"},
      {"const A = 65536 * 65536\n",
       "test.attn:1:11: error: constant 'A' = 4294967296 does not "
       "fit in i32"},
      {"const A = 4611686018427387904 * 4\n",
       "test.attn:1:11: error: integer overflow in constant expression ('*')"},
      {"const A = sqrt(-1.0)\n",
       "test.attn:1:11: error: constant 'A' evaluates to NaN"},
  };
  for (const Case &c : cases) {
    std::string errors;
    EXPECT_FALSE(compile(c.source, errors)) << c.source;
    EXPECT_NE(errors.find(c.error), std::string::npos)
        << c.source << "\ngot: " << errors;
  }
}

TEST(OverrideValues, AcceptsIntAndFloatLiterals) {
  ConstantValue value;
  ASSERT_TRUE(parseOverrideValue("4096", value));
  EXPECT_EQ(value.type, Type::I32);
  EXPECT_EQ(value.intValue, 4096);
  ASSERT_TRUE(parseOverrideValue("-1", value));
  EXPECT_EQ(value.intValue, -1);
  ASSERT_TRUE(parseOverrideValue("1e-3", value));
  EXPECT_EQ(value.type, Type::F32);
  EXPECT_DOUBLE_EQ(value.floatValue, 1e-3);
  ASSERT_TRUE(parseOverrideValue("-inf", value));
  EXPECT_TRUE(std::isinf(value.floatValue) && value.floatValue < 0);
  EXPECT_FALSE(parseOverrideValue("", value));
  EXPECT_FALSE(parseOverrideValue("-", value));
  EXPECT_FALSE(parseOverrideValue("0x10", value));
  EXPECT_FALSE(parseOverrideValue("nan", value));
  EXPECT_FALSE(parseOverrideValue("1.5.2", value));
  EXPECT_FALSE(parseOverrideValue("true", value));
}

TEST(Lexer, PositionsAndKinds) {
  std::string errors;
  llvm::raw_string_ostream stream(errors);
  DiagnosticEngine diags("t.attn", "mask m # comment\n  x//2 ** .5 1e3",
                         stream);
  std::vector<Token> tokens = lex(diags);
  std::vector<TokenKind> kinds;
  for (const Token &token : tokens)
    kinds.push_back(token.kind);
  std::vector<TokenKind> expected = {
      TokenKind::KwMask,     TokenKind::Identifier, TokenKind::Newline,
      TokenKind::Identifier, TokenKind::SlashSlash, TokenKind::Integer,
      TokenKind::StarStar,   TokenKind::Float,      TokenKind::Float,
      TokenKind::Eof};
  EXPECT_EQ(kinds, expected);
  EXPECT_EQ(tokens[3].range.begin.line, 2u);
  EXPECT_EQ(tokens[3].range.begin.column, 3u);
  EXPECT_DOUBLE_EQ(tokens[7].floatValue, 0.5);
  EXPECT_DOUBLE_EQ(tokens[8].floatValue, 1000.0);
  EXPECT_FALSE(diags.hasErrors());
}

TEST(Lexer, ColumnsCountCharactersNotBytes) {
  std::string errors;
  {
    llvm::raw_string_ostream stream(errors);
    DiagnosticEngine diags("t.attn", "# \xc3\xa9t\xc3\xa9\nx \xe2\x89\xa5 @",
                           stream);
    lex(diags);
    EXPECT_EQ(diags.getNumErrors(), 2u);
  }
  EXPECT_NE(errors.find("t.attn:2:3: error: non-ASCII character"),
            std::string::npos)
      << errors;
  EXPECT_NE(errors.find("t.attn:2:5: error: stray '@' in program"),
            std::string::npos)
      << errors;
}

TEST(Sema, ResolvesNamesAndInsertsCasts) {
  std::string errors;
  std::unique_ptr<Program> program =
      compile("param scale: f32 = 2\nbuffer bias: f32[S]\n"
              "score s(x, b, h, q, kv) {\n  let d = q - kv\n  x * scale + "
              "bias[d] + d\n}\n",
              errors);
  ASSERT_TRUE(program) << errors;
  EXPECT_DOUBLE_EQ(program->params[0]->getDefaultValue().floatValue, 2.0);
  EXPECT_EQ(program->params[0]->getDefaultValue().type, Type::F32);
  const ModDecl &mod = *program->mods[0];
  const auto *sum = llvm::dyn_cast<BinaryExpr>(mod.getResult());
  ASSERT_TRUE(sum);
  EXPECT_EQ(sum->getType(), Type::F32);
  // `+ d` promotes the i32 let to f32 through an implicit cast.
  const auto *cast = llvm::dyn_cast<CastExpr>(sum->getRHS());
  ASSERT_TRUE(cast);
  EXPECT_TRUE(cast->isImplicit());
  const auto *name = llvm::dyn_cast<NameExpr>(cast->getOperand());
  ASSERT_TRUE(name);
  EXPECT_EQ(name->getRefKind(), NameExpr::RefKind::Let);
  EXPECT_EQ(name->getLet(), mod.getLets()[0].get());
}

TEST(Diagnostics, SortedAndLimited) {
  // 25 independent errors: the first 20 (in source order) are printed, then
  // one line says how many more there were.
  std::string source;
  for (int i = 0; i < 25; ++i)
    source += "mask m" + std::to_string(i) + "(b, h, q, kv) = q >= unknown" +
              std::to_string(i) + "\n";
  std::string errors;
  EXPECT_FALSE(compile(source, errors));
  size_t count = 0;
  for (size_t at = errors.find(": error: unknown name");
       at != std::string::npos;
       at = errors.find(": error: unknown name", at + 1))
    ++count;
  EXPECT_EQ(count, 20u);
  EXPECT_NE(errors.find("test.attn:20:"), std::string::npos);
  EXPECT_EQ(errors.find("test.attn:21:"), std::string::npos);
  EXPECT_NE(errors.find("test.attn: error: too many errors; 5 more not shown "
                        "(the limit is 20)"),
            std::string::npos)
      << errors;
}

} // namespace
