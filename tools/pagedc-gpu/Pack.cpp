//===- Pack.cpp - The GPU check pack: cases, inputs, references -----------===//

#include "Pack.h"

#include "kernels/Json.h"
#include "pagedc/Error.h"
#include "pagedc/KernelCache.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace pagedc::gpu {

namespace fs = std::filesystem;
using json::Value;

uint64_t PackRandom::next() {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float PackRandom::uniform(float lo, float hi) {
  const float unit = static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * unit;
}

int64_t PackRandom::integer(int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
}

uint16_t toBits16(float value, DType dtype) {
  return dtype == DType::F16 ? floatToHalf(value) : floatToBF16(value);
}

float fromBits16(uint16_t bits, DType dtype) {
  return dtype == DType::F16 ? halfToFloat(bits) : bf16ToFloat(bits);
}

const char *kindName(KernelKind kind) { return kernelKindName(kind); }

std::string utcNow() {
  std::time_t now = std::time(nullptr);
  char text[64];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return text;
}

void writeJsonFile(const std::string &path, const json::Value &value, int indent) {
  std::ofstream out(path);
  out << value.dump(indent) << "\n";
  if (!out)
    throw Error("cannot write " + path);
}

KernelKind kindFromName(const std::string &name) {
  for (KernelKind kind :
       {KernelKind::Prefill, KernelKind::Decode, KernelKind::BlockMaskBuilder})
    if (name == kernelKindName(kind))
      return kind;
  throw Error(fmt::format("pack: unknown kernel kind '{}'", name));
}

CompiledMods PackCase::declaredMods() const {
  CompiledMods mods;
  mods.maskName = mask;
  mods.scoreName = score;
  for (const CaseParam &param : params)
    mods.params.push_back(param.decl);
  for (const CaseBuffer &buffer : buffers)
    mods.buffers.push_back(buffer.decl);
  mods.maskDependence.b = maskReadsB;
  mods.maskDependence.h = maskReadsH;
  return mods;
}

CaseInputs generateInputs(const PackCase &c) {
  CaseInputs inputs;
  PackRandom random(c.seed);
  auto fill = [&](std::vector<int64_t> shape, float lo, float hi, HostTensor &wide,
                  HostTensor &narrow) {
    wide = HostTensor(DType::F32, shape);
    narrow = HostTensor(c.dtype, shape);
    auto *values = wide.dataAs<float>();
    auto *bits = narrow.dataAs<uint16_t>();
    for (int64_t i = 0; i < wide.numel(); ++i) {
      bits[i] = toBits16(random.uniform(lo, hi), c.dtype);
      values[i] = fromBits16(bits[i], c.dtype);
    }
  };
  fill({c.batch, c.headsQ, c.queryLength, c.headDim}, -2.0f, 2.0f, inputs.q, inputs.q16);
  fill({c.batch, c.headsKv, c.maxKvLength, c.headDim}, -1.0f, 1.0f, inputs.k, inputs.k16);
  fill({c.batch, c.headsKv, c.maxKvLength, c.headDim}, -1.0f, 1.0f, inputs.v, inputs.v16);
  uint64_t hash = 0;
  for (const HostTensor *tensor : {&inputs.q16, &inputs.k16, &inputs.v16})
    hash = contentHash64(std::string_view(static_cast<const char *>(tensor->data()),
                                    static_cast<size_t>(tensor->numel()) * 2),
                   hash);
  inputs.checksum = fmt::format("{:016x}", hash);
  return inputs;
}

//===----------------------------------------------------------------------===//
// JSON
//===----------------------------------------------------------------------===//

namespace {

Value intArray(const std::vector<int32_t> &values) {
  Value array = Value::array();
  for (int32_t v : values)
    array.push(Value(v));
  return array;
}

std::vector<int32_t> readIntArray(const Value &value, const std::string &what) {
  std::vector<int32_t> result;
  for (const Value &item : value.asArray(what))
    result.push_back(static_cast<int32_t>(item.asInt(what)));
  return result;
}

const char *scalarName(ScalarKind kind) {
  return kind == ScalarKind::I32 ? "i32" : kind == ScalarKind::F32 ? "f32" : "bool";
}

ScalarKind scalarFromName(const std::string &name, const std::string &what) {
  if (name == "i32")
    return ScalarKind::I32;
  if (name == "f32")
    return ScalarKind::F32;
  if (name == "bool")
    return ScalarKind::Bool;
  throw Error(fmt::format("pack: {}: unknown param type '{}'", what, name));
}

DType dtypeFromName(const std::string &name, const std::string &what) {
  for (DType type : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64,
                     DType::U8, DType::Bool})
    if (name == dtypeName(type))
      return type;
  throw Error(fmt::format("pack: {}: unknown dtype '{}'", what, name));
}

Value paramsToJson(const std::vector<CaseParam> &params) {
  Value array = Value::array();
  for (const CaseParam &param : params) {
    Value item = Value::object();
    item.set("name", param.decl.name);
    item.set("type", scalarName(param.decl.type));
    if (param.decl.type == ScalarKind::F32)
      item.set("value", Value(static_cast<double>(param.value.f32)));
    else if (param.decl.type == ScalarKind::I32)
      item.set("value", Value(param.value.i32));
    else
      item.set("value", Value(param.value.boolean));
    array.push(std::move(item));
  }
  return array;
}

std::vector<CaseParam> paramsFromJson(const Value &value, const std::string &where) {
  std::vector<CaseParam> params;
  for (const Value &item : value.asArray(where + ".params")) {
    CaseParam param;
    param.decl.name = item.at("name").asString(where + ".params.name");
    param.decl.type = scalarFromName(item.at("type").asString(where + ".params.type"), where);
    const Value &v = item.at("value");
    if (param.decl.type == ScalarKind::F32)
      param.value = ParamValue::ofF32(static_cast<float>(v.asDouble(where + ".params.value")));
    else if (param.decl.type == ScalarKind::I32)
      param.value = ParamValue::ofI32(static_cast<int32_t>(v.asInt(where + ".params.value")));
    else
      param.value = ParamValue::ofBool(v.asBool(where + ".params.value"));
    params.push_back(param);
  }
  return params;
}

Value buffersToJson(const std::vector<CaseBuffer> &buffers) {
  Value array = Value::array();
  for (const CaseBuffer &buffer : buffers) {
    Value item = Value::object();
    item.set("name", buffer.decl.name);
    item.set("dtype", dtypeName(buffer.decl.elementType));
    Value dims = Value::array();
    for (const BufferDim &dim : buffer.decl.dims)
      dims.push(dim.kind == BufferDim::Fixed   ? Value(std::to_string(dim.size))
                : dim.kind == BufferDim::Named ? Value(dim.name)
                                               : Value("?"));
    item.set("dims", std::move(dims));
    item.set("file", buffer.file);
    array.push(std::move(item));
  }
  return array;
}

std::vector<CaseBuffer> buffersFromJson(const Value &value, const std::string &where) {
  std::vector<CaseBuffer> buffers;
  for (const Value &item : value.asArray(where + ".buffers")) {
    CaseBuffer buffer;
    buffer.decl.name = item.at("name").asString(where + ".buffers.name");
    buffer.decl.elementType =
        dtypeFromName(item.at("dtype").asString(where + ".buffers.dtype"), where);
    for (const Value &dim : item.at("dims").asArray(where + ".buffers.dims")) {
      const std::string &text = dim.asString(where + ".buffers.dims");
      BufferDim parsed;
      if (text == "?") {
        parsed.kind = BufferDim::Any;
      } else if (!text.empty() && std::isdigit(static_cast<unsigned char>(text[0]))) {
        parsed.kind = BufferDim::Fixed;
        parsed.size = std::stoll(text);
      } else {
        parsed.kind = BufferDim::Named;
        parsed.name = text;
      }
      buffer.decl.dims.push_back(parsed);
    }
    buffer.file = item.at("file").asString(where + ".buffers.file");
    buffers.push_back(std::move(buffer));
  }
  return buffers;
}

int readInt(const Value &object, const char *key, const std::string &where) {
  return static_cast<int>(object.at(key).asInt(where + "." + key));
}

} // namespace

void Pack::write() const {
  Value root = Value::object();
  root.set("format", kPackFormat);
  root.set("version", kPackVersion);
  root.set("arch", arch);
  root.set("created", created);
  Value caseArray = Value::array();
  for (const PackCase &c : cases) {
    Value item = Value::object();
    item.set("name", c.name);
    item.set("source", c.source);
    item.set("mask", c.mask);
    item.set("score", c.score);
    item.set("label", c.label);
    item.set("bundle", c.bundle);
    item.set("kind", kindName(c.kind));
    item.set("dtype", dtypeName(c.dtype));
    item.set("batch", c.batch);
    item.set("heads_q", c.headsQ);
    item.set("heads_kv", c.headsKv);
    item.set("q_len", c.queryLength);
    item.set("head_dim", c.headDim);
    item.set("max_kv_len", c.maxKvLength);
    item.set("kv_len", intArray(c.kvLength));
    item.set("q_offset", intArray(c.qOffset));
    item.set("batch_idx", intArray(c.batchIdx));
    item.set("num_pages", c.numPages);
    item.set("page_size", c.pageSize);
    item.set("max_batch", c.maxBatch);
    Value reserves = Value::array();
    for (auto [slot, length] : c.reserves)
      reserves.push(intArray({slot, length}));
    item.set("reserves", std::move(reserves));
    item.set("scale", Value(static_cast<double>(c.scale)));
    item.set("return_lse", c.returnLse);
    item.set("q_block", c.qBlock);
    item.set("kv_block", c.kvBlock);
    item.set("mask_reads_b", c.maskReadsB);
    item.set("mask_reads_h", c.maskReadsH);
    item.set("seed", Value(fmt::format("{}", c.seed)));
    item.set("input_checksum", c.inputChecksum);
    item.set("params", paramsToJson(c.params));
    item.set("buffers", buffersToJson(c.buffers));
    item.set("tolerance", Value(c.tolerance));
    caseArray.push(std::move(item));
  }
  root.set("cases", std::move(caseArray));
  Value benchArray = Value::array();
  for (const BenchCase &b : bench) {
    Value item = Value::object();
    item.set("name", b.name);
    item.set("label", b.label);
    item.set("bundle", b.bundle);
    item.set("mask", b.mask);
    item.set("score", b.score);
    item.set("kind", kindName(b.kind));
    item.set("batch", b.batch);
    item.set("heads_q", b.headsQ);
    item.set("heads_kv", b.headsKv);
    item.set("q_len", b.queryLength);
    item.set("head_dim", b.headDim);
    item.set("kv_len", b.kvLength);
    item.set("page_size", b.pageSize);
    item.set("kept_fraction", Value(b.keptFraction));
    item.set("q_block", b.qBlock);
    item.set("kv_block", b.kvBlock);
    item.set("params", paramsToJson(b.params));
    item.set("buffers", buffersToJson(b.buffers));
    if (!b.ptxas.empty()) {
      Value reports = Value::array();
      for (const BenchPtxas &r : b.ptxas) {
        Value report = Value::object();
        report.set("arch", r.arch);
        report.set("kernel", r.kernel);
        report.set("registers", r.registers);
        report.set("stack_bytes", r.stackBytes);
        report.set("spill_store_bytes", r.spillStoreBytes);
        report.set("spill_load_bytes", r.spillLoadBytes);
        report.set("threads", r.threads);
        report.set("shared_memory_bytes", r.sharedMemoryBytes);
        reports.push(std::move(report));
      }
      item.set("ptxas", std::move(reports));
    }
    benchArray.push(std::move(item));
  }
  root.set("bench", std::move(benchArray));
  fs::create_directories(directory);
  writeJsonFile((fs::path(directory) / "pack.json").string(), root, 2);
}

Pack Pack::read(const std::string &directory) {
  const fs::path path = fs::path(directory) / "pack.json";
  std::ifstream in(path);
  if (!in)
    throw Error(fmt::format("cannot read {}: is '{}' a pack written by pagedc-gpu-prepare?",
                            path.string(), directory));
  std::stringstream text;
  text << in.rdbuf();
  Value root = Value::parse(text.str());
  if (root.at("format").asString("format") != kPackFormat)
    throw Error(fmt::format("{}: format is not {}", path.string(), kPackFormat));
  if (root.at("version").asInt("version") != kPackVersion)
    throw Error(fmt::format("{}: version {} is not {}", path.string(),
                            root.at("version").asInt("version"), kPackVersion));
  Pack pack;
  pack.directory = directory;
  pack.arch = root.at("arch").asString("arch");
  pack.created = root.at("created").asString("created");
  for (const Value &item : root.at("cases").asArray("cases")) {
    PackCase c;
    c.name = item.at("name").asString("cases.name");
    const std::string where = "cases[" + c.name + "]";
    c.source = item.at("source").asString(where + ".source");
    c.mask = item.at("mask").asString(where + ".mask");
    c.score = item.at("score").asString(where + ".score");
    c.label = item.at("label").asString(where + ".label");
    c.bundle = item.at("bundle").asString(where + ".bundle");
    c.kind = kindFromName(item.at("kind").asString(where + ".kind"));
    c.dtype = dtypeFromName(item.at("dtype").asString(where + ".dtype"), where);
    if (c.dtype != DType::F16 && c.dtype != DType::BF16)
      throw Error(fmt::format("pack: {}: dtype must be f16 or bf16", where));
    c.batch = readInt(item, "batch", where);
    c.headsQ = readInt(item, "heads_q", where);
    c.headsKv = readInt(item, "heads_kv", where);
    c.queryLength = readInt(item, "q_len", where);
    c.headDim = readInt(item, "head_dim", where);
    c.maxKvLength = readInt(item, "max_kv_len", where);
    c.kvLength = readIntArray(item.at("kv_len"), where + ".kv_len");
    c.qOffset = readIntArray(item.at("q_offset"), where + ".q_offset");
    c.batchIdx = readIntArray(item.at("batch_idx"), where + ".batch_idx");
    c.numPages = readInt(item, "num_pages", where);
    c.pageSize = readInt(item, "page_size", where);
    c.maxBatch = readInt(item, "max_batch", where);
    for (const Value &reserve : item.at("reserves").asArray(where + ".reserves")) {
      std::vector<int32_t> pair = readIntArray(reserve, where + ".reserves");
      if (pair.size() != 2)
        throw Error(fmt::format("pack: {}.reserves: entries are [slot, length]", where));
      c.reserves.push_back({pair[0], pair[1]});
    }
    c.scale = static_cast<float>(item.at("scale").asDouble(where + ".scale"));
    c.returnLse = item.at("return_lse").asBool(where + ".return_lse");
    c.qBlock = readInt(item, "q_block", where);
    c.kvBlock = readInt(item, "kv_block", where);
    c.maskReadsB = item.at("mask_reads_b").asBool(where + ".mask_reads_b");
    c.maskReadsH = item.at("mask_reads_h").asBool(where + ".mask_reads_h");
    c.seed = std::stoull(item.at("seed").asString(where + ".seed"));
    c.inputChecksum = item.at("input_checksum").asString(where + ".input_checksum");
    c.params = paramsFromJson(item.at("params"), where);
    c.buffers = buffersFromJson(item.at("buffers"), where);
    c.tolerance = item.at("tolerance").asDouble(where + ".tolerance");
    const auto batch = static_cast<size_t>(c.batch);
    if (c.kvLength.size() != batch || c.qOffset.size() != batch || c.batchIdx.size() != batch)
      throw Error(fmt::format("pack: {}: kv_len, q_offset and batch_idx need {} entries", where,
                              batch));
    pack.cases.push_back(std::move(c));
  }
  for (const Value &item : root.at("bench").asArray("bench")) {
    BenchCase b;
    b.name = item.at("name").asString("bench.name");
    const std::string where = "bench[" + b.name + "]";
    b.label = item.at("label").asString(where + ".label");
    b.bundle = item.at("bundle").asString(where + ".bundle");
    b.mask = item.at("mask").asString(where + ".mask");
    b.score = item.at("score").asString(where + ".score");
    b.kind = kindFromName(item.at("kind").asString(where + ".kind"));
    b.batch = readInt(item, "batch", where);
    b.headsQ = readInt(item, "heads_q", where);
    b.headsKv = readInt(item, "heads_kv", where);
    b.queryLength = readInt(item, "q_len", where);
    b.headDim = readInt(item, "head_dim", where);
    b.kvLength = readInt(item, "kv_len", where);
    b.pageSize = readInt(item, "page_size", where);
    b.keptFraction = item.at("kept_fraction").asDouble(where + ".kept_fraction");
    b.qBlock = readInt(item, "q_block", where);
    b.kvBlock = readInt(item, "kv_block", where);
    b.params = paramsFromJson(item.at("params"), where);
    b.buffers = buffersFromJson(item.at("buffers"), where);
    if (const Value *reports = item.find("ptxas"))
      for (const Value &report : reports->asArray(where + ".ptxas")) {
        BenchPtxas r;
        r.arch = report.at("arch").asString(where + ".ptxas.arch");
        r.kernel = report.at("kernel").asString(where + ".ptxas.kernel");
        r.registers = readInt(report, "registers", where + ".ptxas");
        r.stackBytes = readInt(report, "stack_bytes", where + ".ptxas");
        r.spillStoreBytes = readInt(report, "spill_store_bytes", where + ".ptxas");
        r.spillLoadBytes = readInt(report, "spill_load_bytes", where + ".ptxas");
        r.threads = readInt(report, "threads", where + ".ptxas");
        r.sharedMemoryBytes = readInt(report, "shared_memory_bytes", where + ".ptxas");
        b.ptxas.push_back(std::move(r));
      }
    pack.bench.push_back(std::move(b));
  }
  return pack;
}

} // namespace pagedc::gpu
